"""Decisions inside a record's completion, and the loss weights that make each one learned from its evidence.

A method's decision call (KnowTrace's sufficiency judgement, DoG's answer try, ...) writes a few tokens that
decide what the engine does next (" Yes" or " No"), inside a completion of tens of other tokens. Trained as
plain tokens, a decision carries a few percent of the loss, and the model learns the labels' proportion rather
than the evidence (the bootstrapped M0 judged its graph sufficient in 0 of 66 explorations: docs/selftrain.md,
"Decisions"). A record marks its decision with `mark_decision` (its kind, its label and the span of the
completion's characters that state it); `decision_weights` gives each marked span a loss weight: balanced over
the labels of its kind (each label's records together weigh as much as every other label's) and scaled by
`decision_weight` (train.decision_weight), so that a decision is learned from which prompts carry which label.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Sequence

from knowtrace_train.generation.base import (
    GenerationError, GenerationRequest, OptionScorer, OptionScores, generate_each, request_seed, score_each)

#: the record field that marks a decision: {"kind", "label", "start", "end"} (characters of the completion)
DECISION = "decision"


def mark_decision(record: MutableMapping[str, Any], kind: str, label: str, start: int, end: int) -> MutableMapping[str, Any]:
    """Marks `record`'s decision: the completion's characters [start, end) state `label` of decision `kind`."""
    completion = record.get("completion", "")
    if not (0 <= start < end <= len(completion)):
        raise ValueError(f"a decision span [{start}, {end}) outside the completion of {len(completion)} characters")
    record[DECISION] = {"kind": kind, "label": label, "start": start, "end": end}
    return record


def decision_of(record: Mapping[str, Any], where: str = "record") -> dict[str, Any] | None:
    """The record's decision mark, checked (None where it has none); a malformed one raises naming `where`."""
    d = record.get(DECISION)
    if d is None:
        return None
    completion = record.get("completion")
    ok = (isinstance(d, Mapping) and isinstance(d.get("kind"), str) and isinstance(d.get("label"), str)
          and isinstance(d.get("start"), int) and isinstance(d.get("end"), int) and isinstance(completion, str)
          and 0 <= d["start"] < d["end"] <= len(completion))
    if not ok:
        raise ValueError(f"{where}: field 'decision' must be {{kind, label, start, end}} with 0 <= start < end <= "
                         f"the completion's length, got {d!r}")
    return dict(d)


