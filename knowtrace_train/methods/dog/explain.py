"""What a report highlights in a DoG trajectory: the walk over the graph as the evidence subgraph."""

from __future__ import annotations

from typing import Any

from knowtrace_train.kg import entity_key
from knowtrace_train.methods.dog.config import RELATION
from knowtrace_train.trajectory import Trajectory


def explain_walk(traj: Trajectory) -> dict[str, Any]:
    """`Method.explain` for DoG. Evidence: per hop, the first triple its relation call filled (the one whose
    far entity became the next topic, or that the answer try judged); initial entity: the question's
    topic entity; target entities: the graph's entities that the prediction or a gold answer names. DoG
    filters nothing, so `dropped` is empty; a correct trajectory's other filled triples are shown as
    filled but not walked. Never raises on the record's content."""
    n = len(traj.graph.triplets)
    evidence: list[int] = []
    for call in traj.calls:
        first = call.triplets[0] if call.role == RELATION and call.triplets else None
        if isinstance(first, int) and 0 <= first < n and first not in evidence:
            evidence.append(first)
    topic = traj.meta.get("topic_entity")
    initial = [entity_key(topic)] if isinstance(topic, str) and topic else []
    note = None if evidence else (f"no triple was filled ({traj.stop_reason})" if traj.stop_reason else "no triple was filled")
    return {"status": "ok" if evidence else "no walk", "initial_entities": initial,
            "target_entities": traj.graph.keys_named([traj.prediction, *traj.answers]), "evidence": evidence,
            "dropped": {}, "note": note, "traced_by": "the walk", "dropped_label": "filled, not walked"}
