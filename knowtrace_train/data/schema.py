"""The one schema every stage reads: `QAItem`, `Passage` and the gold evidence an item carries."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from knowtrace_train.errors import UserError


class SchemaError(UserError, ValueError):
    """A record that does not fit the schema; the message names where and which field."""

    label = "data error"


def passage_id(title: str, text: str) -> str:
    """Stable id of a passage from its content: the same (title, text) gets the same id
    in an item's context and in a corpus built from many items."""
    return hashlib.sha1(f"{title}\n{text}".encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text: a title and a paragraph."""

    id: str
    title: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "passage") -> "Passage":
        _require(d, ("id", "title", "text"), where)
        return cls(id=str(d["id"]), title=str(d["title"]), text=str(d["text"]))


@dataclass(frozen=True)
class SubQuestion:
    """One hop of a decomposed question: its question, answer and knowledge type.

    `knowledge_type` is free text from the benchmark (MINTQA: "new"/"old",
    "popular"/"unpopular"); `paragraph_ids` points at the item's own passages.
    """

    question: str
    answer: str
    knowledge_type: str | None = None
    paragraph_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class GoldEvidence:
    """What a benchmark says supports the answer. Every field is optional."""

    titles: tuple[str, ...] = ()
    #: (title, sentence index) pairs, as HotpotQA/2Wiki supporting facts.
    sentences: tuple[tuple[str, int], ...] = ()
    #: ids of the item's own context passages that are supporting (MuSiQue).
    paragraph_ids: tuple[str, ...] = ()
    #: (subject, relation, object), in chain order where the benchmark has one.
    triples: tuple[tuple[str, str, str], ...] = ()
    sub_questions: tuple[SubQuestion, ...] = ()

    def is_empty(self) -> bool:
        return not (self.titles or self.sentences or self.paragraph_ids or self.triples or self.sub_questions)


@dataclass(frozen=True)
class QAItem:
    """A multi-hop question with its gold answers (first = canonical, rest = aliases)."""

    id: str
    question: str
    answers: tuple[str, ...]
    dataset: str = "unknown"
    split: str = "unknown"
    type: str | None = None
    hops: int | None = None
    context: tuple[Passage, ...] = ()
    evidence: GoldEvidence = field(default_factory=GoldEvidence)

    @property
    def answer(self) -> str:
        return self.answers[0]

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise SchemaError(f"item {self.id!r}: field 'question' is empty")
        if not self.answers:
            raise SchemaError(f"item {self.id!r}: field 'answers' is empty")

    # -- JSON round trip -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return json.loads(json.dumps(d))  # tuples -> lists, a plain JSON value

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "item") -> "QAItem":
        _require(d, ("id", "question", "answers"), where)
        if isinstance(d["answers"], str) or not isinstance(d["answers"], (list, tuple)):
            raise SchemaError(f"{where}: field 'answers' must be a list of strings")
        ev = d.get("evidence") or {}
        try:
            evidence = GoldEvidence(
                titles=tuple(ev.get("titles", ())),
                sentences=tuple((str(t), int(i)) for t, i in ev.get("sentences", ())),
                paragraph_ids=tuple(str(p) for p in ev.get("paragraph_ids", ())),
                triples=tuple(tuple(str(x) for x in t) for t in ev.get("triples", ())),  # type: ignore[misc]
                sub_questions=tuple(
                    SubQuestion(
                        question=s["question"],
                        answer=s["answer"],
                        knowledge_type=s.get("knowledge_type"),
                        paragraph_ids=tuple(s.get("paragraph_ids", ())),
                    )
                    for s in ev.get("sub_questions", ())
                ),
            )
            context = tuple(Passage.from_dict(p, f"{where}: context[{i}]") for i, p in enumerate(d.get("context") or ()))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"{where}: field 'evidence' is malformed ({e!r})") from e
        hops = d.get("hops")
        if hops is not None and (isinstance(hops, bool) or not isinstance(hops, int)):
            if isinstance(hops, str) and hops.strip().isdigit():
                hops = int(hops)
            else:
                raise SchemaError(f"{where}: field 'hops' must be a whole number or null, got {hops!r}")
        try:
            return cls(
                id=str(d["id"]),
                question=str(d["question"]),
                answers=tuple(str(a) for a in d["answers"]),
                dataset=str(d.get("dataset", "unknown")),
                split=str(d.get("split", "unknown")),
                type=d.get("type"),
                hops=hops,
                context=context,
                evidence=evidence,
            )
        except SchemaError as e:
            raise SchemaError(f"{where}: {e}") from e


def _require(d: Any, keys: Iterable[str], where: str) -> None:
    if not isinstance(d, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for k in keys:
        if k not in d or d[k] is None:
            raise SchemaError(f"{where}: missing required field {k!r}")


def items_to_dataset(items: Iterable[QAItem]):
    """`datasets.Dataset` with one row per item; nested fields are kept as JSON strings
    so that Arrow never has to unify ragged structures across rows."""
    import datasets

    rows = [it.to_dict() for it in items]
    return datasets.Dataset.from_dict(
        {
            "id": [r["id"] for r in rows],
            "question": [r["question"] for r in rows],
            "answers": [r["answers"] for r in rows],
            "dataset": [r["dataset"] for r in rows],
            "split": [r["split"] for r in rows],
            "type": [r["type"] for r in rows],
            "hops": [r["hops"] for r in rows],
            "context": [json.dumps(r["context"]) for r in rows],
            "evidence": [json.dumps(r["evidence"]) for r in rows],
        }
    )


def items_from_dataset(ds) -> list[QAItem]:
    out = []
    for i, row in enumerate(ds):
        row = dict(row)
        row["context"] = json.loads(row["context"]) if isinstance(row.get("context"), str) else row.get("context")
        row["evidence"] = json.loads(row["evidence"]) if isinstance(row.get("evidence"), str) else row.get("evidence")
        out.append(QAItem.from_dict(row, where=f"dataset row {i}"))
    return out
