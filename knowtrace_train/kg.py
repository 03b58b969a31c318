"""The traced knowledge graph: triplets with provenance (round, guidance pair, model call)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from knowtrace_train.metrics import normalize_answer


def normalize_entity(name: str) -> str:
    """Key under which two spellings of an entity are the same node of the graph (case, spaces,
    a leading article, edge punctuation): what de-duplicates triplets and guidance pairs."""
    s = re.sub(r"\s+", " ", name.strip().casefold())
    s = re.sub(r"^(the|a|an) ", "", s)
    return s.strip(" .,;:'\"")


def entity_key(name: str) -> str:
    """The looser key under which answers and graph entities are matched (target entities, path
    search, evidence quality): the official answer normalisation (case, punctuation, articles, spaces)."""
    return normalize_answer(name)


def same_entity(a: str, b: str) -> bool:
    """Two names of one entity: equal `entity_key`s, or one's key inside the other's as whole words."""
    ka, kb = entity_key(a), entity_key(b)
    if not ka or not kb:
        return False
    return ka == kb or f" {ka} " in f" {kb} " or f" {kb} " in f" {ka} "


def states_gold(subject: str, obj: str, gold: Sequence[str]) -> bool:
    """Whether a triple with these two entities states gold triple `gold` (subject, relation, object): the same
    two entities in either order, whatever the relations say (evidence quality, TRACE's gold-triple recall)."""
    return (same_entity(subject, gold[0]) and same_entity(obj, gold[2])) or (
        same_entity(subject, gold[2]) and same_entity(obj, gold[0]))


@dataclass(frozen=True)
class Triplet:
    subject: str
    relation: str
    object: str

    def key(self) -> tuple[str, str, str]:
        return (normalize_entity(self.subject), normalize_entity(self.relation), normalize_entity(self.object))

    def render(self) -> str:
        """The form the completion prompt asks for and the parser reads."""
        return f"({self.subject}; {self.relation}; {self.object})"


@dataclass(frozen=True)
class GuidancePair:
    """An entity-relation pair from exploration: the entity and what to find about it."""

    entity: str
    guidance: str

    def render(self) -> str:
        return f"- {self.entity}: {self.guidance}"


@dataclass(frozen=True)
class TracedTriplet:
    """A triplet and where it came from: the round, the pair it served, the call index."""

    triplet: Triplet
    round: int
    pair: GuidancePair | None
    call: int
    #: ids of the passages the completion call read
    passage_ids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "triplet": [self.triplet.subject, self.triplet.relation, self.triplet.object],
            "round": self.round,
            "pair": None if self.pair is None else [self.pair.entity, self.pair.guidance],
            "call": self.call,
            "passage_ids": list(self.passage_ids),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TracedTriplet":
        return cls(
            triplet=Triplet(*d["triplet"]),
            round=int(d["round"]),
            pair=None if d.get("pair") is None else GuidancePair(*d["pair"]),
            call=int(d["call"]),
            passage_ids=tuple(d.get("passage_ids", ())),
        )


@dataclass(frozen=True)
class InitialEntity:
    """An expansion point that exploration introduced while it was not yet in the graph."""

    name: str
    round: int
    call: int


@dataclass
class KnowledgeGraph:
    """The question-specific KG. Identical triplets (after normalisation) are kept once,
    with the provenance of their first appearance."""

    triplets: list[TracedTriplet] = field(default_factory=list)
    initial_entities: list[InitialEntity] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._keys = {t.triplet.key() for t in self.triplets}

    def add(self, traced: TracedTriplet) -> bool:
        """Add a triplet; False when an identical one is already there."""
        key = traced.triplet.key()
        if key in self._keys:
            return False
        self._keys.add(key)
        self.triplets.append(traced)
        return True

    def entity_keys(self) -> set[str]:
        return {normalize_entity(e) for t in self.triplets for e in (t.triplet.subject, t.triplet.object)}

    def keys_named(self, names: Iterable[str | None]) -> list[str]:
        """The graph's entities (as `entity_key`s, sorted) that one of `names` names, e.g. a prediction and the
        gold answers: the target entities a report marks for a method that traces none itself."""
        wanted = {entity_key(n) for n in names if n}
        return sorted({entity_key(e) for t in self.triplets for e in (t.triplet.subject, t.triplet.object)} & wanted)

    def note_expansion_point(self, name: str, round: int, call: int) -> bool:
        """Record `name` as an initial entity if it is neither in the graph nor already initial."""
        key = normalize_entity(name)
        if not key or key in self.entity_keys() or key in {normalize_entity(e.name) for e in self.initial_entities}:
            return False
        self.initial_entities.append(InitialEntity(name=name, round=round, call=call))
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "triplets": [t.to_dict() for t in self.triplets],
            "initial_entities": [[e.name, e.round, e.call] for e in self.initial_entities],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KnowledgeGraph":
        return cls(
            triplets=[TracedTriplet.from_dict(t) for t in d.get("triplets", ())],
            initial_entities=[InitialEntity(n, int(r), int(c)) for n, r, c in d.get("initial_entities", ())],
        )

    @classmethod
    def of(cls, triplets: Iterable[Triplet]) -> "KnowledgeGraph":
        g = cls()
        for t in triplets:
            g.add(TracedTriplet(triplet=t, round=0, pair=None, call=-1))
        return g


# -- The three ways to put a graph into a prompt (paper, Section 3.2) -------------------
# KG-to-Triplets and KG-to-Paths are plain functions here; KG-to-Text is a model call
# (the `kg_to_text` role) whose prompt lives in knowtrace_train.methods.knowtrace.prompts.

#: What an empty graph renders as in a prompt.
EMPTY_KG = "None"


def render_triplets(triplets: Iterable[Triplet]) -> str:
    """KG-to-Triplets: one `(subject; relation; object)` per line, in graph order."""
    lines = [t.render() for t in triplets]
    return "\n".join(lines) if lines else EMPTY_KG


def kg_paths(triplets: Iterable[Triplet], max_paths: int = 64) -> list[list[Triplet]]:
    """KG-to-Paths: chain triplets that share an entity (object of one = subject of the next)
    into maximal simple paths. Paths start at entities with no incoming edge (then, for
    edges left over in cycles, at the first uncovered edge's subject); every triplet lies on
    at least one path; a branching entity repeats the triplets before it, as in the paper."""
    edges: list[Triplet] = []
    seen: set[tuple[str, str, str]] = set()
    for t in triplets:
        if t.key() not in seen:
            seen.add(t.key())
            edges.append(t)
    out: dict[str, list[int]] = {}
    incoming: set[str] = set()
    for i, t in enumerate(edges):
        out.setdefault(normalize_entity(t.subject), []).append(i)
        incoming.add(normalize_entity(t.object))
    paths: list[list[int]] = []
    covered: set[int] = set()

    def walk(node: str, path: list[int], nodes: set[str]) -> None:
        if len(paths) >= max_paths:
            return
        nxt = [i for i in out.get(node, ()) if normalize_entity(edges[i].object) not in nodes]
        if not nxt:
            if path:
                paths.append(list(path))
                covered.update(path)
            return
        for i in nxt:
            obj = normalize_entity(edges[i].object)
            walk(obj, path + [i], nodes | {obj})

    starts = []
    for t in edges:
        s = normalize_entity(t.subject)
        if s not in incoming and s not in starts:
            starts.append(s)
    for s in starts:
        walk(s, [], {s})
    for i, t in enumerate(edges):  # edges only reachable inside cycles
        if len(paths) >= max_paths:
            break
        if i not in covered:
            s = normalize_entity(t.subject)
            walk(s, [], {s})
            if i not in covered:  # a self-loop or a path cut by the cap: keep it alone
                paths.append([i])
                covered.add(i)
    # Every triplet must appear even when the cap cut the walk short.
    paths += [[i] for i in range(len(edges)) if i not in covered]
    return [[edges[i] for i in p] for p in paths]


def render_path(path: Iterable[Triplet]) -> str:
    """`A -[r1]-> B -[r2]-> C`: entity names as the triplets spell them."""
    path = list(path)
    parts = [path[0].subject]
    for t in path:
        parts.append(f"-[{t.relation}]-> {t.object}")
    return " ".join(parts)


def render_paths(triplets: Iterable[Triplet], max_paths: int = 64) -> str:
    """KG-to-Paths: one path per line."""
    paths = kg_paths(triplets, max_paths=max_paths)
    return "\n".join(render_path(p) for p in paths) if paths else EMPTY_KG
