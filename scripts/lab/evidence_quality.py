"""Backtracing quality against gold evidence: precision and recall of the evidence subgraph's
triplets or source passages against an item's gold triples, supporting paragraphs or titles.

The paper could not measure this. Where an item carries gold evidence, the evidence subgraph S
of a correct trajectory is compared with it at the finest level the item has:

- ``triples`` (the synthetic world, 2WikiMultihopQA, MINTQA): a triplet matches a gold triple
  when their two entities match (either order; names equal after normalisation, or one
  containing the other), whatever the relation's wording;
- ``paragraphs`` (MuSiQue, HotpotQA via its supporting titles' passages): S's source passages
  against the supporting passage ids;
- ``titles``: the titles of S's source passages against the supporting titles.

A triplet's source passages are those its completion call read that state it (both entity
names, else the object, else the subject; all of them where none does). The same figures for
the whole graph G show what backtracing removes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from knowtrace_train.kg import states_gold
from knowtrace_train.methods.gold_chain import mentions
from knowtrace_train.methods.knowtrace.backtrace.paths import TrajectoryBacktrace
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.kg import TracedTriplet
from knowtrace_train.metrics import normalize_answer
from knowtrace_train.trajectory import Trajectory

TRIPLES, PARAGRAPHS, TITLES = "triples", "paragraphs", "titles"


def gold_kind(item: QAItem) -> str | None:
    """The finest gold evidence an item carries, or None."""
    ev = item.evidence
    if ev.triples:
        return TRIPLES
    if ev.paragraph_ids:
        return PARAGRAPHS
    if ev.titles:
        return TITLES
    return None


def _matches(t: TracedTriplet, g: Sequence[str]) -> bool:
    return states_gold(t.triplet.subject, t.triplet.object, g)


def source_passages(t: TracedTriplet, passages: Mapping[str, Passage]) -> list[str]:
    """Ids of the passages a triplet came from (see the module docstring)."""
    read = [passages[pid] for pid in t.passage_ids if pid in passages]
    unknown = [pid for pid in t.passage_ids if pid not in passages]
    for test in (
        lambda p: mentions(t.triplet.subject, p) and mentions(t.triplet.object, p),
        lambda p: mentions(t.triplet.object, p),
        lambda p: mentions(t.triplet.subject, p),
    ):
        hit = [p.id for p in read if test(p)]
        if hit:
            return hit
    return [p.id for p in read] + unknown


def _pr(predicted: set, gold: set, matched_pred: int | None = None, matched_gold: int | None = None) -> tuple[float, float]:
    if matched_pred is None:
        matched_pred = matched_gold = len(predicted & gold)
    precision = matched_pred / len(predicted) if predicted else 0.0
    recall = matched_gold / len(gold) if gold else 0.0
    return precision, recall


def precision_recall(
    triplets: Sequence[TracedTriplet], item: QAItem, passages: Mapping[str, Passage]
) -> tuple[str, float, float] | None:
    """(kind, precision, recall) of a set of triplets against the item's gold evidence."""
    kind = gold_kind(item)
    if kind is None:
        return None
    if kind == TRIPLES:
        gold = list(item.evidence.triples)
        good = sum(any(_matches(t, g) for g in gold) for t in triplets)
        found = sum(any(_matches(t, g) for t in triplets) for g in gold)
        p = good / len(triplets) if triplets else 0.0
        return kind, p, found / len(gold)
    sources = {pid for t in triplets for pid in source_passages(t, passages)}
    if kind == PARAGRAPHS:
        return (kind, *_pr(sources, set(item.evidence.paragraph_ids)))
    titles = {passages[pid].title for pid in sources if pid in passages}
    gold_titles = {normalize_answer(x) for x in item.evidence.titles}
    return (kind, *_pr({normalize_answer(x) for x in titles}, gold_titles))


@dataclass
class _Mean:
    n: int = 0
    precision: float = 0.0
    recall: float = 0.0
    graph_precision: float = 0.0
    graph_recall: float = 0.0

    def add(self, p: float, r: float, gp: float, gr: float) -> None:
        self.n += 1
        self.precision += p
        self.recall += r
        self.graph_precision += gp
        self.graph_recall += gr

    def to_dict(self) -> dict[str, Any]:
        d = max(self.n, 1)
        return {
            "n": self.n,
            "precision": self.precision / d,
            "recall": self.recall / d,
            "graph_precision": self.graph_precision / d,
            "graph_recall": self.graph_recall / d,
        }


def evidence_quality(
    trajectories: Iterable[Trajectory],
    traces: Iterable[TrajectoryBacktrace],
    items_by_id: Mapping[str, QAItem],
    passages: Mapping[str, Passage] | None = None,
) -> dict[str, Any]:
    """Mean precision/recall of S (and of G) against gold evidence, per dataset and overall,
    over the backtraced trajectories whose item carries gold evidence."""
    if passages is None:
        passages = {p.id: p for it in items_by_id.values() for p in it.context}
    by_id = {t.id: t for t in trajectories}
    per: dict[str, _Mean] = defaultdict(_Mean)
    kinds: dict[str, str] = {}
    total = _Mean()
    for bt in traces:
        traj, item = by_id.get(bt.trajectory_id), items_by_id.get(bt.question_id)
        if not bt.ok or traj is None or item is None:
            continue
        s = [traj.graph.triplets[i] for i in bt.evidence]
        got = precision_recall(s, item, passages)
        if got is None:
            continue
        kind, p, r = got
        _, gp, gr = precision_recall(traj.graph.triplets, item, passages) or (kind, 0.0, 0.0)
        per[traj.dataset].add(p, r, gp, gr)
        kinds[traj.dataset] = kind
        total.add(p, r, gp, gr)
    return {
        **total.to_dict(),
        "by_dataset": {ds: {"gold": kinds[ds], **m.to_dict()} for ds, m in sorted(per.items())},
    }
