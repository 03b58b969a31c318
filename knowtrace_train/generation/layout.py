"""Linear layers on pre-transposed weights: the CPU decoding layout.

`nn.Linear` keeps its weight as [out, in] and multiplies by its transpose. On this project's CPUs (MKL, fp32)
that product is slow at the few rows a decoding step has, on one thread: a model's worth of linear layers at 13
rows took 91 ms against 60 ms on a [in, out] copy of the same weights, and the LM head 43 ms against 17.5 ms
(`scripts/bench_generation.py --phases batched,untransposed` measures the whole backend both ways). With two
threads the two layouts were even at 13 rows (49 ms), so the gain is in one-thread processes. The copy
replaces the weight (the module keeps no [out, in] tensor; `weight` is a view of the copy), so memory grows
only where a weight was tied: the LM head then gets its own copy beside the input embedding (113 MB for
SmolLM2-135M in fp32).
"""

from __future__ import annotations

import torch
from torch import nn


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
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, TransposedLinear(child))
                replaced += 1
    # the other weights are copied too: a model loaded from safetensors holds views of one memory-mapped file, and
    # the file's pages stay mapped (resident once read) while any view of it lives
    for module in model.modules():
        if not isinstance(module, TransposedLinear):
            for param in module.parameters(recurse=False):
                param.data = param.data.clone()
    return replaced


def transpose_here(setting: bool | None, device: torch.device, dtype: torch.dtype) -> bool:
    """`GeneratorConfig.transpose_weights` resolved: as set, else on CPUs in fp32 (where it was measured)."""
    return device.type == "cpu" and dtype == torch.float32 if setting is None else bool(setting)
