"""Answer scores: the official HotpotQA normalisation, EM and F1, MINTQA's accuracy, and their means.

`normalize_answer`, `exact_match` and `f1` follow the official HotpotQA evaluation script
(hotpot_evaluate_v1.py), the same rules SQuAD, 2WikiMultihopQA and MuSiQue use, including its
special case: when either normalised side is "yes", "no" or "noanswer" and the two differ, F1 is 0.

`accuracy` is MINTQA's metric (its §4.2): does the gold answer appear in the predicted text.
Here both sides are normalised first and the gold must appear as whole tokens, so "no" does not
count as found in "Norway".

Against several gold answers (first = canonical, rest = aliases) each metric takes its maximum
over the answers separately, as the official scripts do.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Mapping, Sequence

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


def f1_precision_recall(prediction: str, gold: str) -> tuple[float, float, float]:
    """Token-level (F1, precision, recall) of the normalised strings, with the yes/no/noanswer rule."""
    pred = normalize_answer(prediction)
    ref = normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0, 0.0, 0.0
    pred_tokens = pred.split()
    ref_tokens = ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised strings (official HotpotQA rules)."""
    return f1_precision_recall(prediction, gold)[0]


def accuracy(prediction: str, gold: str) -> float:
    """1.0 where the normalised gold appears, as whole tokens, in the normalised prediction.

    A gold that normalises to nothing (e.g. "the") counts as found only in a prediction that
    also normalises to nothing."""
    pred = normalize_answer(prediction)
    ref = normalize_answer(gold)
    if not ref:
        return float(not pred)
    return float(f" {ref} " in f" {pred} ")


def score(prediction: str | None, answers: Sequence[str] | str) -> dict[str, float]:
    """{"em", "f1", "acc"} of one prediction, each the maximum over the gold answers.

    A missing prediction (None: the method gave no answer) scores zero on all three."""
    golds = (answers,) if isinstance(answers, str) else tuple(answers)
    if not golds:
        raise ValueError("score: no gold answers given")
    if prediction is None:
        return {"em": 0.0, "f1": 0.0, "acc": 0.0}
    return {
        "em": max(exact_match(prediction, g) for g in golds),
        "f1": max(f1(prediction, g) for g in golds),
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
