"""The baselines' shared prompt pieces and tolerant parsers: passages as text, the CoT exemplars, answer extraction.

Exemplars are written for this project about made-up entities (never taken from evaluation data).
Every parser takes untrusted model text and returns a value or None; none raises.
"""

from __future__ import annotations

import re
from typing import Sequence

from knowtrace_train.data.schema import Passage

#: The made-up facts every baseline's exemplars draw on, as passages (title, text).
EXEMPLAR_PASSAGES = {
    "brindle": ("Brindle Maps", "Brindle Maps is a map publisher founded in 1961 by the cartographer Tessa Marrow."),
    "marrow": ("Tessa Marrow", "Tessa Marrow (1930-2004) was a cartographer born in Velmoria who drew coastal charts."),
    "sarn": ("Sarn River", "The Sarn River flows 412 km from the Ulden hills to the Grey Sea."),
    "oskel": ("Oskel River", "The Oskel River is a 268 km long river that drains Lake Pirra."),
}

EXEMPLAR_QUESTIONS = {
    "bridge": ("In which country was the founder of Brindle Maps born?", "Velmoria"),
    "comparison": ("Which river is longer, the Sarn River or the Oskel River?", "Sarn River"),
}

#: The chain of thought of each exemplar question (RA-CoT, IRCoT and Iter-RetGen write it).
EXEMPLAR_COT = {
    "bridge": ["Brindle Maps was founded by Tessa Marrow.", "Tessa Marrow was born in Velmoria.",
               "So the answer is: Velmoria."],
    "comparison": ["The Sarn River is 412 km long.", "The Oskel River is 268 km long.",
                   "So the answer is: Sarn River."],
}
EXEMPLAR_DOCS = {"bridge": ("brindle", "marrow", "oskel"), "comparison": ("sarn", "marrow", "oskel")}

COT_INSTRUCTION = ('Answer the question using the documents. Reason step by step in short sentences, '
                   'then end with "So the answer is: <answer>."')
ANSWER_MARK = "So the answer is:"
#: stop strings of a chain of thought: the model starting another question or document block
COT_STOP = ("\nQuestion:", "\nDocuments:", "\n\n")

_ANSWER_RE = re.compile(r"answer is\s*:?\s*(.*)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def passage_line(passage: Passage, number: int) -> str:
    """One passage on one line: `[n] Title: text`."""
    text = " ".join(passage.text.split())
    title = " ".join(passage.title.split())
    return f"[{number}] {title}: {text}" if title else f"[{number}] {text}"


def passages_block(passages: Sequence[Passage]) -> str:
    """The passages numbered from 1, one a line; a line saying none were found for none."""
    if not passages:
        return "(no documents found)"
    return "\n".join(passage_line(p, i) for i, p in enumerate(passages, 1))


def exemplar_passages(keys: Sequence[str]) -> list[Passage]:
    return [Passage(id=f"exemplar-{k}", title=EXEMPLAR_PASSAGES[k][0], text=EXEMPLAR_PASSAGES[k][1]) for k in keys]


def cot_exemplars() -> str:
    """The CoT exemplars (documents, question, answer), each block as the model's own block looks."""
    blocks = []
    for kind, (question, _) in EXEMPLAR_QUESTIONS.items():
        docs = passages_block(exemplar_passages(EXEMPLAR_DOCS[kind]))
        blocks.append(f"Documents:\n{docs}\nQuestion: {question}\nAnswer: {' '.join(EXEMPLAR_COT[kind])}")
    return "\n\n".join(blocks)


def cot_prompt(question: str, passages: Sequence[Passage], *, fewshot: bool) -> str:
    """The chain-of-thought prompt up to the question (the answer, `Answer:`, is the response prefix)."""
    head = COT_INSTRUCTION + ("\n\n" + cot_exemplars() if fewshot else "")
    return f"{head}\n\nDocuments:\n{passages_block(passages)}\nQuestion: {question}\n"


def extract_answer(text: str) -> str | None:
    """The answer after "answer is" (`So the answer is: X.`, `the final answer is X`), to the end of
    its line, without a closing period or quotes; None where the text has no such answer."""
    m = _ANSWER_RE.search(text or "")
    if m is None:
        return None
    return clean_answer(m.group(1))


def clean_answer(text: str) -> str | None:
    """The first line of `text` without surrounding space, quotes, brackets or a closing period; None if empty."""
    line = (text or "").strip().split("\n", 1)[0].strip()
    line = line.strip(" \"'`[]*")
    while line.endswith((".", ",", ";")):
        line = line[:-1].rstrip()
    return line or None


def first_sentence(text: str) -> str:
    """The first sentence of `text` (up to and including its . ! or ?, or its first line), stripped."""
    line = (text or "").strip().split("\n", 1)[0].strip()
    parts = _SENTENCE_END.split(line, maxsplit=1)
    return parts[0].strip() if parts else ""


def last_sentence(text: str) -> str | None:
    """The last non-empty sentence of `text`'s first paragraph, cleaned as an answer (a fallback)."""
    lines = [x.strip() for x in (text or "").strip().split("\n") if x.strip()]
    if not lines:
        return None
    sentences = [s for s in _SENTENCE_END.split(" ".join(lines)) if s.strip()]
    return clean_answer(sentences[-1]) if sentences else None


def normalized(text: str) -> str:
    """Lower case, single spaces, no punctuation: for noticing a query or a sub-question asked twice."""
    return " ".join(re.sub(r"[^\w\s]", " ", (text or "").lower()).split())
