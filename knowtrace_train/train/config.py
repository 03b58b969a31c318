"""LoRA training settings (one adapter per role; the self-training loop's `train:` sections)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from knowtrace_train.generation.prepare import PROMPT_FORMATS
from knowtrace_train.progress import trainer_bar_off
from knowtrace_train.tracking import trainer_arguments

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass
class LoraTrainConfig:
    """LoRA SFT settings for one role. The self-training sections set effective_batch_size 4 (SmolLM2-135M on CPU:
    one forward pass of 4 records whose shared prompt prefix runs once, rate 3e-4, records up to 1024 tokens;
    scripts/bench/bench_train.py); the paper's smallest grid point (Sec. 4.1: batch 32, rate 1e-4) is
    recipes/configs/selftrain_paper_gpu.yaml's."""

    rank: int = field(default=16, metadata={"help": "LoRA rank r."})
    alpha: int = field(default=32, metadata={"help": "LoRA alpha (the update is scaled by alpha / rank)."})
    dropout: float = field(
        default=0.0,
        metadata={"help": "Dropout on the LoRA input (0 by default; why: docs/training.md)."},
    )
    target_modules: str | list[str] = field(
        default="all-linear",
        metadata={"help": "Modules that get LoRA: 'all-linear' (every linear layer but the LM head) or names."},
    )
    epochs: float = field(default=2.0, metadata={"help": "Passes over the records (the paper tunes 1, 2, 3)."})
    learning_rate: float = field(default=3e-4, metadata={"help": "Peak AdamW learning rate (linear decay)."})
    per_device_batch_size: int | None = field(
        default=None,
        metadata={"help": (
            "Records per forward pass per process; null (auto): a process's whole share of effective_batch_size "
            "in one pass where it divides evenly, else 1 (accumulated).")},
    )
    gradient_accumulation_steps: int = field(
        default=4, metadata={"help": "Forward passes per optimizer step (effective batch = this x batch x processes); ignored where effective_batch_size is set."}
    )
    effective_batch_size: int | None = field(
        default=None,
        metadata={"help": "Records per optimizer step over all processes; when set, the accumulation is derived from it."},
    )
    max_length: int = field(
        default=1024,
        metadata={"help": "Longest prompt+completion in tokens; longer records are skipped (never cut), and counted."},
    )
    seed: int = field(default=0, metadata={"help": "Seed for LoRA initialisation, dropout and record order (self-training derives it from its own seed)."})
    padding_free: bool = field(
        default=True,
        metadata={"help": "Flatten a batch into one sequence without pad tokens (FlashAttention varlen on GPUs)."},
    )
    share_prefixes: bool = field(
        default=True,
        metadata={"help": (
            "On CPUs, where a forward pass holds several records, run the prompt tokens they begin with once and "
            "each record's remainder on their keys and values: the same loss and gradients, fewer tokens computed "
            "(docs/training.md). GPUs keep the padding-free batch.")},
    )
    group_prefix_tokens: int = field(
        default=64,
        metadata={"help": (
            "Where share_prefixes runs: each forward pass draws its records from those whose prompts begin with the "
            "same this many tokens (64: the chat header and the start of one role's instruction), so that instruction "
            "runs once per pass; passes in a seeded random order, every record once per epoch. 0: a uniform shuffle. "
            "The bootstrap's training 1.09x faster, M0 no worse over 2 seeds (docs/training.md).")},
    )
    frozen_bf16: bool = field(
        default=True,
        metadata={"help": (
            "On CPUs training in bf16 (autocast over fp32 weights): cast the frozen weights the linear layers multiply "
            "by (LoRA's base layers, the LM head) to bf16 once instead of at every call. Autocast rounds them alike, "
            "so results are bit-identical; faster (docs/training.md). SFT and KTO; GRPO, which also generates, not.")},
    )
    packing: bool = field(
        default=False,
        metadata={"help": "Pack records into max_length blocks (best-fit decreasing); implies padding_free."},
    )
    precision: str = field(
        default="auto",
        metadata={"help": "'auto' (bf16 on GPUs and CPUs that have it natively, else fp32/fp16), 'fp32', 'bf16', 'fp16'."},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in the backward pass (saves memory, costs ~30% time)."}
    )
    qlora: bool = field(
        default=False, metadata={"help": "Load the base model in 4-bit NF4 through bitsandbytes (GPUs only)."}
    )
    logging_steps: int = field(default=5, metadata={"help": "Optimizer steps between two logged losses."})
    prompt_format: str = field(
        default="chat",
        metadata={"help": "'chat' (prompt as the user turn of the chat template) or 'plain'; same as the generator's."},
    )
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many optimizer steps (-1: all epochs)."})
    plateau_steps: int = field(
        default=0,
        metadata={"help": (
            "Stop where the loss has flattened: once the mean logged loss of the last plateau_steps optimizer steps "
            "fell by less than plateau_min_drop from the plateau_steps before (0: off; a multiple of logging_steps).")},
    )
    plateau_min_drop: float = field(
        default=0.1, metadata={"help": "Relative drop of the windowed mean loss below which training counts as flat."}
    )
    decision_weight: float | None = field(
        default=None,
        metadata={"help": (
            "SFT: the loss weight of a record's decision tokens (KnowTrace's ' Yes'/' No' judgement), balanced over "
            "each decision's labels (knowtrace_train.decisions); null: decision tokens weigh as any other token.")},
    )

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"LoraTrainConfig.{name}: {why} (got {getattr(self, name)!r})")

        for name in ("rank", "alpha", "gradient_accumulation_steps", "max_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "must be a positive integer")
        b = self.per_device_batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise bad("per_device_batch_size", "must be a positive integer or null (auto)")
        if self.effective_batch_size is not None and (
            not isinstance(self.effective_batch_size, int) or self.effective_batch_size < 1
        ):
            raise bad("effective_batch_size", "must be a positive integer or null")
        if not 0.0 <= self.dropout < 1.0:
            raise bad("dropout", "must be in [0, 1)")
        if self.epochs <= 0:
            raise bad("epochs", "must be positive")
        if self.learning_rate <= 0:
            raise bad("learning_rate", "must be positive")
        if self.precision not in PRECISIONS:
            raise bad("precision", f"must be one of {PRECISIONS}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise bad("prompt_format", f"must be one of {PROMPT_FORMATS}")
        if self.logging_steps < 1:
            raise bad("logging_steps", "must be a positive integer")
        w = self.decision_weight
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0):
            raise bad("decision_weight", "must be a number >= 0 or null")
        if w and self.packing:
            raise bad("decision_weight", "weighs decision tokens per record, which packed rows do not keep; set packing: false")
        if self.max_steps == 0 or self.max_steps < -1:
            raise bad("max_steps", "must be -1 (all epochs) or a positive integer")
        if isinstance(self.group_prefix_tokens, bool) or not isinstance(self.group_prefix_tokens, int) \
                or self.group_prefix_tokens < 0:
            raise bad("group_prefix_tokens", "must be 0 (off) or a positive integer")
        if not isinstance(self.plateau_steps, int) or self.plateau_steps < 0:
            raise bad("plateau_steps", "must be 0 (off) or a positive integer")
        if self.plateau_steps % self.logging_steps:
            raise bad("plateau_steps", f"must be a multiple of logging_steps ({self.logging_steps}): it is read from the logged losses")
        if not 0.0 < self.plateau_min_drop < 1.0:
            raise bad("plateau_min_drop", "must be in (0, 1)")
        if isinstance(self.target_modules, (list, tuple)):
            self.target_modules = [str(m) for m in self.target_modules]
            if not self.target_modules:
                raise bad("target_modules", "must name at least one module")



def per_device_batch_for(config: LoraTrainConfig, processes: int) -> int:
    """Records per forward pass per process: `per_device_batch_size`, or where it is null (auto) the process's
    whole share of `effective_batch_size` where that divides evenly among `processes`, else 1."""
    if config.per_device_batch_size is not None:
        return config.per_device_batch_size
    e = config.effective_batch_size
    return e // processes if e is not None and e % processes == 0 else 1


def gradient_accumulation_for(config: LoraTrainConfig, processes: int) -> int:
    """Forward passes per optimizer step for `processes` data-parallel processes: `gradient_accumulation_steps`,
    or, where `effective_batch_size` is set, effective_batch_size / (per-device batch x processes), so the
    effective batch stays what the config names whatever the process count. A remainder raises naming the numbers."""
    if config.effective_batch_size is None:
        return config.gradient_accumulation_steps
    per_device = per_device_batch_for(config, processes)
    per_pass = per_device * processes
    if config.effective_batch_size % per_pass:
        raise ValueError(
            f"effective_batch_size {config.effective_batch_size} is not a multiple of per_device_batch_size "
            f"{per_device} x {processes} processes = {per_pass} records per forward pass; "
            "change one of the three"
        )
    return config.effective_batch_size // per_pass


def as_trained(config: LoraTrainConfig, processes: int) -> LoraTrainConfig:
    """`config` with the per-device batch and the accumulation it trains with under `processes` processes (what
    an adapter's training record holds)."""
    return replace(config, per_device_batch_size=per_device_batch_for(config, processes),
                   gradient_accumulation_steps=gradient_accumulation_for(config, processes))


def launched_processes() -> int:
    """Data-parallel processes of this launch (WORLD_SIZE of torchrun / accelerate launch; 1 when not launched)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def common_args(config: LoraTrainConfig, precision: str, device: str, output_dir: str) -> dict[str, Any]:
    """The Trainer arguments every trainer here shares (SFT's and KTO's): epochs, rate, batches, seeds, precision,
    checkpointing, logging, no checkpoints saved, data-parallel backend."""
    world = launched_processes()
    extra: dict[str, Any] = {}
    if world > 1:
        extra["ddp_backend"] = "nccl" if device == "cuda" else "gloo"
        extra["ddp_find_unused_parameters"] = False
    if config.gradient_checkpointing:
        extra["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    return dict(
        output_dir=output_dir,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        per_device_train_batch_size=per_device_batch_for(config, world),
        gradient_accumulation_steps=gradient_accumulation_for(config, world),
        seed=config.seed,
        data_seed=config.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=device == "cpu",
        gradient_checkpointing=config.gradient_checkpointing,
        logging_steps=config.logging_steps,
        logging_first_step=True,
        save_strategy="no",
        disable_tqdm=trainer_bar_off(),  # no bar redraws in a log file (progress.py)
        **trainer_arguments(),  # report_to "none", or a tracked run's trackers and run name (tracking.py)
        remove_unused_columns=False,
        dataloader_drop_last=False,
        **extra,
    )
