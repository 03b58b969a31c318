"""KnowTrace's sufficiency judgement measured (scripts/lab/judgement.py): `score_judgements` reads the model's
log P(" Yes") - log P(" No") after the judgement words (one prefill a prompt, `OptionScorer`); `judgement_figures`
the decision at a threshold (0: greedy): the accuracy, each label's recall and the mean P(Yes), each with its
interval; `exploration_confusion` counts a run's explorations by (the graph holds the answer, the model said Yes).
The held-out prompts are the package's (`methods/knowtrace/judgement.py`, which the calibration uses).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.knowtrace.config import EXPLORE
from knowtrace_train.methods.knowtrace.judgement import NO, YES, JudgementPrompt, as_decision_prompt, graph_names_answer
from knowtrace_train.metrics import question_kind
from knowtrace_train.trajectory import ModelCall, Trajectory


def score_judgements(scorer, prompts: Sequence[JudgementPrompt], role: str, prefill_judgement: bool = True,
                     batch: int = 32) -> list[float]:
    """log P(" Yes") - log P(" No") of each prompt after the judgement words (fed as the engine feeds them
    where `prefill_judgement`, else after the prompt with the words as the prefix all the same: the decision is
    the token after them), through `scorer.score_options` under `role`'s adapter (`decisions.score_decisions`;
    NaN where unscored)."""
    from knowtrace_train.decisions import score_decisions

    return score_decisions(scorer, [as_decision_prompt(p, role) for p in prompts], batch)


def judgement_figures(prompts: Sequence[JudgementPrompt], log_odds: Sequence[float],
                      threshold: float | None = None) -> dict[str, Any]:
    """The judgement (Yes where the log-odds exceed `threshold`; None: 0, the greedy choice of the two) against the
    gold labels (`decision_figures.label_figures`, its keys named for Yes and No): accuracy, the recall of each
    label (Yes said where the gold says Yes; No where No), the balanced accuracy, the confusion counts and the
    mean P(Yes) per label, each mean with its 95% bootstrap interval over the prompts; and the same for the bridge
    questions alone."""
    from decision_figures import label_figures

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
