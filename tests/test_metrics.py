import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knowtrace_train.metrics import (
    accuracy,
    aggregate,
    exact_match,
    f1,
    f1_precision_recall,
    normalize_answer,
    score,
)


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
