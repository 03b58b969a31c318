"""The facts a corpus states, as (subject; relation; object) triplets: what a gold completion writes from its passages.

KnowTrace's gold trajectories (methods/knowtrace/gold.py) write, for each guidance pair, every triplet the retrieved
passages state about the pair, and, at the rates `strategy.gold_noise` names, the plausible but unneeded pairs and
facts a larger model adds. Both need to know which facts a passage states. Two sources:

- a facts file (`data.facts`, or `facts.jsonl` beside the corpus file, as the synthetic world ships one): one JSON
  object a line, `{"subject", "relation", "object", "passage_id"}`; a fact is stated by the passage it names;
- else the gold evidence of the train questions (`evidence.triples`, with `evidence.paragraph_ids` where they align
  one to one): a fact without a passage id is stated by a passage that names both its entities (`states`, the rule every gold chain uses).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.errors import UserError
from knowtrace_train.kg import Triplet
from knowtrace_train.metrics import normalize_answer

FACTS_FILE = "facts.jsonl"


class FactsFileError(UserError, ValueError):
    """A facts file row that is not a fact."""

    label = "facts file error"


@dataclass(frozen=True)
class Fact:
    triplet: Triplet
    #: the passage that states it; None: any passage naming both entities does
    passage_id: str | None = None


def _key(name: str) -> str:
    return normalize_answer(name)


@dataclass
class FactIndex:
    """Facts by their subject (normalized), in the order they were given."""

    facts: list[Fact] = field(default_factory=list)
    source: str = "none"

    def __post_init__(self) -> None:
        self._by_subject: dict[str, list[Fact]] = {}
        seen: set[tuple[str, str, str]] = set()
        for f in self.facts:
            k = tuple(_key(x) for x in (f.triplet.subject, f.triplet.relation, f.triplet.object))
            if k in seen:
                continue
            seen.add(k)
            self._by_subject.setdefault(k[0], []).append(f)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_subject.values())

    def about(self, entity: str) -> list[Fact]:
        """The facts whose subject is `entity`."""
        return list(self._by_subject.get(_key(entity), ()))

    @staticmethod
    def stated(fact: Fact, passages: Sequence[Passage]) -> bool:
        """Whether one of `passages` states the fact."""
        if fact.passage_id is not None:
            return any(p.id == fact.passage_id for p in passages)
        return any(states(fact.triplet, p) for p in passages)

    def stated_about(self, entity: str, passages: Sequence[Passage]) -> list[Triplet]:
        """Every triplet about `entity` that `passages` state."""
        return [f.triplet for f in self.about(entity) if self.stated(f, passages)]

    @classmethod
    def from_file(cls, path: str | Path) -> "FactIndex":
        path = Path(path)
        facts = []
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise FactsFileError(f"{path}, line {n}: not JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise FactsFileError(f"{path}, line {n}: expected an object with subject, relation, object")
                for k in ("subject", "relation", "object"):
                    if not isinstance(row.get(k), str) or not row[k].strip():
                        raise FactsFileError(f"{path}, line {n}: field {k!r} must be a non-empty string")
                pid = row.get("passage_id")
                if pid is not None and not isinstance(pid, str):
                    raise FactsFileError(f"{path}, line {n}: field 'passage_id' must be a string or absent")
                facts.append(Fact(Triplet(row["subject"], row["relation"], row["object"]), pid))
        return cls(facts, source=str(path))

    @classmethod
    def from_items(cls, items: Iterable[QAItem]) -> "FactIndex":
        """The gold evidence triples of `items` (each with its paragraph id where the item aligns them)."""
        facts = []
        for it in items:
            triples = list(it.evidence.triples)
            pids = list(it.evidence.paragraph_ids)
            aligned = len(pids) == len(triples)
            for i, t in enumerate(triples):
                facts.append(Fact(Triplet(*map(str, t)), pids[i] if aligned else None))
        return cls(facts, source="the train questions' gold evidence")


def passage_words(passage: Passage) -> str:
    """A passage's title and text as normalized words, padded with a space each side (what `mentions`
    searches; compute it once where many entities are looked up in one passage)."""
    return f" {normalize_answer(passage.title + ' ' + passage.text)} "


def mentions(entity: str, passage: Passage | str) -> bool:
    """Whether `passage` (its title or text; or its `passage_words`) names `entity` (normalized words,
    whole-word match)."""
    e = normalize_answer(entity)
    return bool(e) and f" {e} " in (passage if isinstance(passage, str) else passage_words(passage))


def states(t: Triplet, passage: Passage | str) -> bool:
    """Whether `passage` names both entities of the triplet (the rule by which TRACE's gold KG generator
    writes a gold triple for a document)."""
    words = passage if isinstance(passage, str) else passage_words(passage)
    return mentions(t.subject, words) and mentions(t.object, words)


def load_facts(facts_path: str | None, corpus_path: str | None, items: Iterable[QAItem]) -> FactIndex:
    """The facts of a run: `facts_path` where given, else `facts.jsonl` beside the corpus file where there is one,
    else the gold evidence of `items`."""
    if facts_path:
        return FactIndex.from_file(facts_path)
    if corpus_path and (beside := Path(corpus_path).parent / FACTS_FILE).is_file():
        return FactIndex.from_file(beside)
    return FactIndex.from_items(items)


def write_facts(path: str | Path, facts: Iterable[Fact]) -> None:
    from knowtrace_train.io import write_jsonl

    write_jsonl(path, ({"subject": f.triplet.subject, "relation": f.triplet.relation, "object": f.triplet.object,
                        **({"passage_id": f.passage_id} if f.passage_id is not None else {})} for f in facts))
