"""The transformers backend on a tiny random model: batching, shared prefixes, stop strings, roles, errors."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator

import pytest
import torch

from knowtrace_train.generation import (
    BASE_ROLE,
    GenerationError,
    GenerationRequest,
    Generator,
    GeneratorConfig,
    build_generator,
)
from knowtrace_train.generation import hf as hf_mod
from knowtrace_train.generation.hf import TransformersGenerator, pick_device, pick_dtype

#: where the generators under test run ("auto": CUDA where available); references run there too
DEVICE = pick_device("auto")

EXEMPLARS = (
    "Answer with a triplet.\nQuestion: Who founded Brindle Mills?\n(Brindle Mills; founded by; Oskar Venn)\n"
    "Question: Which river flows through Teslin?\n(Teslin; located on; Ardel River)\n"
)
QUESTIONS = [
    "Who wrote The Glass Orchard?",
    "Where was Ivo Brandt born?",
    "Which team does the coach of the Varna Hawks support, and since when?",
    "What is the capital of Marovia?",
    "Who directed Night Ferry?",
]


def prompts() -> list[str]:
    return [f"{EXEMPLARS}Question: {q}\n" for q in QUESTIONS]


def requests(role: str = BASE_ROLE, n: int = 12, **kw) -> list[GenerationRequest]:
    return [GenerationRequest(prompt=p, role=role, max_new_tokens=n, **kw) for p in prompts()]


def make(model_dir, **kw) -> TransformersGenerator:
    kw.setdefault("progress", False)
    kw.setdefault("prompt_format", "plain")
    # float32 on every device ('auto' is bf16 on GPUs): the tests compare decodes run in different
    # batch shapes, which bf16 rounding would let part at a random model's near-ties
    kw.setdefault("dtype", "float32")
    return TransformersGenerator(GeneratorConfig(model=str(model_dir), **kw))


@pytest.fixture(scope="module")
def gen(tiny_model_dir) -> Iterator[TransformersGenerator]:
    with make(tiny_model_dir, batch_size=3) as g:
        yield g


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Greedy model.generate, one prompt at a time, on the plain model (the slow, obvious way)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).to(DEVICE).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))

    def run(prompt: str, n: int, model=model) -> list[int]:
        ids = tok(prompt, return_tensors="pt").input_ids.to(model.device)
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=tok.pad_token_id,
            )
        return out[0, ids.shape[1]:].tolist()

    run.tokenizer = tok
    return run


def token_ids(gen: TransformersGenerator, text: str) -> list[int]:
    return gen.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_is_a_generator(gen):
    assert isinstance(gen, Generator)
    assert gen.count_tokens("Hello world") == len(token_ids(gen, "Hello world"))


def test_batched_outputs_equal_one_at_a_time_reference(gen, reference):
    gen.eos_ids = set()  # a random model may emit eos early; compare full-length greedy runs
    try:
        out = gen.generate(requests(n=10))
    finally:
        gen.eos_ids = gen._eos_ids(gen.model)
    for p, c in zip(prompts(), out):
        ref = reference.tokenizer.decode(reference(p, 10), skip_special_tokens=True)
        assert c.text == ref
        assert c.output_tokens == 10 and c.finish_reason == "length"
        assert c.prompt_tokens == len(reference.tokenizer(p).input_ids)


def test_batch_size_and_prefix_sharing_do_not_change_outputs(tiny_model_dir, gen):
    base = gen.generate(requests())
    one = make(tiny_model_dir, batch_size=1, share_prefix=False).generate(requests())
    unshared = make(tiny_model_dir, batch_size=5, share_prefix=False).generate(requests())
    # prefill in chunks of a few rows, each padded to its own longest suffix
    chunked = make(tiny_model_dir, batch_size=5, prefill_chunk_tokens=24).generate(requests())
    chunked_unshared = make(tiny_model_dir, batch_size=5, share_prefix=False, prefill_chunk_tokens=40).generate(requests())
    texts = [c.text for c in base]
    assert [c.text for c in one] == texts == [c.text for c in unshared]
    assert [c.text for c in chunked] == texts == [c.text for c in chunked_unshared]


@pytest.mark.parametrize("share_prefix", [True, False])
def test_the_lm_head_multiplies_contiguous_rows_in_prefill_and_decoding(tiny_model_dir, share_prefix):
    """A prefill of several rows hands the LM head each row's last hidden state as a contiguous tensor: a strided
    slice of the prefill's hidden states took 1,000x the time of a contiguous one in bf16 on a CPU."""
    g = make(tiny_model_dir, batch_size=5, share_prefix=share_prefix)
    seen: list[tuple[tuple[int, ...], bool]] = []
    hooks = [
        m.get_output_embeddings().register_forward_pre_hook(lambda _m, args: seen.append((tuple(args[0].shape), args[0].is_contiguous())))
        for m in set(g.models.values())
    ]
    try:
        out = g.generate(requests(n=4))
    finally:
        for h in hooks:
            h.remove()
    assert len(out) == len(prompts())
    assert any(shape[0] > 1 for shape, _ in seen), "no call ran the LM head on several rows"
    assert all(shape[1] == 1 for shape, _ in seen), "the head ran on more positions than each row's last"
    assert [shape for shape, contiguous in seen if not contiguous] == []


