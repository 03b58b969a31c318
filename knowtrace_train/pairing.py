"""Two models on the same questions: per-question scores of trajectory files matched by id, their paired tests
(one run each: `compare_scores`), and the pooled paired test of several runs (seeds) per model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from knowtrace_train.io import iter_jsonl
from knowtrace_train.metrics import PairedComparison, bootstrap_interval, paired_test, score

@dataclass(frozen=True)
class QuestionScores:
    """Per-question EM and F1 of one trajectory file, in the file's order."""

    source: str
    ids: list[str]
    em: list[float]
    f1: list[float]


def read_question_scores(path: str | Path) -> QuestionScores:
    """question_id, em and f1 of every scored trajectory in a JSONL file (eval.jsonl, evaluate's
    output); a trajectory not scored yet is scored from its prediction. Reads nothing else of the
    records and, unlike `read_trajectories`, never touches the file."""
    ids: list[str] = []
    em: list[float] = []
    f1: list[float] = []
    for i, d in iter_jsonl(path):
        try:
            qid = str(d["question_id"])
            if d.get("em") is None or d.get("f1") is None:
                s = score(d.get("prediction"), d["answers"], dataset=d.get("dataset"))
                e, f = s["em"], s["f1"]
            else:
                e, f = float(d["em"]), float(d["f1"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{i}: not a scored trajectory ({exc})") from None
        ids.append(qid)
        em.append(e)
        f1.append(f)
    return QuestionScores(str(path), ids, em, f1)


def by_id(q: QuestionScores) -> QuestionScores:
    """`q` with its questions in id order: two files of the same questions pair whatever their order;
    a question id that appears twice is a ValueError (no pairing could say which of the two counts)."""
    order = sorted(range(len(q.ids)), key=q.ids.__getitem__)
    ids = [q.ids[i] for i in order]
    twice = sorted({x for x, y in zip(ids, ids[1:]) if x == y})
    if twice:
        raise ValueError(f"{q.source}: question id(s) {twice[:3]} appear more than once")
    return QuestionScores(q.source, ids, [q.em[i] for i in order], [q.f1[i] for i in order])


def compare_scores(a: QuestionScores, b: QuestionScores, *, seed: int = 0) -> dict[str, Any]:
    """b against a on EM and F1 ({"n", "em", "f1", "only_a", "only_b"}; "em" and "f1" are each a
    `metrics.PairedComparison` as a dict: diff = b - a, its interval, the p-value; exact McNemar for EM,
    paired bootstrap for F1; only_a/only_b count the questions only a, only b answered exactly, McNemar's
    discordant pairs). Questions are matched by id, whatever the files' order; files of other questions
    are a ValueError."""
    a, b = by_id(a), by_id(b)
    if a.ids != b.ids:
        why = f"other questions ({len(set(a.ids) ^ set(b.ids))} ids in one but not the other)"
        raise ValueError(f"cannot pair {a.source} ({len(a.ids)} questions) with {b.source} ({len(b.ids)}): {why}")
    if not a.ids:
        raise ValueError(f"cannot pair {a.source} with {b.source}: no questions")
    return {
        "only_a": sum(1 for x, y in zip(a.em, b.em) if x > y),
        "only_b": sum(1 for x, y in zip(a.em, b.em) if y > x),
        "n": len(a.ids),
        "em": dataclasses.asdict(paired_test(a.em, b.em, seed=seed)),
        "f1": dataclasses.asdict(paired_test(a.f1, b.f1, seed=seed)),
    }


def compare_pooled(a: Sequence[QuestionScores], b: Sequence[QuestionScores], *, seed: int = 0) -> dict[str, Any]:
    """`compare_scores` of two models with several runs (seeds) each on the same questions, in its shape: "em"
    and "f1" are `pooled_paired_test` (each question's difference averaged over the seeds; sign-flip test and
    bootstrap interval over questions), "only_a"/"only_b" the discordant (seed, question) pairs summed over the
    seeds, "seeds" the runs per model. One run each is `compare_scores` (the exact McNemar test)."""
    if not a or not b:
        raise ValueError("compare_pooled: each model needs at least one run")
    if len(a) == 1 and len(b) == 1:
        return compare_scores(a[0], b[0], seed=seed)
    if len(a) != len(b):
        raise ValueError(f"compare_pooled: {len(a)} runs of {a[0].source} against {len(b)} of {b[0].source}; "
                         "the pooled test needs as many runs of each")
    a, b = [by_id(x) for x in a], [by_id(x) for x in b]
    for x in (*a[1:], *b):
        if x.ids != a[0].ids:
            raise ValueError(f"cannot pool {x.source} with {a[0].source}: other questions "
                             f"({len(set(x.ids) ^ set(a[0].ids))} ids in one but not the other)")
    return {
        "only_a": sum(1 for x, y in zip(a, b) for u, v in zip(x.em, y.em) if u > v),
        "only_b": sum(1 for x, y in zip(a, b) for u, v in zip(x.em, y.em) if v > u),
        "n": len(a[0].ids),
        "seeds": len(a),
        "em": dataclasses.asdict(pooled_paired_test([x.em for x in a], [y.em for y in b], seed=seed)),
        "f1": dataclasses.asdict(pooled_paired_test([x.f1 for x in a], [y.f1 for y in b], seed=seed)),
    }


def mean_scores(runs: Sequence[QuestionScores]) -> QuestionScores:
    """Each question's EM and F1 averaged over several runs of one model on the same questions (in id order):
    the per-question scores whose bootstrap over questions is the pooled interval (`pooled_paired_test`'s unit)."""
    runs = [by_id(r) for r in runs]
    for r in runs[1:]:
        if r.ids != runs[0].ids:
            raise ValueError(f"cannot pool {r.source} with {runs[0].source}: other questions")
    if len(runs) == 1:
        return runs[0]
    n = len(runs)
    return QuestionScores(f"mean of {n} runs ({runs[0].source}, ...)", list(runs[0].ids),
                          [sum(col) / n for col in zip(*(r.em for r in runs))],
                          [sum(col) / n for col in zip(*(r.f1 for r in runs))])


def compare_evals(a: str | Path, b: str | Path, *, seed: int = 0) -> dict[str, Any]:
    """`compare_scores` of two trajectory files (model b against model a)."""
    return compare_scores(read_question_scores(a), read_question_scores(b), seed=seed)


# -- several runs (seeds) per model ------------------------------------------------------------------


#: up to this many questions with a non-zero difference, the sign-flip test enumerates every flip (2^16)
EXACT_SIGN_FLIPS = 16


def sign_flip_p_value(differences: Sequence[float], *, lattice: int | None = None, resamples: int = 10_000,
                      seed: int = 0) -> float:
    """Two-sided sign-flip permutation p-value of per-question differences (b - a, each a mean over seeds):
    under no difference between the models a question's two labels are exchangeable, so each difference is
    as likely negated. p = the probability, over independent fair signs, that |sum| reaches the observed
    |sum|. Exact where the differences are multiples of 1/`lattice` (0/1 scores averaged over `lattice`
    seeds: the distribution of the signed sum by convolution) or number at most `EXACT_SIGN_FLIPS` (every
    assignment enumerated); else `resamples` random assignments, the observed one counted in. With one seed
    and 0/1 scores this is the exact McNemar test."""
    d = np.asarray([float(x) for x in differences if float(x) != 0.0], dtype=np.float64)
    if d.size == 0:
        return 1.0
    if lattice is not None:
        steps = np.rint(np.abs(d) * lattice).astype(np.int64)
        if np.allclose(steps, np.abs(d) * lattice, atol=1e-9):
            total = int(steps.sum())
            dist = np.zeros(2 * total + 1)
            dist[total] = 1.0  # index total is a sum of 0
            for k in steps:
                dist = 0.5 * (np.roll(dist, int(k)) + np.roll(dist, -int(k)))  # no wrap: |sum| <= total
            observed = abs(int(np.rint(d.sum() * lattice)))
            sums = np.abs(np.arange(-total, total + 1))
            return min(1.0, float(dist[sums >= observed].sum()))
    observed = abs(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    if d.size <= EXACT_SIGN_FLIPS:
        signs = ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1) * 2 - 1
        return float(np.mean(np.abs(signs @ d) >= observed - tol))
    rng = np.random.default_rng(seed)
    hits = 1  # the observed assignment
    for start in range(0, resamples, 1024):
        signs = rng.integers(0, 2, size=(min(1024, resamples - start), d.size)) * 2 - 1
        hits += int(np.sum(np.abs(signs @ d) >= observed - tol))
    return min(1.0, hits / (resamples + 1))


def pooled_paired_test(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> PairedComparison:
    """Model b against model a over several runs (seeds) on the SAME questions: `a[s][q]`, `b[s][q]` are the
    scores of seed s on question q (every seed scores the same questions in the same order; the seeds of a
    and b correspond).

    `diff` is the mean of b - a over all (seed, question) pairs. The question is the unit of the test: the
    same dev questions recur in every seed, so their outcomes are correlated across seeds (an easy question
    is easy in every run), and McNemar or Cochran-Mantel-Haenszel on the pooled (seed, question) pairs would
    count one question's repeated outcomes as independent evidence. Each question's difference is its mean
    over the seeds; the interval is a bootstrap over questions (a resampled question keeps all its seeds) and
    the p-value the sign-flip permutation test over questions (`sign_flip_p_value`); `n` is the number of
    questions, `seeds` the number of runs. With one seed the p-value is the exact McNemar test's."""
    where = "pooled_paired_test"
    if len(a) != len(b) or not a:
        raise ValueError(f"{where}: a has {len(a)} seeds and b has {len(b)}; both need the same seeds (at least one)")
    xa = np.asarray(a, dtype=np.float64)
    xb = np.asarray(b, dtype=np.float64) if all(len(r) == xa.shape[1] for r in b) else None
    if xa.ndim != 2 or xb is None or xb.shape != xa.shape:
        raise ValueError(f"{where}: every seed of a and b must score the same {xa.shape[1]} questions")
    per_question = (xb - xa).mean(axis=0)
    binary = bool(np.isin(xa, (0.0, 1.0)).all() and np.isin(xb, (0.0, 1.0)).all())
    iv = bootstrap_interval(per_question, confidence=confidence, resamples=resamples, seed=seed)
    return PairedComparison(
        n=int(per_question.size),
        mean_a=float(xa.mean()),
        mean_b=float(xb.mean()),
        diff=iv.mean,
        low=iv.low,
        high=iv.high,
        p_value=sign_flip_p_value(per_question, lattice=xa.shape[0] if binary else None, resamples=resamples, seed=seed),
        test="sign_flip_over_questions",
        confidence=confidence,
        note=iv.note,
        seeds=int(xa.shape[0]),
    )
