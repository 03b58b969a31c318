"""KnowTrace's sufficiency judgement measured: on held-out gold prompts (what a gold trajectory says at each
exploration: "No" while a hop is missing, "Yes" once the chain is in the graph) and on a model's own
explorations (whether the graph it holds there already names the gold answer).

`gold_judgement_prompts` gives the held-out prompts with their labels; `score_judgements` reads the model's
log P(" Yes") - log P(" No") after the judgement words (one prefill a prompt, `OptionScorer`); `judgement_figures`
the decision at a threshold (0: greedy): the accuracy, each label's recall and the mean P(Yes), each with its interval.
`exploration_confusion` counts a run's explorations by (the graph holds the answer, the model said Yes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.gold_chain import chain_rounds, checked_chain
from knowtrace_train.methods.knowtrace.config import EXPLORE
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


def score_judgements(scorer, prompts: Sequence[JudgementPrompt], role: str, prefill_judgement: bool = True,
                     batch: int = 32) -> list[float]:
    """log P(" Yes") - log P(" No") of each prompt after the judgement words (fed as the engine feeds them
    where `prefill_judgement`, else after the prompt with the words as the prefix all the same: the decision is
    the token after them), through `scorer.score_options` under `role`'s adapter (`decisions.score_decisions`;
    NaN where unscored)."""
    from knowtrace_train.decisions import score_decisions

    return score_decisions(scorer, [as_decision_prompt(p, role) for p in prompts], batch)


def as_decision_prompt(p: JudgementPrompt, role: str):
    """`p` as the sufficiency judgement's `decisions.DecisionPrompt`: " Yes" against " No" after the judgement
    words, under `role`'s adapter."""
    from knowtrace_train.decisions import DecisionPrompt

    return DecisionPrompt(SUFFICIENCY, p.prompt, JUDGEMENT, role, (" " + YES, " " + NO), p.label == YES, p.item_id,
                          p.kind)


def judgement_figures(prompts: Sequence[JudgementPrompt], log_odds: Sequence[float],
                      threshold: float | None = None) -> dict[str, Any]:
    """The judgement (Yes where the log-odds exceed `threshold`; None: 0, the greedy choice of the two) against the
    gold labels (`decision_figures.label_figures`, its keys named for Yes and No): accuracy, the recall of each
    label (Yes said where the gold says Yes; No where No), the balanced accuracy, the confusion counts and the
    mean P(Yes) per label, each mean with its 95% bootstrap interval over the prompts; and the same for the bridge
    questions alone."""
    from knowtrace_train.decision_figures import label_figures

    def figures(pairs: list[tuple[JudgementPrompt, float]]) -> dict[str, Any]:
        f = label_figures([p.label == YES for p, _ in pairs], [d for _, d in pairs], threshold)
        word = {"pos": YES, "neg": NO}
        return {
            "prompts": f["prompts"], "unscored": f["unscored"], "accuracy": f["accuracy"],
            "recall_yes": f["recall_positive"], "recall_no": f["recall_negative"],
            "balanced_accuracy": f["balanced_accuracy"]["mean"], "balanced_accuracy_interval": f["balanced_accuracy"],
            "confusion": {f"gold_{word[g]}_said_{word[s]}": f["confusion"][f"gold_{g}_said_{s}"]
                          for g in ("pos", "neg") for s in ("pos", "neg")},
            "p_yes_when_gold_yes": f["p_positive_when_gold_positive"],
            "p_yes_when_gold_no": f["p_positive_when_gold_negative"],
        }

    pairs = list(zip(prompts, log_odds))
    return {"threshold": threshold, "all": figures(pairs),
            "bridge": figures([(p, q) for p, q in pairs if p.kind == "bridge"])}


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


def said_sufficient(call: ModelCall) -> bool | None:
    """The judgement of an exploration call as its parser read it (None where it read none)."""
    parsed = call.parsed if isinstance(call.parsed, Mapping) else {}
    value = parsed.get("sufficient")
    return value if isinstance(value, bool) else None


def exploration_confusion(trajectories: Iterable[Trajectory], items_by_id: Mapping[str, QAItem]) -> dict[str, Any]:
    """A run's explorations (role "explore"; the forced answer is not one) counted by whether the graph shown
    names the gold answer (`graph_names_answer`) and what the model judged: {kind: {"holds_yes", "holds_no",
    "holds_none", "lacks_yes", ...}} for "all", "bridge" and "comparison"; with the share of the explorations
    whose graph holds the answer that said Yes, of the others that said No, and the right answers per source
    (an exploration that answered, or the forced answer)."""
    counts: dict[str, Counter[str]] = {k: Counter() for k in ("all", "bridge", "comparison")}
    right: dict[str, Counter[str]] = {k: Counter() for k in counts}
    for t in trajectories:
        kind = question_kind(items_by_id.get(t.question_id))
        kinds = ["all"] + ([kind] if kind in counts else [])
        for c in t.calls:
            if c.role != EXPLORE:
                continue
            holds = "holds" if graph_names_answer(t, c) else "lacks"
            said = {True: "yes", False: "no", None: "none"}[said_sufficient(c)]
            for k in kinds:
                counts[k][f"{holds}_{said}"] += 1
        if t.em is not None and t.em >= 1.0:
            source = "forced" if t.stop_reason != "answered" else "explored"
            for k in kinds:
                right[k][source] += 1
    out: dict[str, Any] = {}
    for k, c in counts.items():
        holds = c["holds_yes"] + c["holds_no"] + c["holds_none"]
        lacks = c["lacks_yes"] + c["lacks_no"] + c["lacks_none"]
        out[k] = {**{key: c[key] for key in (f"{h}_{s}" for h in ("holds", "lacks") for s in ("yes", "no", "none"))},
                  "yes_when_holds": c["holds_yes"] / holds if holds else None,
                  "no_when_lacks": c["lacks_no"] / lacks if lacks else None,
                  "right_explored": right[k]["explored"], "right_forced": right[k]["forced"]}
    return out
