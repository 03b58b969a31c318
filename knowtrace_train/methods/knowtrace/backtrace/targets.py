"""Target and initial entities of a trajectory's graph: where backtracing starts and where it must arrive."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from knowtrace_train.kg import GuidancePair, KnowledgeGraph, entity_key, normalize_entity
from knowtrace_train.metrics import normalize_answer

#: Answers that name no graph entity but are answers all the same (comparison questions).
YES_NO = ("yes", "no")


def pair_key(pair: GuidancePair) -> tuple[str, str]:
    """A guidance pair as matching treats it: the entity's match key and the normalised guidance."""
    return (entity_key(pair.entity), normalize_entity(pair.guidance))


# -- target and initial entities ------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Target entities (node keys): those named in the thought and those named in the answer
    (or, where the answer names none, the entities that contain the gold answer)."""

    thought: tuple[str, ...] = ()
    answer: tuple[str, ...] = ()

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.answer + self.thought))


def graph_nodes(graph: KnowledgeGraph) -> dict[str, str]:
    """Node key -> first spelling, over the subjects and objects of the graph's triplets."""
    nodes: dict[str, str] = {}
    for t in graph.triplets:
        for name in (t.triplet.subject, t.triplet.object):
            key = entity_key(name)
            if key:
                nodes.setdefault(key, name)
    return nodes


def _match_longest_first(text: str, names: Sequence[str]) -> list[str]:
    """The names (node keys, longest first) that occur as whole-token runs in `text`; a run
    already taken by a longer name is not matched again by a name inside it."""
    tokens = normalize_answer(text).split()
    taken = [False] * len(tokens)
    found: list[str] = []
    for name in names:
        nt = name.split()
        n = len(nt)
        for i in range(len(tokens) - n + 1):
            if tokens[i : i + n] == nt and not any(taken[i : i + n]):
                for j in range(i, i + n):
                    taken[j] = True
                if name not in found:
                    found.append(name)
    return found


def _contains(outer: str, inner: str) -> bool:
    """Whether the token run `inner` occurs in `outer` (both normalised keys)."""
    return bool(inner) and f" {inner} " in f" {outer} "


def find_target_entities(graph: KnowledgeGraph, thought: str | None, answers: Sequence[str]) -> Targets:
    """Graph entities named in the final thought and in the answers (normalised matching,
    longest names first); where the answers name none, the entities containing an answer."""
    nodes = graph_nodes(graph)
    names = sorted(nodes, key=lambda k: (-len(k.split()), -len(k), k))
    in_thought = _match_longest_first(thought or "", names)
    in_answer: list[str] = []
    for a in answers:
        for k in _match_longest_first(a, names):
            if k not in in_answer:
                in_answer.append(k)
    if not in_answer:
        for a in answers:
            ak = entity_key(a)
            if ak in YES_NO:
                continue
            for k in names:
                if _contains(k, ak) and k not in in_answer:
                    in_answer.append(k)
    return Targets(thought=tuple(in_thought), answer=tuple(in_answer))


def initial_entity_keys(graph: KnowledgeGraph) -> list[str]:
    """The graph nodes of the initial entities the engine recorded. A name that is no node
    resolves to the nodes whose name it contains or is contained in ("The Zone (2017 film)"
    and "The Zone")."""
    nodes = graph_nodes(graph)
    out: list[str] = []
    for e in graph.initial_entities:
        key = entity_key(e.name)
        if not key:
            continue
        if key in nodes:
            hits = [key]
        else:
            hits = [k for k in nodes if _contains(key, k) or _contains(k, key)]
        for k in hits:
            if k not in out:
                out.append(k)
    return out
