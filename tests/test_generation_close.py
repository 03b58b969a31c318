"""Generators are closed between stages: close() lets go of the model (and its GPU memory), twice is
fine, generating afterwards is a clear error, and `with build_generator(cfg) as g:` closes."""

from __future__ import annotations

import gc
import sys
import types
import weakref

import pytest
import torch

from knowtrace_train.generation import (
    BASE_ROLE,
    GenerationError,
    GenerationRequest,
    Generator,
    GeneratorClosedError,
    GeneratorConfig,
    build_generator,
)
from knowtrace_train.generation.hf import TransformersGenerator

PROMPTS = [
    "Answer with a triplet.\nQuestion: Who founded Brindle Mills?\n(Brindle Mills; founded by; Oskar Venn)\n"
    f"Question: {q}\n"
    for q in ("Who wrote The Glass Orchard?", "Where was Ivo Brandt born?")
]


def requests(role: str = BASE_ROLE) -> list[GenerationRequest]:
    return [GenerationRequest(prompt=p, role=role, max_new_tokens=4) for p in PROMPTS]


def config(model_dir, **kw) -> GeneratorConfig:
    kw.setdefault("progress", False)
    kw.setdefault("prompt_format", "plain")
    return GeneratorConfig(model=str(model_dir), **kw)


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    folder = tmp_path_factory.mktemp("close_adapter")
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)).save_pretrained(folder)
    return str(folder)


# -- the transformers backend ---------------------------------------------------------------------


@pytest.mark.parametrize("merge", [False, True], ids=["switched adapters", "merged copies"])
def test_close_lets_go_of_the_model_its_adapters_and_the_stored_prefixes(tiny_model_dir, adapter, merge):
    g = TransformersGenerator(config(tiny_model_dir, adapters={"explore": adapter}, min_shared_prefix=8,
                                     merge_adapters=merge))
    assert isinstance(g, Generator)
    g.generate(requests("explore") + requests(BASE_ROLE))
    assert len(g.prefixes) > 0  # keys/values of the shared exemplars are held across calls
    explore = g.models["explore"]
    refs = {
        "the explore role's model": weakref.ref(explore),
        "the plain model": weakref.ref(g.models[None] if merge else explore.get_base_model()),
        "a weight": weakref.ref(next(explore.parameters())),
        "a stored prefix key": weakref.ref(next(iter(g.prefixes._items.values())).keys[0]),
    }
    del explore
    assert all(r() is not None for r in refs.values())
    g.close()
    gc.collect()
    assert [name for name, r in refs.items() if r() is not None] == []
    assert g.closed and g.model is None and not g.models and len(g.prefixes) == 0


def test_close_twice_is_fine_and_generating_after_close_is_a_clear_error(tiny_model_dir):
    g = build_generator(config(tiny_model_dir))
    before = g.count_tokens("Hello world")
    assert not g.closed
    g.close()
    g.close()
    assert g.closed
    with pytest.raises(GeneratorClosedError, match=r"TransformersGenerator .*closed"):
        g.generate(requests())
    # not a GenerationError: the strategy retries and records those as unusable calls, where a
    # closed generator must stop the run
    assert not issubclass(GeneratorClosedError, GenerationError)
    assert g.count_tokens("Hello world") == before  # the tokenizer stays: token counts still work


def test_with_block_closes_the_generator(tiny_model_dir):
    with build_generator(config(tiny_model_dir)) as g:
        assert isinstance(g, TransformersGenerator) and not g.closed
        out = g.generate(requests())
        model = weakref.ref(g.model)
    assert len(out) == 2 and g.closed
    gc.collect()
    assert model() is None


def test_with_block_closes_on_an_error_and_lets_the_error_through(tiny_model_dir):
    with pytest.raises(KeyError, match="boom"):
        with build_generator(config(tiny_model_dir)) as g:
            raise KeyError("boom")
    assert g.closed


def test_close_empties_the_cuda_cache_only_where_cuda_was_started(tiny_model_dir, monkeypatch):
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    build_generator(config(tiny_model_dir, device="cpu")).close()
    assert emptied == []  # closing never starts CUDA (nor needs it)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    build_generator(config(tiny_model_dir, device="cpu")).close()
    assert emptied == [True]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_close_returns_the_gpu_memory(tiny_model_dir):
    def cycle():
        g = build_generator(config(tiny_model_dir, device="cuda"))
        g.generate(requests())
        held = torch.cuda.memory_allocated()
        g.close()
        torch.cuda.synchronize()
        return held

    cycle()  # once for what CUDA keeps for the process (cuBLAS handles and workspaces, kernels)
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    assert cycle() > allocated
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() <= reserved  # the cache handed back to the driver


# -- the vLLM backend, over a stand-in of the vllm package -----------------------------------------


class FakeEngineCore:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def shutdown(self) -> None:
        self.log.append("engine_core.shutdown")


