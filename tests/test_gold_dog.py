"""Gold trajectories of DoG: each call's prompt and completion on a hand-built 2-hop item over a tiny graph, DoG's
own parser reading every gold output back, the skip reasons, and one bootstrap + STaR iteration of DoG on the
tiny model."""

from __future__ import annotations

from knowtrace_train.data.schema import GoldEvidence, QAItem, SubQuestion
from knowtrace_train.kg_store import GraphStore, KGStoreError
from knowtrace_train.methods import get_method
from knowtrace_train.methods.dog import DoGConfig
import knowtrace_train.methods.dog.prompts as prompts
from knowtrace_train.methods.dog.gold import (
    CHAIN_NOT_IN_GRAPH,
    NO_REWRITE,
    NOT_A_WALK,
    OFF_THE_WALK,
    RELATION_NOT_LISTED,
    STORE_ERROR,
    TOO_MANY_HOPS,
    UNREADABLE_STEP,
    answer_try_span,
    dog_gold_records,
    dog_gold_trajectories,
)
from knowtrace_train.methods.dog.parsing import parse_answer, parse_answer_try, parse_relation, parse_turn
from knowtrace_train.methods.gold_chain import NO_CHAIN, UNSUPPORTED_HOP

from gold_helpers import HOTPOT, ITEM, RATIONALE_STATS, Q, bootstrap_and_one_star_iteration, read_jsonl, words

TRIPLES = [
    ("Zentor", "founded by", "Odile Farrant"),
    ("Zentor", "founding year", "1898"),
    ("Odile Farrant", "born in", "Castelbrun"),
    ("Harlow Press", "founded by", "Odile Farrant"),
    ("Castelbrun", "country", "Doravia"),
    ("Odile Farrant", "child", "Ada Farrant"),
    ("Odile Farrant", "child", "Bram Farrant"),
]
Q2 = "Where was Odile Farrant born?"
KINDS = ["relation", "answer_try", "expert", "critic", "linguist", "fallback"]


def one_hop(i, question, triple, answer=None, sub=None) -> QAItem:
    return QAItem(id=f"h{i}", question=question, answers=(answer or triple[2],), dataset="world", type="bridge", hops=1,
                  evidence=GoldEvidence(triples=(triple,), sub_questions=(SubQuestion(sub or question, triple[2]),)))


def gold(config=None, items=(ITEM,), store=None, **kw):
    config = config or DoGConfig()
    kw.setdefault("fewshot", False)
    return dog_gold_records(config, list(items), None, record_kinds=list(get_method("dog").record_roles(config)),
                            store=store or GraphStore(TRIPLES), **kw)


def test_gold_walk_call_by_call_and_dog_s_parser_reads_each_back():
    res = gold()
    assert res.stats["trajectories"] == 1 and res.stats["skipped"] == {}
    texts = [" Who founded Zentor?\nRelation: 1. founded by", " No",
             f" {Q2}", f" different. Simplified question: {Q2}", f" {Q2}",
             f" {Q2}\nRelation: 1. born in", " Yes\nAnswer: Castelbrun"]
    hop1 = ("Zentor", "founded by", "Odile Farrant")
    chat = [f"Expert: Simplified question: {Q2}", f"Critic: Verdict: different. Simplified question: {Q2}"]
    want = [
        # hop 1: Zentor's relations as get_relations lists them, the gold one first of the two
        ("relation", prompts.relation_prompt(Q, "Zentor", ["founded by", "founding year"], False)),
        ("answer_try", prompts.answer_try_prompt(Q, [hop1], False)),
        ("expert", prompts.debate_prompt("expert", Q, hop1, [], False)),
        ("critic", prompts.debate_prompt("critic", Q, hop1, chat[:1], False)),
        ("linguist", prompts.debate_prompt("linguist", Q, hop1, chat, False)),
        # hop 2 asks the rewritten question; "~founded by" (straight back to Zentor) is not listed, nor are the
        # children: Odile's relations are born in, child, ~founded by
        ("relation", prompts.relation_prompt(Q2, "Odile Farrant", ["born in", "child"], False)),
        ("answer_try", prompts.answer_try_prompt(Q2, [("Odile Farrant", "born in", "Castelbrun")], False)),
    ]
    traj = res.trajectories[0]
    assert [(c.role, c.prompt) for c in traj.calls] == want
    assert [c.output for c in traj.calls] == texts
    # the records: every call, its prompt and exact completion, under its own kind; no fallback
    flat = [(k, r["prompt"], r["completion"]) for k in KINDS for r in res.records_by_role[k]]
    assert sorted(flat) == sorted((k, p, t) for (k, p), t in zip(want, texts))
    assert res.records_by_role["fallback"] == [] and set(res.records_by_role) == set(KINDS)
    assert all(r["trajectory_id"] == "w2#gold" and r["iteration"] == 0
               for rs in res.records_by_role.values() for r in rs)
    # DoG's own parsers read each text as intended
    r1 = parse_relation(texts[0], ["founded by", "founding year"])
    assert (r1.subquestion, r1.relation, r1.by_number, r1.error) == ("Who founded Zentor?", "founded by", False, None)
    r2 = parse_relation(texts[5], ["born in", "child"])
    assert (r2.subquestion, r2.relation, r2.error) == (Q2, "born in", None)
    assert parse_answer_try(texts[1]).to_dict() == {"sufficient": False, "answer": None}
    assert parse_answer_try(texts[6]).to_dict() == {"sufficient": True, "answer": "Castelbrun"}
    assert parse_turn(texts[2]).to_dict() == {"question": Q2, "verdict": None}
    assert parse_turn(texts[3], critic=True).to_dict() == {"question": Q2, "verdict": "different"}
    assert [c.parsed for c in traj.calls] == [r1.to_dict(), {"sufficient": False, "answer": None},
                                              {"question": Q2, "verdict": None}, {"question": Q2, "verdict": "different"},
                                              {"question": Q2, "verdict": None}, r2.to_dict(),
                                              {"sufficient": True, "answer": "Castelbrun"}]
    # the engine's own record of the walk
    hops = traj.meta["hops"]
    assert [h["relation"] for h in hops] == ["founded by", "born in"] and hops[0]["simplified"] == Q2
    assert hops[1]["dropped_back"] == "~founded by"
    assert traj.prediction == "Castelbrun" and traj.stop_reason == "answered" and traj.meta["gold"]
    assert res.stats["records"] == {"relation": 2, "answer_try": 2, "expert": 1, "critic": 1, "linguist": 1, "fallback": 0}
    assert res.stats["tokens_all"] == sum(len(t.split()) for t in texts) and res.stats["fa_ratio"] is None


