"""Backtracing trajectories the KnowTrace engine wrote (scripted model outputs, the paper's
Appendix F in the paper's own output style), after a JSONL round trip as rollouts are stored."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Sequence

import pytest

from knowtrace_train.methods.knowtrace import outputs, prompts
from knowtrace_train.methods.knowtrace.backtrace import PATH_RULES, backtrace_trajectories
from knowtrace_train.data.schema import GoldEvidence, Passage, QAItem, passage_id
from knowtrace_train.generation.base import Completion, GenerationRequest
from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.methods.hints import hinted_items
from knowtrace_train.retrieval.base import ScoredPassage, check_search_args
from knowtrace_train.methods.knowtrace import KnowTrace, KnowTraceConfig
from knowtrace_train.trajectory import Trajectory, generated_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "lab"))  # the lab's helper modules


def P(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


QUESTION = "Where was the person who wrote about the rioting being a dividing factor in Birmingham educated?"
RIOTING = "The rioting being a dividing factor in Birmingham"
PASSAGES = [
    P("James Watt", "James Watt, an industrialist, wrote about the rioting being a dividing factor in Birmingham."),
    P("Birmingham", "Birmingham is located in the West Midlands region of England."),
    P("James Watt (education)", "James Watt was educated at the University of Glasgow."),
]
ITEM = QAItem(id="f1", question=QUESTION, answers=("University of Glasgow",), dataset="musique", context=tuple(PASSAGES))
THOUGHT = "James Watt wrote about the rioting being a dividing factor in Birmingham. He was educated at the University of Glasgow."
EXPLORE = [  # by the number of triplets shown; the paper's header variant (Appendix F)
    (0, "Whether the collected knowledge triplets are sufficient: No\n"
        "What entity-relation pairs to retrieve in the current step:\n"
        f"- {RIOTING}: Find out who wrote about this topic.\n"
        "- Birmingham: Find out where Birmingham is located."),
    (3, f"{outputs.JUDGEMENT} No\nRetrieval Guidance:\n- James Watt: Find out which school James Watt attended."),
    (4, f"{outputs.JUDGEMENT} Yes\nThought: {THOUGHT}\nAnswer: University of Glasgow"),
]
COMPLETE = {
    RIOTING: "(James Watt, wrote, the rioting being a dividing factor in Birmingham);\n(James Watt, is, an industrialist);",
    "Birmingham": "(Birmingham, is located in, the West Midlands region of England)",
    "James Watt": "(James Watt, was educated at, University of Glasgow)",
}


class Scripted:
    def __init__(self, never_answer: bool = False):
        self.never_answer = never_answer

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            p = r.prompt + r.prefix  # the response prefix the engine sent
            if p.endswith(prompts.answer_prefix()):
                text = f" {THOUGHT}\nAnswer: University of Glasgow"
            elif p.endswith(prompts.TRIPLETS_HEADER + "\n"):
                entity = re.findall(r"^- (.*?): ", p, re.M)[-1]
                text = COMPLETE.get(entity, "")
            else:
                kg = p.rsplit(prompts.KG_HEADER + "\n", 1)[1].strip()
                # the engine sends the judgement words as the start of the output (prefill_judgement)
                prefilled = kg.endswith(outputs.JUDGEMENT)
                kg = kg.removesuffix(outputs.JUDGEMENT).strip()
                n = 0 if kg == "None" else len(kg.splitlines())
                text = dict(EXPLORE)[n]
                if self.never_answer and n == 4:
                    text = f"{outputs.JUDGEMENT} No\nRetrieval Guidance:\n- University of Glasgow: find its city"
                if prefilled:
                    text = text.removeprefix(outputs.JUDGEMENT)
            out.append(Completion(text, len(p.split()), len(text.split()), "stop"))
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())


class Retriever:
    def search(self, queries, k):
        check_search_args(queries, k)
        words = lambda s: set(re.findall(r"[a-z]+", s.lower())) - {"the", "of", "in", "find", "out", "about", "this", "where", "who"}
        res = []
        for q in queries:
            scored = sorted(((len(words(q) & words(p.title + " " + p.text)), i) for i, p in enumerate(PASSAGES)), key=lambda x: (-x[0], x[1]))
            res.append([ScoredPassage(PASSAGES[i], float(s)) for s, i in scored[:k] if s > 0])
        return res


def rollout(items=(ITEM,), **kw) -> list[Trajectory]:
    trajs = KnowTrace(KnowTraceConfig(passages=2, **kw)).run(list(items), Scripted(), Retriever())
    for t in trajs:
        t.em = float(t.prediction == "University of Glasgow")
    return [Trajectory.from_dict(t.to_dict()) for t in trajs]  # as read back from rollouts.jsonl


def words(s: str) -> int:
    return len(s.split())


@pytest.mark.parametrize("rule", PATH_RULES)
def test_engine_trajectory_backtraces_like_the_paper(rule):
    [traj] = rollout()
    res = backtrace_trajectories([traj], {"f1": ITEM}, count_tokens=words, path_rule=rule)
    assert res.stats["backtraced"] == 1
    # the judgement words are the prefix the engine fed: prompt-side; the completion is what the model wrote
    assert all(r["prefix"] == outputs.JUDGEMENT for r in res.records_by_role["explore"])
    assert [r["prefix"] + r["completion"] for r in res.records_by_role["explore"]] == [
        outputs.exploration_guidance([GuidancePair(RIOTING, "Find out who wrote about this topic.")]),
        outputs.exploration_guidance([GuidancePair("James Watt", "Find out which school James Watt attended.")]),
        outputs.exploration_answer(THOUGHT, "University of Glasgow"),
    ]
    assert [r["completion"] for r in res.records_by_role["complete"]] == [
        outputs.completion([Triplet("James Watt", "wrote", "the rioting being a dividing factor in Birmingham")]),
        outputs.completion([Triplet("James Watt", "was educated at", "University of Glasgow")]),
    ]
    # FA counts output tokens: what the model wrote, not the judgement words the engine fed
    assert res.stats["tokens_all"] == sum(words(generated_text(c)) for c in traj.calls)
    assert 0 < res.stats["fa_ratio"] < 1


def test_engine_prompts_without_exemplars_match_the_renderer():
    [traj] = rollout()
    rec = backtrace_trajectories([traj], {"f1": ITEM}, count_tokens=words, fewshot=False).records_by_role
    shown = [t.triplet for t in traj.graph.triplets[:3]]
    assert rec["explore"][1]["prompt"] == prompts.render_exploration_prompt(QUESTION, shown, fewshot=False)
    first = traj.calls[1]
    assert rec["complete"][0]["prompt"] == prompts.render_completion_prompt(
        first.pair, [next(p for p in PASSAGES if p.id == i) for i in first.passage_ids], fewshot=False)


def test_engine_forced_answer_after_no_progress_is_not_trained():
    """The round-3 exploration judged the graph insufficient ("No") and its completion found nothing; the
    forced answer then ran on that same prompt. Training P -> "Yes" there would teach answering where the
    model itself judged the knowledge insufficient: the record is dropped (it counts as filtered)."""
    trajs = KnowTrace(KnowTraceConfig(passages=2, max_rounds=3)).run([ITEM], Scripted(never_answer=True), Retriever())
    [traj] = [Trajectory.from_dict(t.to_dict()) for t in trajs]
    traj.em = 1.0
    assert traj.calls[-1].role == "answer" and traj.prediction == "University of Glasgow"
    assert traj.stop_reason == "no_progress" and traj.calls[-1].prompt == traj.calls[-3].prompt
    res = backtrace_trajectories([traj], {"f1": ITEM}, count_tokens=words)
    assert res.stats["backtraced"] == 1 and res.records_by_role["answer"] == []
    assert res.stats["roles"]["answer"]["tokens_filtered"] == res.stats["roles"]["answer"]["tokens_all"] > 0
    # the round-3 exploration asked about the answer entity; its completion found nothing: dropped
    assert len(res.records_by_role["explore"]) == 2
    # with more rounds the graph has grown by the time of the forced answer: that one is trained
    trajs = KnowTrace(KnowTraceConfig(passages=2, max_rounds=2)).run([ITEM], Scripted(never_answer=True), Retriever())
    [traj] = [Trajectory.from_dict(t.to_dict()) for t in trajs]
    traj.em = 1.0
    assert traj.stop_reason == "max_rounds" and traj.prediction == "University of Glasgow"
    res = backtrace_trajectories([traj], {"f1": ITEM}, count_tokens=words)
    [ans] = res.records_by_role["answer"]
    assert ans["prompt"] == traj.calls[-1].prompt
    # the forced answer's prefix (the judgement fixed to Yes and "Thought:") is fed, not trained
    assert ans["prefix"] == prompts.answer_prefix() and "decision" not in ans
    assert ans["prefix"] + ans["completion"] == outputs.exploration_answer(THOUGHT, "University of Glasgow")


def test_engine_rationalization_round_trip():
    [traj] = rollout(hinted_items([ITEM]))
    assert "Hint" in traj.question and "Hint" in traj.calls[0].prompt
    res = backtrace_trajectories([traj], {"f1": ITEM}, count_tokens=words)
    recs = [r for v in res.records_by_role.values() for r in v]
    assert res.stats["hinted"] == 1 and len(recs) == 5
    assert all("Hint" not in r["prompt"] for r in recs)
    assert res.records_by_role["explore"][0]["prompt"] == prompts.render_exploration_prompt(QUESTION, [])


def test_hinted_rerun_trajectories_have_their_own_ids():
    from evidence_quality import evidence_quality  # scripts/lab/evidence_quality.py

    plain, hinted = rollout([ITEM, *hinted_items([ITEM])])
    assert (plain.id, plain.question_id) == ("f1", "f1")
    assert (hinted.id, hinted.question_id) == ("f1#hint", "f1") and "Hint" in hinted.question
    res = backtrace_trajectories([plain, hinted], {"f1": ITEM}, count_tokens=words)
    assert res.stats["trajectories"] == 2 and res.stats["hinted"] == 1 and res.stats["backtraced"] == 2
    assert [(bt.trajectory_id, bt.question_id) for bt in res.traces] == [("f1", "f1"), ("f1#hint", "f1")]
    ids = {r["trajectory_id"] for v in res.records_by_role.values() for r in v}
    assert ids == {"f1", "f1#hint"}
    hinted_recs = [r for v in res.records_by_role.values() for r in v if r["trajectory_id"] == "f1#hint"]
    assert hinted_recs and all("Hint" not in r["prompt"] for r in hinted_recs)
    # a consumer keyed on trajectory ids sees both trajectories (one graph emptied: only the plain one counts)
    gold_triple = ("James Watt", "educated at", "University of Glasgow")
    gold = dataclasses.replace(ITEM, evidence=GoldEvidence(triples=(gold_triple,)))
    hinted.graph.triplets.clear()
    q = evidence_quality([plain, hinted], res.traces[:1], {"f1": gold})
    assert q["n"] == 1 and q["graph_recall"] > 0