def test_shared_prefix_is_computed_once_and_reused_across_calls(tiny_model_dir):
    g = make(tiny_model_dir, batch_size=2, min_shared_prefix=8)
    first = g.generate(requests())
    shared_len = len(token_ids(g, EXEMPLARS))
    computed = g.stats["prefix_tokens_computed"]
    assert shared_len - 3 <= computed <= shared_len + 3  # the exemplars' tokens, once, not per batch
    assert g.stats["prompt_tokens_shared"] == computed * len(QUESTIONS)
    second = g.generate(requests()[::-1])
    assert g.stats["prefix_tokens_computed"] == computed  # nothing recomputed
    assert [c.text for c in second] == [c.text for c in first][::-1]
    # a lone prompt reuses the stored prefix too
    lone = g.generate(requests()[2:3])
    assert g.stats["prefix_tokens_computed"] == computed
    assert lone[0].text == first[2].text


def test_results_keep_request_order_across_roles_and_lengths(gen):
    reqs = requests()
    mixed = [dataclasses.replace(r, max_new_tokens=3 + i) for i, r in enumerate(reqs)]
    out = gen.generate(mixed)
    assert [c.output_tokens <= 3 + i for i, c in enumerate(out)] == [True] * len(reqs)
    single = [gen.generate([r])[0] for r in mixed]
    assert [c.text for c in out] == [c.text for c in single]


def test_stop_strings_cut_the_text_and_end_the_sequence(gen):
    free = gen.generate(requests(n=16)[:1])[0]
    text = free.text
    assert len(text) > 6
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = text.find(stop)
    out = gen.generate([dataclasses.replace(requests(n=16)[0], stop=("never-seen-stop", stop))])[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:cut]
    assert out.output_tokens < 16 or free.output_tokens == 16


def test_finish_reasons_length_and_eos(gen, reference):
    free = gen.generate(requests(n=6)[:1])[0]
    assert free.finish_reason == "length" and free.output_tokens == 6
    first = reference(prompts()[0], 6)[0]
    saved = gen.eos_ids
    gen.eos_ids = {first}
    try:
        out = gen.generate(requests(n=6)[:1])[0]
    finally:
        gen.eos_ids = saved
    assert out.finish_reason == "eos" and out.text == "" and out.output_tokens == 1


def test_sampling_is_seeded(gen):
    req = requests(n=12, temperature=1.0, seed=7)[0]
    a, b = gen.generate([req, req])
    c = gen.generate([dataclasses.replace(req, seed=8)])[0]
    assert a.text == b.text
    assert c.text != a.text


def test_chat_and_message_prompts_use_the_chat_template(tiny_model_dir):
    g = make(tiny_model_dir, prompt_format="chat")
    text = prompts()[0]
    rendered = g.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    as_text, as_messages = g.generate(
        [
            GenerationRequest(prompt=text, max_new_tokens=4),
            GenerationRequest(prompt=({"role": "user", "content": text},), max_new_tokens=4),
        ]
    )
    assert as_text.prompt_tokens == as_messages.prompt_tokens == len(token_ids(g, rendered))
    assert as_text.text == as_messages.text
    plain = make(tiny_model_dir, prompt_format="plain").generate([GenerationRequest(prompt=text, max_new_tokens=4)])[0]
    assert plain.prompt_tokens < as_text.prompt_tokens


