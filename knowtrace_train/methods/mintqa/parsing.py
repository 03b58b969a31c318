"""Tolerant parsing of the MINTQA strategies' outputs: an answer, a sub-question or "finish", an answer with its confidence.

Model text is untrusted: every parser returns a value and, where the output could not be used
as asked, an error string for ModelCall.error; none raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LABEL = re.compile(r"^\s*(?:final answer|answer(?: \d+)?|next sub-question|sub-question(?: \d+)?|output)\s*[:\-]\s*", re.I)
_FINISH = re.compile(r"^\W*finish(?:ed)?\b", re.I)
_CONFIDENCE = re.compile(r"confidence\s*[:\-=]?\s*\W*(uncertain|certain|unsure|sure|not sure|low|high)\b", re.I)
_CONFIDENCE_WORDS = {"certain": "certain", "sure": "certain", "high": "certain",
                     "uncertain": "uncertain", "unsure": "uncertain", "not sure": "uncertain", "low": "uncertain"}


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def _clean(text: str) -> str:
    text = _LABEL.sub("", text.strip()).strip()
    text = text.strip().strip('"“”\'`*').strip()
    return text.rstrip(".").strip()


def parse_answer(output: str) -> tuple[str | None, str | None]:
    """(answer, error): the first non-empty line, without a leading "Answer:" label, quotes or a
    final full stop. An empty output gives (None, "empty answer")."""
    answer = _clean(_first_line(output))
    return (answer, None) if answer else (None, "empty answer")


@dataclass(frozen=True)
class Step:
    """A decomposition call read: the next sub-question, or finish."""

    subquestion: str | None
    finish: bool
    error: str | None = None

    def to_dict(self) -> dict:
        return {"subquestion": self.subquestion, "finish": self.finish}


def parse_step(output: str) -> Step:
    """The next sub-question (the first line, up to its first question mark), or finish ("finish"
    alone or first). An empty output is read as finish, with an error saying so."""
    line = _first_line(output)
    if _FINISH.match(_LABEL.sub("", line)):
        return Step(None, True)
    q = _clean(line)
    if "?" in q:
        q = q[: q.index("?") + 1]
    if not q:
        return Step(None, True, "empty sub-question (read as finish)")
    return Step(q, False)


@dataclass(frozen=True)
class SelfAnswer:
    """A self-answer call read: the answer and the confidence ("certain", "uncertain" or None: unreadable)."""

    answer: str | None
    confidence: str | None
    error: str | None = None

    @property
    def certain(self) -> bool:
        return self.answer is not None and self.confidence == "certain"

    def to_dict(self) -> dict:
        return {"answer": self.answer, "confidence": self.confidence}


def parse_selfanswer(output: str) -> SelfAnswer:
    """The answer (first line, before any "Confidence" on it) and the confidence word anywhere in
    the output (certain/sure/high or uncertain/unsure/low). A missing confidence or answer is an
    error; the strategy then retrieves, as for an uncertain answer."""
    m = _CONFIDENCE.search(output)
    confidence = _CONFIDENCE_WORDS[m.group(1).lower()] if m else None
    line = _first_line(output)
    cut = re.search(r"[;,(]?\s*confidence\b", line, re.I)
    answer, err = parse_answer(line[: cut.start()] if cut else line)
    if err is None and confidence is None:
        err = "no confidence (certain/uncertain) found: retrieving"
    elif err is not None:
        err = f"{err}: retrieving"
    return SelfAnswer(answer, confidence, err)
