import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knowtrace_train.data.schema import QAItem
from knowtrace_train.metrics import (
    MIN_QUESTIONS_FOR_INTERVAL,
    Interval,
    PairedComparison,
    accuracy,
    aggregate,
    bootstrap_interval,
    em_by_kind,
    exact_match,
    f1,
    f1_precision_recall,
    format_interval,
    mcnemar_p_value,
    normalize_answer,
    paired_test,
    question_kind,
    score,
)
from knowtrace_train.pairing import pooled_paired_test, sign_flip_p_value


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   Apple,  a day!", "apple day"),
        ("U.S.A.", "usa"),
        ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a whole word
        ("A", ""),
        ("", ""),
        ("Anne's \"best\" (2009)", "annes best 2009"),
        ("THE\tEND\n", "end"),
    ],
)
def test_normalize_answer_official_rules(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_exact_match_ignores_case_articles_punctuation():
    assert exact_match("the Beatles.", "Beatles") == 1.0
    assert exact_match("Beatles band", "Beatles") == 0.0
    assert exact_match("", "Beatles") == 0.0


def test_f1_token_overlap():
    # pred tokens: barack obama ; gold: barack hussein obama
    p, r = 1.0, 2 / 3
    assert f1("Barack Obama", "Barack Hussein Obama") == pytest.approx(2 * p * r / (p + r))
    assert f1_precision_recall("Barack Obama", "Barack Hussein Obama") == pytest.approx((0.8, 1.0, 2 / 3))
    assert f1("Obama Obama", "Obama") == pytest.approx(2 * 0.5 * 1.0 / 1.5)  # Counter intersection
    assert f1("nothing shared", "Obama") == 0.0


def test_f1_empty_prediction_is_zero():
    assert f1("", "Obama") == 0.0
    assert f1("the", "Obama") == 0.0  # normalises to nothing


@pytest.mark.parametrize(
    "pred, gold",
    [("yes", "yes it is"), ("yes it is", "yes"), ("no", "no way"), ("noanswer", "no answer here"), ("yes", "no")],
)
def test_f1_yes_no_rule(pred, gold):
    # official HotpotQA: if either side normalises to yes/no/noanswer and they differ, F1 = 0
    assert f1(pred, gold) == 0.0


def test_f1_yes_no_equal_is_one():
    assert f1("Yes.", "yes") == 1.0


def test_musique_f1_has_no_yes_no_rule_and_scores_two_empty_sides_one():
    # MuSiQue's metrics/answer.py (SQuAD's compute_f1): plain token overlap, no yes/no rule
    assert f1("yes it is", "yes", rules="musique") == pytest.approx(0.5)
    assert f1("no way", "no", rules="musique") == pytest.approx(2 / 3)
    assert f1("yes", "no", rules="musique") == 0.0
    assert f1("the", "a", rules="musique") == 1.0 and f1("the", "a") == 0.0  # both normalise to nothing
    assert f1("", "Obama", rules="musique") == 0.0
    # score picks the rules from the item's dataset; EM and acc are the same under both
    assert score("yes it is", ["yes"], dataset="musique") == {"em": 0.0, "f1": pytest.approx(0.5), "acc": 1.0}
    assert score("yes it is", ["yes"], dataset="hotpotqa")["f1"] == 0.0
    assert score("yes it is", ["yes"], dataset="2wikimultihopqa")["f1"] == 0.0
    assert score("yes it is", ["yes"])["f1"] == 0.0
    with pytest.raises(ValueError, match="f1 rules must be one of hotpotqa, musique"):
        f1("a", "b", rules="squad")


@given(st.text(max_size=30), st.text(max_size=30))
def test_musique_f1_equals_hotpotqa_f1_away_from_yes_no_and_empty(pred, gold):
    from knowtrace_train.metrics import normalize_answer

    p, g = normalize_answer(pred), normalize_answer(gold)
    if p and g and not ({p, g} & {"yes", "no", "noanswer"}):
        assert f1(pred, gold, rules="musique") == f1(pred, gold)


def test_accuracy_is_containment_of_normalized_gold():
    assert accuracy("I think it is the Eiffel Tower, in Paris.", "Eiffel Tower") == 1.0
    assert accuracy("Eiffel", "Eiffel Tower") == 0.0
    # whole tokens only: "no" does not appear in "Norway"
    assert accuracy("Norway", "no") == 0.0
    assert accuracy("no, never", "no") == 1.0
    # a gold that normalises to nothing only matches a prediction that does too
    assert accuracy("The", "a") == 1.0
    assert accuracy("Paris", "the") == 0.0


def test_score_max_over_aliases():
    s = score("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"])
    assert s == {"em": 1.0, "f1": 1.0, "acc": 1.0}
    s = score("Hall", ["G. Stanley Hall", "Hall, Stanley"])
    assert s["em"] == 0.0
    assert s["f1"] == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # best alias: "hall stanley"
    assert s["acc"] == 0.0


