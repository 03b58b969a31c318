"""The MINTQA strategies' prompts (written for this project after the paper's Tables 14-21), each with its exemplars.

Every prompt is plain text that ends where the model's answer starts; one line is one answer
(the stop strings end a call at its line). Exemplars use widely known real-world facts, never
benchmark or evaluation questions.
"""

from __future__ import annotations

from typing import Sequence

from knowtrace_train.data.schema import Passage

#: one line per answer or sub-question
LINE_STOP = ("\n",)
#: the self-answer writes two lines (answer, confidence)
SELFANSWER_STOP = ("\n\n", "\nQuestion:")

# -- direct answering (Table 14) ------------------------------------------------------------------

_DIRECT_INSTRUCTION = "Answer the question directly. Keep the answer as short as possible: a name, a place, a year or yes/no."
_DIRECT_EXEMPLARS = """Question: Which river flows through Paris?
Answer: Seine

Question: Which was built first, the Eiffel Tower or the Empire State Building?
Answer: Eiffel Tower

Question: In which country was the composer of the opera Carmen born?
Answer: France"""

# -- answering over passages (Table 15); sub-questions use it too -----------------------------------

_RAG_INSTRUCTION = ("Answer the question using the documents. Keep the answer as short as possible: "
                    "a name, a place, a year or yes/no.")
_RAG_EXEMPLAR = """Documents:
[1] Edinburgh: Edinburgh is the capital city of Scotland. It is home to the University of Edinburgh, founded in 1583.
[2] Glasgow: Glasgow is the most populous city in Scotland.
Question: When was the university in the capital of Scotland founded?
Answer: 1583

Documents:
[1] Apple Inc.: Apple Inc. founding year 1976. Apple Inc. founded by Steve Jobs. Apple Inc. headquartered in Cupertino.
[2] Steve Jobs: Steve Jobs born in San Francisco. Apple Inc. founded by Steve Jobs.
Question: Who founded Apple Inc.?
Answer: Steve Jobs"""

# -- the next sub-question or "finish" (Table 19) ---------------------------------------------------

_DECOMPOSE_INSTRUCTION = ("Break the main question into simple sub-questions, one at a time. Given the main question and "
                          "the sub-questions answered so far, write the next sub-question, or write finish when the "
                          "answers so far are enough to answer the main question.")
_DECOMPOSE_EXEMPLARS = """Main question: Where was the director of the film Jaws born?
Next sub-question: Who directed the film Jaws?

Main question: Where was the director of the film Jaws born?
Sub-question 1: Who directed the film Jaws?
Answer 1: Steven Spielberg
Next sub-question: Where was Steven Spielberg born?

Main question: Which was founded earlier, Harvard University or Yale University?
Sub-question 1: When was Harvard University founded?
Answer 1: 1636
Next sub-question: When was Yale University founded?

Main question: Where was the director of the film Jaws born?
Sub-question 1: Who directed the film Jaws?
Answer 1: Steven Spielberg
Sub-question 2: Where was Steven Spielberg born?
Answer 2: Cincinnati
Next sub-question: finish"""

# -- a sub-question from the model's own knowledge, with a confidence (Table 21) -------------------

_SELFANSWER_INSTRUCTION = ("Answer the question from your own knowledge with one or a few words. Then say how sure you "
                           "are: certain if you are completely sure, uncertain if you have any doubt.")
_SELFANSWER_EXEMPLARS = """Question: What is the capital of Japan?
Answer: Tokyo
Confidence: certain

Question: Who was the second mayor of the town of Kalgoorlie?
Answer: John Wilson
Confidence: uncertain"""

# -- the final answer from the history (Table 20) ---------------------------------------------------

_FINAL_INSTRUCTION = ("Answer the main question from the sub-questions and their answers. Keep the answer as short as "
                      "possible: a name, a place, a year or yes/no.")
_FINAL_EXEMPLARS = """Main question: Where was the director of the film Jaws born?
Sub-question 1: Who directed the film Jaws?
Answer 1: Steven Spielberg
Sub-question 2: Where was Steven Spielberg born?
Answer 2: Cincinnati
Final answer: Cincinnati

Main question: Which was founded earlier, Harvard University or Yale University?
Sub-question 1: When was Harvard University founded?
Answer 1: 1636
Sub-question 2: When was Yale University founded?
Answer 2: 1701
Final answer: Harvard University"""


def _join(instruction: str, exemplars: str, task: str, fewshot: bool) -> str:
    return "\n\n".join([instruction, exemplars, task] if fewshot else [instruction, task])


def render_passage(p: Passage) -> str:
    """`title: text` (the text alone for a passage without a title)."""
    return f"{p.title}: {p.text}" if p.title else p.text


def render_passages(passages: Sequence[Passage]) -> str:
    """The numbered documents block, `[i] title: text` per passage; "(none found)" for none."""
    if not passages:
        return "Documents:\n(none found)"
    return "Documents:\n" + "\n".join(f"[{i}] {render_passage(p)}" for i, p in enumerate(passages, 1))


def render_history(history: Sequence[tuple[str, str]]) -> str:
    """The sub-question/answer pairs so far, numbered from 1 (empty text for none)."""
    return "\n".join(f"Sub-question {i}: {q}\nAnswer {i}: {a}" for i, (q, a) in enumerate(history, 1))


def direct_prompt(question: str, fewshot: bool = True) -> str:
    return _join(_DIRECT_INSTRUCTION, _DIRECT_EXEMPLARS, f"Question: {question.strip()}\nAnswer:", fewshot)


def rag_prompt(question: str, passages: Sequence[Passage], fewshot: bool = True) -> str:
    task = f"{render_passages(passages)}\nQuestion: {question.strip()}\nAnswer:"
    return _join(_RAG_INSTRUCTION, _RAG_EXEMPLAR, task, fewshot)


def decompose_prompt(question: str, history: Sequence[tuple[str, str]], fewshot: bool = True) -> str:
    lines = [f"Main question: {question.strip()}", render_history(history), "Next sub-question:"]
    return _join(_DECOMPOSE_INSTRUCTION, _DECOMPOSE_EXEMPLARS, "\n".join(x for x in lines if x), fewshot)


def selfanswer_prompt(subquestion: str, fewshot: bool = True) -> str:
    return _join(_SELFANSWER_INSTRUCTION, _SELFANSWER_EXEMPLARS, f"Question: {subquestion.strip()}\nAnswer:", fewshot)


def final_prompt(question: str, history: Sequence[tuple[str, str]], fewshot: bool = True) -> str:
    lines = [f"Main question: {question.strip()}", render_history(history) or "(no sub-questions)", "Final answer:"]
    return _join(_FINAL_INSTRUCTION, _FINAL_EXEMPLARS, "\n".join(lines), fewshot)
