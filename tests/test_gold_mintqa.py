"""Gold trajectories of MINTQA's decomposing strategies: each call's prompt and completion on a hand-built 2-hop
item, the engine's own parsers reading every gold output back, the passages as the strategy retrieves them,
and the skip reasons."""

from __future__ import annotations

import pytest

from knowtrace_train.methods import get_method
from knowtrace_train.methods.mintqa import MintQADecomposeConfig, MintQADynamicConfig, MintQARagConfig
import knowtrace_train.methods.mintqa.prompts as prompts
from knowtrace_train.methods.mintqa.gold import TOO_MANY_HOPS, UNREADABLE_STEP, mintqa_gold_records
from knowtrace_train.methods.mintqa.parsing import parse_answer, parse_selfanswer, parse_step
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP
from knowtrace_train.selftrain.config import has_gold_trajectories

from gold_helpers import ASKED_TWICE, HOTPOT, ITEM, NO_ENTITY, RATIONALE_STATS, P, Q, Mapped, words

S1, S2 = "Who founded Zentor?", "Where was Odile Farrant born?"
HITS = {S1: ["zentor", "harlow"], S2: ["odile", "zentor"]}


def gold(config, items=(ITEM,), retriever=None, **kw):
    kw.setdefault("fewshot", False)
    return mintqa_gold_records(config, list(items), retriever or Mapped(HITS),
                               record_kinds=list(get_method(config.name).record_roles(config)), **kw)


def test_decompose_gold_calls_and_their_parses():
    retriever = Mapped(HITS)
    res = gold(MintQADecomposeConfig(passages=2), retriever=retriever)
    assert res.stats["trajectories"] == 1 and res.stats["skipped"] == {}
    # the strategy's own retrieval: each sub-question is the query, top `passages`
    assert retriever.queries == [S1, S2]
    history = [(S1, "Odile Farrant"), (S2, "Castelbrun")]
    want = [
        ("decompose", prompts.decompose_prompt(Q, [], False), f" {S1}"),
        ("subanswer", prompts.rag_prompt(S1, [P["zentor"], P["harlow"]], False), " Odile Farrant"),
        ("decompose", prompts.decompose_prompt(Q, history[:1], False), f" {S2}"),
        ("subanswer", prompts.rag_prompt(S2, [P["odile"], P["zentor"]], False), " Castelbrun"),
        ("decompose", prompts.decompose_prompt(Q, history, False), " finish"),
        ("answer", prompts.final_prompt(Q, history, False), " Castelbrun"),
    ]
    traj = res.trajectories[0]
    assert [(c.role, c.prompt, c.output) for c in traj.calls] == want
    assert [c.passage_ids for c in traj.calls if c.role == "subanswer"] == [["p-zentor", "p-harlow"], ["p-odile", "p-zentor"]]
    # the records: every call, prompt and exact completion, under its own kind
    assert {k: [(r["prompt"], r["completion"]) for r in rs] for k, rs in res.records_by_role.items()} == {
        k: [(p, t) for kind, p, t in want if kind == k] for k in ("decompose", "subanswer", "answer")}
    assert all(r["trajectory_id"] == "w2#gold" and r["iteration"] == 0 for rs in res.records_by_role.values() for r in rs)
    # the engine's parsers read each text as intended
    assert [parse_step(t).to_dict() for _, _, t in want[0:5:2]] == [
        {"subquestion": S1, "finish": False}, {"subquestion": S2, "finish": False}, {"subquestion": None, "finish": True}]
    assert [parse_answer(t) for _, _, t in (want[1], want[3], want[5])] == [
        ("Odile Farrant", None), ("Castelbrun", None), ("Castelbrun", None)]
    assert [c.parsed for c in traj.calls] == [
        {"subquestion": S1, "finish": False}, {"answer": "Odile Farrant"}, {"subquestion": S2, "finish": False},
        {"answer": "Castelbrun"}, {"subquestion": None, "finish": True}, {"answer": "Castelbrun"}]
    assert traj.meta["subquestions"] == [
        {"step": 1, "question": S1, "answer": "Odile Farrant", "retrieved": True},
        {"step": 2, "question": S2, "answer": "Castelbrun", "retrieved": True}]
    assert traj.stop_reason == "finished" and traj.prediction == "Castelbrun" and traj.meta["gold"]
    assert res.stats["records"] == {"decompose": 3, "subanswer": 2, "answer": 1}
    assert RATIONALE_STATS <= set(res.stats) and res.stats["fa_ratio"] is None


