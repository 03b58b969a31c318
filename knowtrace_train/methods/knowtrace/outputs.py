"""Canonical texts of model outputs per role: what the parser reads and what SFT targets write."""

from __future__ import annotations

from typing import Iterable

from knowtrace_train.kg import GuidancePair, Triplet

#: The judgement line of the exploration template (paper, Appendix D).
JUDGEMENT = "Whether the given knowledge triplets are sufficient for answering:"


def exploration_guidance(pairs: Iterable[GuidancePair]) -> str:
    """An exploration that asks for more knowledge: judgement No, then the guidance pairs."""
    lines = [f"{JUDGEMENT} No", "Retrieval Guidance:"]
    lines += [p.render() for p in pairs]
    return "\n".join(lines)


def exploration_answer(thought: str, answer: str) -> str:
    """An exploration that concludes: judgement Yes, the thought and the answer."""
    return f"{JUDGEMENT} Yes\nThought: {thought.strip()}\nAnswer: {answer.strip()}"


def completion(triplets: Iterable[Triplet]) -> str:
    """A knowledge completion: one `(subject; relation; object)` per line."""
    return "\n".join(t.render() for t in triplets)
