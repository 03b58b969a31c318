"""Prompt rendering for knowledge exploration, completion, the forced answer and KG-to-Text.

Two prompt sets (`PROMPT_SETS`, the strategy's `prompts`): "short", the paper's Appendix D templates
shortened for small models (explore.yaml, complete.yaml beside this module), and "paper", the
instructions of the paper's Figures 4 and 5 word for word (paper/explore.yaml, paper/complete.yaml);
both carry 4 few-shot exemplars written for this project, and share kg_to_text.yaml. Exemplar outputs are rendered with
`knowtrace_train.methods.knowtrace.outputs`, the same texts the parser reads back and SFT targets write.
`fewshot=False` renders the same prompt without the exemplars (for trained adapters).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from knowtrace_train.data.schema import Passage
from knowtrace_train.errors import UserError
from knowtrace_train.kg import EMPTY_KG, GuidancePair, Triplet, render_paths, render_triplets
import knowtrace_train.methods.knowtrace.outputs as outputs

PROMPT_DIR = Path(__file__).resolve().parent

#: The KG renderings of the exploration prompt (paper, Section 3.2).
KG_FORMATS = ("triplets", "paths", "text")

#: Stop strings: every canonical output is free of blank lines, and a model that goes on
#: writes the next exemplar's header.
EXPLORE_STOP = ("\n\n", "\nQuestion:")
COMPLETE_STOP = ("\n\n", "\nDocuments:", "\nInput Entity")
KG_TO_TEXT_STOP = ("\n\n", "\nKnowledge triplets:")

QUESTION = "Question:"
KG_HEADER = "Knowledge triplets collected in previous steps:"
DOCUMENTS = "Documents:"
PAIR_HEADER = "Input Entity with Knowledge Guidance:"
TRIPLETS_HEADER = "Structured Knowledge Triple(s):"
TEXT_KG_HEADER = "Knowledge triplets:"
TEXT_HEADER = "Text:"


class PromptFileError(UserError, ValueError):
    """A prompt data file that does not have the expected fields."""

    label = "prompt file error"


#: The prompt sets: "short" (the Appendix D templates shortened for small models) and "paper" (the paper's own
#: instructions, word for word). docs/knowtrace.md says how they differ.
PROMPT_SETS = ("short", "paper")
DEFAULT_PROMPT_SET = "short"


@dataclass(frozen=True)
class _Templates:
    explore: dict[str, Any]
    complete: dict[str, Any]
    kg_to_text: dict[str, Any]


def _load(name: str, required: Sequence[str], prompt_set: str = DEFAULT_PROMPT_SET) -> dict[str, Any]:
    path = PROMPT_DIR / name if prompt_set == DEFAULT_PROMPT_SET or name == "kg_to_text.yaml" \
        else PROMPT_DIR / prompt_set / name
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise PromptFileError(f"{path}: expected a mapping")
    for key in required:
        if key not in data:
            raise PromptFileError(f"{path}: missing field {key!r}")
    if len(data["exemplars"]) != 4:
        raise PromptFileError(f"{path}: expected 4 exemplars, got {len(data['exemplars'])}")
    return data


def check_prompt_set(prompt_set: str) -> str:
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"prompts must be one of {list(PROMPT_SETS)}, got {prompt_set!r}")
    return prompt_set


@functools.lru_cache(maxsize=len(PROMPT_SETS))
def templates(prompt_set: str = DEFAULT_PROMPT_SET) -> _Templates:
    """The templates of one prompt set."""
    check_prompt_set(prompt_set)
    return _Templates(
        explore=_load("explore.yaml", ("instruction", "kg_notes", "answer_prefix", "exemplars"), prompt_set),
        complete=_load("complete.yaml", ("instruction", "exemplars"), prompt_set),
        kg_to_text=_load("kg_to_text.yaml", ("instruction", "exemplars"), prompt_set),
    )


def _triplets(rows: Sequence[Sequence[str]]) -> list[Triplet]:
    return [Triplet(str(s), str(r), str(o)) for s, r, o in rows]


def _sentences(triplets: Sequence[Triplet]) -> str:
    """A template rendering of triplets as sentences, used for the exemplars of the
    KG-to-Text strategy (the question's own graph is rewritten by a model call)."""
    if not triplets:
        return EMPTY_KG
    return " ".join(f"{t.subject} {t.relation} {t.object}." for t in triplets)


def render_kg(triplets: Sequence[Triplet], kg_format: str = "triplets", kg_text: str | None = None) -> str:
    """The graph block of the exploration prompt in one of the three strategies.
    `kg_text` is the KG-to-Text model output for `triplets` (required for "text" unless empty)."""
    if kg_format not in KG_FORMATS:
        raise ValueError(f"kg_format must be one of {KG_FORMATS}, got {kg_format!r}")
    if kg_format == "triplets":
        return render_triplets(triplets)
    if kg_format == "paths":
        return render_paths(triplets)
    if not triplets:
        return EMPTY_KG
    if kg_text is None:
        raise ValueError("kg_format='text' needs kg_text (the KG-to-Text output) for a non-empty graph")
    text = " ".join(kg_text.split())
    return text or EMPTY_KG


def _exploration_output(out: dict[str, Any]) -> str:
    if "answer" in out:
        return outputs.exploration_answer(out["thought"], out["answer"])
    return outputs.exploration_guidance(GuidancePair(str(e), str(g)) for e, g in out["pairs"])


def _exploration_head(fewshot: bool, kg_format: str, prompt_set: str = DEFAULT_PROMPT_SET) -> str:
    t = templates(prompt_set).explore
    parts = [t["instruction"]]
    if kg_format != "triplets":
        parts.append(t["kg_notes"][kg_format])
    head = "\n".join(parts)
    if not fewshot:
        return head + "\n\n"
    blocks = []
    for ex in t["exemplars"]:
        ex_triplets = _triplets(ex["triplets"])
        kg = _sentences(ex_triplets) if kg_format == "text" else render_kg(ex_triplets, kg_format)
        blocks.append(f"{QUESTION} {ex['question']}\n{KG_HEADER}\n{kg}\n{_exploration_output(ex['output'])}")
    return head + "\n\n" + "\n\n".join(blocks) + "\n\n"


def render_exploration_prompt(
    question: str,
    triplets: Sequence[Triplet],
    *,
    fewshot: bool = True,
    kg_format: str = "triplets",
    kg_text: str | None = None,
    prompt_set: str = DEFAULT_PROMPT_SET,
) -> str:
    """I_exp(q, G): instruction, exemplars, the question and the graph so far. The model's
    output starts with the judgement line (`outputs.JUDGEMENT`)."""
    kg = render_kg(triplets, kg_format, kg_text)
    return f"{_exploration_head(fewshot, kg_format, prompt_set)}{QUESTION} {question.strip()}\n{KG_HEADER}\n{kg}\n"


def answer_prefix(prompt_set: str = DEFAULT_PROMPT_SET) -> str:
    """How the forced answering call starts its answer: the judgement fixed to Yes, then
    `Thought:`. The call sends the exploration prompt with this as the response prefix
    (`GenerationRequest.prefix`), so the model writes only the thought and the answer; the
    recorded output starts with it."""
    return templates(prompt_set).explore["answer_prefix"]


def render_passage(passage: Passage) -> str:
    """One document line of the completion prompt: `Title: text` on one line."""
    text = " ".join(passage.text.split())
    title = " ".join(passage.title.split())
    return f"{title}: {text}" if title else text


def _completion_block(pair: GuidancePair, documents: Sequence[str]) -> str:
    docs = "\n".join(documents) if documents else EMPTY_KG
    return f"{DOCUMENTS}\n{docs}\n{PAIR_HEADER}\n{pair.render()}\n{TRIPLETS_HEADER}\n"


def render_completion_prompt(pair: GuidancePair, passages: Sequence[Passage], *, fewshot: bool = True,
                             prompt_set: str = DEFAULT_PROMPT_SET) -> str:
    """I_com(e, r, C): instruction, exemplars, the retrieved documents and the guidance pair.
    The model's output is one `(subject; relation; object)` per line."""
    t = templates(prompt_set).complete
    parts = [t["instruction"] + "\n\n"]
    if fewshot:
        for ex in t["exemplars"]:
            docs = [render_passage(Passage(id="", title=str(a), text=str(b))) for a, b in ex["documents"]]
            block = _completion_block(GuidancePair(*map(str, ex["pair"])), docs)
            parts.append(block + outputs.completion(_triplets(ex["triplets"])) + "\n\n")
    parts.append(_completion_block(pair, [render_passage(p) for p in passages]))
    return "".join(parts)


def render_kg_to_text_prompt(triplets: Sequence[Triplet], *, fewshot: bool = True) -> str:
    """KG-to-Text: ask the model to rewrite the triplets as sentences (output after `Text:`)."""
    t = templates().kg_to_text
    parts = [t["instruction"] + "\n\n"]
    if fewshot:
        for ex in t["exemplars"]:
            kg = render_triplets(_triplets(ex["triplets"]))
            parts.append(f"{TEXT_KG_HEADER}\n{kg}\n{TEXT_HEADER} {ex['text']}\n\n")
    parts.append(f"{TEXT_KG_HEADER}\n{render_triplets(triplets)}\n{TEXT_HEADER}")
    return "".join(parts)


def exemplar_names(prompt_set: str = DEFAULT_PROMPT_SET) -> set[str]:
    """Every entity name the exemplars of a prompt set use (to check they stay clear of evaluation data)."""
    t = templates(prompt_set)
    names: set[str] = set()
    for ex in t.explore["exemplars"]:
        names.update(str(x) for tr in ex["triplets"] for x in (tr[0], tr[2]))
        names.update(str(e) for e, _ in ex["output"].get("pairs", ()))
    for ex in t.complete["exemplars"]:
        names.update(str(d[0]) for d in ex["documents"])
        names.update(str(x) for tr in ex["triplets"] for x in (tr[0], tr[2]))
    for ex in t.kg_to_text["exemplars"]:
        names.update(str(x) for tr in ex["triplets"] for x in (tr[0], tr[2]))
    return {n for n in names if not n.isdigit()}
