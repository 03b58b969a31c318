"""What a training mode is (the registry: train/modes.py): the settings section it reads, the records it trains
on and how one role's adapter trains on them; and `trained_info`, an adapter's training record in metrics.json."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Callable, Sequence


class TrainingMode(abc.ABC):
    """One way to train an iteration's adapters on the rationalizer's records. The base class is what every mode
    shares; a mode overrides what it does differently."""

    #: the mode's name (a run's `mode`); "sft" is the mode of a run whose `mode` names a rationalizer
    name: str = ""
    #: the rationalizers that label its records, the first the method has ((): the run's `mode` names one)
    rationalizers: tuple[str, ...] = ()
    #: a role's adapter trains on from M(z-1)'s (the policy goes on) instead of a new one on M0
    continues_policy: bool = False
    #: the keys of a record the trainer reads
    record_keys: tuple[str, ...] = ("prompt", "prefix", "completion", "decision")

    def rationalizer_options(self, config) -> dict[str, Any]:
        """Keyword arguments the mode adds to the rationalizer's call."""
        return {}

    def records(self, records: dict[str, list[dict[str, Any]]], stats: dict[str, Any], *, trajectories, iteration: int,
                config, method, kinds: Sequence[str], count_tokens: Callable | None
                ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
        """The records per kind the mode trains on, and the statistics rationale.json keeps: the rationalizer's."""
        return records, stats

    def rationalizer(self, rationalizers) -> str:
        """The rationalizer that labels the mode's records for a method with `rationalizers` (names): the first
        of the mode's own the method has."""
        return next(n for n in self.rationalizers if n in rationalizers)

    def check_settings(self, config, rationalizers) -> None:
        """Raise ValueError where the run's settings contradict the mode, for a method with `rationalizers`
        (checked as the config loads: a config error naming the key)."""
        return None

    def check(self, config, rationalizers) -> None:
        """Raise ValueError where the run cannot train in this mode here (checked by `validate`, before any work)."""
        return None

    def train_section(self, config, train):
        """The `train` section as the mode trains it (its batch per forward pass, for the accumulation)."""
        return train

    @abc.abstractmethod
    def train(self, records: list[dict[str, Any]], *, base: Path, output_dir: Path, train, seed: int, config,
              role: str, where: str, init_adapter: str | None) -> dict[str, Any]:
        """One role's adapter trained on its `records` into `output_dir` (`train` with `seed`; `config` the run's
        config; `where` names the iteration in messages; `init_adapter` M(z-1)'s adapter of the role, for a mode
        that `continues_policy`): the training record metrics.json keeps ({"records": 0, ...}: the role stays on
        M0)."""

    def usable(self, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """(the records' `record_keys`, the number left out): an empty output (a completion that found nothing,
        kept whole in mode "star") teaches nothing the end-of-sequence token does not, so it is counted only."""
        rows = [{k: r[k] for k in self.record_keys if k in r} for r in records
                if isinstance(r.get("completion"), str) and r["completion"].strip()]
        return rows, len(records) - len(rows)

    #: the keys of the rationalizer's statistics the iteration's metrics keep beside the common ones
    rationale_keys: tuple[str, ...] = ()


def trained_info(res, seed: int) -> dict[str, Any]:
    """An adapter's training figures for metrics.json (any trainer's TrainResult)."""
    return {
        "records": res.records,
        "skipped_records": res.skipped_records,
        "loss": res.train_loss,
        "losses": list(res.losses),
        "steps": res.steps,
        "plateau_stop_step": res.plateau_stop_step,
        "tokens": res.tokens,
        "tokens_per_second": res.tokens_per_second,
        "train_seconds": res.seconds,
        "seed": seed,
        # the batch as trained: per-device batch x accumulation x processes
        "effective_batch_size": res.effective_batch_size,
        "gradient_accumulation_steps": res.gradient_accumulation_steps,
        "processes": res.processes,
    }
