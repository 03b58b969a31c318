"""DoG's prompts, written for this project after the paper's descriptions of its modules (no text of the authors').

Every prompt is plain text that ends where the model's answer starts (in the chat format it is the
user turn). Exemplars use widely known real-world facts, never benchmark or evaluation questions.
Triples are rendered `(subject; relation; object)`; a relation written "~r" is r read backwards.
"""

from __future__ import annotations

from typing import Sequence

from knowtrace_train.methods.dog.config import CRITIC, EXPERT, LINGUIST

#: a relation call writes two lines, an answer try one or two, a debate turn one or two
BLOCK_STOP = ("\n\n", "\nQuestion:", "\nOriginal question:")
LINE_STOP = ("\n",)

SPEAKER = {EXPERT: "Expert", CRITIC: "Critic", LINGUIST: "Linguist"}

# -- relation filtering ------------------------------------------------------------------------------

_RELATION_INSTRUCTION = (
    "A multi-hop question is solved one sub-question at a time, starting from its topic entity. Write the first "
    "sub-question about the topic entity, then pick the one relation from the list that answers it. A relation "
    'that starts with "~" points backwards: "Paris ~capital of" means the things whose capital is Paris.')
_RELATION_EXEMPLARS = """Question: In which country was the director of the film Jaws born?
Topic entity: Jaws
Relations: 1. release year; 2. directed by; 3. ~sequel of
Sub-question: Who directed Jaws?
Relation: 2. directed by

Question: Which company did the man who founded Microsoft marry into?
Topic entity: Microsoft
Relations: 1. founded by; 2. headquartered in; 3. ~employer
Sub-question: Who founded Microsoft?
Relation: 1. founded by"""

# -- answer trying -----------------------------------------------------------------------------------

_ANSWER_INSTRUCTION = (
    "Decide whether the knowledge triples, together with what you already know, are enough to answer the whole "
    "question. Write Yes or No. After Yes, write the answer on the next line.")
_ANSWER_EXEMPLARS = """Question: In which country was the director of the film Jaws born?
Triples: (Jaws; directed by; Steven Spielberg)
Enough: No

Question: Who directed the film Jaws?
Triples: (Jaws; directed by; Steven Spielberg)
Enough: Yes
Answer: Steven Spielberg"""

# -- question simplifying: the debate ------------------------------------------------------------------

_DEBATE_TASK = (
    "A team rewrites a multi-hop question into one that is one hop shorter. The knowledge triple answers the "
    "question's first sub-question; the new question puts the triple's answer in place of that sub-question.")
_ROLE = {
    EXPERT: ("You are the question-simplifying expert. Use the triple to answer the first sub-question and write the "
             "shorter question that is left to solve."),
    CRITIC: ("You are a strict critic. Compare the original question with the simplified question in the chat. If they "
             "are the same, or the triple's answer is not in the simplified question, the simplification failed: say "
             "same and write a correct one. Otherwise say different and repeat it."),
    LINGUIST: ("You are a linguist. Remove from the simplified question every word left over from the sub-question "
               "already answered, so that only the part still to solve remains, about the triple's answer. Write the "
               "clean question."),
}
_DEBATE_EXEMPLAR = """Original question: In which country was the director of the film Jaws born?
Triple: (Jaws; directed by; Steven Spielberg)
Simplified question: In which country was Steven Spielberg born?"""
_CRITIC_START = "Verdict:"
_QUESTION_START = "Simplified question:"

# -- fallback from the model's own knowledge -------------------------------------------------------------

_FALLBACK_INSTRUCTION = "Answer the question from your own knowledge. Keep the answer short: a name, a place or a year."
_FALLBACK_EXEMPLARS = """Question: Which river flows through Paris?
Answer: Seine

Question: In which country was the director of the film Jaws born?
Answer: United States"""


def _join(instruction: str, exemplars: str, task: str, fewshot: bool) -> str:
    return "\n\n".join([instruction, exemplars, task] if fewshot else [instruction, task])


def render_triple(t: Sequence[str]) -> str:
    return f"({t[0]}; {t[1]}; {t[2]})"


def render_triples(triples: Sequence[Sequence[str]]) -> str:
    return " ".join(render_triple(t) for t in triples) if triples else "(none)"


def render_relations(relations: Sequence[str]) -> str:
    return "; ".join(f"{i}. {r}" for i, r in enumerate(relations, 1))


def relation_prompt(question: str, topic: str, relations: Sequence[str], fewshot: bool = True) -> str:
    task = f"Question: {question.strip()}\nTopic entity: {topic}\nRelations: {render_relations(relations)}\nSub-question:"
    return _join(_RELATION_INSTRUCTION, _RELATION_EXEMPLARS, task, fewshot)


def answer_try_prompt(question: str, triples: Sequence[Sequence[str]], fewshot: bool = True) -> str:
    task = f"Question: {question.strip()}\nTriples: {render_triples(triples)}\nEnough:"
    return _join(_ANSWER_INSTRUCTION, _ANSWER_EXEMPLARS, task, fewshot)


def render_turn(role: str, question: str | None, verdict: str | None = None) -> str:
    """One line of the debate's chat log, as the later speakers see it."""
    said = f"{_QUESTION_START} {question}" if question else "(no question written)"
    if role == CRITIC:
        said = f"{_CRITIC_START} {verdict or 'unclear'}. {said}"
    return f"{SPEAKER[role]}: {said}"


def debate_prompt(role: str, question: str, triple: Sequence[str], chat: Sequence[str], fewshot: bool = True) -> str:
    """The prompt of `role`'s turn: the team's task, the role, (an exemplar), the question and triple,
    the chat so far (every earlier turn of this hop's debate), and the role's own opening."""
    opening = f"{SPEAKER[role]}: {_CRITIC_START if role == CRITIC else _QUESTION_START}"
    lines = [f"Original question: {question.strip()}", f"Triple: {render_triple(triple)}", "Chat:", *chat, opening]
    head = f"{_DEBATE_TASK}\n{_ROLE[role]}"
    return _join(head, f"Example:\n{_DEBATE_EXEMPLAR}", "\n".join(lines), fewshot)


def fallback_prompt(question: str, fewshot: bool = True) -> str:
    return _join(_FALLBACK_INSTRUCTION, _FALLBACK_EXEMPLARS, f"Question: {question.strip()}\nAnswer:", fewshot)
