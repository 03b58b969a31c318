"""What every method's gold trajectories share beyond the hop chain (gold_chain.py): the common skip reasons,
a gold trajectory's mark, the check that a method's loop read each gold output back, and the records.

A method's gold module (baselines/gold.py, dog/gold.py, mintqa/gold.py, trace/gold.py) runs its own loop with
the gold texts in place of the model and keeps what is its own (its calls' texts, its extra skip reasons);
what it keeps and the items it skips, per reason, are counted in a `GoldTally`, and `gold_records` turns the
kept trajectories into STaR records (methods/star.py), every call kept, with the `Rationale` statistics and the
skip counts (the keywords of every method's `Method.gold_records`, in one place). KnowTrace's gold
trajectories (knowtrace/gold.py) are built call by call and written by its backtracing records instead.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.star import star_records
from knowtrace_train.metrics import exact_match
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)

#: skip reasons (beside gold_chain's NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP): the chain needs more
#: rounds, steps or hops than the method's settings allow; the method's parser does not read a gold output
#: back as the intended step, or its loop does not end with the gold answer
TOO_MANY_HOPS = "too_many_hops"
UNREADABLE_STEP = "unreadable_step"
#: the suffix of a gold trajectory's id (`<item id>#gold`)
GOLD_ID_SUFFIX = "#gold"
#: the error of a call for which the gold script has no output (the loop went off the gold path)
OFF_SCRIPT = "the gold script has no output for this call"


def words(text: str) -> int:
    """The token count where none is given: whitespace words."""
    return len(text.split())


def one_line(text: str) -> str:
    """`text` on one line, its white space folded."""
    return " ".join(text.split())


#: what a method's gold run gives: the gold trajectories, and per reason the number of items that gave none
GoldTrajectories = tuple[list[Trajectory], dict[str, int]]


class GoldTally:
    """A method's gold trajectories as its run keeps them, and per reason the items that gave none."""

    def __init__(self) -> None:
        self.kept: list[Trajectory] = []
        self.reasons: dict[str, int] = defaultdict(int)

    def skip(self, reason: str) -> None:
        self.reasons[reason] += 1

    def add(self, traj: Trajectory, item: QAItem, reason: str | None = None) -> None:
        """Keeps `traj` as the gold trajectory of `item` (its id `<item id>#gold`, scored right, `meta["gold"]`),
        or, with a `reason`, counts the item as skipped for it."""
        if reason is not None:
            self.skip(reason)
            return
        traj.id = item.id + GOLD_ID_SUFFIX
        traj.em, traj.f1 = 1.0, 1.0
        traj.meta["gold"] = True
        self.kept.append(traj)

    def result(self) -> GoldTrajectories:
        """The kept trajectories and the skip counts (by reason name)."""
        return self.kept, dict(sorted(self.reasons.items()))


def gold_call(traj: Trajectory, role: str, rnd: int, prompt: str, text: str | None, count_tokens: Callable[[str], int],
              *, prefix: str = "", off_script: str = OFF_SCRIPT, **fields: Any) -> ModelCall:
    """Appends to `traj` the call a gold script made: `prefix` + `text` as its output, or, where the script has
    no `text` for it (None), an empty output and `off_script` as its error; `fields` are the call's others
    (`passage_ids`, `retrieved_tokens`)."""
    call = ModelCall(index=len(traj.calls), role=role, round=rnd, prompt=prompt, output=prefix + (text or ""),
                     prompt_tokens=count_tokens(prompt), output_tokens=count_tokens(text or ""), finish_reason="stop",
                     error=None if text is not None else off_script, prefix=prefix, **fields)
    traj.calls.append(call)
    return call


def read_back(traj: Trajectory, expected: Sequence[Mapping[str, Any]], item: QAItem, stop_reason: str) -> bool:
    """Whether the loop made exactly the expected calls, its parser read each gold output as intended (every
    key of the call's `expected` entry in its `parsed`, with that value, and no error), and it ended with
    `stop_reason` and the gold answer."""
    if traj.stop_reason != stop_reason or len(traj.calls) != len(expected):
        return False
    for call, want in zip(traj.calls, expected):
        if call.error is not None or not isinstance(call.parsed, dict):
            return False
        if any(k not in call.parsed or call.parsed[k] != v for k, v in want.items()):
            return False
    return bool(traj.prediction) and any(exact_match(traj.prediction, a) for a in item.answers)


@dataclass
class GoldRecords:
    """SFT records per record kind of a method's gold trajectories, their statistics (the `Rationale`
    protocol's, with `items` and the skip reasons) and the trajectories themselves."""

    records_by_role: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any]
    trajectories: list[Trajectory] = field(default_factory=list)


#: a method's gold run over some items: `run(items, fewshot=, require_support=, count_tokens=)`
GoldRun = Callable[..., GoldTrajectories]


def gold_records(
    method: str,
    run: GoldRun,
    items: Iterable[QAItem],
    *,
    record_kinds: Sequence[str],
    fewshot: bool = True,
    require_support: bool = True,
    count_tokens: Callable[[str], int] | None = None,
    iteration: int | None = 0,
) -> GoldRecords:
    """SFT records {"prompt", "completion", "role", "trajectory_id", "iteration"} per record kind (every kind
    in `record_kinds` present, empty where no call has it) of method `method`'s gold trajectories of `items`
    (`run`, prompts with exemplars as `fewshot` says, skipping a hop the retrieved passages do not state where
    `require_support`): every call kept, as STaR keeps a correct rollout's."""
    items = list(items)
    count = count_tokens or words
    trajectories, skipped = run(items, fewshot=fewshot, require_support=require_support, count_tokens=count)
    star = star_records(trajectories, {it.id: it for it in items}, count_tokens=count, iteration=iteration)
    records = {k: star.records_by_role.get(k, []) for k in record_kinds}
    for k, v in star.records_by_role.items():
        records.setdefault(k, v)
    stats = {
        "mode": "gold",
        "method": method,
        "items": len(items),
        "trajectories": len(trajectories),
        "correct": len(trajectories),
        "skipped": skipped,
        "records": {k: len(v) for k, v in records.items()},
        "tokens_all": star.stats["tokens_all"],
        "tokens_filtered": 0,
        "fa_ratio": None,
        "roles": star.stats["roles"],
    }
    log.info("%s gold trajectories: %d of %d items, skipped %s", method, len(trajectories), len(items), skipped)
    return GoldRecords(records_by_role=records, stats=stats, trajectories=trajectories)