def test_answer_try_records_mark_their_decision_and_weigh_balanced_per_label():
    """Each answer try's " Yes" / " No" is a marked decision (kind answer_try), counted per label; with a
    decision_weight the labels weigh alike in training however many records each has (a 2-hop walk says No once,
    every walk Yes once)."""
    from knowtrace_train.decisions import decision_weights

    born = one_hop(1, "Where was Odile Farrant born?", ("Odile Farrant", "born in", "Castelbrun"))
    res = gold(items=(ITEM, born))
    assert res.stats["trajectories"] == 2
    tries = res.records_by_role["answer_try"]
    assert [(r["completion"], r["decision"]) for r in tries] == [
        (" No", {"kind": "answer_try", "label": "No", "start": 0, "end": 3}),
        (" Yes\nAnswer: Castelbrun", {"kind": "answer_try", "label": "Yes", "start": 0, "end": 4}),
        (" Yes\nAnswer: Castelbrun", {"kind": "answer_try", "label": "Yes", "start": 0, "end": 4})]
    assert res.stats["decisions"] == {"answer_try": {"No": 1, "Yes": 2}}
    assert all("decision" not in r for k in KINDS if k != "answer_try" for r in res.records_by_role[k])
    weights = decision_weights(tries, 4.0)
    assert weights == [6.0, 3.0, 3.0]  # w * n / (labels * n_label): No 6 in all, Yes 6 in all
    assert answer_try_span("", " Nobody") is None and answer_try_span(" No", "") is None


def test_method_entry_exemplars_debate_rounds_and_the_tail_answer():
    m = get_method("dog")
    cfg = DoGConfig(debate_rounds=0, answer_from="tail")
    res = m.gold_records(cfg, [ITEM], None, fewshot=True, require_support=True, count_tokens=words, iteration=3)
    # the method's own graph (the bundled world) does not hold the hand-built chain
    assert res.stats["skipped"] == {CHAIN_NOT_IN_GRAPH: 1} and res.stats["trajectories"] == 0
    assert set(res.records_by_role) == {"relation", "answer_try", "expert", "fallback"}
    res = gold(cfg, fewshot=True, iteration=3)
    assert RATIONALE_STATS <= set(res.stats)
    assert res.stats["records"] == {"relation": 2, "answer_try": 2, "expert": 1, "fallback": 0}
    assert "Microsoft" in res.records_by_role["relation"][0]["prompt"]  # the exemplars
    assert res.records_by_role["expert"][0]["completion"] == f" {Q2}"
    assert {r["iteration"] for rs in res.records_by_role.values() for r in rs} == {3}
    # two rounds: the three roles twice, each writing the same rewrite
    res = gold(DoGConfig(debate_rounds=2))
    calls = res.trajectories[0].calls
    assert [c.role for c in calls] == ["relation", "answer_try", "expert", "critic", "linguist", "expert", "critic",
                                       "linguist", "relation", "answer_try"]
    assert res.trajectories[0].meta["hops"][0]["simplified"] == Q2


class Failing(GraphStore):
    def triple_filling(self, entity, relation):
        raise KGStoreError("down")


