"""LoRA SFT of one role on prompt/completion records (TRL SFTTrainer + PEFT), loss on the completion only (over 500 lines: a role's records to tokens, its loading, training and saving, in the order one training runs).

A record is ``{"prompt", "completion"}`` (the ``sft_<role>.jsonl`` rows). Each is tokenized here, once, into
the exact token sequence the generator feeds the model (`prompt_ids`) followed by the completion's tokens
(`completion_ids`); labels are -100 on every prompt token, so the loss covers the completion only. TRL then
batches these pre-tokenized rows: padding-free (all rows of a batch flattened into one sequence, no pad
tokens) or packed. Runs data-parallel when launched with ``torchrun``/``accelerate launch`` (gloo on CPUs,
nccl on GPUs); only the main process writes the adapter.
"""

from __future__ import annotations

import abc
import logging
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from knowtrace_train.decisions import decision_of, decision_weights
from knowtrace_train.errors import LaunchError, RunError, UserError, import_extra
from knowtrace_train.generation.prepare import PROMPT_FORMATS
from knowtrace_train.io import atomic_dir, iter_jsonl, read_json, write_json
from knowtrace_train.train.config import LoraTrainConfig, as_trained, common_args, launched_processes, per_device_batch_for
from knowtrace_train.train.mode import TrainingMode, trained_info
from knowtrace_train.train.precision import frozen_in_bf16, resolve_precision, training_device
from knowtrace_train.train.trainer import counting_trainer_class, pass_groups

logger = logging.getLogger(__name__)

#: Written beside the PEFT files in every adapter folder: role, base model, prompt format, config, figures.
TRAINING_INFO = "knowtrace_training.json"


class SFTRecordError(UserError, ValueError):
    """A prompt/completion record that cannot be trained on; the message names the record and field."""
    label = "data error"


@dataclass(frozen=True)
class TrainResult:
    """What one role's training produced and how fast it ran (tokens summed over all processes)."""

    adapter_dir: Path
    train_loss: float
    #: non-pad tokens processed (prompt + completion), all epochs, all processes
    tokens: int
    seconds: float
    tokens_per_second: float
    #: tokens that carried loss (completion tokens)
    completion_tokens: int = 0
    records: int = 0
    skipped_records: int = 0
    steps: int = 0
    #: the logged training losses, one per `logging_steps`
    losses: tuple[float, ...] = ()
    precision: str = "fp32"
    #: records per optimizer step as trained: per-device batch x accumulation x processes
    effective_batch_size: int = 0
    gradient_accumulation_steps: int = 0
    processes: int = 1
    #: the optimizer step where `plateau_steps` found the loss flat and stopped training (None: trained to the end)
    plateau_stop_step: int | None = None
    #: token positions the forward passes computed: pads included, a prefix that records share once (share_prefixes)
    computed_tokens: int = 0


# ---------------------------------------------------------------------------------------------------------------
# Records -> token ids


