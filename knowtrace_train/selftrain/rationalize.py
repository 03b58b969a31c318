"""The "rationalize" stage: an iteration's correct rollouts turned into the records its adapters train on
(sft_<kind>.jsonl) by the rationalizer the run's training mode names (KnowTrace's "backtrace" filters them; "star"
keeps them whole), with its figures in rationale.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knowtrace_train.io import write_json
from knowtrace_train.selftrain.models import read_sft
from knowtrace_train.train.modes import resolve
from knowtrace_train.trajectory import read_trajectories


class Rationalize:
    """Iteration z's rollouts (rollouts.jsonl) in, its records per call kind and the stage's figures out. Built with
    the run's context (context.py)."""

    def __init__(self, run) -> None:
        self.run = run

    def __call__(self, folder: Path, z: int) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        """(the stage's figures, the records of each call kind the method writes)."""
        info = self.run.stages.run(folder, "rationalize", lambda: self._rationalize(folder, z))
        return info, read_sft(folder, self.run.record_kinds())

    def _rationalize(self, folder: Path, z: int) -> dict[str, Any]:
        """Correct rollouts -> sft_<kind>.jsonl with the rationalizer `mode` names, and rationale.json."""
        run = self.run
        cfg = run.config
        info: dict[str, Any] = {}
        if run.procs.is_main:
            from knowtrace_train.data.store import passages_by_id

            name, mode = resolve(cfg.mode, run.method.rationalizers())
            trajs = read_trajectories(folder / "rollouts.jsonl")
            res = run.method.rationalizers()[name](
                trajs, run.items_by_id, strategy=cfg.strategy,
                count_tokens=run.count_tokens, fewshot=cfg.fewshot_trained, iteration=z,
                passages=passages_by_id(run.corpus),  # a store's id index: not every passage in memory
                **mode.rationalizer_options(cfg),
            )
            records, st = mode.records(res.records_by_role, res.stats, trajectories=trajs, iteration=z, config=cfg,
                                       method=run.method, kinds=run.record_kinds(), count_tokens=run.count_tokens)
            run.write_records(folder, records)
            write_json(folder / "rationale.json", st)
            info = {k: st.get(k) for k in ("mode", "trajectories", "correct", "backtraced", "skipped", "fa_ratio",
                                            "tokens_all", "tokens_filtered", "records")}
            info["fa_by_role"] = {r: v.get("fa_ratio") for r, v in st.get("roles", {}).items()}
            for key in ("fa_decomposed", "backtrace_records"):  # backtracing's (KnowTrace): why FA filtered
                if key in st:
                    info[key] = st[key]
            info.update({k: st[k] for k in mode.rationale_keys if k in st})
        return run.procs.broadcast(info)
