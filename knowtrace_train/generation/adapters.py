"""The role adapters of the transformers backend: one PeftModel that switches adapters per role, or (the CPU
default, `GeneratorConfig.merge_adapters`) a copy of the weights per role with its adapter merged in."""

from __future__ import annotations

from pathlib import Path

import torch

from knowtrace_train.generation.base import GenerationError


def check_adapter_dir(role: str, path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not (p / "adapter_config.json").is_file():
        raise GenerationError(f"adapter for role {role!r}: {p} is not a PEFT adapter folder (no adapter_config.json)")
    return p


def load_with_adapters(model, adapters: dict[str, str]):
    """Wrap `model` in one PeftModel holding every role's LoRA adapter, each named after its role."""
    if not adapters:
        return model
    from peft import PeftModel

    items = [(role, check_adapter_dir(role, path)) for role, path in adapters.items()]
    role, path = items[0]
    # low_cpu_mem_usage: the LoRA weights are made empty and then loaded, not initialised at random first, so
    # loading draws nothing from torch's global generator (an evaluation beside a training must not move it)
    peft_model = PeftModel.from_pretrained(model, str(path), adapter_name=role, is_trainable=False,
                                           low_cpu_mem_usage=True)
    for role, path in items[1:]:
        peft_model.load_adapter(str(path), adapter_name=role, is_trainable=False, low_cpu_mem_usage=True)
    return peft_model


def merge_adapters_here(setting: bool | None, device: torch.device) -> bool:
    """`GeneratorConfig.merge_adapters` resolved: as set, else merged copies on CPUs only."""
    return device.type == "cpu" if setting is None else bool(setting)


def merged_copy(model, role: str, path: str | Path):
    """A copy of `model` with the role's LoRA adapter merged into its weights (in fp32, then back to the
    model's dtype): decoding it costs what the plain model costs."""
    import copy

    from peft import PeftModel

    dtype = next(model.parameters()).dtype
    base = copy.deepcopy(model).to(torch.float32)
    merged = PeftModel.from_pretrained(base, str(check_adapter_dir(role, path)), is_trainable=False,
                                       low_cpu_mem_usage=True).merge_and_unload()  # as in load_with_adapters
    return merged.to(dtype).eval()