# -- roles and adapters ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    """Two random LoRA adapters (non-zero B, so they change outputs), saved like trained ones."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = {}
    for seed, role in enumerate(["explore", "complete"]):
        torch.manual_seed(100 + seed)
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
        cfg = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
        peft_model = get_peft_model(model, cfg)
        folder = tmp_path_factory.mktemp(f"adapter_{role}")
        peft_model.save_pretrained(folder)
        out[role] = str(folder)
    return out


@pytest.fixture(scope="module")
def role_gen(tiny_model_dir, adapters) -> Iterator[TransformersGenerator]:
    with make(tiny_model_dir, adapters=adapters, base_roles=("answer",), batch_size=4) as g:
        yield g


def test_adapters_change_outputs_and_base_role_equals_plain_model(role_gen, gen):
    plain = [c.text for c in gen.generate(requests())]
    explore = [c.text for c in role_gen.generate(requests("explore"))]
    complete = [c.text for c in role_gen.generate(requests("complete"))]
    # the authors' code left the reasoner adapter active for its base role: after an adapted call,
    # the base role (and a configured base role) must still be the plain model
    base = [c.text for c in role_gen.generate(requests(BASE_ROLE))]
    answer = [c.text for c in role_gen.generate(requests("answer"))]
    assert base == plain
    assert answer == plain
    assert explore != plain and complete != plain and explore != complete


def test_mixed_roles_in_one_call_equal_separate_calls(role_gen):
    roles = ["explore", BASE_ROLE, "complete", "explore", BASE_ROLE]
    mixed = [dataclasses.replace(r, role=role) for r, role in zip(requests(), roles)]
    together = [c.text for c in role_gen.generate(mixed)]
    apart = [role_gen.generate([r])[0].text for r in mixed]
    assert together == apart


def test_merged_role_copies_decode_as_the_switched_adapters_do(tiny_model_dir, adapters, role_gen):
    """merge_adapters (the CPU default): each role on its own copy with its adapter merged in gives the greedy
    texts PEFT's switched adapters give (fp32: the two differ only by rounding), and keeps one copy per role."""
    with make(tiny_model_dir, adapters=adapters, base_roles=("answer",), batch_size=4, merge_adapters=False) as switched:
        assert not switched.merged and len({id(m) for m in switched.models.values()}) == 1
        for role in ("explore", "complete", BASE_ROLE, "answer"):
            assert [c.text for c in role_gen.generate(requests(role))] == [c.text for c in switched.generate(requests(role))]
    if DEVICE.type == "cpu":
        assert role_gen.merged and len({id(m) for m in role_gen.models.values()}) == 3
        assert not any("lora" in name for name, _ in role_gen.models["explore"].named_parameters())


def test_adapter_active_after_base_call_is_reapplied(role_gen):
    before = role_gen.generate(requests("explore")[:2])
    role_gen.generate(requests(BASE_ROLE)[:2])
    after = role_gen.generate(requests("explore")[:2])
    assert [c.text for c in before] == [c.text for c in after]


# -- bad input ------------------------------------------------------------------------------------


def test_role_without_adapter_is_an_error_naming_it(role_gen):
    with pytest.raises(GenerationError, match=r"request 1 \(role 'judge'\).*no adapter for role 'judge'"):
        role_gen.generate([requests("explore")[0], requests("judge")[0]])


def test_without_adapters_every_role_runs_on_the_plain_model(gen):
    assert [c.text for c in gen.generate(requests("explore"))] == [c.text for c in gen.generate(requests())]


def test_missing_adapter_folder_is_an_error_naming_role_and_path(tiny_model_dir, tmp_path):
    with pytest.raises(GenerationError, match=r"role 'explore'.*nowhere"):
        make(tiny_model_dir, adapters={"explore": str(tmp_path / "nowhere")})


