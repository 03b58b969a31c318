"""What a report highlights in a TRACE trajectory: its reasoning chains as the evidence subgraph."""

from __future__ import annotations

from typing import Any

from knowtrace_train.kg import entity_key
from knowtrace_train.trajectory import Trajectory


def chain_triplets(traj: Trajectory) -> list[list[int]] | None:
    """Each recorded chain of `meta["chains"]` (best first) as its indices into `traj.graph.triplets`
    (anything that is no index of the graph dropped); None where the trajectory records no chains (the
    `all_docs` and `no_docs` readers). Never raises on the record's content."""
    chains = traj.meta.get("chains")
    if not isinstance(chains, list):
        return None
    n = len(traj.graph.triplets)
    out = []
    for chain in chains:
        raw = chain.get("triplets") if isinstance(chain, dict) else None
        out.append([i for i in (raw if isinstance(raw, list) else [])
                    if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n])
    return out


def explain_chains(traj: Trajectory) -> dict[str, Any]:
    """`Method.explain` for TRACE. Evidence: the graph triples of the question's chains (what TRACE-Triple
    reads; TRACE-Doc reads their documents); initial entities: the heads of each chain's first triple;
    target entities: the graph's entities that the prediction or a gold answer names. TRACE filters
    nothing, so `dropped` is empty; a correct trajectory's triples outside every chain are shown as
    what no chain chose. Never raises on the record's content."""
    triplets = traj.graph.triplets
    chains = chain_triplets(traj) or []
    evidence: list[int] = []
    initial: list[str] = []
    for idx in chains:
        evidence += [i for i in idx if i not in evidence]
        if idx:
            head = entity_key(triplets[idx[0]].triplet.subject)
            if head not in initial:
                initial.append(head)
    targets = traj.graph.keys_named([traj.prediction, *traj.answers])
    status = "ok" if evidence else ("no chains" if not chains else "empty chains")
    note = None if evidence else (
        "no reasoning chain holds a triple (the reader answered without the graph)" if triplets else "no graph")
    return {"status": status, "initial_entities": initial, "target_entities": targets, "evidence": evidence,
            "dropped": {}, "note": note, "traced_by": "reasoning chains", "dropped_label": "on no chain"}
