"""Linear layers on pre-transposed weights (generation.layout): the same products, only plain nn.Linear
replaced, the generator's own models converted where configured, its outputs unchanged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from knowtrace_train.generation import GenerationRequest, GeneratorConfig
from knowtrace_train.generation.hf import TransformersGenerator
from knowtrace_train.generation import layout as layout_mod
from knowtrace_train.generation.layout import (
    PACKED_MAX_ROWS, PackedLinear, TransposedLinear, onednn_packs_bf16, pack_here, transpose_here, transpose_linears)

from test_generation import adapters  # noqa: F401, E402  (two random LoRA adapters, saved like trained ones)

PROMPTS = [f"Question: who founded the mill in town {i}, and when?\n" for i in range(5)]


def make(model_dir, **kw) -> TransformersGenerator:
    kw.setdefault("prompt_format", "plain")
    return TransformersGenerator(GeneratorConfig(model=str(model_dir), progress=False, device="cpu", **kw))


def texts(gen: TransformersGenerator, role: str = "base") -> list[str]:
    return [c.text for c in gen.generate([GenerationRequest(prompt=p, role=role, max_new_tokens=8) for p in PROMPTS])]


def linears(model) -> tuple[int, int]:
    """(plain nn.Linear, TransposedLinear) modules of `model`."""
    mods = list(model.modules())
    return sum(type(m) is nn.Linear for m in mods), sum(isinstance(m, TransposedLinear) for m in mods)


@pytest.mark.parametrize("bias", [False, True])
def test_transposed_linear_computes_what_the_linear_does(bias):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=bias)
    t = TransposedLinear(lin)
    for shape in [(1, 24), (13, 24), (2, 7, 24)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(t(x), lin(x))
    assert t.weight_t.shape == (24, 40) and t.weight_t.is_contiguous()
    assert torch.equal(t.weight, lin.weight) and t.weight.data_ptr() == t.weight_t.data_ptr()  # a view, no second copy
    assert not any(p.requires_grad for p in t.parameters())
    assert (t.bias is not None) == bias and "in_features=24, out_features=40" in repr(t)


def test_only_plain_linear_layers_are_replaced_and_the_rest_is_copied():
    class Scaled(nn.Linear):  # a subclass (as PEFT's layers are): its own forward is kept
        pass

    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.ReLU(), Scaled(8, 8), nn.Sequential(nn.Linear(8, 3)))
    x = torch.randint(0, 10, (2, 5))
    before = model(x)
    emb = model[0].weight.data_ptr()
    assert transpose_linears(model) == 2
    assert isinstance(model[1], TransposedLinear) and type(model[3]) is Scaled and isinstance(model[4][0], TransposedLinear)
    torch.testing.assert_close(model(x), before)
    # the weights left in place are copies, so nothing keeps a loaded file's memory map alive
    assert model[0].weight.data_ptr() != emb


def test_transpose_here_resolves_the_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert transpose_here(None, cpu, torch.float32) and not transpose_here(None, cpu, torch.bfloat16)
    assert not transpose_here(None, cuda, torch.float32)
    assert transpose_here(True, cuda, torch.bfloat16) and not transpose_here(False, cpu, torch.float32)


def test_the_generator_transposes_its_own_cpu_fp32_models_and_decodes_the_same(tiny_model_dir):
    with make(tiny_model_dir, dtype="float32") as on, make(tiny_model_dir, dtype="float32", transpose_weights=False) as off:
        assert linears(on.model)[0] == 0 and linears(on.model)[1] > 0
        assert linears(off.model)[1] == 0
        assert texts(on) == texts(off)
    with make(tiny_model_dir, dtype="bfloat16") as half:  # measured in fp32 only: bf16 keeps nn.Linear
        assert linears(half.model)[1] == 0


def test_merged_role_copies_are_transposed_and_a_callers_model_is_left_alone(tiny_model_dir, adapters):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with make(tiny_model_dir, dtype="float32", adapters=adapters) as on, \
            make(tiny_model_dir, dtype="float32", adapters=adapters, transpose_weights=False) as off:
        assert on.merged and all(linears(m)[0] == 0 for m in on.models.values())
        for role in ("explore", "complete", "base"):
            assert texts(on, role) == texts(off, role)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    plain = linears(model)[0]
    with TransformersGenerator(GeneratorConfig(progress=False, device="cpu", prompt_format="plain"), model=model, tokenizer=tok):
        assert linears(model) == (plain, 0)


# oneDNN packs bf16 weights only on CPUs with AVX512 BW/VL/DQ or AVX-NE-CONVERT (not on an AVX2-only CPU)
needs_bf16_packing = pytest.mark.skipif(not onednn_packs_bf16(), reason="oneDNN cannot pack bf16 weights on this CPU")


@needs_bf16_packing
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_computes_what_the_linear_does_bit_for_bit(bias):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=bias).to(torch.bfloat16)
    p = PackedLinear(lin)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    try:  # count the packed products: inputs of up to PACKED_MAX_ROWS rows take them, longer ones the plain one
        torch.ops.mkldnn._linear_pointwise = lambda *a: calls.append(a[0].shape) or real(*a)
        for shape in [(1, 24), (13, 24), (2, 7, 24), (PACKED_MAX_ROWS, 24), (PACKED_MAX_ROWS + 1, 24), (300, 24)]:
            x = torch.randn(*shape).to(torch.bfloat16)
            assert torch.equal(p(x), lin(x))
    finally:
        torch.ops.mkldnn._linear_pointwise = real
    assert calls == [(1, 24), (13, 24), (2, 7, 24), (PACKED_MAX_ROWS, 24)]
    assert not any(t.requires_grad for t in p.parameters()) and "packed" in repr(p)
    assert (p.bias is not None) == bias and torch.equal(p.weight, lin.weight)


def test_pack_here_resolves_the_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pack_here(None, cpu, torch.bfloat16) == onednn_packs_bf16()
    assert not pack_here(None, cpu, torch.float32) and not pack_here(None, cuda, torch.bfloat16)
    assert not pack_here(False, cpu, torch.bfloat16)
    from knowtrace_train.generation.base import GenerationError

    with pytest.raises(GenerationError, match="generator.pack_weights: true needs a CPU model in bf16"):
        pack_here(True, cpu, torch.float32)


def test_a_cpu_whose_onednn_cannot_pack_bf16_decodes_unpacked(monkeypatch, tiny_model_dir):
    # an AVX2-only CPU: oneDNN refuses to reorder a bf16 weight, so 'auto' keeps nn.Linear and 'true' says why
    from knowtrace_train.generation.base import GenerationError

    monkeypatch.setattr(layout_mod, "onednn_packs_bf16", lambda: False)
    cpu = torch.device("cpu")
    assert not pack_here(None, cpu, torch.bfloat16)
    with pytest.raises(GenerationError, match="unable to pack bf16 on this CPU|oneDNN missing"):
        pack_here(True, cpu, torch.bfloat16)
    with make(tiny_model_dir, dtype="bfloat16") as half:
        assert not any(isinstance(m, PackedLinear) for m in half.model.modules()) and linears(half.model)[0] > 0
        assert texts(half)


@needs_bf16_packing
def test_the_generator_packs_its_own_cpu_bf16_models_and_decodes_the_same(tiny_model_dir, adapters):  # noqa: F811
    def packed(model) -> int:
        return sum(isinstance(m, PackedLinear) for m in model.modules())

    with make(tiny_model_dir, dtype="bfloat16", adapters=adapters) as on, \
            make(tiny_model_dir, dtype="bfloat16", adapters=adapters, pack_weights=False) as off:
        assert on.merged and all(linears(m)[0] == 0 and packed(m) > 0 for m in on.models.values())
        assert all(packed(m) == 0 for m in off.models.values())
        for role in ("explore", "complete", "base"):
            assert texts(on, role) == texts(off, role)
    with make(tiny_model_dir, dtype="float32") as fp32:  # fp32 keeps the transposed layout
        assert packed(fp32.model) == 0 and linears(fp32.model)[1] > 0
