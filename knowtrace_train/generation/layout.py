"""Linear layers on a copy of their weights laid out for the CPU's product: the CPU decoding layouts.

In bf16 (`PackedLinear`, `pack_linears`): oneDNN, which multiplies bf16 matrices on CPUs, reorders an [out, in]
weight into its blocked layout at every call, a copy of the whole weight for a product of a few rows. The
blocked copy, made once (`torch.ops.mkldnn._reorder_linear_weight`, the packing PyTorch's own compiler uses),
gives the same values at a decoding step's few rows in less time (docs/generation.md has the measurements).

In fp32 (`TransposedLinear`, `transpose_linears`):

`nn.Linear` keeps its weight as [out, in] and multiplies by its transpose. On this project's CPUs (MKL, fp32)
that product is slow at the few rows a decoding step has, on one thread: a model's worth of linear layers at 13
rows took 91 ms against 60 ms on a [in, out] copy of the same weights, and the LM head 43 ms against 17.5 ms
(`scripts/bench/bench_generation.py --phases batched,untransposed` measures the whole backend both ways). With two
threads the two layouts were even at 13 rows (49 ms), so the gain is in one-thread processes. The copy
replaces the weight (the module keeps no [out, in] tensor; `weight` is a view of the copy), so memory grows
only where a weight was tied: the LM head then gets its own copy beside the input embedding (113 MB for
SmolLM2-135M in fp32).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from knowtrace_train.generation.base import GenerationError


class TransposedLinear(nn.Module):
    """`nn.Linear`'s product on a contiguous [in, out] copy of its weight (frozen: for inference)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """The [out, in] weight, as a view of the transposed copy."""
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(x, self.weight_t)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def transpose_linears(model: nn.Module) -> int:
    """Replace every plain `nn.Linear` of `model` (in place) with a `TransposedLinear`; returns how many.
    PEFT's LoRA layers and other subclasses are left alone."""
    return _replace_linears(model, TransposedLinear)


class PackedLinear(nn.Module):
    """`nn.Linear`'s product on oneDNN's blocked copy of its bf16 weight, made once (frozen: for inference on a CPU),
    for inputs of up to `PACKED_MAX_ROWS` rows (decoding steps, short prefills); longer inputs multiply by the
    [out, in] weight, which the module keeps (so a model's linear weights take twice their memory). Both give the
    same values bit for bit up to `PACKED_MAX_ROWS` rows where measured (docs/generation.md; above it oneDNN may
    split the two products otherwise), so decoding is unchanged. The packed copy
    is an opaque oneDNN tensor (not a parameter: `state_dict` and `.to()` do not see it)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().clone(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        # the row count is a hint for the blocking: a decoding step's batch
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, PACKED_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= PACKED_MAX_ROWS * self.in_features:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed"


#: the rows a packed weight's blocking is chosen for (GeneratorConfig.batch_size's default), and the most rows an
#: input may have to take the packed product
PACKED_ROWS = 32
PACKED_MAX_ROWS = 256


def _replace_linears(model: nn.Module, make) -> int:
    """Replace every plain `nn.Linear` of `model` (in place) with `make(linear)`; returns how many. PEFT's LoRA
    layers and other subclasses are left alone. The other weights are copied too: a model loaded from safetensors
    holds views of one memory-mapped file, and the file's pages stay mapped (resident once read) while any view of
    it lives."""
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, make(child))
                replaced += 1
    for module in model.modules():
        if not isinstance(module, (TransposedLinear, PackedLinear)):
            for param in module.parameters(recurse=False):
                param.data = param.data.clone()
    return replaced


def pack_linears(model: nn.Module) -> int:
    """Replace every plain `nn.Linear` of a bf16 `model` (in place) with a `PackedLinear`; returns how many."""
    return _replace_linears(model, PackedLinear)


@functools.cache
def onednn_packs_bf16() -> bool:
    """Whether this torch can pack a bf16 weight on this CPU: it has oneDNN, and oneDNN's bf16 path runs here (it
    needs AVX512 BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU has neither and refuses). Tried once on a tiny weight."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), PACKED_ROWS)
    except RuntimeError:
        return False
    return True


def pack_here(setting: bool | None, device: torch.device, dtype: torch.dtype) -> bool:
    """`GeneratorConfig.pack_weights` resolved: as set (a GenerationError off a CPU in bf16 whose oneDNN can pack,
    naming the key), else on CPUs in bf16 where oneDNN can pack (`onednn_packs_bf16`)."""
    can_pack = onednn_packs_bf16()
    possible = device.type == "cpu" and dtype == torch.bfloat16 and can_pack
    if setting and not possible:
        onednn = ("missing" if not torch.backends.mkldnn.is_available()
                  else "available" if can_pack else "available but unable to pack bf16 on this CPU")
        raise GenerationError(f"generator.pack_weights: true needs a CPU model in bf16 and torch with oneDNN (mkldnn) "
                              f"that can pack bf16 on this CPU; here: {device.type}, {dtype}, oneDNN {onednn}")
    return possible if setting is None else bool(setting)


def transpose_here(setting: bool | None, device: torch.device, dtype: torch.dtype) -> bool:
    """`GeneratorConfig.transpose_weights` resolved: as set, else on CPUs in fp32 (where it was measured)."""
    return device.type == "cpu" and dtype == torch.float32 if setting is None else bool(setting)