@pytest.mark.parametrize("prompt", ["", "   \n", ()])
def test_empty_prompt_is_an_error_naming_the_request(gen, prompt):
    reqs = requests()[:2] + [GenerationRequest(prompt=prompt, role="explore")]
    with pytest.raises(GenerationError, match=r"request 2 \(role 'explore'\): empty prompt"):
        gen.generate(reqs)


def test_too_long_prompt_is_an_error_unless_truncation_is_configured(tiny_model_dir):
    long = "word " * 300
    strict = make(tiny_model_dir, max_context=128)
    with pytest.raises(GenerationError, match=r"request 0 .*prompt of \d+ tokens plus max_new_tokens 8 exceeds .* 128"):
        strict.generate([GenerationRequest(prompt=long, max_new_tokens=8)])
    lenient = make(tiny_model_dir, max_context=128, truncate_prompts=True)
    out = lenient.generate([GenerationRequest(prompt=long, max_new_tokens=8)])[0]
    full = len(lenient.tokenizer(long)["input_ids"])
    assert out.prompt_tokens == 120
    assert out.truncated_tokens == full - 120
    assert out.output_tokens == 8


def test_bad_request_fields_are_errors(gen):
    with pytest.raises(GenerationError, match="max_new_tokens"):
        gen.generate([GenerationRequest(prompt="x", max_new_tokens=0)])
    with pytest.raises(GenerationError, match="stop"):
        gen.generate([GenerationRequest(prompt="x", stop=("",))])
    with pytest.raises(GenerationError, match="temperature"):
        gen.generate([GenerationRequest(prompt="x", temperature=-1.0)])


def test_config_validation_names_the_field():
    with pytest.raises(GenerationError, match="backend"):
        GeneratorConfig(backend="tgi")
    with pytest.raises(GenerationError, match="prompt_format"):
        GeneratorConfig(prompt_format="jinja")
    with pytest.raises(GenerationError, match="batch_size"):
        GeneratorConfig(batch_size=0)
    from knowtrace_train.config import load_config

    with pytest.raises(ValueError, match=r"unknown key 'batchsize' for GeneratorConfig \(did you mean 'batch_size'\?\)"):
        load_config(GeneratorConfig, data={"batchsize": 4})
    with pytest.raises(GenerationError, match="'base'"):
        GeneratorConfig(adapters={"base": "/x"})


def test_build_generator_picks_the_backend(tiny_model_dir):
    g = build_generator(GeneratorConfig(model=str(tiny_model_dir), progress=False))
    assert isinstance(g, TransformersGenerator)
    assert g.model.config._attn_implementation == "knowtrace_shared_prefix"


def test_auto_dtype_is_bf16_only_on_cpus_that_compute_it_natively(monkeypatch, tiny_model_dir):
    cpu = torch.device("cpu")
    monkeypatch.setattr(hf_mod, "cpu_has_native_bf16", lambda: True)
    assert pick_dtype("auto", cpu) == torch.bfloat16
    g = build_generator(GeneratorConfig(model=str(tiny_model_dir), progress=False, device="cpu"))
    assert next(g.model.parameters()).dtype == torch.bfloat16
    g.close()
    monkeypatch.setattr(hf_mod, "cpu_has_native_bf16", lambda: False)
    assert pick_dtype("auto", cpu) == torch.float32
    assert pick_dtype("bfloat16", cpu) == torch.bfloat16 and pick_dtype("float32", cpu) == torch.float32


# -- devices under a launcher: each process its own GPU -----------------------------------------------


