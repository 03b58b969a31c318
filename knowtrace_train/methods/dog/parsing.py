"""Tolerant parsing of DoG's outputs: a sub-question and relation, a Yes/No verdict and answer, a simplified question.

Model text is untrusted: every parser returns a value and, where the output could not be used as
asked, an error string for ModelCall.error; none raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

_LINES = re.compile(r"\s*\n\s*")
_RELATION_LABEL = re.compile(r"(?:^|\n)\s*(?:output\s*:\s*)?relation(?:[_ ]?\d+)?\s*[:\-]\s*(.*)", re.I)
_NUMBER = re.compile(r"^\W*(?:relation[_ ]?)?(\d+)\b", re.I)
_SUBQ_LABEL = re.compile(r"^\s*(?:first\s+)?sub-?question\s*[:\-]\s*", re.I)
_VERDICT = re.compile(r"\b(yes|no)\b", re.I)
_ANSWER_LABEL = re.compile(r"(?:^|\n)\s*(?:final\s+)?answer\s*[:\-]\s*(.*)", re.I)
_SIMPLIFIED = re.compile(r"simplified[_ ]question\s*[:\-]\s*(.*)", re.I)
_SAME = re.compile(r"\b(same|different|failed|fine|correct|ok)\b", re.I)
_SAME_WORDS = {"same": "same", "failed": "same", "different": "different", "fine": "different", "correct": "different",
               "ok": "different"}


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.strip().splitlines() if ln.strip()]


def _clean(text: str) -> str:
    text = text.strip().strip('"“”\'`*').strip()
    return text.rstrip(".").strip()


def _norm_relation(text: str) -> str:
    text = re.sub(r"\s+", " ", text.strip().lower().replace("_", " "))
    text = re.sub(r"^~\s*", "~", text)
    return text.strip(" .,;:'\"`*")


@dataclass(frozen=True)
class RelationChoice:
    """A relation call read: the sub-question stated and the relation picked (None: not in the list)."""

    subquestion: str | None
    relation: str | None
    error: str | None = None
    #: the relation was read from its number alone (the name written, if any, is not in the list)
    by_number: bool = False

    def to_dict(self) -> dict:
        return {"subquestion": self.subquestion, "relation": self.relation, "by_number": self.by_number}


def match_relation(text: str, relations: Sequence[str]) -> str | None:
    """The listed relation `text` names: by its name (case, "_" for spaces and a space after "~"
    forgiven), the longest listed name inside the text (an inverse "~r" only where the text writes the
    "~"), else by its number in the list ("2", "relation_2: <a name not listed>"). The name wins over
    the number where both are listed (small models copy an exemplar's number). None: it names none."""
    want = _norm_relation(re.sub(r"^\W*(?:relation[_ ]?)?\d+\s*[:.)\-]?\s*", "", text))
    by_norm = {_norm_relation(r): r for r in relations}
    if want in by_norm:
        return by_norm[want]
    low = _norm_relation(text)
    for norm in sorted(by_norm, key=len, reverse=True):
        if norm.startswith("~"):
            if norm in low.replace("~ ", "~"):
                return by_norm[norm]
        elif re.search(rf"(?<![~\w]){re.escape(norm)}(?!\w)", low):
            return by_norm[norm]
    m = _NUMBER.match(text)
    if m and 1 <= int(m.group(1)) <= len(relations):
        return relations[int(m.group(1)) - 1]
    return None


def parse_relation(output: str, relations: Sequence[str]) -> RelationChoice:
    """The sub-question (the first line, without a label, up to its question mark) and the relation
    (from the "Relation:" line, else from anything after the first line; `by_number` where only its
    number in the list named it). A relation named neither by a listed name nor a listed number is
    an error; so is an empty output."""
    lines = _lines(output)
    if not lines:
        return RelationChoice(None, None, "empty output")
    first = _SUBQ_LABEL.sub("", lines[0])
    sub = None
    if not _RELATION_LABEL.match("\n" + lines[0]):
        sub = _clean(first[: first.index("?") + 1] if "?" in first else first) or None
    m = _RELATION_LABEL.search("\n" + "\n".join(lines))
    text = m.group(1) if m else "\n".join(lines[1:])
    relation = match_relation(text, relations) if text.strip() else None
    if relation is None:
        return RelationChoice(sub, None, f"relation not in the list: {text.strip()[:80]!r}" if text.strip() else "no relation written")
    by_number = match_relation(re.sub(r"^\W*(?:relation[_ ]?)?\d+\s*[:.)\-]?\s*", "", text), relations) is None
    return RelationChoice(sub, relation, by_number=by_number)


@dataclass(frozen=True)
class AnswerTry:
    """An answer try read: whether the triples suffice (None: no Yes/No found, read as No) and the answer."""

    sufficient: bool | None
    answer: str | None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"sufficient": self.sufficient, "answer": self.answer}


def parse_answer_try(output: str) -> AnswerTry:
    """The first Yes or No word anywhere, and the answer of an "Answer:" line (else, after a Yes, the
    text after "Yes" on its line or the next line). No Yes/No is an error and reads as No."""
    m = _VERDICT.search(output)
    if m is None:
        return AnswerTry(None, None, "no Yes/No found (read as No)")
    sufficient = m.group(1).lower() == "yes"
    a = _ANSWER_LABEL.search(output)
    answer = _clean(_lines(a.group(1))[0]) if a and _lines(a.group(1)) else None
    if answer is None and sufficient:
        rest = _lines(output[m.end():])
        if rest:
            answer = _clean(re.sub(r"^\W+", "", rest[0])) or (_clean(rest[1]) if len(rest) > 1 else None)
    return AnswerTry(sufficient, answer or None)


def parse_answer(output: str) -> tuple[str | None, str | None]:
    """(answer, error): the first non-empty line without an "Answer:" label, quotes or a final stop."""
    lines = _lines(output)
    answer = _clean(re.sub(r"^\s*(?:final\s+)?answer\s*[:\-]\s*", "", lines[0], flags=re.I)) if lines else ""
    return (answer, None) if answer else (None, "empty answer")


@dataclass(frozen=True)
class Turn:
    """A debate turn read: the simplified question (None: none written) and, for the critic, its
    verdict ("same": the simplification failed, "different", or None)."""

    question: str | None
    verdict: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"question": self.question, "verdict": self.verdict}


def parse_turn(output: str, *, critic: bool = False) -> Turn:
    """The question after the last "Simplified question:" label, else the first line with a question
    mark (else the first line), cut after its question mark; the critic's verdict is its first
    same/different word. An output with no question is an error (the turn adds nothing)."""
    verdict = None
    if critic:
        v = _SAME.search(output.split("?")[0]) or _SAME.search(output)
        verdict = _SAME_WORDS[v.group(1).lower()] if v else None
    found = _SIMPLIFIED.findall(output)
    lines = [ln for ln in (_lines(found[-1]) if found and _lines(found[-1]) else _lines(output))]
    if not found:
        lines = [ln for ln in lines if "?" in ln] or lines
        if critic and lines:
            lines = [re.sub(r"^\W*(?:verdict\s*[:\-]\s*)?(?:same|different|failed|fine|correct|ok)\b\W*", "", lines[0], flags=re.I)]
    text = _clean(re.sub(r"^\s*(?:expert|critic|linguist)\s*:\s*", "", lines[0], flags=re.I)) if lines else ""
    if "?" in text:
        text = text[: text.index("?") + 1]
    if len(text) < 3:
        return Turn(None, verdict, "no simplified question written")
    return Turn(text, verdict)
