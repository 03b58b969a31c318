"""An iteration's questions and adapters (a mixin of SelfTrain): which of D's questions it rolls out, and each
role's adapter trained on its records by the run's training mode (train/modes.py: SFT, KTO, GRPO or a registered
one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knowtrace_train.data.schema import QAItem
from knowtrace_train.train.modes import get_mode


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
        """The adapter of `adapter` trained on `records` by the training mode `trainer` names; its trainer reports
        to the run's trackers as <run_name>/<folder>/<adapter> (tracking.py)."""
        from knowtrace_train.tracking import trainer_run

        with trainer_run(getattr(self, "tracking", None), folder.name, adapter):
            return get_mode(trainer).train(records, base=base, output_dir=folder / subdir / adapter, train=tc,
                                           seed=seed, config=self.config, role=adapter, where=folder.name,
                                           init_adapter=init_adapter)