def test_score_each_metric_maxed_independently():
    # em from one alias, acc from another
    s = score("the answer is Paris", ["Paris", "the answer is Paris"])
    assert s == {"em": 1.0, "f1": 1.0, "acc": 1.0}
    s = score("capital city Paris", ["Paris", "capital city of France"])
    assert s["em"] == 0.0 and s["acc"] == 1.0
    assert s["f1"] == pytest.approx(max(2 * (1 / 3) * 1 / (4 / 3), 2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4)))


def test_score_none_prediction_is_zero_and_string_answer_accepted():
    assert score(None, ["x"]) == {"em": 0.0, "f1": 0.0, "acc": 0.0}
    assert score("Paris", "Paris") == {"em": 1.0, "f1": 1.0, "acc": 1.0}


def test_score_rejects_no_answers():
    with pytest.raises(ValueError, match="no gold answers"):
        score("x", [])


def test_aggregate_means_and_count():
    agg = aggregate([{"em": 1.0, "f1": 1.0, "acc": 1.0}, {"em": 0.0, "f1": 0.5, "acc": 1.0}])
    assert agg == {"em": 0.5, "f1": 0.75, "acc": 1.0, "count": 2}
    assert aggregate([]) == {"em": 0.0, "f1": 0.0, "acc": 0.0, "count": 0}
    assert aggregate(iter([score("a", ["a"])]))["count"] == 1


def test_aggregate_rejects_mismatched_keys():
    with pytest.raises(ValueError, match="keys"):
        aggregate([{"em": 1.0}, {"f1": 1.0}])


@given(st.text(max_size=30), st.lists(st.text(max_size=30), min_size=1, max_size=3))
def test_score_bounds_and_consistency(pred, answers):
    s = score(pred, answers)
    for v in s.values():
        assert 0.0 <= v <= 1.0 and not math.isnan(v)
    if s["em"] == 1.0:
        assert s["acc"] == 1.0
        # the yes/no rule never fires on an exact match; F1 is 1 unless gold normalises to nothing
        assert s["f1"] == 1.0 or any(normalize_answer(a) == "" for a in answers)


# -- intervals and paired tests ---------------------------------------------------------------------


def test_interval_of_constant_scores_is_the_constant():
    iv = bootstrap_interval([1.0] * 30)
    assert iv == Interval(mean=1.0, low=1.0, high=1.0, n=30, confidence=0.95, note=None)
    assert bootstrap_interval([0.0] * 25).low == 0.0 == bootstrap_interval([0.0] * 25).high


def test_interval_is_deterministic_for_a_seed_and_varies_with_it():
    values = [1.0] * 9 + [0.0] * 21
    assert bootstrap_interval(values, seed=3) == bootstrap_interval(values, seed=3)
    draws = {(bootstrap_interval(values, seed=s, resamples=500).low) for s in range(6)}
    assert len(draws) > 1


def test_interval_of_a_known_binary_vector_matches_the_normal_approximation():
    values = [1.0] * 30 + [0.0] * 90  # mean 0.25, n 120
    iv = bootstrap_interval(values)
    assert iv.mean == 0.25 and iv.n == 120
    half = 1.96 * math.sqrt(0.25 * 0.75 / 120)  # 0.0775
    assert iv.low < 0.25 < iv.high
    assert iv.low == pytest.approx(0.25 - half, abs=0.02)
    assert iv.high == pytest.approx(0.25 + half, abs=0.02)


def test_interval_widens_when_n_falls_or_confidence_rises():
    big = bootstrap_interval([1.0] * 30 + [0.0] * 90)
    small = bootstrap_interval([1.0] * 6 + [0.0] * 18)  # same mean, n 24
    assert small.mean == big.mean == 0.25
    assert small.high - small.low > big.high - big.low
    narrow = bootstrap_interval([1.0] * 30 + [0.0] * 90, confidence=0.5)
    assert narrow.high - narrow.low < big.high - big.low


def test_interval_needs_enough_questions():
    assert MIN_QUESTIONS_FOR_INTERVAL == 20
    iv = bootstrap_interval([1.0] * 3 + [0.0] * 9)
    assert iv.mean == 0.25 and iv.n == 12
    assert iv.low is None and iv.high is None
    assert iv.note == "n < 20: too few questions for an interval"
    assert bootstrap_interval([1.0] * 20).low == 1.0  # 20 is enough


def test_format_interval():
    assert format_interval(Interval(mean=0.25, low=1 / 6, high=1 / 3, n=24)) == "0.250 [0.167, 0.333] (n=24)"
    assert format_interval(bootstrap_interval([1.0] * 3 + [0.0] * 9)) == "0.250 (n=12; too few for an interval)"


