"""The evidence subgraph S: the triplets on the paths from the target entities back to the initial entities.

Two path rules: "backward" follows the edges back from the targets along the direction in which
exploration found them; "shortest" takes all shortest paths on the undirected graph (what the
authors' code does). `backtrace(traj)` traces one trajectory and never raises on its content:
a trajectory that cannot be traced gets a skip reason instead.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Mapping, Sequence

from knowtrace_train.kg import KnowledgeGraph, entity_key
from knowtrace_train.metrics import exact_match
from knowtrace_train.methods.knowtrace.backtrace.targets import (
    YES_NO,
    Targets,
    find_target_entities,
    initial_entity_keys,
)
from knowtrace_train.methods.knowtrace.config import DEFAULT_PATH_RULE, PATH_RULES
from knowtrace_train.trajectory import Trajectory

log = logging.getLogger(__name__)

#: Why a trajectory gave no backtrace.
SKIP_INCORRECT = "incorrect"
SKIP_EMPTY_GRAPH = "empty_graph"
SKIP_NO_ANSWER_ENTITY = "no_answer_entity"
SKIP_NO_TARGET = "no_target_entity"
SKIP_NO_INITIAL = "no_initial_entity"
SKIP_NO_PATH = "no_path"
SKIP_HINT_LEAK = "hint_leak"
SKIP_NO_ANSWER_CALL = "no_answer_call"
OK = "ok"

#: Steps of the backward path search per target before it gives up (keeps pathological graphs cheap).
_SEARCH_BUDGET = 200_000


# -- the evidence subgraph ---------------------------------------------------------------


def _edges(graph: KnowledgeGraph) -> list[tuple[str, str, int]]:
    """(from, to, triplet index), oriented the way exploration found each triplet: from the
    guidance pair's entity to the other entity; subject -> object where the pair is unknown
    or names neither entity. Self-loops are left out."""
    edges = []
    for i, tt in enumerate(graph.triplets):
        s, o = entity_key(tt.triplet.subject), entity_key(tt.triplet.object)
        if not s or not o or s == o:
            continue
        pe = entity_key(tt.pair.entity) if tt.pair is not None else None
        edges.append((o, s, i) if pe == o else (s, o, i))
    return edges


def _backward_paths(graph: KnowledgeGraph, targets: Sequence[str], initials: Sequence[str]) -> set[int]:
    """Triplets on the simple paths that lead from each target back (against the edges) to an
    initial entity; a path stops at the first initial entity it meets."""
    into: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for u, v, i in _edges(graph):
        into[v].append((u, i))
    initial = set(initials)
    found: set[int] = set()
    for t in targets:
        if t in initial:
            continue
        budget = _SEARCH_BUDGET
        # DFS over (node, nodes on path, triplets on path)
        stack: list[tuple[str, frozenset[str], tuple[int, ...]]] = [(t, frozenset([t]), ())]
        while stack:
            budget -= 1
            if budget < 0:
                log.warning("backward path search from %r stopped after %d steps", t, _SEARCH_BUDGET)
                break
            node, seen, path = stack.pop()
            if node in initial and path:
                found.update(path)
                continue
            for u, i in into.get(node, ()):
                if u not in seen:
                    stack.append((u, seen | {u}, path + (i,)))
    return found


def _bfs(adj: Mapping[str, list[tuple[str, int]]], start: str) -> dict[str, int]:
    dist = {start: 0}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v, _ in adj.get(u, ()):
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def _shortest_paths(graph: KnowledgeGraph, targets: Sequence[str], initials: Sequence[str]) -> set[int]:
    """Triplets on all shortest paths between each initial entity and each target, on the
    undirected graph (parallel triplets between two entities are all on the path)."""
    adj: dict[str, list[tuple[str, int]]] = defaultdict(list)
    edge_list = []
    for u, v, i in _edges(graph):
        adj[u].append((v, i))
        adj[v].append((u, i))
        edge_list.append((u, v, i))
    found: set[int] = set()
    from_target = {t: _bfs(adj, t) for t in targets}
    for a in initials:
        da = _bfs(adj, a)
        for t in targets:
            if t == a or t not in da:
                continue
            dt, d = from_target[t], da[t]
            for u, v, i in edge_list:
                for x, y in ((u, v), (v, u)):
                    if x in da and y in dt and da[x] + 1 + dt[y] == d:
                        found.add(i)
    return found


def evidence_subgraph(
    graph: KnowledgeGraph, targets: Sequence[str], initials: Sequence[str], path_rule: str = DEFAULT_PATH_RULE
) -> list[int]:
    """S ⊆ G as sorted indices into `graph.triplets`: the triplets on the paths that lead
    from the target entities back to the initial entities (node keys) under `path_rule`."""
    if path_rule == "backward":
        found = _backward_paths(graph, targets, initials)
    elif path_rule == "shortest":
        found = _shortest_paths(graph, targets, initials)
    else:
        raise ValueError(f"path_rule must be one of {PATH_RULES}, got {path_rule!r}")
    return sorted(found)


@dataclass(frozen=True)
class TrajectoryBacktrace:
    """What backtracing found for one trajectory: `status` is "ok" or the skip reason."""

    trajectory_id: str
    question_id: str
    dataset: str
    status: str
    targets: Targets = Targets()
    initial_entities: tuple[str, ...] = ()
    #: indices into the trajectory graph's triplets
    evidence: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == OK


def _answer_strings(traj: Trajectory) -> list[str]:
    """The answer side of [t, â]: the prediction and the gold answers it matches."""
    out = []
    if traj.prediction:
        out.append(traj.prediction)
    matched = [a for a in traj.answers if traj.prediction and exact_match(traj.prediction, a)]
    for a in matched or list(traj.answers[:1]):
        if a not in out:
            out.append(a)
    return out


def backtrace(traj: Trajectory, path_rule: str = DEFAULT_PATH_RULE) -> TrajectoryBacktrace:
    """Trace the evidence subgraph of one (correct) trajectory. Never raises on its content."""
    base = dict(trajectory_id=traj.id, question_id=traj.question_id, dataset=traj.dataset)
    if path_rule not in PATH_RULES:
        raise ValueError(f"path_rule must be one of {PATH_RULES}, got {path_rule!r}")
    if not traj.graph.triplets:
        return TrajectoryBacktrace(status=SKIP_EMPTY_GRAPH, **base)
    answers = _answer_strings(traj)
    targets = find_target_entities(traj.graph, traj.thought, answers)
    yes_no = any(entity_key(a) in YES_NO for a in answers)
    if not targets.answer and not yes_no:
        return TrajectoryBacktrace(status=SKIP_NO_ANSWER_ENTITY, targets=targets, **base)
    if not targets.all:
        return TrajectoryBacktrace(status=SKIP_NO_TARGET, targets=targets, **base)
    initials = initial_entity_keys(traj.graph)
    if not initials:
        return TrajectoryBacktrace(status=SKIP_NO_INITIAL, targets=targets, **base)
    evidence = evidence_subgraph(traj.graph, targets.all, initials, path_rule)
    status = OK if evidence else SKIP_NO_PATH
    return TrajectoryBacktrace(
        status=status, targets=targets, initial_entities=tuple(initials), evidence=tuple(evidence), **base
    )
