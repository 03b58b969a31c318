"""Merging LoRA adapters into base weights: a plain model folder (safetensors + tokenizer) that serves alone."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

from knowtrace_train.errors import RunError
from knowtrace_train.io import atomic_dir

logger = logging.getLogger(__name__)


def merge_adapters_into_base(
    base_path: str | Path, adapter_dir: str | Path | Sequence[str | Path], out_dir: str | Path
) -> Path:
    """Fold LoRA adapter(s) into the base weights and save a plain model folder (safetensors + tokenizer).

    Several adapters are merged one after another (their updates add up), in the order given. The weights
    keep the base checkpoint's dtype. The folder is written beside `out_dir` and renamed into place.
    The base must be unquantized: an adapter trained with `qlora` (on a 4-bit copy of this base) is merged
    into the full-precision weights, as PEFT users expect; a base folder with a `quantization_config` is refused.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_path, out_dir = Path(base_path), Path(out_dir)
    adapters = [Path(adapter_dir)] if isinstance(adapter_dir, (str, Path)) else [Path(a) for a in adapter_dir]
    if not adapters:
        raise ValueError("merge_adapters_into_base: no adapter given")
    for a in adapters:
        if not (a / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{a}: not a PEFT adapter folder (no adapter_config.json)")
    config_file = base_path / "config.json"
    if config_file.is_file() and "quantization_config" in json.loads(config_file.read_text(encoding="utf-8")):
        raise RunError(f"{base_path} is a quantized checkpoint: merge the adapter into the unquantized base "
                         "(a qlora adapter is trained on a 4-bit copy of it, never saved as one)")
    model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype="auto")
    for a in adapters:
        model = PeftModel.from_pretrained(model, str(a)).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(str(base_path))
    with atomic_dir(out_dir, what="the merged model") as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    logger.info("merged %s into %s -> %s", ", ".join(map(str, adapters)), base_path, out_dir)
    return out_dir
