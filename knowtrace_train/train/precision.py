"""Training precision per device: bf16 where the hardware computes it natively, fp32 on other CPUs."""

from __future__ import annotations

import logging

from knowtrace_train.generation.devices import NATIVE_BF16_FLAGS, cpu_has_native_bf16

logger = logging.getLogger(__name__)

__all__ = ["NATIVE_BF16_FLAGS", "cpu_has_native_bf16", "frozen_in_bf16", "resolve_precision", "training_device"]


def resolve_precision(precision: str, device: str) -> tuple[str, str]:
    """(fp32|bf16|fp16, why). 'auto' takes bf16 on GPUs that support it (else fp16) and on CPUs with native
    bf16 (AVX512-BF16 or AMX), fp32 on other CPUs, where bf16 is emulated and slower than fp32 (docs/training.md
    has the measurements)."""
    if precision != "auto":
        return precision, "set in the config"
    if device == "cuda":
        import torch

        if torch.cuda.is_bf16_supported():
            return "bf16", "the GPU supports bf16"
        return "fp16", "the GPU has no bf16"
    if cpu_has_native_bf16():
        return "bf16", "the CPU has native bf16 (" + "/".join(NATIVE_BF16_FLAGS) + ")"
    return "fp32", "the CPU has no native bf16 (" + "/".join(NATIVE_BF16_FLAGS) + "), where bf16 is slower than fp32"


def training_device() -> str:
    """cuda where a GPU is visible, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def frozen_in_bf16(model, config, precision: str, device: str) -> int:
    """Cast, once, the frozen weights a LoRA model's linear layers multiply by to bf16: each LoRA layer's base
    weight and the LM head (untied from the input embedding, which stays fp32). For CPU training in bf16, where
    the weights are loaded in fp32 and the Trainer autocasts: autocast rounds a frozen weight to bf16 again at
    every call (it caches only the casts of weights that train; docs/training.md, `frozen_bf16`, has their cost).
    Autocast would round them the same way, so every product, loss and gradient
    is bit-identical (tests/test_train.py); the LoRA weights, the norms and the embedding stay fp32. It also turns
    off PEFT's cast of each LoRA layer's input to the LoRA weights' dtype, which autocast undoes (the same values).
    Acts where the training `config` (a LoraTrainConfig) sets `frozen_bf16` and trains in `precision` bf16 on
    `device` cpu; returns how many weights were cast (0 elsewhere)."""
    if not (config.frozen_bf16 and precision == "bf16" and device == "cpu"):
        return 0
    import torch
    from peft.tuners.lora import LoraLayer

    from knowtrace_train.train.trainer import output_head

    cast = 0
    for module in model.modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            if weight.dtype == torch.float32 and not weight.requires_grad:
                weight.data = weight.data.to(torch.bfloat16)
                cast += 1
            # PEFT casts a layer's input to the fp32 LoRA weights' dtype, and autocast casts it back to bf16 for
            # lora_A's product: for a bf16 input (the MLP's down projection) two copies of [tokens, 1536] forward
            # and two backward, for the same values (bf16 -> fp32 -> bf16 is exact)
            module.cast_input_dtype_enabled = False
    head = output_head(model)
    if type(head) is torch.nn.Linear and head.weight.dtype == torch.float32 and not head.weight.requires_grad:
        # a new Parameter: the input embedding keeps the fp32 one it shared
        head.weight = torch.nn.Parameter(head.weight.detach().to(torch.bfloat16), requires_grad=False)
        cast += 1
    logger.info("cast %d frozen weights to bf16 once (LoRA's base layers and the LM head): autocast casts them no "
                "more", cast)
    return cast
