"""Hinted reruns (STaR's rationalization, Section 3.2), for any method: rerun wrong questions with the gold answer as a hint,
then train on the correct reruns as if the hint had never been there.

The hint is appended to the question text, so every strategy runs a hinted item unchanged.
A trajectory of a hinted item carries the hinted question and its own id (`trajectory_id`:
`<item id>#hint`, its question_id stays the item id, so it never collides with the unhinted
trajectory of the same question); `unhint_prompt` turns any prompt
that shows it back into the prompt of the plain question (backtracing does this for every
exploration record), and `mentions_hint` catches a thought that leans on the hint.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from knowtrace_train.data.schema import QAItem
from knowtrace_train.trajectory import is_correct

HINT_TEMPLATE = "{question} (Hint: the answer is {answer}.)"
#: appended to the item id to make the trajectory id of a hinted rerun
HINT_ID_SUFFIX = "#hint"
_HINT_WORD = re.compile(r"\bhint(?:s|ed)?\b", re.IGNORECASE)


def hinted_question(question: str, answer: str) -> str:
    """The question with the gold answer given as a hint."""
    return HINT_TEMPLATE.format(question=question.strip(), answer=answer.strip())


def hinted_items(items: Iterable[QAItem]) -> list[QAItem]:
    """The items to rerun for rationalization: same id, answers and evidence, hinted question
    (a strategy names their trajectories with `trajectory_id`)."""
    return [dataclasses.replace(it, question=hinted_question(it.question, it.answer)) for it in items]


def trajectory_id(item: QAItem) -> str:
    """The id of a trajectory of `item`: the item id, or `<item id>#hint` where the item is a
    hinted rerun (its question ends with its own gold answer as the hint)."""
    hint = HINT_TEMPLATE.format(question="", answer=item.answer.strip())
    return item.id + HINT_ID_SUFFIX if item.question.endswith(hint) else item.id


def is_hinted(trajectory_question: str, item_question: str) -> bool:
    """Whether a trajectory ran on the hinted form of the item's question."""
    q = trajectory_question.strip()
    return q != item_question.strip() and q.startswith(item_question.strip()) and "Hint:" in q


def unhint_prompt(prompt: str, hinted: str, question: str) -> str | None:
    """The prompt with the hinted question replaced by the plain one; None where the prompt
    does not show the hinted question (then it has to be rendered afresh)."""
    hinted, question = hinted.strip(), question.strip()
    if hinted not in prompt:
        return None
    return prompt.replace(hinted, question)


def mentions_hint(text: str | None) -> bool:
    """A thought that refers to the hint cannot be trained on without it."""
    return bool(text) and bool(_HINT_WORD.search(text or ""))


def items_to_rationalize(trajectories: Iterable, items_by_id: dict[str, QAItem]) -> list[QAItem]:
    """Hinted items for the questions that no trajectory answered correctly (in first-seen
    order); their rerun's trajectories go to backtracing beside the others."""
    solved: set[str] = set()
    order: list[str] = []
    for t in trajectories:
        if t.question_id not in order:
            order.append(t.question_id)
        if is_correct(t):
            solved.add(t.question_id)
    return hinted_items(items_by_id[q] for q in order if q not in solved and q in items_by_id)
