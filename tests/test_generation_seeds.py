"""Per-request sampling seeds: `request_seed`, the transformers backend's per-row generators, and
the seed the vLLM backend hands to SamplingParams (checked against a stand-in vllm module)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from knowtrace_train.generation import GenerationRequest, GeneratorConfig
from knowtrace_train.generation.base import request_seed
from knowtrace_train.generation.hf import TransformersGenerator

from test_generation import EXEMPLARS, QUESTIONS  # noqa: E402  (the same prompts as the backend's tests)

PROMPTS = [f"{EXEMPLARS}Question: {q}\n" for q in QUESTIONS]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# -- request_seed --------------------------------------------------------------------------------


def test_request_seed_is_stable_across_processes():
    # sha256 of the JSON list [base, *keys]: fixed values, whatever PYTHONHASHSEED a process has
    assert request_seed(0) == 1354539281
    assert request_seed(0, "traj-17", 3) == 2026797657
    assert request_seed(12345, "hotpot/5a8b57f25542995d1e6f1371", 0) == 159176748


def test_request_seed_differs_with_every_key_and_stays_31_bit():
    seeds = {request_seed(b, t, c) for b in range(3) for t in ("q1", "q2", "q3") for c in range(4)}
    assert len(seeds) == 3 * 3 * 4
    assert all(0 <= s < 2**31 for s in seeds)
    assert request_seed(0, "1") != request_seed(0, 1)  # a key's type counts
    assert request_seed(0, "a", "b") != request_seed(0, "ab")  # keys stay apart
    assert request_seed(0, 1, 2) != request_seed(0, 2, 1)  # order counts
    assert request_seed(7, "q", 1) == request_seed(7, "q", 1)


def test_request_seed_rejects_keys_without_a_stable_text():
    with pytest.raises(TypeError, match="key 1"):
        request_seed(0, "q", 1.5)
    with pytest.raises(TypeError, match="base_seed"):
        request_seed("0", "q")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key 0"):
        request_seed(0, True)


def test_config_seed_must_be_an_integer():
    from knowtrace_train.generation import GenerationError

    with pytest.raises(GenerationError, match="seed"):
        GeneratorConfig(seed=1.5)  # type: ignore[arg-type]
    from knowtrace_train.config import load_config

    assert load_config(GeneratorConfig, data={"seed": 3}).seed == 3


# -- the transformers backend --------------------------------------------------------------------


def make(model_dir, **kw) -> TransformersGenerator:
    kw.setdefault("progress", False)
    kw.setdefault("prompt_format", "plain")
    kw.setdefault("device", "cpu")
    return TransformersGenerator(GeneratorConfig(model=str(model_dir), **kw))


def sampled(prompt: str, seed: int, n: int = 10, temperature: float = 1.0) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_new_tokens=n, temperature=temperature, seed=seed)


@pytest.fixture(scope="module")
def gen(tiny_model_dir) -> TransformersGenerator:
    g = make(tiny_model_dir, batch_size=3)
    g.eos_ids = set()  # a random model may emit eos early; compare full-length samples
    return g


def test_different_seeds_give_different_samples(gen):
    out = gen.generate([sampled(PROMPTS[0], seed) for seed in range(5)])
    assert len({c.text for c in out}) == 5
    assert all(c.output_tokens == 10 for c in out)


@pytest.mark.parametrize("device", DEVICES)
def test_a_sample_equals_a_one_at_a_time_reference_sampler(tiny_model_dir, device):
    """The row's own torch.Generator, seeded with request_seed(config.seed, request.seed), draws
    every token of that row from softmax(logits / temperature): the obvious sampler, by hand."""
    from transformers import AutoModelForCausalLM

    g = make(tiny_model_dir, batch_size=4, seed=11, device=device)
    g.eos_ids = set()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).to(device).eval()
    reqs = [sampled(p, seed=40 + i, temperature=0.7) for i, p in enumerate(PROMPTS[:3])]
    out = g.generate(reqs)
    for r, c in zip(reqs, out):
        ids = g.tokenizer(r.prompt, return_tensors="pt").input_ids.to(device)
        sampler = torch.Generator(device=device)
        sampler.manual_seed(request_seed(11, r.seed))
        new = []
        with torch.inference_mode():
            for _ in range(r.max_new_tokens):
                logits = model(ids).logits[0, -1].float()
                tok = torch.multinomial(torch.softmax(logits / r.temperature, dim=-1), 1, generator=sampler)
                new.append(int(tok))
                ids = torch.cat([ids, tok[None]], dim=1)
        assert c.text == g.tokenizer.decode(new, skip_special_tokens=True)


def test_a_sample_never_depends_on_its_neighbours_or_the_batch_size(tiny_model_dir, gen):
    target = sampled(PROMPTS[2], seed=7)
    alone = gen.generate([target])[0].text
    assert gen.generate([target])[0].text == alone  # a rerun
    neighbours = [sampled(PROMPTS[i], seed=100 + i) for i in (0, 1, 3, 4)]
    greedy = [dataclasses.replace(r, temperature=0.0) for r in neighbours[:2]]
    batches = [
        neighbours[:2] + [target] + neighbours[2:],
        [target] + greedy + neighbours,
        neighbours[::-1] + [sampled(PROMPTS[2], seed=8), target],  # same prompt, another seed beside it
    ]
    for batch in batches:
        texts = [c.text for c in gen.generate(batch)]
        assert texts[batch.index(target)] == alone
    for kw in ({"batch_size": 1}, {"batch_size": 5, "share_prefix": False}, {"batch_size": 2, "prefill_chunk_tokens": 24}):
        other = make(tiny_model_dir, **kw)
        other.eos_ids = set()
        texts = [c.text for c in other.generate(batches[0])]
        assert texts[2] == alone, kw


def test_config_seed_is_mixed_into_every_sampled_request(tiny_model_dir, gen):
    req = sampled(PROMPTS[0], seed=3)
    zero = gen.generate([req])[0].text
    other = make(tiny_model_dir, batch_size=3, seed=1)
    other.eos_ids = set()
    assert other.generate([req])[0].text != zero
    again = make(tiny_model_dir, batch_size=2, seed=1)
    again.eos_ids = set()
    assert again.generate([req])[0].text == other.generate([req])[0].text


def test_greedy_ignores_every_seed_and_matches_model_generate(tiny_model_dir, gen):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    reqs = [GenerationRequest(prompt=p, max_new_tokens=8) for p in PROMPTS[:3]]
    base = gen.generate(reqs)
    reseeded = make(tiny_model_dir, batch_size=3, seed=99)
    reseeded.eos_ids = set()
    for out in (gen.generate([dataclasses.replace(r, seed=1234) for r in reqs]), reseeded.generate(reqs)):
        assert [c.text for c in out] == [c.text for c in base]
    for r, c in zip(reqs, base):
        ids = gen.tokenizer(r.prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                pad_token_id=gen.tokenizer.pad_token_id,
            )
        assert c.text == gen.tokenizer.decode(ref[0, ids.shape[1]:], skip_special_tokens=True)


# -- the vLLM backend, against a stand-in vllm module ----------------------------------------------


class _FakeLLM:
    """Records the engine arguments and every SamplingParams; answers a fixed text."""

    instances: list["_FakeLLM"] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.params: list = []
        _FakeLLM.instances.append(self)

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        self.params.extend(params)
        out = types.SimpleNamespace(text="x", token_ids=[1], finish_reason="length", stop_reason=None)
        return [types.SimpleNamespace(outputs=[out]) for _ in prompts]


class _FakeSamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = _FakeLLM
    vllm.SamplingParams = _FakeSamplingParams
    lora = types.ModuleType("vllm.lora")
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = lambda **kw: types.SimpleNamespace(**kw)
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", lora_request)):
        monkeypatch.setitem(sys.modules, name, module)
    _FakeLLM.instances.clear()
    return _FakeLLM


def test_vllm_gets_each_sampled_request_its_own_seed(tiny_model_dir, fake_vllm):
    from knowtrace_train.generation.vllm_backend import VLLMGenerator

    g = VLLMGenerator(GeneratorConfig(backend="vllm", model=str(tiny_model_dir), seed=5, device="cpu", progress=False))
    reqs = [sampled("Who?", seed=1), sampled("Who?", seed=2), GenerationRequest(prompt="Who?", seed=3)]
    out = g.generate(reqs)
    assert [c.text for c in out] == ["x"] * 3
    (engine,) = fake_vllm.instances
    assert engine.kwargs["seed"] == 5
    assert [p.seed for p in engine.params] == [request_seed(5, 1), request_seed(5, 2), None]
    assert [p.temperature for p in engine.params] == [1.0, 1.0, 0.0]