def test_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="no scores"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([1.0] * 30, confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_interval([1.0] * 30, resamples=0)


def _pairs(n10: int, n01: int, n11: int, n00: int) -> tuple[list[float], list[float]]:
    """Per-question EM of models a and b: n10 questions only a gets right, n01 only b, ..."""
    a = [1.0] * n10 + [0.0] * n01 + [1.0] * n11 + [0.0] * n00
    b = [0.0] * n10 + [1.0] * n01 + [1.0] * n11 + [0.0] * n00
    return a, b


def test_mcnemar_exact_p_value_hand_computed():
    a, b = _pairs(1, 6, 10, 13)  # 7 discordant pairs, 1 against b
    c = paired_test(a, b)
    assert c.test == "mcnemar"
    # 2 * P(X <= 1 | n=7, p=1/2) = 2 * (1 + 7) / 128
    assert c.p_value == pytest.approx(0.125, abs=1e-12)
    assert (c.n, c.mean_a, c.mean_b) == (30, 11 / 30, 16 / 30)
    assert c.diff == pytest.approx(5 / 30)
    assert c.low < c.diff < c.high
    # the other direction gives the same two-sided p and the opposite difference
    d = paired_test(b, a)
    assert d.p_value == c.p_value and d.diff == pytest.approx(-c.diff)


def test_mcnemar_more_cases():
    # 2 * P(X <= 0 | n=5) = 2 / 32
    assert paired_test(*_pairs(0, 5, 10, 10)).p_value == pytest.approx(0.0625, abs=1e-12)
    # balanced discordance: 2 * P(X <= 3 | n=6) = 2 * 42 / 64 > 1, capped
    assert paired_test(*_pairs(3, 3, 10, 10)).p_value == 1.0
    # no discordant pair at all
    none = paired_test(*_pairs(0, 0, 12, 12))
    assert none.p_value == 1.0 and none.diff == 0.0 and none.low == 0.0 == none.high


def test_paired_bootstrap_for_non_binary_scores():
    # F1-like scores: b beats a by 0.3 on 60 questions and loses by 0.3 on 40
    a = [0.5] * 100
    b = [0.8] * 60 + [0.2] * 40
    c = paired_test(a, b)
    assert c.test == "paired_bootstrap"
    assert c.diff == pytest.approx(0.06)
    # normal approximation: sd of the differences 0.2939, z = 0.06 / 0.02939 = 2.04, p = 0.041
    assert 0.02 < c.p_value < 0.07
    assert c.low < 0.06 < c.high and c.low > 0  # p < 0.05 and the interval excludes 0 agree here
    assert paired_test(a, b) == c  # deterministic for the seed
    # no difference at all, and a difference every resample keeps
    assert paired_test(a, a).p_value == 1.0
    assert paired_test(a, [0.75] * 100).p_value == 0.0


def test_paired_test_small_n_has_a_p_value_but_no_interval():
    a, b = _pairs(1, 6, 2, 3)  # n 12
    c = paired_test(a, b)
    assert c.n == 12 and c.low is None and c.high is None
    assert c.note == "n < 20: too few questions for an interval"
    assert c.p_value == pytest.approx(0.125, abs=1e-12)
    f = paired_test([0.5] * 12, [0.6] * 6 + [0.45] * 6)
    assert f.test == "paired_bootstrap" and f.low is None and 0.0 <= f.p_value <= 1.0


def test_paired_test_rejects_unequal_lengths():
    with pytest.raises(ValueError, match=r"a has 3 scores.*b has 2"):
        paired_test([1.0, 0.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="no scores"):
        paired_test([], [])
    assert isinstance(paired_test([1.0] * 20, [1.0] * 20), PairedComparison)


@pytest.mark.parametrize(
    "type_, kind",
    [
        ("bridge", "bridge"),  # HotpotQA, the synthetic world, 2Wiki
        ("comparison", "comparison"),  # HotpotQA, the synthetic world, 2Wiki
        ("bridge_comparison", "comparison"),  # 2WikiMultihopQA
        ("compositional", "bridge"),  # 2WikiMultihopQA
        ("inference", "bridge"),  # 2WikiMultihopQA
        ("2hop", "bridge"),  # MuSiQue (id prefixes)
        ("3hop1", "bridge"),
        ("3hop2", "bridge"),
        ("4hop1", "bridge"),
        ("4hop3", "bridge"),
        ("Comparison", "comparison"),
        ("new-old", None),  # MINTQA: knowledge types, not a question structure
        ("popular", None),
        ("", None),
        (None, None),
    ],
)
def test_question_kind_maps_the_benchmarks_type_strings(type_, kind):
    assert question_kind(type_) == kind


def test_question_kind_reads_items_and_records():
    item = QAItem(id="q", question="Which is older?", answers=("yes",), type="comparison")
    assert question_kind(item) == "comparison"
    assert question_kind(QAItem(id="q", question="Is it?", answers=("no",))) is None  # never from the answer
    assert question_kind({"type": "bridge", "answers": ["yes"]}) == "bridge"
    assert question_kind({"id": "x"}) is None


def test_question_kind_covers_every_type_in_the_world_data():
    import world_helpers  # noqa: F401  (the generator, scripts/world/, on the path)
    from world.questions import CATEGORIES  # (type, hops) -> share

    assert {question_kind(t) for t, _ in CATEGORIES} == {"bridge", "comparison"}


def test_em_by_kind_groups_and_intervals():
    scores = [1.0, 0.0] * 15 + [1.0] * 4 + [0.0] * 2
    kinds = ["bridge"] * 30 + ["comparison"] * 4 + [None] * 2
    out = em_by_kind(scores, kinds)
    assert list(out) == ["bridge", "comparison", "unknown"]
    assert out["bridge"].mean == 0.5 and out["bridge"].n == 30 and out["bridge"].low < 0.5 < out["bridge"].high
    assert out["comparison"] == bootstrap_interval([1.0] * 4)
    assert out["unknown"].mean == 0.0 and out["unknown"].n == 2 and out["unknown"].low is None
    with pytest.raises(ValueError, match="3 scores.*2 kinds"):
        em_by_kind([1.0, 0.0, 1.0], ["bridge", "bridge"])


# -- several seeds: the pooled paired test -----------------------------------------------------------------


def test_pooled_test_on_a_hand_computed_table():
    """Two seeds, four questions. Per-question differences (mean over the seeds of b - a): q1 1, q2 0.5,
    q3 -0.5, q4 0. The sign-flip test enumerates the 2^3 sign assignments of the three non-zero ones:
    |sum| over them is 2, 1, 1, 0, 0, 1, 1, 2 (observed 1), so p = 6/8."""
    a = [[0, 0, 1, 1], [0, 1, 0, 1]]
    b = [[1, 1, 0, 1], [1, 1, 0, 1]]
    r = pooled_paired_test(a, b)
    assert (r.n, r.seeds, r.test) == (4, 2, "sign_flip_over_questions")
    assert r.diff == pytest.approx(0.25) and r.mean_a == pytest.approx(0.5) and r.mean_b == pytest.approx(0.75)
    assert r.p_value == pytest.approx(6 / 8)
    assert r.low is None and r.note  # 4 questions: no interval


def test_pooled_test_with_one_seed_is_exact_mcnemar():
    a = [[1, 0, 0, 0, 1, 1, 0, 0, 1, 0] * 3]
    b = [[0, 1, 1, 1, 1, 1, 1, 0, 1, 1] * 3]
    r = pooled_paired_test(a, b)
    only_a = sum(x > y for x, y in zip(a[0], b[0]))
    only_b = sum(y > x for x, y in zip(a[0], b[0]))
    assert (only_a, only_b) == (3, 15)
    assert r.p_value == pytest.approx(mcnemar_p_value(only_a, only_b))
    assert r.p_value == pytest.approx(paired_test(a[0], b[0]).p_value)
    assert r.low is not None and r.low <= r.diff <= r.high


def test_a_question_repeated_over_seeds_is_one_unit_not_several():
    """The same 5 questions gained in 4 seeds: pooled McNemar on the 20 (seed, question) pairs would say
    p = 2 * 0.5^20; the questions are 5, so the sign-flip test says 2 * 0.5^5."""
    a = [[0] * 5 + [1] * 20 for _ in range(4)]
    b = [[1] * 5 + [1] * 20 for _ in range(4)]
    r = pooled_paired_test(a, b)
    assert r.p_value == pytest.approx(2 / 2**5) and r.diff == pytest.approx(5 / 25)


def test_sign_flip_exact_sampled_and_enumerated_agree():
    d = [1.0] * 14 + [-1.0] * 6  # 20 non-zero: McNemar(6, 14) exactly on the lattice, sampled without it
    assert sign_flip_p_value(d, lattice=1) == pytest.approx(mcnemar_p_value(6, 14))
    assert sign_flip_p_value(d, resamples=20_000) == pytest.approx(mcnemar_p_value(6, 14), abs=0.01)
    thirds = [1 / 3, 2 / 3, -1 / 3, 1.0, 2 / 3, -2 / 3, 1 / 3]  # three seeds: the lattice's answer is the enumeration's
    assert sign_flip_p_value(thirds, lattice=3) == pytest.approx(sign_flip_p_value(thirds))
    assert sign_flip_p_value([0.0, 0.0]) == 1.0


def test_pooled_test_refuses_unequal_tables():
    with pytest.raises(ValueError, match="same seeds"):
        pooled_paired_test([[1, 0]], [[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="same 2 questions"):
        pooled_paired_test([[1, 0]], [[1, 0, 1]])