def decision_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per decision kind, the records of each label."""
    counts: dict[str, Counter] = {}
    for r in records:
        d = decision_of(r)
        if d is not None:
            counts.setdefault(d["kind"], Counter())[d["label"]] += 1
    return {k: dict(sorted(c.items())) for k, c in sorted(counts.items())}


def decision_weights(records: Sequence[Mapping[str, Any]], decision_weight: float | None) -> list[float | None]:
    """Per record, the loss weight of its decision's tokens (None: no decision, or weighting off). With
    `decision_weight` w, a record of label l of kind k weighs w * n_k / (L_k * n_kl): n_k the kind's marked
    records, L_k its labels, n_kl the label's; each label then weighs w * n_k / L_k in all, and a kind whose
    labels are balanced weighs w a token, as many records as it has. A kind whose records all carry one label
    is not weighted (None): there is no evidence to tell its labels apart, and weighting would only push that
    label harder (an iteration whose model never judged its graph sufficient has "No" records only). None or 0:
    no weighting."""
    if not decision_weight:
        return [None] * len(records)
    counts = decision_counts(records)
    out: list[float | None] = []
    for r in records:
        d = decision_of(r)
        labels = counts[d["kind"]] if d is not None else {}
        if len(labels) < 2:
            out.append(None)
            continue
        n = sum(labels.values())
        out.append(decision_weight * n / (len(labels) * labels[d["label"]]))
    return out


# -- a decision as a calibrated threshold ---------------------------------------------------------------
# Greedy decoding says " Yes" where P(" Yes") beats P(" No") (and every other token). A trained model can tell the
# labels apart (its P(Yes) is higher where the gold says Yes) and still fall on one side of that point for every
# prompt, and which side is the training seed's (docs/decisions.md). A threshold on the log-odds
# log P(yes) - log P(no), chosen where held-out gold prompts are told apart best, decides from the evidence the
# model does read, whatever its bias.

@dataclass(frozen=True)
class DecisionPrompt:
    """A held-out gold prompt of one decision: the prompt and the fed prefix after which the model states it,
    under `role`'s adapter; `options` the words it states it with, the positive first and then the others
    (KnowTrace's " Yes", " No"; TRACE's selector "A", the stop, then every candidate triple's letter); `label`
    True where the gold trajectory states the positive one there. `choice`: where the gold states another
    option than the positive, which one where that matters (TRACE's gold triple's letter), else None."""

    kind: str
    prompt: str
    prefix: str
    role: str
    options: tuple[str, ...]
    label: bool
    item_id: str = ""
    #: the question's kind ("bridge", "comparison") where known
    question_kind: str | None = None
    choice: str | None = None
    #: a decision the engine reads from free text (IRCoT's stop: "answer is" anywhere in its sentence) rather than
    #: between fixed words: the model writes up to `max_new_tokens` tokens (until a `stop` string), greedily, and
    #: `reads(text)` is whether the engine takes the positive option from it (`options` then only name the two)
    reads: Callable[[str], bool] | None = None
    max_new_tokens: int = 0
    stop: tuple[str, ...] = ()


def option_log_odds(scores: OptionScores | Exception, options: Sequence[str]) -> float:
    """log P(options[0]) - the highest log P of the other options, of an `OptionScores` (two options: the
    log-odds of the first against the second; more: positive exactly where the first is the most likely); a
    missing option (a backend reports only its top tokens) counts as -inf; NaN where none is known or scoring
    failed."""
    if not isinstance(scores, OptionScores):
        return math.nan
    values = [scores.logprobs.get(o) for o in options]
    if all(v is None for v in values):
        return math.nan
    pos = -math.inf if values[0] is None else values[0]
    neg = max((-math.inf if v is None else v) for v in values[1:])
    return pos - neg


def score_prompts(scorer: OptionScorer, prompts: Sequence[DecisionPrompt], batch: int = 32
                  ) -> list[OptionScores | Exception]:
    """Each prompt's options scored (`score_each`: one prefill a prompt, no decoding), in batches of `batch`; a
    prompt the engine reads from free text (`DecisionPrompt.reads`) is decoded greedily instead and read as the
    engine reads it, its scores then log P 0 for the option taken and -inf for the other (`read_decisions`)."""
    out: list[OptionScores | Exception | None] = [None] * len(prompts)
    scored = [i for i, p in enumerate(prompts) if p.reads is None]
    read = [i for i, p in enumerate(prompts) if p.reads is not None]
    for lo in range(0, len(scored), batch):
        idx = scored[lo : lo + batch]
        part = [prompts[i] for i in idx]
        requests = [GenerationRequest(prompt=p.prompt, prefix=p.prefix, role=p.role, max_new_tokens=1) for p in part]
        for i, s in zip(idx, score_each(scorer, requests, [list(p.options) for p in part])):
            out[i] = s
    for lo in range(0, len(read), batch):
        idx = read[lo : lo + batch]
        for i, s in zip(idx, read_decisions(scorer, [prompts[i] for i in idx])):
            out[i] = s
    return out  # type: ignore[return-value]


def read_decisions(generator: Any, prompts: Sequence[DecisionPrompt]) -> list[OptionScores | Exception]:
    """Prompts whose decision the engine reads from free text: each decoded greedily (`generate_each`: a refused
    request comes back as its error, in its place) and read with its `reads`; the option taken scores log P 0,
    the other -inf, so `option_log_odds` is +inf where the positive is taken and -inf where not."""
    requests = [GenerationRequest(prompt=p.prompt, prefix=p.prefix, role=p.role, max_new_tokens=p.max_new_tokens,
                                  stop=p.stop) for p in prompts]
    out: list[OptionScores | Exception] = []
    for p, c in zip(prompts, generate_each(generator, requests)):
        if isinstance(c, Exception):
            out.append(c)
            continue
        took = bool(p.reads(c.text))  # type: ignore[misc]
        out.append(OptionScores({p.options[0]: 0.0 if took else -math.inf,
                                 p.options[1]: -math.inf if took else 0.0}, c.prompt_tokens, c.truncated_tokens))
    return out


def score_decisions(scorer: OptionScorer, prompts: Sequence[DecisionPrompt], batch: int = 32) -> list[float]:
    """The log-odds (`option_log_odds`) of each prompt's positive option, in batches of `batch`."""
    return [option_log_odds(s, p.options) for s, p in zip(score_prompts(scorer, prompts, batch), prompts)]


def choose_threshold(log_odds: Sequence[float], labels: Sequence[bool]) -> dict[str, Any] | None:
    """The threshold t (say positive where log-odds > t) that tells `labels` apart best: the highest balanced
    accuracy (the mean of the two labels' recalls, so that the commoner label does not decide); among equals,
    the one nearest 0 (the greedy point), placed halfway between two neighbouring scores. None where a label is
    missing (nothing to tell apart) or no score is finite. Returns the threshold and its figures on these prompts."""
    pairs = [(d, bool(y)) for d, y in zip(log_odds, labels) if not math.isnan(d)]
    pos, neg = sum(1 for _, y in pairs if y), sum(1 for _, y in pairs if not y)
    finite = sorted({d for d, _ in pairs if math.isfinite(d)})
    if not pos or not neg or not finite:
        return None
    cuts = [finite[0] - 1.0] + [(a + b) / 2 for a, b in zip(finite, finite[1:])] + [finite[-1] + 1.0, 0.0]

    def figures(t: float) -> tuple[float, float, float]:
        ry = sum(1 for d, y in pairs if y and d > t) / pos
        rn = sum(1 for d, y in pairs if not y and d <= t) / neg
        return (ry + rn) / 2, ry, rn

    best = max(cuts, key=lambda t: (round(figures(t)[0], 12), -abs(t)))
    bal, ry, rn = figures(best)
    greedy = figures(0.0)
    return {"threshold": round(best, 6), "balanced_accuracy": round(bal, 4), "recall_yes": round(ry, 4),
            "recall_no": round(rn, 4), "positives": pos, "negatives": neg, "unscored": len(log_odds) - len(pairs),
            "greedy": {"balanced_accuracy": round(greedy[0], 4), "recall_yes": round(greedy[1], 4),
                       "recall_no": round(greedy[2], 4)}}


def calibrate(scorer: OptionScorer, prompts: Sequence[DecisionPrompt]) -> dict[str, dict[str, Any]]:
    """Per decision kind of `prompts`, `choose_threshold` over the scorer's log-odds (`thresholds_by_kind`)."""
    scores = score_decisions(scorer, prompts)
    return thresholds_by_kind(((p.kind, d, p.label) for p, d in zip(prompts, scores)),
                              "the held-out prompts carry one label only, or none was scored")


def thresholds_by_kind(rows: Iterable[tuple[str, float, bool]], why: str) -> dict[str, dict[str, Any]]:
    """Per decision kind of `rows` ((kind, log-odds, label)), sorted by kind: `choose_threshold`'s result, or
    {"threshold": None, "positives", "negatives", "why": `why`} where the kind cannot be calibrated; each with
    its "prompts" count."""
    by_kind: dict[str, list[tuple[float, bool]]] = {}
    for kind, d, label in rows:
        by_kind.setdefault(kind, []).append((d, bool(label)))
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted(by_kind):
        scores, labels = [d for d, _ in by_kind[kind]], [y for _, y in by_kind[kind]]
        out[kind] = choose_threshold(scores, labels) or {
            "threshold": None, "positives": sum(labels), "negatives": len(labels) - sum(labels), "why": why}
        out[kind]["prompts"] = len(labels)
    return out


def thresholds_of(calibration: Mapping[str, Mapping[str, Any]] | None) -> dict[str, float]:
    """{kind: threshold} of a calibration (`calibrate`'s result, as calibration.json holds it), the kinds with one."""
    return {k: float(v["threshold"]) for k, v in (calibration or {}).items()
            if isinstance(v, Mapping) and v.get("threshold") is not None}


# -- an engine deciding by a threshold ------------------------------------------------------------------

@dataclass(frozen=True)
class Decided:
    """A decision taken from the scores: `word` (one of the options), which the engine feeds after the call's
    prefix and records as the model's output (so training puts its loss on it, as on a generated token), and the
    log-odds it was taken from."""

    word: str
    log_odds: float


def require_scorer(generator: Any, what: str) -> None:
    """A one-line GenerationError where `generator` cannot score options (`what`: the setting that needs it)."""
    if not isinstance(generator, OptionScorer):
        raise GenerationError(f"{what} needs a generator with score_options "
                              f"(knowtrace_train.generation.base.OptionScorer); {type(generator).__name__} has none")


def decide(scorer: OptionScorer, requests: Sequence[GenerationRequest], options: tuple[str, str], threshold: float,
           temperature: float, seeds: Sequence[int]) -> tuple[list[Decided | None], float]:
    """Each request's decision between `options` (positive, negative) from one batched scoring of its next token
    after its prefix (no decoding): the positive where log P(positive) - log P(negative) exceeds `threshold`; at a
    `temperature` above 0 drawn with probability sigmoid((log-odds - threshold) / temperature) from the request's
    own stream (`seeds[i]`: the same call decides the same on a rerun, whatever else is in the batch). None where
    the log-odds are unknown (the scorer refused the request, neither option reported): the call is left to greedy
    decoding. Returns the decisions and the seconds the scoring took."""
    requests = list(requests)
    t0 = time.perf_counter()
    scores = score_each(scorer, requests, [list(options)] * len(requests))
    dt = time.perf_counter() - t0
    out: list[Decided | None] = []
    for sc, seed in zip(scores, seeds):
        d = option_log_odds(sc, options)
        if math.isnan(d):
            out.append(None)
            continue
        margin = d - threshold
        if temperature > 0:
            u = random.Random(seed).random()
            yes = u < 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, margin / temperature))))
        else:
            yes = margin > 0
        out.append(Decided(options[0] if yes else options[1], d))
    return out, dt


def decide_jobs(scorer: OptionScorer, jobs: Sequence[Any], *, prefix: str, role: str, threshold: float,
                temperature: float, seed: int, stream: str) -> float:
    """An engine's calls decided by `threshold` (`decide`, " Yes" against " No" after `prefix` under `role`): each
    job (an engine's pending call: its `prompt` and `state.traj`) gets `decided` (the word to feed and record as
    output) and `log_odds` where the scores are known, and its question's trajectory its share of the scoring's
    seconds. Each call draws on its own stream: `request_seed(seed, trajectory id, the call's index, stream)`.
    Returns the seconds."""
    requests = [GenerationRequest(prompt=j.prompt, prefix=prefix, role=role, max_new_tokens=1) for j in jobs]
    seeds = [request_seed(seed, j.state.traj.id, len(j.state.traj.calls), stream) for j in jobs]
    decided, dt = decide(scorer, requests, (" Yes", " No"), threshold, temperature, seeds)
    for j, d in zip(jobs, decided):
        j.state.traj.wall_time += dt / len(jobs)
        if d is not None:
            j.decided, j.log_odds = d.word, d.log_odds
    return dt
