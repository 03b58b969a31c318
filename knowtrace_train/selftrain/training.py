"""The "train" stage: each role's adapter trained from the base on an iteration's records by the run's training mode
(train/modes.py: SFT, KTO, GRPO or a registered one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from knowtrace_train.selftrain.models import ModelState
from knowtrace_train.train.modes import get_mode


class Train:
    """Records per adapter and the model they continue in, the adapters trained out. Built with the run's context
    (context.py)."""

    def __init__(self, run) -> None:
        self.run = run

    def groups(self, records: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        """Records of each call kind go to the adapter of the role that kind runs with."""
        out: dict[str, list[dict[str, Any]]] = {}
        for kind, adapter in self.run.method.record_roles(self.run.config.strategy).items():
            out.setdefault(adapter, []).extend(records.get(kind, []))
        return out

    def __call__(self, folder: Path, z: int, groups: Mapping[str, list[dict[str, Any]]], base: Path,
                 prev: ModelState) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """Iteration z's adapters, one per role of `groups`, trained from `base` (a mode that continues the policy
        starts each from `prev`'s): (each role's training figures, the adapters M(z) runs with). A role without
        records trains nothing; where the mode continues the policy it keeps `prev`'s adapter."""
        cfg = self.run.config
        mode = self.run.training_mode
        info: dict[str, dict[str, Any]] = {}
        for i, (adapter, recs) in enumerate(groups.items()):
            info[adapter] = self.run.stages.run(folder, f"train_{adapter}", lambda a=adapter, r=recs, i=i: self.adapter(
                folder, a, r, base, cfg.train, seed=cfg.seed * 1000 + z * 10 + i, trainer=mode.name,
                init_adapter=prev.adapters.get(a) if mode.continues_policy else None))
        adapters = {a: str(folder / "adapters" / a) for a, t in info.items() if t.get("records", 0) > 0}
        if mode.continues_policy and adapters:  # the policy goes on: a role without rows keeps M(z-1)'s adapter
            adapters = {**prev.adapters, **adapters}
        return info, adapters

    def adapter(self, folder: Path, adapter: str, records: list[dict[str, Any]], base: Path, tc, seed: int,
                subdir: str = "adapters", trainer: str = "sft", init_adapter: str | None = None) -> dict[str, Any]:
        """The adapter of `adapter` trained on `records` by the training mode `trainer` names; its trainer reports
        to the run's trackers as <run_name>/<folder>/<adapter> (tracking.py)."""
        from knowtrace_train.tracking import trainer_run

        with trainer_run(self.run.tracking, folder.name, adapter):
            return get_mode(trainer).train(records, base=base, output_dir=folder / subdir / adapter, train=tc,
                                           seed=seed, config=self.run.config, role=adapter, where=folder.name,
                                           init_adapter=init_adapter)
