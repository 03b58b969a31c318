"""One trajectory as the question view draws it: its calls by round, its traced graph with the method's highlights.

Works on any method's `Trajectory` (the shared record): calls with their role, round, pair, passages,
parsed items; the graph from `trajectory.graph`; the method's `explain` (initial and target entities,
evidence subgraph, what the filters dropped) where it has one. A trajectory without a graph gets
`graph: None` and the page says so.
"""

from __future__ import annotations

from typing import Any

from knowtrace_train.kg import GuidancePair, Triplet, entity_key, normalize_entity
from knowtrace_train.trajectory import ModelCall, Trajectory, is_correct


def node_key(name: str) -> str:
    """A node of the drawn graph: the key backtracing matches entities under (`kg.entity_key`)."""
    return entity_key(name) or normalize_entity(name) or name


def _items(call: ModelCall) -> list[str]:
    """The parsed pairs and triplets of a call, rendered the way the canonical outputs write them."""
    p = call.parsed if isinstance(call.parsed, dict) else {}
    out = []
    for x in p.get("pairs") or ():
        if isinstance(x, (list, tuple)) and len(x) == 2:
            out.append(GuidancePair(str(x[0]), str(x[1])).render())
    for x in p.get("triplets") or ():
        if isinstance(x, (list, tuple)) and len(x) == 3:
            out.append(Triplet(*(str(v) for v in x)).render())
    return out


def call_entry(call: ModelCall, dropped: dict[str, Any] | None) -> dict[str, Any]:
    drop = (dropped or {}).get(str(call.index)) or {}
    gone = set(drop.get("items") or ())
    return {
        "index": call.index, "role": call.role, "round": call.round, "prompt": call.prompt, "output": call.output,
        "parsed": call.parsed, "error": call.error, "finish_reason": call.finish_reason,
        "pair": None if call.pair is None else [call.pair.entity, call.pair.guidance],
        "triplets": list(call.triplets), "passage_ids": list(call.passage_ids),
        "prompt_tokens": call.prompt_tokens, "output_tokens": call.output_tokens,
        "items": [{"text": t, "dropped": bool(drop.get("all")) or t in gone} for t in _items(call)],
        "dropped_all": bool(drop.get("all")),
        "dropped_items": [t for t in gone if t not in _items(call)],
    }


def graph_entry(traj: Trajectory, explain: dict[str, Any] | None, correct: bool) -> dict[str, Any] | None:
    """Nodes (initial/target flags) and edges (evidence/dropped flags) of the traced graph; None without one."""
    g = traj.graph
    if not g.triplets and not g.initial_entities:
        return None
    nodes: dict[str, dict[str, Any]] = {}

    def node(name: str) -> str:
        k = node_key(name)
        nodes.setdefault(k, {"key": k, "label": name, "initial": False, "target": False})
        return k

    evidence = set((explain or {}).get("evidence") or ())
    edges = []
    for i, tt in enumerate(g.triplets):
        t = tt.triplet
        edges.append({
            "i": i, "s": node(t.subject), "o": node(t.object), "subject": t.subject, "relation": t.relation,
            "object": t.object, "round": tt.round, "call": tt.call,
            "pair": None if tt.pair is None else [tt.pair.entity, tt.pair.guidance],
            "passage_ids": list(tt.passage_ids), "evidence": i in evidence,
            # what backtracing's second filter removes: a correct trajectory's triplets outside S
            "dropped": explain is not None and correct and i not in evidence,
        })
    if explain is not None:
        initial = [k for k in explain.get("initial_entities") or () if k in nodes]
        # an initial entity the graph never reached still shows where exploration started
        initial += [node(e.name) for e in g.initial_entities if node_key(e.name) not in nodes]
        targets = [k for k in explain.get("target_entities") or () if k in nodes]
    else:
        initial = [node(e.name) for e in g.initial_entities]
        wanted = {node_key(a) for a in [traj.prediction or "", *traj.answers] if a}
        targets = [k for k in nodes if k in wanted]
    for k in initial:
        nodes[k]["initial"] = True
    for k in targets:
        nodes[k]["target"] = True
    # how the method names what it highlights (KnowTrace: backtracing's filters)
    dropped_label = (explain or {}).get("dropped_label") or "dropped by the filters"
    return {"nodes": list(nodes.values()), "edges": edges, "dropped_label": dropped_label}


def question_entry(key: int, run: dict[str, Any], set_index: int, traj: Trajectory, lookups) -> dict[str, Any]:
    """Everything the question view shows of one trajectory, and what the list filters on."""
    correct = is_correct(traj)
    explain, why = lookups.explain(traj, run)
    info = lookups.question(traj.question_id)
    hops = info.get("hops") if info.get("hops") is not None else traj.meta.get("hops")
    return {
        "key": key, "run": run["index"], "set": set_index, "id": traj.id, "question_id": traj.question_id,
        "question": traj.question, "answers": list(traj.answers), "prediction": traj.prediction,
        "thought": traj.thought, "dataset": traj.dataset, "strategy": traj.strategy, "correct": correct,
        "em": traj.em, "f1": traj.f1, "hops": hops if isinstance(hops, int) else None, "kind": info.get("kind"),
        "stop_reason": traj.stop_reason, "rounds": traj.rounds, "wall_time": round(traj.wall_time, 2),
        "iteration": traj.iteration, "meta": traj.meta,
        "calls": [call_entry(c, (explain or {}).get("dropped")) for c in sorted(traj.calls, key=lambda c: c.index)],
        "graph": graph_entry(traj, explain, correct),
        "explain": None if explain is None else {k: v for k, v in explain.items() if k != "dropped"},
        "explain_note": why,
    }