def test_each_launched_process_generates_on_its_own_gpu(monkeypatch):
    from knowtrace_train.generation.devices import engine_visible_devices, process_device, visible_devices
    from knowtrace_train.generation.vllm_backend import VLLMGenerator

    assert process_device("auto", 0, None) == "cpu" and process_device("auto", 0, 1) == "cpu"
    assert process_device("auto", 4, None) == "cuda"  # not launched: the current device, as before
    # launched: LOCAL_RANK mod GPUs, the rule accelerate's PartialState gives the Trainer
    assert [process_device("auto", 4, r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert process_device("cuda", 2, 3) == "cuda:1"
    assert process_device("cuda:1", 4, 0) == "cuda:1" and process_device("cpu", 4, 2) == "cpu"  # explicit: kept

    # the transformers backend's device, from a monkeypatched launcher environment on a 2-GPU machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert pick_device("auto") == pick_device("cuda") == torch.device("cuda:1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert pick_device("auto") == torch.device("cuda:0")

    # the vLLM engine starts in its own process seeing only this process's GPU (its first visible one)
    assert engine_visible_devices("cuda:1", None, 2) == "1"
    assert engine_visible_devices("cuda:1", "4,6", 2) == "6"
    assert engine_visible_devices("cuda", None, 2) is None and engine_visible_devices("cpu", None, 0) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert VLLMGenerator._engine_gpu("auto") == "6"
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert VLLMGenerator._engine_gpu("auto") is None  # its default GPU already
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(GenerationError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        VLLMGenerator._engine_gpu("auto")
    with visible_devices("6"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"


# -- the real model -------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_batched_with_shared_prefix_equals_model_generate(smollm2_dir):
    """Two few-shot prompts sharing their exemplars: the batched backend (prefix computed once)
    gives model.generate's greedy text, and stops at the stop string."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shots = (
        "Extract the knowledge triplet.\n"
        "Text: Oskar Venn founded Brindle Mills in 1901.\nTriplet: (Brindle Mills; founded by; Oskar Venn)\n\n"
        "Text: Teslin lies on the Ardel River.\nTriplet: (Teslin; located on; Ardel River)\n\n"
    )
    texts = [f"{shots}Text: Dara Quill is the mayor of Port Elsin.\n", f"{shots}Text: The Quiet Atlas was published by Fenwick Press.\n"]
    stop = ("\n\n",)
    gen = TransformersGenerator(GeneratorConfig(model=str(smollm2_dir), progress=False, dtype="float32"))
    out = gen.generate([GenerationRequest(prompt=t, role="explore", max_new_tokens=16, stop=stop) for t in texts])
    assert gen.stats["prompt_tokens_shared"] > 0
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    # the reference on the generator's device and dtype
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).to(gen.device).eval()
    for t, c in zip(texts, out):
        rendered = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        enc = tok(rendered, add_special_tokens=False, return_tensors="pt").to(model.device)
        with torch.inference_mode():
            ref = model.generate(**enc, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
        ref_text = tok.decode(ref[0, enc.input_ids.shape[1]:], skip_special_tokens=True)
        expected = ref_text.split(stop[0])[0]
        assert c.text == expected
        assert c.prompt_tokens == enc.input_ids.shape[1]


def test_the_benchmark_splits_forward_passes_into_prefill_and_decode_steps(tiny_model_dir):
    """scripts/bench/bench_generation.py's split: every forward pass counted once, as prefill (several positions per
    row) or a decode step (one per row), with the rows it computed."""
    import importlib.util
    from pathlib import Path

    # the script puts scripts/ on sys.path itself (for bench_prompts)
    spec = importlib.util.spec_from_file_location(
        "bench_generation_script", Path(__file__).resolve().parents[1] / "scripts" / "bench" / "bench_generation.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    g = build_generator(GeneratorConfig(model=str(tiny_model_dir), progress=False, batch_size=2))
    split = bench.time_forward_passes(g)
    out = g.generate([GenerationRequest(prompt=f"Question {i}: what is {i} plus {i}?", max_new_tokens=n)
                      for i, n in enumerate((3, 6, 5))])
    prefilled = g.stats["prompt_tokens_prefilled"]  # suffixes after any shared prefix, pads not counted
    g.close()
    pre, dec = split["prefill"], split["decode"]
    # every sequence's first token comes from its prefill; each later token from one decode step's row
    assert dec["positions"] == sum(c.output_tokens - 1 for c in out)
    assert 1 <= pre["calls"] <= 3 and prefilled <= pre["positions"] < prefilled + 3 * 8
    assert dec["calls"] >= max(c.output_tokens for c in out) - 1 and pre["seconds"] > 0 and dec["seconds"] > 0
    assert "decode" in bench.describe_forward("batched", split)
    assert bench.time_forward_passes(object()) is None
