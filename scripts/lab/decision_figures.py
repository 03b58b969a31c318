"""A model's decisions on held-out gold prompts, as figures: what scripts/lab/decisions.py (every method) and
scripts/lab/judgement.py (KnowTrace) print.

Each `decisions.DecisionPrompt` is scored once (its options' next-token log-probabilities); the decision is the
positive option where its log-odds against the best other option exceed a threshold (0: the greedy choice among
the options; or the model's calibrated one). `label_figures` gives, for one set of prompts, the accuracy, each
label's recall, the balanced accuracy (their mean), the confusion counts and the mean P(positive) per label,
each with its 95% bootstrap interval over the prompts (the prompts of one question are resampled as if
independent: the intervals are narrower than a resampling of questions would give). `choice_figures` gives, for
the prompts whose gold takes a particular other option (`DecisionPrompt.choice`: TRACE's gold triple's letter),
that option's rank among the other options and whether the best-scored option of all is the gold one.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from knowtrace_train.decisions import DecisionPrompt, option_log_odds
from knowtrace_train.generation.base import OptionScores
from knowtrace_train.metrics import MIN_QUESTIONS_FOR_INTERVAL, bootstrap_interval


def interval(values: Sequence[float]) -> dict[str, Any]:
    """{"mean", "low", "high", "n"} of `values` (bootstrap_interval; None throughout for none)."""
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0}
    iv = bootstrap_interval(values)
    return {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}


def balanced_interval(right_pos: Sequence[float], right_neg: Sequence[float], *, resamples: int = 10_000,
                      seed: int = 0) -> dict[str, Any]:
    """The balanced accuracy (the mean of the two labels' recalls) and its 95% interval, each label's prompts
    resampled apart (stratified percentile bootstrap); None where a label has no prompt, no bounds where one has
    fewer than MIN_QUESTIONS_FOR_INTERVAL."""
    if not right_pos or not right_neg:
        return {"mean": None, "low": None, "high": None, "n": len(right_pos) + len(right_neg)}
    import numpy as np

    pos, neg = np.asarray(right_pos, dtype=float), np.asarray(right_neg, dtype=float)
    mean = float((pos.mean() + neg.mean()) / 2)
    out = {"mean": mean, "low": None, "high": None, "n": int(pos.size + neg.size)}
    if min(pos.size, neg.size) < MIN_QUESTIONS_FOR_INTERVAL:
        return out
    rng = np.random.default_rng(seed)
    means = (pos[rng.integers(0, pos.size, (resamples, pos.size))].mean(axis=1)
             + neg[rng.integers(0, neg.size, (resamples, neg.size))].mean(axis=1)) / 2
    out["low"], out["high"] = (float(x) for x in np.percentile(means, [2.5, 97.5]))
    return out


def p_positive(log_odds: float) -> float:
    """P(positive) / (P(positive) + P(the best other)) of a log-odds (NaN stays NaN)."""
    if math.isnan(log_odds):
        return log_odds
    return 1.0 / (1.0 + math.exp(-max(-700.0, min(700.0, log_odds))))


def label_figures(labels: Sequence[bool], log_odds: Sequence[float], threshold: float | None = None) -> dict[str, Any]:
    """The decisions (positive where the log-odds exceed `threshold`; None: 0, the greedy choice) against the gold
    `labels`: "prompts", "unscored" (NaN log-odds, left out of the rest), "accuracy", "recall_positive" (the
    positive said where the gold says it), "recall_negative", "balanced_accuracy", "confusion"
    ({gold_<pos|neg>_said_<pos|neg>: n}) and "p_positive_when_gold_positive" / "..._negative" (the mean
    P(positive)); each figure {"mean", "low", "high", "n"}."""
    t = 0.0 if threshold is None else threshold
    said = [(y, d > t, p_positive(d)) for y, d in zip(labels, log_odds) if not math.isnan(d)]
    pos = [float(s) for y, s, _ in said if y]
    neg = [float(not s) for y, s, _ in said if not y]
    name = {True: "pos", False: "neg"}
    return {
        "prompts": len(labels), "unscored": len(labels) - len(said),
        "accuracy": interval([float(y == s) for y, s, _ in said]),
        "recall_positive": interval(pos), "recall_negative": interval(neg),
        "balanced_accuracy": balanced_interval(pos, neg),
        "confusion": {f"gold_{name[g]}_said_{name[s]}": sum(1 for y, x, _ in said if (y, x) == (g, s))
                      for g in (True, False) for s in (True, False)},
        "p_positive_when_gold_positive": interval([q for y, _, q in said if y]),
        "p_positive_when_gold_negative": interval([q for y, _, q in said if not y]),
    }


def choice_figures(prompts: Sequence[DecisionPrompt], scores: Sequence[OptionScores | Exception]) -> dict[str, Any] | None:
    """Of the prompts with a `choice` (the gold takes that option, not the positive one), scored: "prompts";
    "rank", the choice's rank among the options after the positive (1: the best scored; ties go to the earlier
    option, as TRACE's beam search breaks them; an unreported option scores -inf); "top1", whether it ranks first
    there; "best_of_all", whether it is the best-scored option of all (the positive included: the step the
    engine's greedy choice takes); "options", the number it was ranked among. None where no prompt has a choice."""
    rows = []
    for p, s in zip(prompts, scores):
        if p.choice is None or not isinstance(s, OptionScores) or p.choice not in p.options[1:]:
            continue
        lp = [-math.inf if s.logprobs.get(o) is None else s.logprobs[o] for o in p.options]
        others = list(range(1, len(p.options)))
        order = sorted(others, key=lambda j: (-lp[j], j))
        gold = p.options.index(p.choice)
        best = min(range(len(p.options)), key=lambda j: (-lp[j], j))
        rows.append((order.index(gold) + 1, best == gold, len(others)))
    if not any(p.choice is not None for p in prompts):
        return None
    return {"prompts": sum(1 for p in prompts if p.choice is not None), "scored": len(rows),
            "rank": interval([float(r) for r, _, _ in rows]), "top1": interval([float(r == 1) for r, _, _ in rows]),
            "best_of_all": interval([float(b) for _, b, _ in rows]),
            "options": interval([float(n) for _, _, n in rows])}


def decision_figures(prompts: Sequence[DecisionPrompt], scores: Sequence[OptionScores | Exception],
                     thresholds: dict[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """Per decision kind of `prompts` (sorted): its options, the labels' counts, `label_figures` at the greedy
    choice ("greedy") and, where `thresholds` holds one for the kind, at it ("calibrated", with "threshold"),
    and `choice_figures` where the kind's prompts carry a choice ("choice")."""
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({p.kind for p in prompts}):
        idx = [i for i, p in enumerate(prompts) if p.kind == kind]
        ps, ss = [prompts[i] for i in idx], [scores[i] for i in idx]
        labels = [p.label for p in ps]
        odds = [option_log_odds(s, p.options) for s, p in zip(ss, ps)]
        positive = ps[0].options[0]
        negatives = sorted({o for p in ps for o in p.options[1:]})
        entry: dict[str, Any] = {
            "positive": positive, "negative": negatives[0] if len(negatives) == 1 else "the best other option",
            "prompts": len(ps), "gold_positive": sum(labels), "gold_negative": len(ps) - sum(labels),
            "questions": len({p.item_id for p in ps}), "greedy": label_figures(labels, odds)}
        t = (thresholds or {}).get(kind)
        if t is not None:
            entry["calibrated"] = {"threshold": t, **label_figures(labels, odds, t)}
        choice = choice_figures(ps, ss)
        if choice is not None:
            entry["choice"] = choice
        out[kind] = entry
    return out
