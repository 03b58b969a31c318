"""What backtracing makes of one trajectory, as a report draws it: evidence subgraph, entities, filtered outputs."""

from __future__ import annotations

from typing import Any

from knowtrace_train.methods.knowtrace.backtrace.filters import filter_trajectory
from knowtrace_train.methods.knowtrace.backtrace.paths import backtrace
from knowtrace_train.methods.knowtrace.config import DEFAULT_PATH_RULE
from knowtrace_train.trajectory import Trajectory, is_correct


def _words(text: str) -> int:
    return len(text.split())


def _removed_lines(full: str | None, kept: str | None) -> list[str]:
    """The lines of the unfiltered canonical output that the filtered output no longer has."""
    keep = set((kept or "").splitlines())
    return [line for line in (full or "").splitlines() if line.strip() and line not in keep]


def explain_trajectory(traj: Trajectory, path_rule: str = DEFAULT_PATH_RULE) -> dict[str, Any]:
    """`Method.explain` for KnowTrace: the backtrace (status, initial and target entities as node keys,
    evidence triplet indices) and, for a correct trajectory, what the two filters drop per model call
    ({"all": True} where the whole record goes, else the removed pairs/triplets as rendered lines)."""
    bt = backtrace(traj, path_rule)
    out: dict[str, Any] = {
        "status": bt.status,
        "path_rule": path_rule,
        "initial_entities": list(bt.initial_entities),
        "target_entities": list(bt.targets.all),
        "evidence": list(bt.evidence),
        "dropped": {},
        "note": None,
    }
    if not is_correct(traj):
        out["note"] = "incorrect: backtracing trains no record of it (the evidence shown is what it would trace)"
        return out
    evidence = list(bt.evidence) if bt.ok else None
    if evidence is None:
        out["note"] = f"no evidence subgraph ({bt.status}): every record is dropped"
    for f in filter_trajectory(traj, evidence, _words):
        if not f.kept:
            out["dropped"][str(f.call.index)] = {"all": True, "items": []}
        else:
            removed = _removed_lines(f.full_output, f.output)
            if removed:
                out["dropped"][str(f.call.index)] = {"all": False, "items": removed}
    return out
