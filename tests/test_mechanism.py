"""Mechanism statistics (`Method.mechanism`): TRACE's and KnowTrace's on hand-built trajectories against
hand-computed counts, empty denominators, items without gold evidence, and the comparison's Mechanism table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knowtrace_train.compare import Cell, CompareConfig, figures, format_tables, mechanism_table
from knowtrace_train.data.schema import GoldEvidence, QAItem
from knowtrace_train.evaluate import summarize
from knowtrace_train.kg import KnowledgeGraph, Triplet
from knowtrace_train.methods import get_method
from knowtrace_train.methods.base import MechanismStat, Method
from knowtrace_train.methods.knowtrace import KnowTraceConfig
from knowtrace_train.methods.trace import TraceConfig
from knowtrace_train.pairing import QuestionScores
from knowtrace_train.trajectory import ModelCall, Trajectory

from backtrace_fixtures import appendix_f
from test_evaluate import _traced_but_unconnected


# -- the statistic -------------------------------------------------------------------------------------


def test_a_statistic_keeps_its_counts_and_an_empty_denominator_has_no_value():
    s = MechanismStat(12, 30)
    assert s.value == pytest.approx(0.4) and s.cell() == "12/30 = 0.400"
    assert s.to_dict() == {"numerator": 12, "denominator": 30, "value": 0.4, "note": None}
    empty = MechanismStat(0, 0, "no question carries gold evidence triples")
    assert empty.value is None and empty.cell() == "- (no question carries gold evidence triples)"
    assert empty.to_dict()["value"] is None and MechanismStat(0, 0).cell() == "-"
    assert MechanismStat(45, 30).cell() == "45/30 = 1.500"  # a mean per question: the total over the questions
    with pytest.raises(ValueError, match="counts things"):
        MechanismStat(1, -1)


def test_a_method_without_mechanism_statistics_reports_none():
    assert Method().mechanism([appendix_f()], KnowTraceConfig(), {}) == {}
    ra = get_method("ra_cot")
    assert ra.mechanism([appendix_f()], ra.config_class(), {}) == {}


# -- TRACE -------------------------------------------------------------------------------------------------


def _item(qid: str, triples=()) -> QAItem:
    return QAItem(qid, f"question {qid}?", ("x",), dataset="toy", evidence=GoldEvidence(triples=tuple(triples)))


def _select(index: int, probs) -> ModelCall:
    return ModelCall(index=index, role="select", round=1, prompt="", output="", prompt_tokens=0, output_tokens=0,
                     finish_reason="scored", parsed=None if probs is None else {"chain": [], "probs": probs})


def _trace_traj(qid: str, triplets, chains, first_probs="absent") -> Trajectory:
    calls = [ModelCall(index=0, role="kg", round=0, prompt="", output="", prompt_tokens=0, output_tokens=0)]
    if first_probs != "absent":
        calls.append(_select(1, first_probs))
        calls.append(_select(2, [0.9, 0.1]))  # a later step: never the first choice
    return Trajectory(id=qid, question_id=qid, question=f"question {qid}?", answers=["x"], dataset="toy",
                      strategy="trace", calls=calls, graph=KnowledgeGraph.of(Triplet(*t) for t in triplets),
                      meta={"reader": "triple", "chains": [{"triplets": c, "logprob": 0.0, "score": 1.0, "ended": "stop"}
                                                           for c in chains]})


ADA = [("Ada Lin", "born in", "Oslo"), ("Oslo", "country", "Norway"), ("Ada Lin", "occupation", "chemist")]
BERGEN = [("Bergen", "lies in", "Norway"), ("Bergen", "climate", "rainy")]


def trace_cells():
    """Four questions: hand-computed below."""
    trajs = [
        # best chain 2 triples; first choice B (0.5 > 0.3 > 0.2); both gold triples in the chains
        _trace_traj("t1", ADA, [[0, 1], [2]], [0.2, 0.5, 0.3]),
        # the empty chain wins; A and B tie at the first step: the earlier option, A (stop); 1 of 2 gold
        # triples found (the relation's wording differs: entities match, in either order)
        _trace_traj("t2", BERGEN, [[], [0]], [0.4, 0.4, 0.2]),
        # an empty graph: no selector call, an exhausted empty chain; its gold triple is not found
        _trace_traj("t3", [], [[]]),
        # a HotpotQA-like item (no gold triples) and an unreadable first selector record; the chain's
        # out-of-range index and non-integer entries are not triples of the graph
        _trace_traj("t4", BERGEN, [[1, 7, "0", True]], None),
    ]
    items = {"t1": _item("t1", ADA[:2]), "t2": _item("t2", [("Norway", "contains", "Bergen"), ("Norway", "capital", "Oslo")]),
             "t3": _item("t3", [("Bergen", "lies in", "Norway")]), "t4": _item("t4")}
    return trajs, items


def test_trace_chain_length_first_step_stops_and_gold_recall_by_hand():
    trajs, items = trace_cells()
    stats = get_method("trace").mechanism(trajs, TraceConfig(), items)
    assert list(stats) == ["chain_length", "first_step_stop", "gold_triple_recall"]
    # best chains: 2 + 0 + 0 + 1 triples over 4 questions
    assert (stats["chain_length"].numerator, stats["chain_length"].denominator) == (3, 4)
    # first choices: B, A (tie), none, unreadable: 1 stop of 2 readable first steps
    first = stats["first_step_stop"]
    assert (first.numerator, first.denominator) == (1, 2) and "2 of 4 questions" in first.note
    # gold triples: 2 of 2 (t1), 1 of 2 (t2: (Bergen; lies in; Norway) matches (Norway; contains; Bergen)), 0 of 1 (t3)
    recall = stats["gold_triple_recall"]
    assert (recall.numerator, recall.denominator) == (3, 5) and "1 of 4 questions without gold triples" in recall.note
    assert recall.cell() == "3/5 = 0.600"


def test_trace_without_gold_evidence_or_chains_has_no_value_and_never_raises():
    trajs, items = trace_cells()
    hotpot = {k: _item(k) for k in items}  # no item carries gold triples (HotpotQA)
    stats = get_method("trace").mechanism(trajs, TraceConfig(), hotpot)
    assert stats["gold_triple_recall"].value is None and "no question carries gold evidence triples" in stats["gold_triple_recall"].note
    assert stats["chain_length"].value == pytest.approx(3 / 4)  # needs no gold evidence
    # questions the items do not name, and garbage meta: counted as recorded, never an exception
    junk = _trace_traj("t9", ADA, [[0]], [0.1, 0.9])
    junk.meta["chains"] = "garbage"
    stats = get_method("trace").mechanism([junk], TraceConfig(), {})
    assert stats["chain_length"].value is None and stats["chain_length"].note == "no trajectory records reasoning chains"
    assert (stats["first_step_stop"].numerator, stats["first_step_stop"].denominator) == (0, 1)
    assert all(s.value is None and s.note == "no trajectories" for s in get_method("trace").mechanism([], TraceConfig(), {}).values())
    # the readers that build no chains have no chain statistics
    assert get_method("trace").mechanism(trajs, TraceConfig(reader="all_docs"), items) == {}


# -- KnowTrace -----------------------------------------------------------------------------------------


def test_knowtrace_rounds_and_evidence_supported_em_by_hand():
    traced, unconnected, wrong = appendix_f(), _traced_but_unconnected(), appendix_f()
    wrong.id = wrong.question_id = "t3"
    wrong.prediction, wrong.em = "Oxford", 0.0
    traced.rounds, unconnected.rounds, wrong.rounds = 3, 2, 0
    stats = get_method("knowtrace").mechanism([traced, unconnected, wrong], KnowTraceConfig(), {})
    assert stats["rounds_per_question"].cell() == "5/3 = 1.667"
    # right and backed by its own graph: the traced one only (the unconnected one is right but a guess)
    assert (stats["evidence_supported_em"].numerator, stats["evidence_supported_em"].denominator) == (1, 3)
    # the same count the evaluation summary gives
    from knowtrace_train.evaluate import evidence_check

    assert summarize([traced, unconnected, wrong], evidence=evidence_check(KnowTraceConfig())).evidence_supported == 1
    assert all(s.value is None for s in get_method("knowtrace").mechanism([], KnowTraceConfig(), {}).values())


# -- the comparison's Mechanism table -------------------------------------------------------------------


def _cell(method: str, dataset: str, trajs, mechanism) -> Cell:
    for t in trajs:
        t.em, t.f1 = 0.0, 0.0
    ids = [t.question_id for t in trajs]
    return Cell(method, dataset, Path(f"{dataset}/{method}.jsonl"), summarize(trajs),
                QuestionScores(method, ids, [0.0] * len(ids), [0.0] * len(ids)), mechanism=mechanism)


def test_format_tables_and_figures_carry_the_mechanism_table():
    trajs, items = trace_cells()
    hotpot = [_trace_traj("h1", BERGEN, [[0]], [0.6, 0.4])]
    cells = [
        _cell("trace", "world", trajs, get_method("trace").mechanism(trajs, TraceConfig(), items)),
        _cell("ra_cot", "world", trajs, {}),
        _cell("trace", "hotpotqa", hotpot, get_method("trace").mechanism(hotpot, TraceConfig(), {"h1": _item("h1")})),
        _cell("ra_cot", "hotpotqa", hotpot, {}),
    ]
    text = format_tables(cells)
    # the earlier tables are unchanged and come first; the Mechanism table is the last
    assert text.index("Table 1 layout") < text.index("Table 5 layout") < text.index("Mechanism:")
    lines = mechanism_table(cells)
    assert lines[0].startswith("Mechanism:") and text.endswith(lines[1])
    rows = lines[1].splitlines()
    assert rows[0] == "| dataset | method | statistic: numerator/denominator = value |  |  |"
    assert rows[2] == ("| world | trace | chain_length: 3/4 = 0.750 | first_step_stop: 1/2 = 0.500 | "
                       "gold_triple_recall: 3/5 = 0.600 |")
    assert rows[3] == "| world | ra_cot | none (the method records no mechanism statistic) |  |  |"
    assert rows[4] == ("| hotpotqa | trace | chain_length: 1/1 = 1.000 | first_step_stop: 1/1 = 1.000 | "
                       "gold_triple_recall: - (no question carries gold evidence triples (e.g. HotpotQA, MuSiQue)) |")
    assert len(rows) == 6  # header, rule, one row per (dataset, method)
    fig = figures(cells, CompareConfig())
    json.dumps(fig)  # JSON-able
    assert fig["cells"]["trace"]["world"]["mechanism"]["first_step_stop"] == {
        "numerator": 1, "denominator": 2, "value": 0.5, "note": "2 of 4 questions without a readable first selector call (an empty graph or an unreadable record) left out"}
    assert fig["cells"]["trace"]["hotpotqa"]["mechanism"]["gold_triple_recall"]["value"] is None
    assert fig["cells"]["ra_cot"]["world"]["mechanism"] == {}