class FakeLLM:
    """What VLLMGenerator touches of vllm.LLM: the constructor, generate, and the V1 engine's
    `llm_engine.engine_core.shutdown()` that stops the engine core (process)."""

    log: list[str] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.llm_engine = types.SimpleNamespace(engine_core=FakeEngineCore(self.log))
        self.log.append("LLM")

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        done = types.SimpleNamespace(text=" ok", token_ids=[1, 2], finish_reason="length", stop_reason=None)
        return [types.SimpleNamespace(outputs=[done]) for _ in prompts]


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` package with the names the backend imports; its calls go to one log."""
    log: list[str] = []
    FakeLLM.log = log
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    lora = types.ModuleType("vllm.lora")
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = lambda **kw: types.SimpleNamespace(**kw)
    distributed = types.ModuleType("vllm.distributed")
    parallel_state = types.ModuleType("vllm.distributed.parallel_state")
    parallel_state.destroy_model_parallel = lambda: log.append("destroy_model_parallel")
    parallel_state.destroy_distributed_environment = lambda: log.append("destroy_distributed_environment")
    for name, module in {
        "vllm": vllm, "vllm.lora": lora, "vllm.lora.request": lora_request,
        "vllm.distributed": distributed, "vllm.distributed.parallel_state": parallel_state,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return log


def test_vllm_close_stops_the_engine_and_lets_go_of_it_once(tiny_model_dir, fake_vllm):
    from knowtrace_train.generation.vllm_backend import VLLMGenerator

    g = build_generator(config(tiny_model_dir, backend="vllm", device="cpu"))
    assert isinstance(g, VLLMGenerator) and isinstance(g, Generator)
    assert [c.text for c in g.generate(requests())] == [" ok", " ok"]
    llm = weakref.ref(g.llm)
    g.close()
    gc.collect()
    assert llm() is None and g.llm is None and g.closed
    # the engine core stops first, then vLLM's parallel state (this process had no process group)
    assert fake_vllm == ["LLM", "engine_core.shutdown", "destroy_model_parallel", "destroy_distributed_environment"]
    g.close()
    assert fake_vllm.count("engine_core.shutdown") == 1
    with pytest.raises(GeneratorClosedError, match=r"VLLMGenerator .*closed"):
        g.generate(requests())


def test_vllm_close_keeps_a_process_group_it_did_not_start(tiny_model_dir, fake_vllm, monkeypatch):
    """Under torchrun the run's own (gloo) process group exists before the engine: vLLM's
    destroy_distributed_environment would destroy it, and the rollout gather after it."""
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    with build_generator(config(tiny_model_dir, backend="vllm", device="cpu")) as g:
        g.generate(requests())
    assert g.closed
    assert fake_vllm == ["LLM", "engine_core.shutdown", "destroy_model_parallel"]


def test_vllm_close_still_lets_go_when_the_engine_fails_to_stop(tiny_model_dir, fake_vllm, monkeypatch):
    def broken(self):
        raise RuntimeError("engine core gone already")

    monkeypatch.setattr(FakeEngineCore, "shutdown", broken)
    g = build_generator(config(tiny_model_dir, backend="vllm", device="cpu"))
    llm = weakref.ref(g.llm)
    with pytest.raises(RuntimeError, match="gone already"):
        g.close()
    gc.collect()
    assert llm() is None and g.closed
    assert "destroy_model_parallel" in fake_vllm
    g.close()  # nothing left to do


def test_a_vllm_engine_that_cannot_start_is_a_clear_error_naming_the_setting(tiny_model_dir, fake_vllm, monkeypatch):
    """An engine that fails to start (vLLM says only "Engine core initialization failed") is a GenerationError
    naming the memory setting and the torch in use, not a hang or a bare RuntimeError; a CPU KV cache larger
    than the memory available is refused before the engine starts."""
    from knowtrace_train.generation import GenerationError
    from knowtrace_train.generation import vllm_backend

    def fail(**kwargs):
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")

    monkeypatch.setattr(sys.modules["vllm"], "LLM", fail)
    with pytest.raises(GenerationError, match=r"could not start its engine on the CPU \(RuntimeError: Engine core "
                       r"initialization failed.*lower generator.cpu_kvcache_gib \(now 1 GiB\).*this process has torch"):
        build_generator(config(tiny_model_dir, backend="vllm", device="cpu", cpu_kvcache_gib=1))
    monkeypatch.setattr(vllm_backend, "available_memory_gib", lambda: 20.0)
    with pytest.raises(GenerationError, match=r"generator.cpu_kvcache_gib is 200 GiB but this machine has 20.0 GiB available"):
        build_generator(config(tiny_model_dir, backend="vllm", device="cpu", cpu_kvcache_gib=200))
    assert "LLM" not in fake_vllm