def test_items_without_a_gold_walk_are_counted_and_skipped():
    comparison = QAItem(id="c", question="Were Zentor and Harlow Press founded by the same person?", answers=("yes",),
                        evidence=GoldEvidence(triples=(("Zentor", "founded by", "Odile Farrant"),
                                                       ("Harlow Press", "founded by", "Odile Farrant"))))
    three = QAItem(id="t", question="In which country was the founder of Zentor born?", answers=("Doravia",),
                   evidence=GoldEvidence(triples=(*ITEM.evidence.triples, ("Castelbrun", "country", "Doravia"))))
    missing_relation = one_hop(1, "Who designed Zentor?", ("Zentor", "designed by", "Odile Farrant"))
    missing_entity = one_hop(2, "Who founded Nowhere Ltd?", ("Nowhere Ltd", "founded by", "Odile Farrant"))
    missing_triple = one_hop(3, "Who founded Zentor?", ("Zentor", "founded by", "Bram Farrant"))
    question_mark = one_hop(4, "Who founded Zentor?", ("Zentor", "founded by", "Odile Farrant"),
                            sub="Who founded Zentor? The bicycle maker")
    items = [HOTPOT, comparison, three, missing_relation, missing_entity, missing_triple, question_mark, ITEM]
    res = gold(items=items)
    assert res.stats["skipped"] == {NO_CHAIN: 1, NOT_A_WALK: 1, NO_REWRITE: 1, CHAIN_NOT_IN_GRAPH: 3,
                                    UNREADABLE_STEP: 1}
    assert res.stats["items"] == 8 and res.stats["trajectories"] == 1
    assert {r["trajectory_id"] for rs in res.records_by_role.values() for r in rs} == {"w2#gold"}
    # the gold relation is in the store but the prompt's list is cut before it
    year = one_hop(5, "When was Zentor founded?", ("Zentor", "founding year", "1898"))
    assert gold(DoGConfig(max_relations=1), [year]).stats["skipped"] == {RELATION_NOT_LISTED: 1}
    assert gold(DoGConfig(max_relations=2), [year]).stats["trajectories"] == 1
    # DoG answers from the first filled triple with answer_from: tail; Bram is the second child
    bram = one_hop(6, "Who is a child of Odile Farrant?", ("Odile Farrant", "child", "Bram Farrant"))
    assert gold(DoGConfig(answer_from="tail"), [bram]).stats["skipped"] == {OFF_THE_WALK: 1}
    kept = gold(DoGConfig(answer_from="model"), [bram])
    assert kept.stats["trajectories"] == 1 and kept.trajectories[0].prediction == "Bram Farrant"
    assert gold(DoGConfig(max_hops=1)).stats["skipped"] == {TOO_MANY_HOPS: 1}
    assert gold(store=Failing(TRIPLES)).stats["skipped"] == {STORE_ERROR: 1}


def test_the_model_alone_has_the_fallback_for_its_gold_and_it_is_unsupported():
    cfg = DoGConfig(max_hops=0)
    res = gold(cfg)
    assert res.stats["skipped"] == {UNSUPPORTED_HOP: 1} and res.records_by_role == {"fallback": []}
    res = gold(cfg, require_support=False)
    assert res.stats["trajectories"] == 1
    rec, = res.records_by_role["fallback"]
    assert rec["prompt"] == prompts.fallback_prompt(Q, False) and rec["completion"] == " Castelbrun"
    assert parse_answer(rec["completion"]) == ("Castelbrun", None)
    assert res.trajectories[0].stop_reason == "max_hops" and res.trajectories[0].prediction == "Castelbrun"


def test_dog_bootstrap_and_one_star_iteration_on_the_tiny_model(tmp_path, tiny_model_dir):
    def gold_trajectories(run):
        return dog_gold_trajectories(run.config.strategy, run.questions.rollout, fewshot=run.config.fewshot_trained)[0]

    run, gold_stats, it = bootstrap_and_one_star_iteration(
        tmp_path, tiny_model_dir, "dog", ["--strategy.max_hops", "2", "--strategy.relation_tokens", "8",
                                          "--strategy.answer_tokens", "6", "--strategy.debate_tokens", "6",
                                          "--strategy.fallback_tokens", "4"],
        gold_trajectories)
    d = run.run_dir
    boot = {k: read_jsonl(d / f"iter_0/sft_{k}.jsonl") for k in ("relation", "answer_try", "expert", "critic", "linguist")}
    assert all(len(boot[k]) == gold_stats["records"][k] > 0 for k in boot)
    assert (d / "iter_0/sft_fallback.jsonl").read_text() == ""
    assert all(r["trajectory_id"].endswith("#gold") for rs in boot.values() for r in rs)
    assert all(parse_relation(r["completion"], []).subquestion for r in boot["relation"])
    assert it["sft_records"]["relation"] > 0 and (d / "iter_1/adapters/relation/adapter_config.json").is_file()
