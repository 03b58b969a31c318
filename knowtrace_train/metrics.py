"""Answer scores: the official HotpotQA normalisation, EM and F1, MINTQA's accuracy, their means and their uncertainty.

`normalize_answer` and `exact_match` are the official rules of HotpotQA (hotpot_evaluate_v1.py),
2WikiMultihopQA (2wikimultihop_evaluate_v1.1.py) and MuSiQue (metrics/answer.py): the same
normalisation. F1 differs by benchmark (`f1_precision_recall`'s `rules`):

- ``"hotpotqa"`` (HotpotQA's and 2Wiki's scripts; the default): when either normalised side is
  "yes", "no" or "noanswer" and the two differ, F1 is 0; two sides that normalise to nothing score 0.
- ``"musique"`` (MuSiQue's own metric, SQuAD's `compute_f1`): no yes/no rule; where either side
  normalises to nothing, F1 is 1 if both do, else 0.

`score(..., dataset=)` picks the rules from the item's dataset ("musique" -> MuSiQue's, anything
else -> HotpotQA's). 2Wiki's v1.1 script also scores against the aliases and demonyms of the
answer's Wikidata id (`id_aliases.json`): the 2Wiki reader puts them into the item's answers, so the
maximum over answers below is that script's rule.

`accuracy` is MINTQA's metric (its §4.2): does the gold answer appear in the predicted text.
Here both sides are normalised first and the gold must appear as whole tokens, so "no" does not
count as found in "Norway".

Against several gold answers (first = canonical, rest = aliases) each metric takes its maximum
over the answers separately, as the official scripts do.

How sure a mean is: `bootstrap_interval` gives a percentile-bootstrap interval of the mean of
per-question scores, `paired_test` compares two models on the same questions (exact McNemar for
0/1 scores such as EM, a paired bootstrap otherwise), and `em_by_kind` splits scores into bridge
and comparison questions (`question_kind`). Under `MIN_QUESTIONS_FOR_INTERVAL` questions no
interval is given, only the mean and a note saying so; every resampling is seeded, so the same
scores give the same numbers.

MINTQA's breakdowns: `familiarity_share` labels a question by the share of popular (MINTQA-POP) or
new (MINTQA-TI) facts in its chain, and `scores_by_group` gives accuracy, EM (with its interval)
and F1 per group (hop count, kind, familiarity).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 where the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


#: F1 rules by benchmark (see the module's doc): HotpotQA's and 2Wiki's scripts, or MuSiQue's
F1_RULES = ("hotpotqa", "musique")


def f1_rules(dataset: str | None) -> str:
    """The F1 rules a benchmark's official script uses: "musique" for MuSiQue, else "hotpotqa"."""
    return "musique" if isinstance(dataset, str) and dataset.strip().lower() == "musique" else "hotpotqa"


