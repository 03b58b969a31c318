"""Backtracing quality against gold evidence, and the script that reports it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backtrace_fixtures import ANSWER, QUESTION, appendix_f, words
from knowtrace_train.methods.knowtrace.backtrace import PATH_RULES, backtrace_trajectories
from knowtrace_train.data.schema import GoldEvidence, Passage, QAItem
from knowtrace_train.io import write_jsonl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "lab"))  # the lab's helper modules

from evidence_quality import evidence_quality, precision_recall, source_passages  # noqa: E402
GOLD_TRIPLES = (("James Watt", "author of", "rioting being a dividing factor in Birmingham"),
                ("James Watt", "educated at", "University of Glasgow"))


def _item(**evidence) -> QAItem:
    ctx = (
        Passage("p1", "James Watt", "James Watt wrote about the rioting being a dividing factor in Birmingham."),
        Passage("p2", "Watt (unit)", "The watt is a unit of power."),
        Passage("p3", "Birmingham", "Birmingham is in the West Midlands region of England."),
        Passage("p4", "University of Glasgow", "James Watt was educated at the University of Glasgow."),
    )
    return QAItem(id="t1", question=QUESTION, answers=(ANSWER,), dataset="musique", context=ctx,
                  evidence=GoldEvidence(**evidence))


def _measure(item, rule="shortest"):
    traj = appendix_f()
    res = backtrace_trajectories([traj], {"t1": item}, count_tokens=words, path_rule=rule)
    return evidence_quality([traj], res.traces, {"t1": item})


@pytest.mark.parametrize("rule", PATH_RULES)
def test_triples(rule):
    q = _measure(_item(triples=GOLD_TRIPLES), rule)
    assert q["n"] == 1 and q["precision"] == 1.0 and q["recall"] == 1.0
    assert q["graph_precision"] == 0.5 and q["graph_recall"] == 1.0
    assert q["by_dataset"]["musique"]["gold"] == "triples"


def test_paragraphs_and_titles():
    q = _measure(_item(paragraph_ids=("p1", "p4")))
    assert (q["precision"], q["recall"]) == (1.0, 1.0)
    assert q["graph_precision"] == pytest.approx(2 / 3) and q["graph_recall"] == 1.0
    q = _measure(_item(titles=("James Watt",)))
    assert (q["precision"], q["recall"]) == (0.5, 1.0)


def test_source_passages_are_those_stating_the_triplet():
    traj = appendix_f()
    ctx = {p.id: p for p in _item().context}
    assert source_passages(traj.graph.triplets[0], ctx) == ["p1"]       # read p1, p2
    assert source_passages(traj.graph.triplets[3], ctx) == ["p4"]        # read p4, p1; p1 lacks Glasgow
    assert source_passages(traj.graph.triplets[2], {}) == ["p3"]        # unknown passages: all read


def test_no_gold_evidence_is_not_measured():
    assert precision_recall(appendix_f().graph.triplets, _item(), {}) is None
    assert _measure(_item())["n"] == 0


def test_script_prints_figures_and_a_json_last_line(tmp_path):
    rollouts, items = tmp_path / "rollouts.jsonl", tmp_path / "items.jsonl"
    wrong = appendix_f()
    wrong.id, wrong.em = "t1#2", 0.0
    write_jsonl(rollouts, [appendix_f().to_dict(), wrong.to_dict()])
    write_jsonl(items, [_item(triples=GOLD_TRIPLES).to_dict()])
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "lab" / "backtrace_quality.py"), "--rollouts", str(rollouts),
                          "--items", str(items), "--tokenizer", "words"], capture_output=True, text=True, cwd=REPO, check=True).stdout
    last = json.loads(out.strip().splitlines()[-1])
    assert last["trajectories"] == 2 and last["correct"] == 1 and last["precision"] == 1.0 and last["recall"] == 1.0
    assert 0 < last["fa_ratio"] < 1 and set(last["by_rule"]) == set(PATH_RULES)
    assert "musique" in out


def test_simulated_rollouts_script(tmp_path):
    from knowtrace_train.data.schema import SubQuestion, passage_id

    def P(title, text):
        return Passage(passage_id(title, text), title, text)

    corpus = [P("Zentor", "Zentor is a bicycle company founded by Odile Farrant. Zentor is based in Vesse."),
              P("Odile Farrant", "Odile Farrant was born in Castelbrun. She studied at Kell University."),
              P("Castelbrun", "Castelbrun is a city in Doravia.")]
    item = QAItem(id="w1", question="Where was the founder of Zentor born?", answers=("Castelbrun",), dataset="world",
                  evidence=GoldEvidence(
                      triples=(("Zentor", "founded by", "Odile Farrant"), ("Odile Farrant", "born in", "Castelbrun")),
                      sub_questions=(SubQuestion("Who founded Zentor?", "Odile Farrant", paragraph_ids=(corpus[0].id,)),
                                     SubQuestion("Where was Odile Farrant born?", "Castelbrun", paragraph_ids=(corpus[1].id,)))))
    other = QAItem(id="w2", question="Where did Odile Farrant study?", answers=("Kell University",), dataset="world",
                   evidence=GoldEvidence(triples=(("Odile Farrant", "educated at", "Kell University"),),
                                         sub_questions=(SubQuestion("q", "Kell University", paragraph_ids=(corpus[1].id,)),)))
    items, corpus_file, out = tmp_path / "items.jsonl", tmp_path / "corpus.jsonl", tmp_path / "sim.jsonl"
    write_jsonl(items, [item.to_dict(), other.to_dict()])
    write_jsonl(corpus_file, [p.to_dict() for p in corpus])
    subprocess.run([sys.executable, str(REPO / "scripts" / "lab" / "backtrace_simulated_rollouts.py"), "--items", str(items),
                    "--corpus", str(corpus_file), "--output", str(out), "--n", "1", "--noise", "0"],
                   check=True, capture_output=True, cwd=REPO)
    from knowtrace_train.io import read_jsonl
    from knowtrace_train.trajectory import Trajectory

    [traj] = [Trajectory.from_dict(d) for d in read_jsonl(out)]
    assert traj.em == 1.0
    # the greedy extractor also wrote the other item's fact from the second passage: an extraneous triplet
    assert len(traj.graph.triplets) == 3
    res = backtrace_trajectories([traj], {"w1": item}, count_tokens=words)
    q = evidence_quality([traj], res.traces, {"w1": item})
    assert (q["precision"], q["recall"]) == (1.0, 1.0) and q["graph_precision"] == pytest.approx(2 / 3)


def test_script_pools_several_rollout_files(tmp_path):
    """The same question in two iterations' rollouts counts twice (ids tagged by file)."""
    a, b, items = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "items.jsonl"
    write_jsonl(a, [appendix_f().to_dict()])
    write_jsonl(b, [appendix_f().to_dict()])
    write_jsonl(items, [_item(triples=GOLD_TRIPLES).to_dict()])
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "lab" / "backtrace_quality.py"), "--rollouts", str(a), str(b),
                          "--items", str(items), "--tokenizer", "words"], capture_output=True, text=True, cwd=REPO, check=True).stdout
    last = json.loads(out.strip().splitlines()[-1])
    assert last["trajectories"] == 2 and last["correct"] == 2 and last["backtraced"] == 2 and last["with_gold"] == 2
