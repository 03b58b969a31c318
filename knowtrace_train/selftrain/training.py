"""An iteration's questions and adapters (a mixin of SelfTrain): which of D's questions it rolls out, and how each
role's adapter trains on its records, by the mode's trainer: SFT, KTO (train/kto.py) or GRPO (train/grpo.py:
the rows of a step's rollouts, each call with its trajectory's group-relative advantage under the method's
credit rule, and the role's policy steps, continuing M(z-1)'s adapter)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from knowtrace_train.data.schema import QAItem
from knowtrace_train.trajectory import Trajectory

log = logging.getLogger(__name__)


class AdapterTraining:
    """SelfTrain provides config, questions, method, record_kinds and count_tokens."""

    def rollout_items(self, z: int) -> list[QAItem]:
        """Iteration z's rollout questions: all of D, or with `rollout.questions` k the z-th slice of k of them
        (questions (z-1)k .. zk-1 of D, wrapping round)."""
        d, k = self.questions.rollout, self.config.rollout.questions
        if k is None or k >= len(d):
            return list(d)
        start = ((z - 1) * k) % len(d)
        return [d[(start + i) % len(d)] for i in range(k)]

    def _train(self, folder: Path, adapter: str, records: list[dict[str, Any]], base: Path, tc, seed: int,
               subdir: str = "adapters", trainer: str = "sft", init_adapter: str | None = None) -> dict[str, Any]:
        """The adapter of `adapter` trained on `records`; its trainer reports to the run's trackers as
        <run_name>/<folder>/<adapter> (tracking.py)."""
        from knowtrace_train.tracking import trainer_run

        with trainer_run(getattr(self, "tracking", None), folder.name, adapter):
            return self._train_adapter(folder, adapter, records, base, tc, seed, subdir, trainer, init_adapter)

    def _train_adapter(self, folder: Path, adapter: str, records: list[dict[str, Any]], base: Path, tc, seed: int,
                       subdir: str, trainer: str, init_adapter: str | None) -> dict[str, Any]:
        if trainer == "grpo":
            return self._train_grpo(folder, adapter, records, base, tc, seed, subdir, init_adapter)
        # An empty output (a completion that found nothing, kept whole in mode "star") teaches
        # nothing the end-of-sequence token does not: such records are not trained on, only counted.
        keys = ("prompt", "prefix", "completion", "label") if trainer == "kto" else ("prompt", "prefix", "completion", "decision")
        rows = [{k: r[k] for k in keys if k in r} for r in records
                if isinstance(r.get("completion"), str) and r["completion"].strip()]
        empty = len(records) - len(rows)
        extra: dict[str, Any] = {}
        if trainer == "kto":
            from knowtrace_train.train.kto import route_role

            trainer, rows, extra = route_role(rows, self.config.kto, f"{folder.name}: the {adapter} adapter")
            if trainer is None:
                return {"records": 0, "empty_completions": empty, **extra}
        if not rows:
            log.warning("%s: no records for the %s adapter; the role runs on M0", folder.name, adapter)
            return {"records": 0, "empty_completions": empty}
        if trainer == "kto":
            from knowtrace_train.train.kto import train_role_kto

            res, extra["kto"] = train_role_kto(base, rows, folder / subdir / adapter, dataclasses.replace(tc, seed=seed),
                                               self.config.kto, role=adapter)
        else:
            from knowtrace_train.train.lora import train_role

            res = train_role(base, rows, folder / subdir / adapter, dataclasses.replace(tc, seed=seed), role=adapter)
        return {**extra, **trained_info(res, seed), "empty_completions": empty}

    def _grpo_rows(self, trajs: list[Trajectory], z: int, stats: dict[str, Any]
                   ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
        """mode: grpo's rows per record kind (every call with its trajectory's group-relative advantage, masked by
        the method's credit rule under `credit: backtrace`) and the rationalizer's statistics with the GRPO ones
        (rewards, groups, masked calls) under "grpo"."""
        from knowtrace_train.train.grpo import grpo_records

        cfg = self.config
        credited = (self.method.credited_calls(trajs, strategy=cfg.strategy, count_tokens=self.count_tokens)
                    if cfg.grpo.credit == "backtrace" else None)
        rows, gstats = grpo_records(trajs, cfg.grpo, kinds=self.record_kinds(), credited=credited, iteration=z)
        log.info("iteration %d GRPO: mean reward %.3f over %d trajectories; %d of %d groups trained (%d with equal "
                 "rewards skipped); %d positive and %d negative rows, %d calls masked by the credit rule", z,
                 gstats["reward_mean"] or 0.0, gstats["trajectories"], gstats["groups_trained"], gstats["groups"],
                 gstats["groups_skipped_equal_rewards"], gstats["rows_positive"], gstats["rows_negative"],
                 gstats["masked_by_credit"])
        return rows, {**stats, "records": gstats["records"], "grpo": gstats}

    def _train_grpo(self, folder: Path, adapter: str, rows: list[dict[str, Any]], base: Path, tc, seed: int,
                    subdir: str, init_adapter: str | None) -> dict[str, Any]:
        """One role's GRPO steps on its rows (every call as the policy made it, an empty output included), from
        M(z-1)'s adapter where it has one."""
        from knowtrace_train.train.grpo import train_role_grpo

        if not rows:
            log.warning("%s: no GRPO row for the %s adapter (every advantage 0); the role keeps %s", folder.name, adapter,
                        init_adapter or "M0")
            return {"records": 0}
        # a kind may train another role's adapter (KnowTrace's forced answer trains exploration's)
        rows = [{k: r[k] for k in ("prompt", "prefix", "completion", "advantage", "reward") if k in r} for r in rows]
        res, figures = train_role_grpo(base, rows, folder / subdir / adapter, dataclasses.replace(tc, seed=seed),
                                       self.config.grpo, role=adapter, temperature=self.config.rollout_temperature,
                                       init_adapter=init_adapter)
        return {"grpo": figures, **trained_info(res, seed)}


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