def render_prompt_ids(tokenizer, prompt: str | Sequence[Mapping[str, str]], prompt_format: str) -> list[int]:
    """The token ids the model sees before its completion: the generator must feed exactly these.

    chat: the prompt (a string is one user message; a list is the messages) through the tokenizer's chat
    template with the assistant turn opened (`add_generation_prompt`), tokenized without extra special tokens.
    plain: ``tokenizer(prompt)`` with the tokenizer's own special tokens (BOS where it adds one).
    """
    if prompt_format == "chat":
        text = tokenizer.apply_chat_template(_messages(prompt), add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if prompt_format == "plain":
        if not isinstance(prompt, str):
            raise ValueError("prompt_format 'plain' needs a string prompt, got chat messages")
        return list(tokenizer(prompt)["input_ids"])
    raise ValueError(f"unknown prompt_format {prompt_format!r}; expected one of {PROMPT_FORMATS}")


def record_texts(
    tokenizer, prompt: str | Sequence[Mapping[str, str]], completion: str, prompt_format: str, prefix: str = ""
) -> tuple[str, str]:
    """(prompt text, completion text) as the model reads and writes them. chat: the prompt through the chat template
    with the assistant turn opened, then `prefix` (the start of the answer the engine feeds), and the rest of the turn
    as the template closes it, through the end-of-sequence token (where the generator stops); plain: the prompt and
    the prefix, and the completion plus EOS. For trainers that tokenize text themselves (TRL's KTO); `encode_record`
    tokenizes the same texts."""
    eos = tokenizer.eos_token
    if prompt_format == "chat":
        messages = _messages(prompt)
        head = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(
            messages + [{"role": "assistant", "content": prefix + completion}], tokenize=False
        )
        if not full.startswith(head + prefix):
            raise ValueError(
                "the chat template renders the prompt differently with and without the assistant turn, so "
                f"training would not see what the generator feeds: {(head + prefix)[-80:]!r} vs "
                f"{full[len(head) + len(prefix) - 80 : len(head) + len(prefix)]!r}"
            )
        tail = full[len(head) + len(prefix) :]
        if eos and eos in tail:
            tail = tail[: tail.index(eos) + len(eos)]
        return head + prefix, tail
    if prompt_format == "plain":
        if not isinstance(prompt, str):
            raise ValueError("prompt_format 'plain' needs a string prompt, got chat messages")
        return prompt + prefix, completion + (eos or "")
    raise ValueError(f"unknown prompt_format {prompt_format!r}; expected one of {PROMPT_FORMATS}")


def encode_record(
    tokenizer, prompt: str | Sequence[Mapping[str, str]], completion: str, prompt_format: str, prefix: str = ""
) -> tuple[list[int], list[int]]:
    """(prompt_ids, completion_ids) of one record: the ids the generator feeds (`render_prompt_ids`, then `prefix`,
    the start of the answer the engine feeds, tokenized on its own as the generator tokenizes it) and the ids the
    model writes after them (the loss goes on these only).

    chat: the completion is the rest of the assistant turn as the chat template closes it, up to and including the
    first end-of-sequence token (the generator stops there). plain: the completion's tokens and the EOS token.
    """
    prompt_ids, eos = render_prompt_ids(tokenizer, prompt, prompt_format), tokenizer.eos_token_id
    if prefix:
        prompt_ids += list(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    if prompt_format != "chat":
        return prompt_ids, list(tokenizer(completion, add_special_tokens=False)["input_ids"]) + ([eos] if eos is not None else [])
    tail = record_texts(tokenizer, prompt, completion, prompt_format, prefix)[1]
    completion_ids = list(tokenizer(tail, add_special_tokens=False)["input_ids"])
    return prompt_ids, completion_ids[: completion_ids.index(eos) + 1] if eos in completion_ids else completion_ids


def decision_token_span(tokenizer, completion: str, start: int, end: int, completion_ids: Sequence[int]) -> range:
    """The indices into `completion_ids` of the tokens that carry the characters [start, end) of `completion`
    (by the tokenizer's character offsets of the completion alone, whose tokens up to the span's end must be the
    record's own; a ValueError otherwise)."""
    enc = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    hit = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    if not hit or list(completion_ids[: hit[-1] + 1]) != ids[: hit[-1] + 1]:
        raise ValueError(f"the decision {completion[start:end]!r} is not on whole tokens of the completion {completion[:60]!r}")
    return range(hit[0], hit[-1] + 1)


def _messages(prompt: str | Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


def load_records(records: Sequence[Mapping[str, Any]] | str | Path, role: str,
                 allow_empty: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """Validate prompt/completion records: a list of mappings or a JSONL path; returns (where, record) pairs.

    A record needs a non-empty ``completion`` string (empty allowed with `allow_empty`: a policy that wrote
    nothing but EOS) and a ``prompt`` that is a non-empty string or a list of ``{"role", "content"}`` messages;
    a ``prefix``, where present, is a string; a ``decision`` is one `knowtrace_train.decisions` marks; a ``role``
    field, where present, must be `role`.
    """
    if isinstance(records, (str, Path)):
        rows: Iterable[tuple[str, Mapping[str, Any]]] = ((f"{records}:{n}", r) for n, r in iter_jsonl(records))
    else:
        rows = ((f"record {i}", r) for i, r in enumerate(records))
    out = []
    for where, rec in rows:
        if not isinstance(rec, Mapping):
            raise SFTRecordError(f"{where}: expected an object with 'prompt' and 'completion', got {type(rec).__name__}")
        prompt, completion = rec.get("prompt"), rec.get("completion")
        if isinstance(prompt, str):
            if not prompt:
                raise SFTRecordError(f"{where}: field 'prompt' is empty")
        elif isinstance(prompt, (list, tuple)) and prompt:
            for j, m in enumerate(prompt):
                if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                    raise SFTRecordError(f"{where}: field 'prompt'[{j}] is not a {{'role', 'content'}} message")
        else:
            raise SFTRecordError(f"{where}: field 'prompt' must be a non-empty string or list of messages")
        if not isinstance(completion, str) or not (completion.strip() or (allow_empty and completion == "")):
            raise SFTRecordError(f"{where}: field 'completion' must be a non-empty string")
        if not isinstance(rec.get("prefix", ""), str):
            raise SFTRecordError(f"{where}: field 'prefix' must be a string, got {rec['prefix']!r}")
        try:
            decision_of(rec, where)
        except ValueError as e:
            raise SFTRecordError(str(e)) from None
        if "role" in rec and rec["role"] != role:
            raise SFTRecordError(f"{where}: field 'role' is {rec['role']!r} but this run trains role {role!r}")
        out.append((where, dict(rec)))
    if not out:
        raise SFTRecordError(f"no records to train role {role!r} on")
    return out


def tokenize_records(
    tokenizer, records: Sequence[tuple[str, Mapping[str, Any]]], prompt_format: str, max_length: int,
    decision_weight: float | None = None,
) -> tuple[list[dict[str, list[int]]], int]:
    """Rows of {"input_ids", "labels"} (labels -100 on the prompt and the fed prefix) and the number skipped for
    length. With `decision_weight` (`knowtrace_train.decisions.decision_weights`) and any record marking a
    decision, every row also has "loss_weights": 0 on the prompt, 1 on a completion token, the record's decision
    weight on its decision's tokens."""
    weights = decision_weights([r for _, r in records], decision_weight)
    weighted = any(w is not None for w in weights)
    rows, skipped = [], []
    for (where, rec), w in zip(records, weights):
        prompt_ids, completion_ids = encode_record(tokenizer, rec["prompt"], rec["completion"], prompt_format,
                                                   rec.get("prefix", ""))
        if len(prompt_ids) + len(completion_ids) > max_length:
            skipped.append(f"{where} ({len(prompt_ids) + len(completion_ids)} tokens)")
            continue
        row = {"input_ids": prompt_ids + completion_ids, "labels": [-100] * len(prompt_ids) + completion_ids}
        if weighted:
            lw = [0.0] * len(prompt_ids) + [1.0] * len(completion_ids)
            if w is not None:
                d = rec["decision"]
                for i in decision_token_span(tokenizer, rec["completion"], d["start"], d["end"], completion_ids):
                    lw[len(prompt_ids) + i] = w
            row["loss_weights"] = lw
        rows.append(row)
    if skipped:
        logger.warning(
            "skipped %d of %d records longer than max_length=%d, e.g. %s",
            len(skipped), len(records), max_length, ", ".join(skipped[:3]),
        )
    if not rows:
        raise SFTRecordError(f"every record is longer than max_length={max_length} tokens")
    return rows, len(skipped)


def prefix_tree_tokens(rows: Sequence[Mapping[str, Sequence[int]]]) -> int:
    """Tokens a prefix tree over the rows' input_ids holds: what a training that shared every common prompt
    prefix (tree packing) would run, against sum(len(input_ids)) today (scripts/bench/bench_train.py --shared-prefixes)."""
    root: dict = {}
    nodes = 0
    for row in rows:
        node = root
        for t in row["input_ids"]:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                nodes += 1
            node = nxt
    return nodes


# ---------------------------------------------------------------------------------------------------------------
# Precision and model loading


def padding_free_batches(config: LoraTrainConfig) -> bool:
    """Whether batches are flattened without pad tokens: where a pass holds several records and `padding_free`
    asks for it, or where records are packed (at one record per pass there is no padding to remove, and TRL
    warns about it)."""
    return (config.padding_free and per_device_batch_for(config, launched_processes()) > 1) or config.packing


def _attention_implementation(device: str, padding_free: bool, precision: str) -> str:
    """FlashAttention 2 for 16-bit padding-free batches on GPUs where installed (true varlen); SDPA elsewhere,
    where transformers turns the flattened batch's position ids into a block-diagonal causal mask."""
    if device == "cuda" and padding_free and precision in ("bf16", "fp16"):
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def _load_base(base_model_path: Path, precision: str, config: LoraTrainConfig, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {
        "attn_implementation": _attention_implementation(
            device, padding_free_batches(config), precision
        )
    }
    if config.qlora:
        check_qlora(device)
        from accelerate import PartialState

        compute = torch.bfloat16 if precision == "bf16" else torch.float16
        kwargs["quantization_config"] = nf4_config(compute)
        kwargs["dtype"] = compute
        kwargs["device_map"] = {"": PartialState().local_process_index}
    else:
        # bf16 on GPUs: weights in bf16 (half the memory), LoRA weights stay fp32 (PEFT upcasts adapters).
        # Elsewhere the weights stay fp32 and the Trainer autocasts.
        kwargs["dtype"] = torch.bfloat16 if (precision == "bf16" and device == "cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(base_model_path), **kwargs)
    if config.qlora:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=config.gradient_checkpointing)
    return model


def check_qlora(device: str) -> None:
    """QLoRA's 4-bit NF4 base needs bitsandbytes and a CUDA GPU: raise naming what is missing (before any work)."""
    import_extra("bitsandbytes", "qlora", "train.qlora: true")
    if device != "cuda":
        raise RunError(f"train.qlora: true needs a CUDA GPU (bitsandbytes 4-bit NF4), but training runs on {device}; "
                         "set qlora: false on CPUs")


def nf4_config(compute_dtype):
    """QLoRA's quantization of the base: 4-bit NF4 weights, double-quantized constants, `compute_dtype` matmuls."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def lora_config(config: LoraTrainConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=config.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


# ---------------------------------------------------------------------------------------------------------------
# Training


def loss_flattened(losses: Sequence[float], window: int, min_drop: float) -> bool:
    """Whether the last `window` logged losses' mean fell by less than `min_drop` (relative) from the mean of
    the `window` before: the training loss has flattened. Fewer than 2 x window losses: not yet."""
    if window < 1 or len(losses) < 2 * window:
        return False
    last = sum(losses[-window:]) / window
    before = sum(losses[-2 * window:-window]) / window
    return last > (1.0 - min_drop) * before


def plateau_callback(config: LoraTrainConfig):
    """A TrainerCallback that stops training where `loss_flattened` holds over `config.plateau_steps` steps. It
    reads the losses the Trainer logs every `logging_steps` (averaged over those steps and gathered over all
    processes, so every data-parallel process stops at the same step); the first-step log is left out."""
    from transformers import TrainerCallback

    window = config.plateau_steps // config.logging_steps

    class StopOnPlateau(TrainerCallback):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.stopped_at: int | None = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs or state.global_step % config.logging_steps:
                return control
            self.losses.append(float(logs["loss"]))
            if self.stopped_at is None and loss_flattened(self.losses, window, config.plateau_min_drop):
                self.stopped_at = state.global_step
                control.should_training_stop = True
                logger.info("the loss has flattened at step %d (mean of the last %d steps %.4f, of the %d before %.4f): "
                            "stopping", state.global_step, config.plateau_steps,
                            sum(self.losses[-window:]) / window, config.plateau_steps,
                            sum(self.losses[-2 * window:-window]) / window)
            return control

    return StopOnPlateau()


def sft_args(config: LoraTrainConfig, precision: str, device: str, output_dir: str):
    """TRL's SFTConfig for our settings (everything that differs from TRL's defaults is set here)."""
    from trl import SFTConfig

    return SFTConfig(
        **common_args(config, precision, device, output_dir),
        # Records are tokenized and length-checked here; TRL only batches them.
        max_length=config.max_length if config.packing else None,
        packing=config.packing,
        packing_strategy="bfd",
        padding_free=padding_free_batches(config),
        completion_only_loss=None,  # labels are given: -100 on the prompt
    )


def sft_trainer(base_model_path: Path, rows: list[dict], config: LoraTrainConfig, device: str, precision: str,
                tokenizer, output_dir: str):
    """The counting SFT trainer of `train_role` on tokenized `rows`: the base loaded for `config` with its LoRA
    adapter, batches as the config asks (shared prefixes on CPUs, packed rows where `packing` runs without
    FlashAttention), the frozen weights in bf16 where that pays."""
    from datasets import Dataset

    model = _load_base(base_model_path, precision, config, device)
    attention = model.config._attn_implementation
    Trainer = counting_trainer_class(share_prefixes=config.share_prefixes and not config.packing,
                                     packed_rows=config.packing and attention != "flash_attention_2")
    trainer = Trainer(model=model, args=sft_args(config, precision, device, output_dir),
                      train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=lora_config(config))
    trainer.record_groups = pass_groups(rows, config, device)
    frozen_in_bf16(trainer.model, config, precision, device)
    return trainer


def train_role(
    base_model_path: str | Path,
    records: Sequence[Mapping[str, Any]] | str | Path,
    output_dir: str | Path,
    config: LoraTrainConfig | None = None,
    *,
    role: str,
) -> TrainResult:
    """Train one role's LoRA adapter on prompt/completion records and save it in PEFT's format.

    `records` is a list of {"prompt", "completion"} mappings or a JSONL path (sft_<role>.jsonl). The adapter
    lands in `output_dir` (written to a temporary folder beside it and renamed, so a killed run leaves no
    half adapter) with `TRAINING_INFO` beside PEFT's files. Under torchrun/accelerate every process calls
    this; only the main process writes.
    """
    # the batch and accumulation as trained (derived from effective_batch_size where set): recorded with the adapter
    config = as_trained(config or LoraTrainConfig(), launched_processes())
    return train_adapter(base_model_path, output_dir, SFTTraining(config, role, records))[0]


@dataclass
class RoleTraining(abc.ABC):
    """One mode's parts of `train_adapter`, the steps every trainer of one role's adapter runs (SFT's below, KTO's
    in train/kto.py, GRPO's in train/grpo.py): the rows it trains on, its trainer over them, and its figures."""

    #: as trained: what the base loads with (and, unless `recorded` says otherwise, what is measured and recorded)
    config: LoraTrainConfig
    role: str
    #: the records the mode's rows come from (a list of mappings or a JSONL path)
    records: Any
    #: the mode's settings, kept with its figures in the adapter's training record under `key` ("": neither)
    settings: Any = None
    key: ClassVar[str] = ""
    #: the prefix of the temporary folder the trainer writes its checkpoints into
    scratch: ClassVar[str] = "knowtrace_train"

    @property
    def recorded(self) -> LoraTrainConfig:
        return self.config

    @abc.abstractmethod
    def rows(self, tokenizer, device: str, precision: str, why: str) -> tuple[list[dict[str, Any]], int]:
        """The rows the trainer reads, and the number of records skipped."""

    @abc.abstractmethod
    def trainer(self, base_model_path: Path, rows: list[dict[str, Any]], device: str, precision: str, tokenizer,
                scratch: str):
        """The counting trainer over `rows`, its base loaded, writing its checkpoints into `scratch`."""

    def figures(self, trainer, result: TrainResult) -> dict[str, Any]:
        """The mode's figures of the training (logged here), kept beside `settings` in the training record."""
        return {}


def train_adapter(base_model_path: str | Path, output_dir: str | Path, mode: RoleTraining
                  ) -> tuple[TrainResult, dict[str, Any]]:
    """The steps every role's training runs, `mode`'s parts as hooks: the device, precision and tokenizer; the
    mode's rows and its trainer; the training measured; the adapter saved with its training record. Returns the
    TrainResult and the mode's figures."""
    import torch

    base_model_path, output_dir = Path(base_model_path), Path(output_dir)
    device, precision, why, tokenizer = training_setup(base_model_path, mode.config)
    rows, skipped = mode.rows(tokenizer, device, precision, why)
    with tempfile.TemporaryDirectory(prefix=f"{mode.scratch}_{mode.role}_") as scratch:
        trainer = mode.trainer(base_model_path, rows, device, precision, tokenizer, scratch)
        result = train_measured(trainer, mode.recorded, output_dir, records=len(rows), skipped=skipped,
                                precision=precision)
        figures = mode.figures(trainer, result)
        extra = {mode.key: {**asdict(mode.settings), **figures}} if mode.key else None
        save_trained_adapter(trainer, output_dir, mode.role, base_model_path, mode.recorded, precision, why, result,
                             extra=extra)
    del trainer
    if device == "cuda":
        torch.cuda.empty_cache()
    return result, figures


class SFTTraining(RoleTraining):
    """SFT's parts of `train_adapter`: the records tokenized, the loss on the completion only."""

    def rows(self, tokenizer, device, precision, why):
        logger.info("role %s: training in %s on %s (%s)", self.role, precision, device, why)
        checked = load_records(self.records, self.role)
        rows, self.skipped = tokenize_records(tokenizer, checked, self.config.prompt_format, self.config.max_length,
                                              self.config.decision_weight)
        return rows, self.skipped

    def trainer(self, base_model_path, rows, device, precision, tokenizer, scratch):
        config = self.config
        trainer = sft_trainer(base_model_path, rows, config, device, precision, tokenizer, scratch)
        accumulation, processes = trainer.args.gradient_accumulation_steps, trainer.accelerator.num_processes
        logger.info("role %s: %d records (%d skipped), %d tokens, batch %d x %d accumulation x %d processes = %d",
                    self.role, len(rows), self.skipped, sum(len(r["input_ids"]) for r in rows),
                    config.per_device_batch_size, accumulation, processes,
                    config.per_device_batch_size * accumulation * processes)
        return trainer

    def figures(self, trainer, result):
        logger.info(
            "role %s: loss %.4f over %d steps, %d tokens in %.1f s (%.1f tokens/s; %d positions computed)",
            self.role, result.train_loss, result.steps, result.tokens, result.seconds, result.tokens_per_second,
            result.computed_tokens,
        )
        return {}


def train_measured(trainer, config: LoraTrainConfig, output_dir: Path, *, records: int, skipped: int,
                   precision: str) -> TrainResult:
    """Run a counting trainer (the SFT or the KTO one) over `config` as trained: the plateau stop where configured,
    the process count checked against WORLD_SIZE first, and its TrainResult (tokens and counts over all processes)."""
    plateau = plateau_callback(config) if config.plateau_steps else None
    if plateau is not None:
        trainer.add_callback(plateau)
    processes = trainer.accelerator.num_processes
    if processes != launched_processes():
        raise LaunchError(
            f"accelerate runs {processes} processes but WORLD_SIZE says "
            f"{launched_processes()}: the accumulation would not give the effective batch the config names"
        )
    start = time.perf_counter()
    output = trainer.train()
    seconds = time.perf_counter() - start
    tokens, completion_tokens, computed = trainer.global_counts()
    accumulation = trainer.args.gradient_accumulation_steps
    return TrainResult(
        adapter_dir=output_dir,
        train_loss=float(output.training_loss),
        tokens=tokens,
        seconds=seconds,
        tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
        completion_tokens=completion_tokens,
        records=records,
        skipped_records=skipped,
        steps=int(output.global_step),
        losses=tuple(float(h["loss"]) for h in trainer.state.log_history if "loss" in h),
        precision=precision,
        effective_batch_size=config.per_device_batch_size * accumulation * processes,
        gradient_accumulation_steps=accumulation,
        processes=processes,
        plateau_stop_step=None if plateau is None else plateau.stopped_at,
        computed_tokens=computed,
    )


def training_setup(base_model_path: Path, config: LoraTrainConfig):
    """Every trainer's start (SFT's, KTO's, GRPO's): (device, precision, why that precision, the base's tokenizer
    with a pad token); QLoRA off a CUDA device is refused here."""
    from transformers import AutoTokenizer

    device = training_device()
    if config.qlora:
        check_qlora(device)
    precision, why = resolve_precision(config.precision, device)
    tokenizer = AutoTokenizer.from_pretrained(str(base_model_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return device, precision, why, tokenizer


def save_trained_adapter(trainer, output_dir: Path, role, base_model_path, config, precision, why, result,
                         extra: Mapping[str, Any] | None = None) -> None:
    """Every trainer's end (SFT's, KTO's, GRPO's): the main process saves the trained adapter and its training
    record; the others wait for it."""
    if trainer.accelerator.is_main_process:
        _save_adapter(trainer.accelerator.unwrap_model(trainer.model), output_dir, role, base_model_path, config,
                      precision, why, result, extra=extra)
    trainer.accelerator.wait_for_everyone()


def _save_adapter(peft_model, output_dir: Path, role, base_model_path, config, precision, why, result,
                  extra: Mapping[str, Any] | None = None) -> None:
    if output_dir.exists():
        logger.info("replacing the adapter in %s", output_dir)
    with atomic_dir(output_dir, what=f"the trained {role} adapter") as tmp:
        peft_model.save_pretrained(str(tmp))
        info = {
            "role": role,
            "base_model": str(base_model_path.resolve()),
            "prompt_format": config.prompt_format,
            "precision": precision,
            "precision_reason": why,
            "config": asdict(config),
            "result": {k: v for k, v in asdict(result).items() if k != "adapter_dir"},
            **(extra or {}),
        }
        write_json(tmp / TRAINING_INFO, info)
    logger.info("saved the %s adapter to %s", role, output_dir)


def read_training_info(adapter_dir: str | Path) -> dict[str, Any]:
    """The `TRAINING_INFO` record of an adapter folder ({} where the adapter was not trained here)."""
    path = Path(adapter_dir) / TRAINING_INFO
    if not path.is_file():
        return {}
    return read_json(path)


class SFTMode(TrainingMode):
    """SFT on the rationalizer's records, a new adapter on M0 each iteration: the mode of a run whose `mode` names
    a rationalizer (`backtrace`, `star`)."""

    name = "sft"

    def train(self, records, *, base, output_dir, train, seed, config, role, where, init_adapter):
        rows, empty = self.usable(records)
        if not rows:
            logger.warning("%s: no records for the %s adapter; the role runs on M0", where, role)
            return {"records": 0, "empty_completions": empty}
        res = train_role(base, rows, output_dir, replace(train, seed=seed), role=role)
        return {**trained_info(res, seed), "empty_completions": empty}
