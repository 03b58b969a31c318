"""KnowTrace's sufficiency judgement as the calibration sees it: held-out gold prompts (what a gold trajectory says
at each exploration: "No" while a hop is missing, "Yes" once the chain is in the graph) and, on a model's own
explorations, whether the graph it holds there already names the gold answer.

`gold_judgement_prompts` gives the held-out prompts with their labels, `as_decision_prompt` one of them as the
judgement's `decisions.DecisionPrompt`; `graph_names_answer` the right judgement of an exploration of a run.
The figures of the judgement (scripts/lab/judgement.py) are scripts/lab/judgement_figures.py's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.gold_chain import chain_rounds, checked_chain
from knowtrace_train.methods.knowtrace.outputs import JUDGEMENT, SUFFICIENCY
from knowtrace_train.metrics import normalize_answer, question_kind
from knowtrace_train.trajectory import ModelCall, Trajectory

YES, NO = "Yes", "No"


@dataclass(frozen=True)
class JudgementPrompt:
    """One held-out exploration prompt of a gold trajectory and the judgement the gold trajectory makes there."""

    item_id: str
    kind: str | None  # "bridge", "comparison" or None
    hop: int  # rounds of hops already in the graph
    prompt: str
    label: str  # YES or NO


def gold_judgement_prompts(items: Iterable[QAItem], *, fewshot: bool = True, kg_format: str = "triplets",
                           prompt_set: str = "short") -> tuple[list[JudgementPrompt], dict[str, int]]:
    """Per item with a gold chain asked in n rounds (`chain_rounds`), its n + 1 exploration prompts as a gold
    trajectory shows them: the graph holding the hops of the first h rounds (h = 0..n), labelled No for h < n and
    Yes for h = n. The passages are not needed (an exploration prompt shows the graph only). Items without a chain
    are counted per reason."""
    import knowtrace_train.methods.knowtrace.prompts as prompts

    out: list[JudgementPrompt] = []
    skipped: Counter[str] = Counter()
    for it in items:
        chain = checked_chain(it)
        if isinstance(chain, str):
            skipped[chain] += 1
            continue
        rounds = chain_rounds(chain)
        for h in range(len(rounds) + 1):
            shown = [hop.triplet for r in rounds[:h] for hop in r]
            text = prompts.render_exploration_prompt(it.question, shown, fewshot=fewshot, kg_format=kg_format,
                                                     prompt_set=prompt_set)
            out.append(JudgementPrompt(it.id, question_kind(it), h, text, YES if h == len(rounds) else NO))
    return out, dict(sorted(skipped.items()))


def as_decision_prompt(p: JudgementPrompt, role: str):
    """`p` as the sufficiency judgement's `decisions.DecisionPrompt`: " Yes" against " No" after the judgement
    words, under `role`'s adapter."""
    from knowtrace_train.decisions import DecisionPrompt

    return DecisionPrompt(SUFFICIENCY, p.prompt, JUDGEMENT, role, (" " + YES, " " + NO), p.label == YES, p.item_id,
                          p.kind)


def graph_names_answer(traj: Trajectory, call: ModelCall) -> bool:
    """Whether the graph shown to exploration `call` (the triplets added before it) names a gold answer as a
    triplet's subject or object (normalized as EM normalizes): the graph then holds the answer's evidence, and
    "Yes" is the right judgement (for a bridge question; a comparison's answer may be named before its evidence)."""
    answers = {normalize_answer(a) for a in traj.answers if a}
    for t in traj.graph.triplets:
        if t.call < call.index and (normalize_answer(t.triplet.subject) in answers
                                    or normalize_answer(t.triplet.object) in answers):
            return True
    return False
