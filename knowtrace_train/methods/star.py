"""Plain STaR records for any method: every generation of a correct trajectory, as the model wrote it.

The record is the call's prompt, the response prefix the engine fed after it (`prefix`, prompt-side in
training: the model does not write it) and what the model generated (`completion`), under the call's role:
prompt + prefix + completion is the exact text the model saw and wrote. Nothing is filtered, so the FA ratio is
not defined (None); the output tokens are counted all the same. A trajectory of a hinted rerun is
not trained on here (its prompts show the hint, and a generic method cannot take it out), nor is a
call that failed or wrote nothing. `fewshot` is not applied: a generic method's prompts are kept
as they were sent.

With `undesirable` holding "incorrect" (preference training), every call of a wrong, unhinted
trajectory is a record too, labelled false (the kept ones true); "filtered" adds nothing here, since
nothing is filtered.

What every STaR rationalizer shares is here: the plain question of a hinted rerun (`plain_question`), the record
(`star_record`) and the count of undesirable records (`undesirable_stats`). KnowTrace's "star" is its backtracer
with nothing filtered (`backtrace_trajectories(mode="star")`): the same records in KnowTrace's canonical output
texts and unhinted prompts, built by these, with the FA ratio measured as backtracing would filter.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.trajectory import Trajectory, is_correct, split_prefix


#: where a rationalizer's undesirable records (label false, preference training) come from: the calls of wrong
#: trajectories, and the calls a filtering rationalizer (backtracing) drops whole from correct ones
UNDESIRABLE_SOURCES = ("incorrect", "filtered")


def undesirable_sources(values: Iterable[str]) -> frozenset[str]:
    """A rationalizer's `undesirable` argument as a set, checked against UNDESIRABLE_SOURCES."""
    sources = frozenset(values)
    unknown = sorted(sources - set(UNDESIRABLE_SOURCES))
    if unknown:
        raise ValueError(f"undesirable sources must be among {UNDESIRABLE_SOURCES}, got {unknown}")
    return sources


def plain_question(traj: Trajectory, items_by_id: Mapping[str, QAItem]) -> tuple[str, bool]:
    """The question a record of `traj` is trained on (its item's, without a rationalization hint; the trajectory's
    own where the item is unknown) and whether `traj` is a hinted rerun of it."""
    item = items_by_id.get(traj.question_id)
    question = item.question if item is not None else traj.question
    return question, question.strip() != traj.question.strip()


def star_record(prompt: str, fed: str | None, text: str, role: str, traj: Trajectory, iteration: int | None,
                label: bool | None = None) -> dict[str, Any]:
    """The SFT record of one generation: {"prompt", "prefix", "completion", "role", "trajectory_id", "iteration"}
    and "label" where preference training asks for one (not None). `text` is what the call answered after the
    prefix the engine `fed`: that prefix is prompt-side in training, the loss goes on what the model wrote after it.
    `iteration` None keeps the trajectory's own."""
    prefix, completion = split_prefix(fed, text)
    rec: dict[str, Any] = {
        "prompt": prompt,
        "prefix": prefix,
        "completion": completion,
        "role": role,
        "trajectory_id": traj.id,
        "iteration": iteration if iteration is not None else traj.iteration,
    }
    if label is not None:
        rec["label"] = label
    return rec


def undesirable_stats(sources: Iterable[str], by_source: Mapping[str, Mapping[str, int]],
                      skipped: Mapping[str, int]) -> dict[str, Any]:
    """`stats["undesirable"]` of a rationalizer: the sources asked for, the records labelled false per role (and per
    role and source, `by_source`), and the undesirable calls skipped, by why."""
    return {"sources": sorted(sources), "records": {r: sum(v.values()) for r, v in by_source.items()},
            "by_source": by_source, "skipped": dict(sorted(skipped.items()))}


@dataclass
class StarResult:
    records_by_role: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any] = field(default_factory=dict)


def star_records(
    trajectories: Iterable[Trajectory],
    items_by_id: Mapping[str, QAItem],
    *,
    strategy: Any = None,
    count_tokens: Callable[[str], int],
    fewshot: bool = True,
    iteration: int | None = None,
    passages: Mapping[str, Passage] | None = None,
    undesirable: Iterable[str] = (),
) -> StarResult:
    """Records {"prompt", "prefix", "completion", "role", "trajectory_id", "iteration"} per call role (and "label"
    where `undesirable` asks for the wrong trajectories' calls too)."""
    undesirable = undesirable_sources(undesirable)
    labelled = bool(undesirable)
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    tokens: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    unwanted: Counter[str] = Counter()
    n = correct = 0
    for traj in trajectories:
        n += 1
        ok = is_correct(traj)
        _, hinted = plain_question(traj, items_by_id)
        if not ok:
            skipped["incorrect"] += 1
            if "incorrect" not in undesirable or hinted:
                continue
        else:
            correct += 1
            if hinted:  # its prompts show the hint, and a generic method cannot take it out
                skipped["hinted"] += 1
                continue
        for call in sorted(traj.calls, key=lambda c: c.index):
            if call.error or not call.output.strip() or not isinstance(call.prompt, str):
                continue
            rec = star_record(call.prompt, call.prefix, call.output, call.role, traj, iteration,
                              ok if labelled else None)
            if not rec["completion"].strip():
                continue
            if ok:
                tokens[call.role] += count_tokens(rec["completion"])
            else:
                unwanted[call.role] += 1
            records[call.role].append(rec)
    stats = {
        "mode": "star",
        "trajectories": n,
        "correct": correct,
        "skipped": dict(sorted(skipped.items())),
        "records": {r: len(v) for r, v in sorted(records.items())},
        "tokens_all": sum(tokens.values()),
        "tokens_filtered": 0,
        "fa_ratio": None,
        "roles": {r: {"tokens_all": t, "tokens_filtered": 0, "fa_ratio": None} for r, t in sorted(tokens.items())},
    }
    if labelled:
        stats["undesirable"] = undesirable_stats(undesirable, {r: {"incorrect": c} for r, c in sorted(unwanted.items())},
                                                 {})
    return StarResult(records_by_role=dict(records), stats=stats)