def f1_precision_recall(prediction: str, gold: str, *, rules: str = "hotpotqa") -> tuple[float, float, float]:
    """Token-level (F1, precision, recall) of the normalised strings under `rules` (see `F1_RULES`)."""
    if rules not in F1_RULES:
        raise ValueError(f"f1 rules must be one of {', '.join(F1_RULES)}, got {rules!r}")
    pred = normalize_answer(prediction)
    ref = normalize_answer(gold)
    pred_tokens = pred.split()
    ref_tokens = ref.split()
    if rules == "musique":
        if not pred_tokens or not ref_tokens:
            agree = float(pred_tokens == ref_tokens)
            return agree, agree, agree
    elif (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0, 0.0, 0.0
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1(prediction: str, gold: str, *, rules: str = "hotpotqa") -> float:
    """Token-level F1 of the normalised strings (HotpotQA's rules, or MuSiQue's with rules="musique")."""
    return f1_precision_recall(prediction, gold, rules=rules)[0]


def accuracy(prediction: str, gold: str) -> float:
    """1.0 where the normalised gold appears, as whole tokens, in the normalised prediction.

    A gold that normalises to nothing (e.g. "the") counts as found only in a prediction that
    also normalises to nothing."""
    pred = normalize_answer(prediction)
    ref = normalize_answer(gold)
    if not ref:
        return float(not pred)
    return float(f" {ref} " in f" {pred} ")


def score(prediction: str | None, answers: Sequence[str] | str, *, dataset: str | None = None) -> dict[str, float]:
    """{"em", "f1", "acc"} of one prediction, each the maximum over the gold answers; F1 under the
    rules of `dataset`'s official script (`f1_rules`: MuSiQue's for "musique", else HotpotQA's).

    A missing prediction (None: the method gave no answer) scores zero on all three."""
    golds = (answers,) if isinstance(answers, str) else tuple(answers)
    if not golds:
        raise ValueError("score: no gold answers given")
    if prediction is None:
        return {"em": 0.0, "f1": 0.0, "acc": 0.0}
    return {
        "em": max(exact_match(prediction, g) for g in golds),
        "f1": max(f1(prediction, g, rules=f1_rules(dataset)) for g in golds),
        "acc": max(accuracy(prediction, g) for g in golds),
    }


def aggregate(scores: Iterable[Mapping[str, float]]) -> dict[str, float | int]:
    """Mean of each metric over `scores` (all with the same keys) plus "count".

    No scores gives em/f1/acc 0.0 with count 0 (never NaN, so the result stays valid JSON)."""
    rows = list(scores)
    if not rows:
        return {"em": 0.0, "f1": 0.0, "acc": 0.0, "count": 0}
    keys = list(rows[0])
    for i, row in enumerate(rows):
        if set(row) != set(keys):
            raise ValueError(f"aggregate: score {i} has keys {sorted(row)}, expected {sorted(keys)}")
    out: dict[str, float | int] = {k: sum(float(r[k]) for r in rows) / len(rows) for k in keys}
    out["count"] = len(rows)
    return out


# -- uncertainty ---------------------------------------------------------------------------------

#: Fewer per-question scores than this get a mean but no interval: a bootstrap of a handful of
#: questions gives an interval that looks precise and is not.
MIN_QUESTIONS_FOR_INTERVAL = 20

_TOO_FEW = f"n < {MIN_QUESTIONS_FOR_INTERVAL}: too few questions for an interval"

#: bootstrap indices drawn per block (resamples x questions), so 10,000 resamples of a 7,405-question
#: dev set need about 32 MB at a time instead of 600 MB
_BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Interval:
    """The mean of `n` per-question scores and its bootstrap interval at `confidence`.

    With fewer than `MIN_QUESTIONS_FOR_INTERVAL` scores `low` and `high` are None and `note` says
    why; print `format_interval(iv)` rather than the bounds."""

    mean: float
    low: float | None
    high: float | None
    n: int
    confidence: float = 0.95
    note: str | None = None


@dataclass(frozen=True)
class PairedComparison:
    """Model b against model a on the same `n` questions.

    `diff` = mean_b - mean_a; `low`/`high` its paired-bootstrap interval (None, with `note`, under
    `MIN_QUESTIONS_FOR_INTERVAL` questions); `p_value` two-sided, from `test`: "mcnemar" (exact,
    for 0/1 scores) or "paired_bootstrap"."""

    n: int
    mean_a: float
    mean_b: float
    diff: float
    low: float | None
    high: float | None
    p_value: float
    test: str
    confidence: float = 0.95
    note: str | None = None
    #: runs (seeds) pooled: `n` questions x `seeds` runs of each model (`pooled_paired_test`)
    seeds: int = 1


def _scores_array(values: Iterable[float], where: str) -> np.ndarray:
    arr = np.asarray([float(v) for v in values], dtype=np.float64)
    if arr.size == 0:
        raise ValueError(f"{where}: no scores given")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{where}: scores must be finite numbers")
    return arr


def _check_resampling(confidence: float, resamples: int, where: str) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"{where}: confidence must lie strictly between 0 and 1, got {confidence!r}")
    if not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"{where}: resamples must be a positive integer, got {resamples!r}")


