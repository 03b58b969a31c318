"""KTO of one role (TRL's KTOTrainer + PEFT): desirable and undesirable calls, M0 as the reference.

A record is a labelled prompt/completion row ``{"prompt", "completion", "label"}`` (the ``sft_<role>.jsonl`` rows
of a `mode: kto` iteration; label true: a call backtracing kept; false: a call of a wrong trajectory, or one
backtracing filtered). The adapter is trained on M0 and the reference is M0 itself: the same weights with the
adapter disabled, so no second model is held. Prompts and completions reach TRL as the exact texts the
generator feeds and reads (`lora.record_texts`), so TRL's tokenization gives the token ids the SFT trainer
trains on (tests/test_kto.py checks it on the real tokenizer).

KTO estimates its KL term from the mismatched pairs of a batch, so a forward pass holds `kto.batch_size` >= 2
records and TRL reads them in order: the records are shuffled here, with the training seed. The class weights
follow TRL's guidance for unbalanced data (desirable x weight = undesirable x weight, per role) unless set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from knowtrace_train.methods.star import UNDESIRABLE_SOURCES
from knowtrace_train.train.config import (
    LoraTrainConfig,
    as_trained,
    common_args,
    launched_processes,
)
from knowtrace_train.train.lora import (
    RoleTraining,
    SFTRecordError,
    TrainResult,
    _load_base,
    encode_record,
    load_records,
    lora_config,
    record_texts,
    train_adapter,
    train_role,
)
from knowtrace_train.train.mode import TrainingMode, trained_info
from knowtrace_train.train.precision import frozen_in_bf16
from knowtrace_train.train.trainer import counting_trainer_class

logger = logging.getLogger(__name__)


@dataclass
class KTOSettings:
    """Preference training of `mode: kto` (TRL's KTOTrainer, Ethayarajh et al. 2024): per role adapter, from M0
    with M0 as the reference (the adapter disabled: no second model in memory). Desirable records are the
    calls backtracing keeps in correct trajectories; undesirable ones come from `undesirable`. The LoRA
    settings (rank, rate, epochs, effective batch) are the `train:` section's."""

    beta: float = field(default=0.1, metadata={"help": "KTO's beta: how far the adapter may move from M0 (TRL's default)"})
    undesirable: list[str] = field(
        default_factory=lambda: ["incorrect"],
        metadata={"help": "undesirable records: 'incorrect' (every call of a wrong trajectory) and/or 'filtered' "
                          "(calls backtracing drops whole from correct trajectories)"},
    )
    desirable_weight: float | None = field(
        default=None,
        metadata={"help": "weight of the desirable losses (None: balanced per role, so desirable x weight equals "
                          "undesirable x undesirable_weight, TRL's guidance for unbalanced data)"},
    )
    undesirable_weight: float = field(default=1.0, metadata={"help": "weight of the undesirable losses"})
    batch_size: int = field(
        default=4,
        metadata={"help": "records per forward pass (>= 2: KTO estimates its KL term from the batch's mismatched pairs)"},
    )
    one_class: str = field(
        default="sft",
        metadata={"help": "a role whose records are all desirable: 'sft' trains it by SFT on them, 'skip' leaves it on "
                          "M0 (a role with no desirable record is left on M0 either way); both are reported"},
    )
    undesirable_per_desirable: float | None = field(
        default=None,
        metadata={"help": "train on at most this many undesirable records per desirable one, per role, drawn with the "
                          "training seed (None: all; the records files keep all of them). A KTO record costs several "
                          "SFT records (the reference's and the KL term's passes: docs/selftrain.md)"},
    )

    def __post_init__(self) -> None:
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or self.beta <= 0:
            raise ValueError(f"kto.beta must be a positive number, got {self.beta!r}")
        if isinstance(self.undesirable, str) or not isinstance(self.undesirable, (list, tuple)):
            raise ValueError(f"kto.undesirable must be a list of sources among {list(UNDESIRABLE_SOURCES)}, "
                             f"got {self.undesirable!r}")
        unknown = [u for u in self.undesirable if u not in UNDESIRABLE_SOURCES]
        if unknown:
            raise ValueError(f"kto.undesirable: unknown source(s) {unknown}; known: {list(UNDESIRABLE_SOURCES)}")
        self.undesirable = list(dict.fromkeys(self.undesirable))
        for name in ("desirable_weight", "undesirable_weight"):
            v = getattr(self, name)
            if v is None and name == "desirable_weight":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"kto.{name} must be a positive number{' or null' if name == 'desirable_weight' else ''}, got {v!r}")
        if self.one_class not in ("sft", "skip"):
            raise ValueError(f"kto.one_class must be 'sft' or 'skip', got {self.one_class!r}")
        r = self.undesirable_per_desirable
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or r <= 0):
            raise ValueError(f"kto.undesirable_per_desirable must be a positive number or null, got {r!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 2:
            raise ValueError(f"kto.batch_size must be an integer >= 2 (KTO estimates its KL term within a batch), "
                             f"got {self.batch_size!r}")


def labelled_rows(tokenizer, records, role: str, prompt_format: str, max_length: int) -> tuple[list[dict[str, Any]], int]:
    """Checked records -> TRL rows {"prompt", "completion", "label"} (texts as the model reads and writes them) and
    the number skipped. A record without a boolean "label" raises naming it. Skipped, counted and logged: a record
    longer than `max_length` tokens, and one whose prompt and completion merge into other tokens when TRL tokenizes
    them as one text (TRL would cut the prompt's last token: the model would train on a context it never sees)."""
    rows, skipped = [], {"too_long": [], "boundary_merge": []}
    for where, rec in load_records(records, role):
        label = rec.get("label")
        if not isinstance(label, bool):
            raise SFTRecordError(f"{where}: field 'label' must be true (desirable) or false (undesirable), got {label!r}")
        prefix = rec.get("prefix", "")
        prompt_ids, completion_ids = encode_record(tokenizer, rec["prompt"], rec["completion"], prompt_format, prefix)
        if len(prompt_ids) + len(completion_ids) > max_length:
            skipped["too_long"].append(where)
            continue
        prompt, completion = record_texts(tokenizer, rec["prompt"], rec["completion"], prompt_format, prefix)
        joint = list(tokenizer(text=prompt + completion)["input_ids"])
        if list(tokenizer(text=prompt)["input_ids"]) != prompt_ids or joint != prompt_ids + completion_ids:
            skipped["boundary_merge"].append(where)
            continue
        rows.append({"prompt": prompt, "completion": completion, "label": label})
    for why, where in skipped.items():
        if where:
            logger.warning("skipped %d of %d records (%s%s), e.g. %s", len(where), len(rows) + sum(map(len, skipped.values())),
                           why, f" > max_length={max_length}" if why == "too_long" else "", ", ".join(where[:3]))
    if not rows:
        raise SFTRecordError(f"no record of role {role!r} can be trained on: {({k: len(v) for k, v in skipped.items()})}")
    return rows, sum(map(len, skipped.values()))


def cap_undesirable(rows: list[dict[str, Any]], ratio: float | None, seed: int) -> tuple[list[dict[str, Any]], int]:
    """At most `ratio` undesirable rows per desirable one (rounded down, at least one where any exists), drawn with
    `seed`; the rows keep their order. Returns the rows and how many undesirable ones were left out."""
    if ratio is None:
        return rows, 0
    bad = [i for i, r in enumerate(rows) if not r["label"]]
    keep = max(1, int(ratio * (len(rows) - len(bad))))
    if len(bad) <= keep:
        return rows, 0
    dropped = set(random.Random(seed).sample(bad, len(bad) - keep))
    return [r for i, r in enumerate(rows) if i not in dropped], len(dropped)


def kto_plan(records, kto: KTOSettings) -> tuple[str, str]:
    """How a role's labelled records train: ("kto", ""), or, where a class is empty, ("sft", why) (only desirable
    records and `kto.one_class: sft`) or ("skip", why) (no desirable record, or `one_class: skip`)."""
    desirable = sum(1 for r in records if r.get("label") is True)
    undesirable = sum(1 for r in records if r.get("label") is False)
    if not desirable:
        return "skip", f"no desirable record ({undesirable} undesirable): KTO has nothing to move towards"
    if not undesirable:
        why = f"no undesirable record ({desirable} desirable)"
        return ("sft", why + ": trained by SFT on them") if kto.one_class == "sft" else ("skip", why + ": kto.one_class is skip")
    return "kto", ""


def route_role(rows: list[dict[str, Any]], kto: KTOSettings, where: str) -> tuple[str | None, list[dict[str, Any]], dict]:
    """(trainer: "kto", "sft" or None to leave the role on M0; the rows it trains on; the fallback to report) of a
    role's labelled rows, by `kto_plan`; a fallback is logged naming `where`."""
    plan, why = kto_plan(rows, kto)
    if plan == "kto":
        return "kto", rows, {}
    logger.warning("%s has %s", where, why if plan == "sft" else why + "; the role runs on M0")
    report = {"kto_fallback": {"plan": plan, "why": why}}
    if plan == "skip":
        return None, [], report
    return "sft", [{k: r[k] for k in ("prompt", "prefix", "completion") if k in r} for r in rows], report


def class_weights(desirable: int, undesirable: int, kto: KTOSettings) -> tuple[float, float]:
    """(desirable_weight, undesirable_weight): `kto`'s where set; else balanced so that desirable x weight equals
    undesirable x undesirable_weight (the lower end of TRL's recommended range, Eq. 8 of the KTO paper), 1.0
    where one class is empty."""
    if kto.desirable_weight is not None:
        return float(kto.desirable_weight), float(kto.undesirable_weight)
    if not desirable or not undesirable:
        return 1.0, float(kto.undesirable_weight)
    return undesirable * kto.undesirable_weight / desirable, float(kto.undesirable_weight)


def kto_args(config: LoraTrainConfig, kto: KTOSettings, weights: tuple[float, float], precision: str, device: str,
             output_dir: str):
    """TRL's KTOConfig for our settings (`config` with kto.batch_size records per pass); KTO's own defaults, bf16
    and gradient checkpointing on, are overridden by the arguments every trainer here shares."""
    from trl import KTOConfig

    return KTOConfig(
        **common_args(dataclasses.replace(config, per_device_batch_size=kto.batch_size), precision, device, output_dir),
        max_length=config.max_length,
        beta=kto.beta,
        desirable_weight=weights[0],
        undesirable_weight=weights[1],
        precompute_ref_log_probs=False,
    )


def train_role_kto(
    base_model_path: str | Path,
    records: Sequence[Mapping[str, Any]] | str | Path,
    output_dir: str | Path,
    config: LoraTrainConfig | None = None,
    kto: KTOSettings | None = None,
    *,
    role: str,
) -> tuple[TrainResult, dict[str, Any]]:
    """Train one role's LoRA adapter with KTO on labelled records and save it in PEFT's format (as `train_role`
    does); returns the result and the KTO figures (records per class, weights, the last logged KL and rewards)."""
    kto = kto or KTOSettings()
    config = dataclasses.replace(config or LoraTrainConfig(), per_device_batch_size=kto.batch_size)
    return train_adapter(base_model_path, output_dir,
                         KTOTraining(as_trained(config, launched_processes()), role, records, kto))


class KTOTraining(RoleTraining):
    """KTO's parts of `train_adapter`: labelled rows, capped and shuffled with the training seed; M0 the reference."""

    key, scratch = "kto", "knowtrace_kto"

    def rows(self, tokenizer, device, precision, why):
        config, kto = self.config, self.settings
        tokenizer.padding_side = "left"
        rows, skipped = labelled_rows(tokenizer, self.records, self.role, config.prompt_format, config.max_length)
        rows, self.left_out = cap_undesirable(rows, kto.undesirable_per_desirable, config.seed)
        random.Random(config.seed).shuffle(rows)  # TRL reads KTO's records in order (its KL pairs are batch neighbours)
        self.desirable = sum(r["label"] for r in rows)
        self.undesirable = len(rows) - self.desirable
        self.weights = class_weights(self.desirable, self.undesirable, kto)
        logger.info("role %s: KTO on %d desirable and %d undesirable records (weights %.3f / %.3f, beta %g) in %s on %s",
                    self.role, self.desirable, self.undesirable, self.weights[0], self.weights[1], kto.beta, precision,
                    device)
        return rows, skipped

    def trainer(self, base_model_path, rows, device, precision, tokenizer, scratch):
        from datasets import Dataset

        model = _load_base(base_model_path, precision, self.config, device)
        args = kto_args(self.config, self.settings, self.weights, precision, device, scratch)
        trainer = counting_trainer_class("kto")(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                                processing_class=tokenizer, peft_config=lora_config(self.config))
        frozen_in_bf16(trainer.model, self.config, precision, device)
        return trainer

    def figures(self, trainer, result):
        logged = [h for h in trainer.state.log_history if "loss" in h]
        last = logged[-1] if logged else {}
        figures = {
            "desirable": self.desirable,
            "undesirable": self.undesirable,
            "undesirable_left_out": self.left_out,
            "desirable_weight": self.weights[0],
            "undesirable_weight": self.weights[1],
            "beta": self.settings.beta,
            "batch_size": self.settings.batch_size,
            # per logged step: the KL estimate and the mean implied rewards of each class
            "log": [{k: h[k] for k in ("step", "loss", "kl", "rewards/chosen", "rewards/rejected", "rewards/margins")
                     if k in h} for h in logged],
            "kl": last.get("kl"),
            "reward_margin": last.get("rewards/margins"),
        }
        logger.info("role %s: KTO loss %.4f over %d steps, %d tokens in %.1f s (%.1f tokens/s), last KL %s",
                    self.role, result.train_loss, result.steps, result.tokens, result.seconds,
                    result.tokens_per_second, figures["kl"])
        return figures


class KTOMode(TrainingMode):
    """`mode: kto`: the rationalizer labels every record desirable or not (`kto.undesirable`), and each role's
    adapter trains by KTO from M0; a role with one class falls back as `kto.one_class` says (`route_role`)."""

    name = "kto"
    rationalizers = ("backtrace", "star")
    record_keys = ("prompt", "prefix", "completion", "label")
    rationale_keys = ("undesirable",)

    def rationalizer_options(self, config) -> dict[str, Any]:
        return {"undesirable": config.kto.undesirable}

    def check_settings(self, config, rationalizers) -> None:
        if self.rationalizer(rationalizers) == "star" and "filtered" in config.kto.undesirable:
            raise ValueError(f"kto.undesirable: 'filtered' needs a rationalizer that filters (backtrace); method "
                             f"{config.strategy.name!r} has {list(rationalizers)}")

    def check(self, config, rationalizers) -> None:
        if config.train.prompt_format != "chat":
            raise ValueError(f"mode: {config.mode} needs train.prompt_format: chat (TRL tokenizes a plain prompt and its "
                             "completion as one text, and their tokens merge across the boundary)")

    def train_section(self, config, train):
        """KTO trains kto.batch_size records per forward pass."""
        return dataclasses.replace(train, per_device_batch_size=config.kto.batch_size)

    def train(self, records, *, base, output_dir, train, seed, config, role, where, init_adapter):
        rows, empty = self.usable(records)
        plan, rows, extra = route_role(rows, config.kto, f"{where}: the {role} adapter")
        if plan is None:
            return {"records": 0, "empty_completions": empty, **extra}
        if not rows:
            logger.warning("%s: no records for the %s adapter; the role runs on M0", where, role)
            return {"records": 0, "empty_completions": empty}
        if plan == "kto":
            res, extra["kto"] = train_role_kto(base, rows, output_dir, dataclasses.replace(train, seed=seed), config.kto,
                                               role=role)
        else:
            res = train_role(base, rows, output_dir, dataclasses.replace(train, seed=seed), role=role)
        return {**extra, **trained_info(res, seed), "empty_completions": empty}
