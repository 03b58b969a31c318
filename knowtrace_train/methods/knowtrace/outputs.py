"""Canonical texts of model outputs per role: what the parser reads and what SFT targets write."""

from __future__ import annotations

from typing import Iterable

from knowtrace_train.kg import GuidancePair, Triplet

#: The judgement line of the exploration template (paper, Appendix D).
JUDGEMENT = "Whether the given knowledge triplets are sufficient for answering:"
#: the decision the judgement states (knowtrace_train.decisions): the graph suffices ("Yes") or not ("No")
SUFFICIENCY = "sufficiency"


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


def judgement_span(prefix: str, completion: str) -> tuple[str, int, int] | None:
    """(label, start, end) of the sufficiency judgement in a completion that follows `prefix`: the characters
    [start, end) of `completion` that say " Yes" or " No" after the judgement words. None where the completion
    states no judgement (it is in the prefix, as in the forced answer's, or missing)."""
    full = prefix + completion
    if not full.startswith(JUDGEMENT):
        return None
    rest = full[len(JUDGEMENT):]
    start = len(JUDGEMENT) - len(prefix)
    if start < 0:
        return None
    for label in ("Yes", "No"):
        word = " " + label
        if rest.startswith(word) and (len(rest) == len(word) or not rest[len(word)].isalnum()):
            return label, start, start + len(word)
    return None
