import json

import pytest

from knowtrace_train.data.schema import (
    GoldEvidence,
    Passage,
    QAItem,
    SchemaError,
    SubQuestion,
    items_from_dataset,
    items_to_dataset,
)
from knowtrace_train.kg import GuidancePair, KnowledgeGraph, TracedTriplet, Triplet
from knowtrace_train.trajectory import ModelCall, Trajectory


def _item() -> QAItem:
    return QAItem(
        id="q1",
        question="Where was the founder of Acme born?",
        answers=("Lorvale", "Lorvale City"),
        dataset="world",
        split="dev",
        type="bridge",
        hops=2,
        context=(Passage("p1", "Acme", "Acme was founded by Ida Venn."),),
        evidence=GoldEvidence(
            titles=("Acme",),
            sentences=(("Acme", 0),),
            paragraph_ids=("p1",),
            triples=(("Acme", "founded by", "Ida Venn"), ("Ida Venn", "born in", "Lorvale")),
            sub_questions=(SubQuestion("Who founded Acme?", "Ida Venn", "popular", ("p1",)),),
        ),
    )


def test_qaitem_json_round_trip():
    it = _item()
    assert QAItem.from_dict(json.loads(json.dumps(it.to_dict()))) == it
    assert it.answer == "Lorvale"


def test_qaitem_dataset_round_trip():
    items = [_item(), QAItem("q2", "Who?", ("X",))]
    assert items_from_dataset(items_to_dataset(items)) == items


@pytest.mark.parametrize(
    "row, field",
    [
        ({"question": "q", "answers": ["a"]}, "id"),
        ({"id": "1", "answers": ["a"]}, "question"),
        ({"id": "1", "question": "q"}, "answers"),
        ({"id": "1", "question": "q", "answers": "a"}, "answers"),
        ({"id": "1", "question": "q", "answers": []}, "answers"),
    ],
)
def test_qaitem_errors_name_the_field(row, field):
    with pytest.raises(SchemaError, match=field) as e:
        QAItem.from_dict(row, where="f.jsonl:3")
    assert "f.jsonl:3" in str(e.value)


def test_trajectory_round_trip_keeps_provenance():
    g = KnowledgeGraph()
    pair = GuidancePair("Acme", "who founded it")
    assert g.note_expansion_point("Acme", round=1, call=0)
    assert g.add(TracedTriplet(Triplet("Acme", "founded by", "Ida Venn"), 1, pair, 1, ("p1",)))
    assert not g.add(TracedTriplet(Triplet("acme", "Founded by", "ida venn"), 2, pair, 3))
    assert not g.note_expansion_point("Ida Venn", round=2, call=2)  # already in the graph
    t = Trajectory(
        id="q1/knowtrace",
        question_id="q1",
        question="Q?",
        answers=["Lorvale"],
        dataset="world",
        strategy="knowtrace",
        calls=[ModelCall(0, "complete", 1, "prompt", "(Acme; founded by; Ida Venn)", 10, 5, pair=pair, triplets=[0])],
        graph=g,
    )
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.to_dict() == t.to_dict()
    assert back.graph.triplets[0].pair == pair
    assert back.graph.initial_entities[0].name == "Acme"