def _bootstrap_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Means of `resamples` resamples (with replacement, same size) of `values`; deterministic for
    `seed`. Drawn in blocks of whole resamples to bound memory; each block is vectorised."""
    rng = np.random.default_rng(seed)
    n = values.size
    block = max(1, _BLOCK_ELEMENTS // n)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, block):
        stop = min(start + block, resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = values[idx].mean(axis=1)
    return means


def _percentiles(means: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_interval(
    values: Iterable[float], *, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> Interval:
    """Percentile-bootstrap interval of the mean of per-question scores (e.g. each question's EM).

    The same values and seed always give the same interval. Under `MIN_QUESTIONS_FOR_INTERVAL`
    values the Interval has the mean only (low/high None, `note` says why). No values is an error."""
    where = "bootstrap_interval"
    _check_resampling(confidence, resamples, where)
    arr = _scores_array(values, where)
    mean = float(arr.mean())
    if arr.size < MIN_QUESTIONS_FOR_INTERVAL:
        return Interval(mean=mean, low=None, high=None, n=int(arr.size), confidence=confidence, note=_TOO_FEW)
    low, high = _percentiles(_bootstrap_means(arr, resamples, seed), confidence)
    return Interval(mean=mean, low=low, high=high, n=int(arr.size), confidence=confidence)


def format_interval(iv: Interval, digits: int = 3) -> str:
    """The interval as text: `0.250 [0.167, 0.333] (n=24)`, or `0.250 (n=12; too few for an interval)`
    when it has no bounds."""
    if iv.low is None or iv.high is None:
        return f"{iv.mean:.{digits}f} (n={iv.n}; too few for an interval)"
    return f"{iv.mean:.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}] (n={iv.n})"


def mcnemar_p_value(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p-value from the discordant pairs: questions only model a gets
    right, and only model b. Under no difference each discordant pair is a fair coin, so
    p = 2 * P(X <= min(only_a, only_b)) with X ~ Binomial(only_a + only_b, 1/2), capped at 1;
    1.0 when no pair is discordant. Exact integer arithmetic, so large counts stay exact."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"mcnemar_p_value: counts must be >= 0, got {only_a}, {only_b}")
    m = only_a + only_b
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(only_a, only_b) + 1))
    return min(1.0, 2 * tail / 2**m)


def paired_test(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> PairedComparison:
    """Compare two models' per-question scores on the SAME questions, in the same order.

    The difference is b - a. Its interval is a paired bootstrap (whole questions are resampled,
    both models' scores together), omitted under `MIN_QUESTIONS_FOR_INTERVAL` questions. The
    p-value (two-sided, computed at any n): for 0/1 scores on both sides (EM) the exact McNemar
    test (`mcnemar_p_value`); otherwise (F1) the paired bootstrap's share of resampled mean
    differences on the other side of 0 from the observed one (0 itself counts as the other side),
    doubled and capped at 1; 1.0 when the observed difference is 0, and 0.0 when no resample
    crosses 0 (read: p < 1/resamples)."""
    where = "paired_test"
    _check_resampling(confidence, resamples, where)
    if len(a) != len(b):
        raise ValueError(
            f"{where}: a has {len(a)} scores and b has {len(b)}; both must score the same questions"
        )
    xa = _scores_array(a, where)
    xb = _scores_array(b, where)
    n = int(xa.size)
    d = xb - xa
    diff = float(d.mean())
    binary = bool(np.isin(xa, (0.0, 1.0)).all() and np.isin(xb, (0.0, 1.0)).all())
    need_interval = n >= MIN_QUESTIONS_FOR_INTERVAL
    means = _bootstrap_means(d, resamples, seed) if (need_interval or not binary) else None
    if binary:
        test = "mcnemar"
        p_value = mcnemar_p_value(int(np.sum((xa == 1.0) & (xb == 0.0))), int(np.sum((xa == 0.0) & (xb == 1.0))))
    else:
        test = "paired_bootstrap"
        assert means is not None
        if diff == 0.0:
            p_value = 1.0
        else:
            other_side = np.mean(means <= 0.0) if diff > 0 else np.mean(means >= 0.0)
            p_value = min(1.0, 2.0 * float(other_side))
    low = high = None
    if need_interval:
        assert means is not None
        low, high = _percentiles(means, confidence)
    return PairedComparison(
        n=n,
        mean_a=float(xa.mean()),
        mean_b=float(xb.mean()),
        diff=diff,
        low=low,
        high=high,
        p_value=p_value,
        test=test,
        confidence=confidence,
        note=None if need_interval else _TOO_FEW,
    )


# -- question kinds --------------------------------------------------------------------------------

#: `QAItem.type` values of comparison questions: HotpotQA and the synthetic world "comparison";
#: 2WikiMultihopQA "comparison" and "bridge_comparison" (compare two entities, each reached by a
#: bridge hop).
COMPARISON_TYPES = frozenset({"comparison", "bridge_comparison"})
#: `QAItem.type` values of bridge (chain) questions: HotpotQA and the world "bridge" (the world's
#: 1-hop questions carry it too); 2WikiMultihopQA "compositional" and "inference". MuSiQue's types
#: ("2hop", "3hop1", "4hop3", ...: every MuSiQue question is a chain) match `_MUSIQUE_TYPE`.
BRIDGE_TYPES = frozenset({"bridge", "compositional", "inference"})
_MUSIQUE_TYPE = re.compile(r"\d+hop\d*")
#: the order `em_by_kind` lists kinds in
KINDS = ("bridge", "comparison", "unknown")


def question_kind(type_or_item: Any) -> str | None:
    """The kind of a question, "comparison", "bridge" or None (unknown), from its type: a
    `QAItem.type` string, a `QAItem`, or a record mapping with a "type" key. Matching ignores case
    and surrounding space.

    Only the type field decides (see COMPARISON_TYPES, BRIDGE_TYPES and MuSiQue's "<k>hop<j>"); a
    yes/no answer is not taken as a sign of a comparison. MINTQA's type is its per-hop knowledge
    types ("new-old", "popular"), not a question structure, so it gives None, as do a missing or
    unrecognised type."""
    if isinstance(type_or_item, Mapping):
        value = type_or_item.get("type")
    elif type_or_item is None or isinstance(type_or_item, str):
        value = type_or_item
    else:
        value = getattr(type_or_item, "type", None)
    if not isinstance(value, str):
        return None
    t = value.strip().lower()
    if t in COMPARISON_TYPES:
        return "comparison"
    if t in BRIDGE_TYPES or _MUSIQUE_TYPE.fullmatch(t):
        return "bridge"
    return None


def em_by_kind(
    scores: Sequence[float],
    kinds: Sequence[str | None],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Interval]:
    """{kind: Interval of the mean score} over the questions of each kind, `kinds[i]` being
    `question_kind` of question i (None goes under "unknown"). Kinds come in the order bridge,
    comparison, unknown, then any others by name; a kind with no questions is absent. Works for
    any per-question score, EM being the usual one."""
    if len(scores) != len(kinds):
        raise ValueError(f"em_by_kind: {len(scores)} scores but {len(kinds)} kinds; they must align")
    groups: dict[str, list[float]] = {}
    for s, k in zip(scores, kinds):
        groups.setdefault("unknown" if k is None else k, []).append(s)
    order = sorted(groups, key=lambda k: (KINDS.index(k) if k in KINDS else len(KINDS), k))
    return {
        k: bootstrap_interval(groups[k], confidence=confidence, resamples=resamples, seed=seed) for k in order
    }


#: MINTQA's knowledge types: the familiar one of each pair, and the share `familiarity_share` counts
_FAMILIAR_PAIRS = {"popular": "popular", "unpopular": "popular", "new": "new", "old": "new"}


def familiarity_share(item: Any) -> str | None:
    """MINTQA's breakdown key of a question: how many of its chain's facts are popular (MINTQA-POP:
    "popular 1/2", one of two hops popular) or new (MINTQA-TI: "new 2/3"), from the knowledge type
    of each gold sub-question (`QAItem.evidence.sub_questions[i].knowledge_type`). None where the
    item carries no such types, or mixes the two benchmarks' kinds."""
    subs = getattr(getattr(item, "evidence", None), "sub_questions", ()) or ()
    types = [str(s.knowledge_type).strip().lower() for s in subs if getattr(s, "knowledge_type", None)]
    if not types or len(types) != len(subs) or any(t not in _FAMILIAR_PAIRS for t in types):
        return None
    counted = {_FAMILIAR_PAIRS[t] for t in types}
    if len(counted) != 1:
        return None
    kind = counted.pop()
    return f"{kind} {sum(t == kind for t in types)}/{len(types)}"


def scores_by_group(
    scores: Sequence[Mapping[str, float]], groups: Sequence[Any], *, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Per group (e.g. hop count, `familiarity_share`; None goes under "unknown"), in sorted order:
    {"n", "acc", "em", "f1", "em_interval": [low, high] or None under MIN_QUESTIONS_FOR_INTERVAL}
    of the `score` dicts of its questions."""
    if len(scores) != len(groups):
        raise ValueError(f"scores_by_group: {len(scores)} scores but {len(groups)} groups; they must align")
    by: dict[str, list[Mapping[str, float]]] = {}
    for s, g in zip(scores, groups):
        by.setdefault("unknown" if g is None else str(g), []).append(s)
    out: dict[str, dict[str, Any]] = {}
    for g in sorted(by):
        rows = by[g]
        iv = bootstrap_interval([r["em"] for r in rows], seed=seed)
        out[g] = {"n": len(rows), **{k: round(float(v), 4) for k, v in aggregate(rows).items() if k != "count"},
                  "em_interval": None if iv.low is None else [round(iv.low, 4), round(iv.high, 4)]}  # type: ignore[arg-type]
    return out


def hits_at_1(prediction: str | None, answers: Sequence[str] | str) -> float:
    """Hits@1 of a graph-QA answer (DoG's measure): 1 when the single answer exactly matches (after
    normalisation) one gold entity name or alias, else 0; no answer scores 0."""
    golds = (answers,) if isinstance(answers, str) else tuple(answers)
    if prediction is None or not golds:
        return 0.0
    return max(exact_match(prediction, g) for g in golds)


def hits_at_1_by_hops(
    predictions: Sequence[str | None], answers: Sequence[Sequence[str]], hops: Sequence[int | None], *, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Hits@1 per hop count (None under "unknown"): {"n", "hits@1", "interval": [low, high] or None}."""
    if not (len(predictions) == len(answers) == len(hops)):
        raise ValueError("hits_at_1_by_hops: predictions, answers and hops must align")
    by: dict[str, list[float]] = {}
    for p, a, h in zip(predictions, answers, hops):
        by.setdefault("unknown" if h is None else str(h), []).append(hits_at_1(p, a))
    out: dict[str, dict[str, Any]] = {}
    for g in sorted(by):
        iv = bootstrap_interval(by[g], seed=seed)
        out[g] = {"n": len(by[g]), "hits@1": round(sum(by[g]) / len(by[g]), 4),
                  "interval": None if iv.low is None else [round(iv.low, 4), round(iv.high, 4)]}  # type: ignore[arg-type]
    return out