def test_dynamic_gold_rates_every_sub_question_uncertain_and_retrieves():
    retriever = Mapped(HITS)
    res = gold(MintQADynamicConfig(passages=2), retriever=retriever)
    assert res.stats["trajectories"] == 1 and retriever.queries == [S1, S2]
    traj = res.trajectories[0]
    assert [c.role for c in traj.calls] == ["decompose", "selfanswer", "subanswer", "decompose", "selfanswer",
                                            "subanswer", "decompose", "answer"]
    own = [c for c in traj.calls if c.role == "selfanswer"]
    assert [c.prompt for c in own] == [prompts.selfanswer_prompt(S1, False), prompts.selfanswer_prompt(S2, False)]
    assert {c.output for c in own} == {" unknown\nConfidence: uncertain"}
    read = parse_selfanswer(" unknown\nConfidence: uncertain")
    assert (read.answer, read.confidence, read.certain, read.error) == ("unknown", "uncertain", False, None)
    assert [e["confidence"] for e in traj.meta["subquestions"]] == ["uncertain", "uncertain"]
    assert [e["answer"] for e in traj.meta["subquestions"]] == ["Odile Farrant", "Castelbrun"]
    assert res.stats["records"] == {"decompose": 3, "selfanswer": 2, "subanswer": 2, "answer": 1}
    # the decompose calls are the decompose strategy's, with exemplars where asked
    res = gold(MintQADynamicConfig(passages=2), fewshot=True)
    assert "Steven Spielberg" in res.records_by_role["decompose"][0]["prompt"]


def test_max_steps_hops_need_no_finish_and_the_method_entries():
    res = gold(MintQADecomposeConfig(passages=2, max_steps=2))
    traj = res.trajectories[0]
    assert [c.role for c in traj.calls] == ["decompose", "subanswer", "decompose", "subanswer", "answer"]
    assert traj.stop_reason == "max_steps" and traj.prediction == "Castelbrun"
    for name in ("mintqa_decompose", "mintqa_dynamic"):
        m = get_method(name)
        assert has_gold_trajectories(m)
        out = m.gold_records(m.config_class(passages=2), [ITEM], Mapped(HITS), fewshot=False, require_support=True,
                             count_tokens=words, iteration=1)
        assert out.stats["trajectories"] == 1 and set(out.records_by_role) == set(m.record_roles(m.config_class()))
    for name in ("mintqa_rag", "mintqa_parametric"):  # one call each: nothing to decompose
        assert not has_gold_trajectories(get_method(name))
    with pytest.raises(ValueError, match="no gold trajectories"):
        get_method("mintqa_rag").gold_records(MintQARagConfig(), [ITEM], Mapped(HITS), fewshot=False, require_support=True,
                                              count_tokens=len, iteration=0)


def test_items_without_a_gold_trajectory_are_counted_and_skipped():
    res = gold(MintQADecomposeConfig(passages=2), [HOTPOT, NO_ENTITY, ASKED_TWICE, ITEM])
    # the sub-question asked twice: the loop stops on it, so the gold outputs are not its steps
    assert res.stats["skipped"] == {NO_CHAIN: 1, NO_CHAIN_ENTITY: 1, UNREADABLE_STEP: 1}
    assert res.stats["items"] == 4 and res.stats["trajectories"] == 1
    assert {r["trajectory_id"] for rs in res.records_by_role.values() for r in rs} == {"w2#gold"}
    assert gold(MintQADecomposeConfig(passages=2, max_steps=1)).stats["skipped"] == {TOO_MANY_HOPS: 1}


def test_a_hop_its_passages_do_not_state_skips_the_item():
    no_hop2 = {**HITS, S2: ["zentor", "harlow"]}
    for cfg in (MintQADecomposeConfig(passages=2), MintQADynamicConfig(passages=2)):
        res = gold(cfg, retriever=Mapped(no_hop2))
        assert res.stats["skipped"] == {UNSUPPORTED_HOP: 1} and res.stats["trajectories"] == 0, cfg.name
        assert all(rs == [] for rs in res.records_by_role.values())
        assert gold(cfg, retriever=Mapped(no_hop2), require_support=False).stats["trajectories"] == 1
    # the passages are the strategy's: one passage per sub-question finds hop 1 only where it is first
    assert gold(MintQADecomposeConfig(passages=1), retriever=Mapped({S1: ["harlow", "zentor"], S2: ["odile"]})
                ).stats["skipped"] == {UNSUPPORTED_HOP: 1}
    assert gold(MintQADecomposeConfig(passages=2), retriever=Mapped({S1: ["harlow", "zentor"], S2: ["odile"]})
                ).stats["trajectories"] == 1
