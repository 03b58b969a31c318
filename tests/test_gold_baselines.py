"""Gold trajectories of the five baselines: each call's prompt and completion on a hand-built 2-hop item, the
method's own parser reading every gold output back, the skip reasons, the bootstrap config check, and one
bootstrap + STaR iteration of Self-Ask on the tiny model."""

from __future__ import annotations

import json

import pytest

from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.data.schema import GoldEvidence, QAItem, SubQuestion
from knowtrace_train.methods import get_method
from knowtrace_train.methods.baselines import (
    IRCoTConfig,
    IterRetGenConfig,
    RACoTConfig,
    ReActConfig,
    SelfAskConfig,
)
from knowtrace_train.methods.baselines import react, self_ask
from knowtrace_train.methods.baselines.common import cot_prompt, extract_answer, first_sentence
from knowtrace_train.methods.baselines.gold import (
    TOO_MANY_HOPS,
    UNREADABLE_STEP,
    baseline_gold_records,
)
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP
from knowtrace_train.selftrain import SelfTrain
from knowtrace_train.selftrain.config import SelfTrainConfig

from gold_helpers import ASKED_TWICE, HOTPOT, ITEM, NO_ENTITY, RATIONALE_STATS, P, Q, Mapped
from gold_helpers import bootstrap_and_one_star_iteration, read_jsonl, words

S1, S2 = "Zentor was founded by Odile Farrant.", "Odile Farrant was born in Castelbrun."
COT = f"{S1} {S2} So the answer is: Castelbrun."
#: what the test retriever returns per query (the queries each method must send), at most `k` of them
HITS = {
    Q: ["zentor", "odile"],
    "Who founded Zentor?": ["zentor", "harlow"],
    "Where was Odile Farrant born?": ["odile"],
    S1: ["odile", "zentor"],
    S2: ["castel"],
    f"{Q} {COT}": ["odile", "zentor"],
}


def block(*keys: str) -> str:
    return "\n".join(f"[{i}] {P[k].title}: {P[k].text}" for i, k in enumerate(keys, 1))


def gold(name, config, items=(ITEM,), retriever=None, **kw):
    m = get_method(name)
    kw.setdefault("fewshot", False)
    return baseline_gold_records(name, config, list(items), retriever or Mapped(HITS),
                                 record_kinds=list(m.record_roles(config)), **kw)


def check_calls(res, prompts, pieces):
    """The records, call by call: the prompt, the response prefix the loop feeds (prompt-side in training) and the
    completion = the gold text alone, what the model writes (`pieces`: (what the loop adds to the transcript
    before the call, the gold text))."""
    recs = res.records_by_role["reason"]
    assert res.records_by_role["answer"] == [] and len(recs) == len(pieces) == len(prompts)
    transcript = ""
    for rec, prompt, (added, text) in zip(recs, prompts, pieces):
        transcript += added
        assert rec["prompt"] == prompt
        assert rec["prefix"] == transcript and rec["completion"] == text
        assert rec["role"] == "reason" and rec["trajectory_id"] == "w2#gold" and rec["iteration"] == 0
        transcript += text


# -- each baseline, call by call -----------------------------------------------------------------------


def test_self_ask_gold_calls_and_their_parses():
    retriever = Mapped(HITS)
    res = gold("self_ask", SelfAskConfig(passages=2), retriever=retriever)
    assert res.stats["trajectories"] == 1 and res.stats["skipped"] == {}
    # the follow-ups are the sub-questions ("#1" resolved), and each is the query of its retrieval
    assert retriever.queries == ["Who founded Zentor?", "Where was Odile Farrant born?"]
    texts = [" Yes.\nFollow up: Who founded Zentor?",
             " Odile Farrant.\nFollow up: Where was Odile Farrant born?",
             " Castelbrun.\nSo the final answer is: Castelbrun."]
    pieces = [(f"Question: {Q}\nAre follow up questions needed here:", texts[0]),
              (f"\nContext: {block('zentor', 'harlow')}\nIntermediate answer:", texts[1]),
              (f"\nContext: {block('odile')}\nIntermediate answer:", texts[2])]
    check_calls(res, [self_ask.prompt(False)] * 3, pieces)
    # the question and the passages are in the response prefix, which the engine feeds: never in the completion
    assert Q in res.records_by_role["reason"][0]["prefix"] and Q not in res.records_by_role["reason"][0]["completion"]
    assert P["odile"].text in res.records_by_role["reason"][2]["prefix"]
    assert P["odile"].text not in res.records_by_role["reason"][2]["completion"]
    # Self-Ask's own parser reads each gold output as the intended step
    parsed = [self_ask.parse_step(t) for t in texts]
    assert [p["follow_up"] for p in parsed] == ["Who founded Zentor?", "Where was Odile Farrant born?", None]
    assert [p["intermediate"] for p in parsed[1:]] == ["Odile Farrant", "Castelbrun"]
    assert [p["final"] for p in parsed] == [None, None, "Castelbrun"]
    traj = res.trajectories[0]
    assert traj.prediction == "Castelbrun" and traj.stop_reason == "answered" and traj.meta["gold"]
    assert [c.parsed for c in traj.calls] == parsed


def test_ircot_gold_calls_and_their_parses():
    retriever = Mapped(HITS)
    res = gold("ircot", IRCoTConfig(passages=2), retriever=retriever)
    assert res.stats["trajectories"] == 1 and res.stats["skipped"] == {}
    # the question first, then each sentence is the next query; passages accumulate without repeats
    assert retriever.queries == [Q, S1, S2]
    two = [P["zentor"], P["odile"]]
    prompts = [cot_prompt(Q, two, fewshot=False)] * 2 + [cot_prompt(Q, [*two, P["castel"]], fewshot=False)]
    for p in prompts:
        assert Q in p and P["zentor"].text in p
    assert P["castel"].text in prompts[2]
    texts = [f" {S1}", f" {S2}", " So the answer is: Castelbrun."]
    check_calls(res, prompts, [("Answer:", texts[0]), ("", texts[1]), ("", texts[2])])
    assert [first_sentence(t) for t in texts] == [S1, S2, "So the answer is: Castelbrun."]
    assert [extract_answer(first_sentence(t)) for t in texts] == [None, None, "Castelbrun"]
    assert res.trajectories[0].prediction == "Castelbrun" and res.trajectories[0].thought == COT


def test_react_gold_calls_and_their_parses():
    retriever = Mapped(HITS)
    res = gold("react", ReActConfig(passages=2), retriever=retriever)
    assert res.stats["trajectories"] == 1 and res.stats["skipped"] == {}
    assert retriever.queries == ["Who founded Zentor?", "Where was Odile Farrant born?"]
    texts = [" I need to find out: Who founded Zentor?\nAction 1: Search[Who founded Zentor?]",
             f" {S1} Now I need to find out: Where was Odile Farrant born?\nAction 2: Search[Where was Odile Farrant born?]",
             f" {S2} So the answer is Castelbrun.\nAction 3: Finish[Castelbrun]"]
    pieces = [(f"Question: {Q}\nThought 1:", texts[0]),
              (f"\nObservation 1: {block('zentor', 'harlow')}\nThought 2:", texts[1]),
              (f"\nObservation 2: {block('odile')}\nThought 3:", texts[2])]
    check_calls(res, [react.prompt(False)] * 3, pieces)
    parsed = [react.parse_action(t) for t in texts]
    assert [(p["action"], p["argument"]) for p in parsed] == [
        ("search", "Who founded Zentor?"), ("search", "Where was Odile Farrant born?"), ("finish", "Castelbrun")]
    assert parsed[1]["thought"] == f"{S1} Now I need to find out: Where was Odile Farrant born?"
    assert [c.parsed for c in res.trajectories[0].calls] == parsed


def test_ra_cot_gold_call_and_its_parse():
    retriever = Mapped(HITS)
    res = gold("ra_cot", RACoTConfig(passages=2), retriever=retriever)
    assert res.stats["trajectories"] == 1 and retriever.queries == [Q]
    prompt = cot_prompt(Q, [P["zentor"], P["odile"]], fewshot=False)
    check_calls(res, [prompt], [("Answer:", f" {COT}")])
    assert extract_answer(f" {COT}") == "Castelbrun" and res.trajectories[0].calls[0].error is None


def test_iter_retgen_gold_calls_and_their_parses():
    retriever = Mapped(HITS)
    res = gold("iter_retgen", IterRetGenConfig(passages=2, max_rounds=2), retriever=retriever)
    assert res.stats["trajectories"] == 1
    # iteration 2's query is the question and iteration 1's generation
    assert retriever.queries == [Q, f"{Q} {COT}"]
    prompts = [cot_prompt(Q, [P["zentor"], P["odile"]], fewshot=False),
               cot_prompt(Q, [P["odile"], P["zentor"]], fewshot=False)]
    recs = res.records_by_role["reason"]
    assert [r["prompt"] for r in recs] == prompts and [r["completion"] for r in recs] == [f" {COT}"] * 2
    assert [r["prefix"] for r in recs] == ["Answer:"] * 2
    assert [c.parsed for c in res.trajectories[0].calls] == [{"answer": "Castelbrun"}] * 2


def test_method_entry_gives_a_rationale_with_exemplars_as_asked():
    m = get_method("self_ask")
    cfg = SelfAskConfig(passages=2)
    res = m.gold_records(cfg, [ITEM], Mapped(HITS), fewshot=True, require_support=True, count_tokens=words,
                         iteration=0)
    assert set(res.records_by_role) == set(m.record_roles(cfg)) == {"reason", "answer"}
    assert RATIONALE_STATS <= set(res.stats)
    assert res.stats["mode"] == "gold" and res.stats["records"] == {"reason": 3, "answer": 0}
    assert res.stats["tokens_all"] == sum(len(r["completion"].split()) for r in res.records_by_role["reason"])
    assert all(r["prompt"] == self_ask.prompt(True) for r in res.records_by_role["reason"])
    assert "Brindle Maps" in res.records_by_role["reason"][0]["prompt"]  # the exemplars
    # a method without gold trajectories says so
    with pytest.raises(ValueError, match="no gold trajectories"):
        get_method("mintqa_rag").gold_records(get_method("mintqa_rag").config_class(), [ITEM], Mapped(HITS),
                                              fewshot=False, require_support=True, count_tokens=len, iteration=0)


# -- what cannot give a gold trajectory ------------------------------------------------------------


def test_items_without_a_gold_trajectory_are_counted_and_skipped():
    items = [HOTPOT, NO_ENTITY, ASKED_TWICE, ITEM]
    res = gold("self_ask", SelfAskConfig(passages=2), items)
    # the sub-question asked twice: Self-Ask's loop stops on it, so the gold outputs are not its steps
    assert res.stats["skipped"] == {NO_CHAIN: 1, NO_CHAIN_ENTITY: 1, UNREADABLE_STEP: 1}
    assert res.stats["items"] == 4 and res.stats["trajectories"] == 1
    assert {r["trajectory_id"] for r in res.records_by_role["reason"]} == {"w2#gold"}
    # IRCoT needs a sentence per hop and one for the answer: 2 hops do not fit in 2 rounds
    assert gold("ircot", IRCoTConfig(passages=2, max_rounds=2)).stats["skipped"] == {TOO_MANY_HOPS: 1}
    assert gold("self_ask", SelfAskConfig(passages=2, max_rounds=1)).stats["skipped"] == {TOO_MANY_HOPS: 1}
    # a ReAct answer with a bracket cannot be read back from Finish[...]
    bracket = QAItem(id="b", question=Q, answers=("Castel]brun",), evidence=GoldEvidence(
        triples=(("Zentor", "founded by", "Castel]brun"),), sub_questions=(SubQuestion("Who founded Zentor?", "Castel]brun"),)))
    assert gold("react", ReActConfig(passages=2), [bracket], require_support=False).stats["skipped"] == {UNREADABLE_STEP: 1}


def test_a_hop_the_retrieved_passages_do_not_state_skips_the_item():
    no_hop2 = {**HITS, "Where was Odile Farrant born?": ["zentor"], Q: ["zentor", "harlow"], S1: ["zentor"], S2: []}
    for name, cfg in [("self_ask", SelfAskConfig(passages=2)), ("react", ReActConfig(passages=2)),
                      ("ircot", IRCoTConfig(passages=2)), ("ra_cot", RACoTConfig(passages=2)),
                      ("iter_retgen", IterRetGenConfig(passages=2, max_rounds=2))]:
        res = gold(name, cfg, retriever=Mapped(no_hop2))
        assert res.stats["skipped"] == {UNSUPPORTED_HOP: 1} and res.stats["trajectories"] == 0, name
        assert res.records_by_role == {"reason": [], "answer": []}
        res = gold(name, cfg, retriever=Mapped(no_hop2), require_support=False)
        assert res.stats["trajectories"] == 1, name
    # RA-CoT and Iter-RetGen: every passage list that carries the chain must state each hop; here the
    # question's retrieval does not find hop 2 (Iter-RetGen's second iteration would)
    only_first = {**HITS, Q: ["zentor", "harlow"]}
    assert gold("iter_retgen", IterRetGenConfig(passages=2, max_rounds=2), retriever=Mapped(only_first)
                ).stats["skipped"] == {UNSUPPORTED_HOP: 1}
    assert gold("self_ask", SelfAskConfig(passages=2), retriever=Mapped(only_first)).stats["trajectories"] == 1


# -- the bootstrap config and the loop ---------------------------------------------------------------


def test_a_bootstrap_of_a_method_without_gold_trajectories_is_refused_before_any_work(tmp_path):
    for mode in ("always", "auto"):
        cfg = load_config(SelfTrainConfig, None, ["--strategy.name", "mintqa_rag", "--mode", "star", "--bootstrap.mode",
                                                  mode, "--output_dir", str(tmp_path / "run")])
        with pytest.raises(ValueError, match=rf"bootstrap.mode: {mode} builds M0 from gold trajectories, and method "
                                             r"'mintqa_rag' has none \(methods with gold trajectories: dog, ircot, "
                                             r"iter_retgen, knowtrace, mintqa_decompose, mintqa_dynamic, ra_cot, react, "
                                             r"self_ask, trace\); set bootstrap.mode: never"):
            SelfTrain(cfg, progress=False)
        assert not (tmp_path / "run").exists()
    load_config(SelfTrainConfig, None, ["--strategy.name", "mintqa_rag", "--mode", "star", "--bootstrap.mode",
                                        "never"]).validate()
    for name in ("self_ask", "ircot", "react", "ra_cot", "iter_retgen"):
        load_config(SelfTrainConfig, None, ["--strategy.name", name, "--mode", "star"]).validate()
    # the recipe turns it into a config error naming the file
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("selftrain_recipe", Path(__file__).parents[1] / "recipes" / "selftrain.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    with pytest.raises(ConfigError, match="defaults: bootstrap.mode: always .* method 'mintqa_rag' has none"):
        recipe.load(None, ["--strategy.name", "mintqa_rag", "--mode", "star"])


def test_self_ask_bootstrap_and_one_star_iteration_on_the_tiny_model(tmp_path, tiny_model_dir):
    from knowtrace_train.methods.baselines.gold import baseline_gold_trajectories

    def gold_trajectories(run):
        return baseline_gold_trajectories("self_ask", run.config.strategy, run.questions.rollout, run.retriever,
                                          fewshot=run.config.fewshot_trained)[0]

    run, gold_stats, it = bootstrap_and_one_star_iteration(
        tmp_path, tiny_model_dir, "self_ask", ["--strategy.passages", "2", "--strategy.max_rounds", "3",
                                               "--strategy.max_new_tokens", "8", "--strategy.answer_tokens", "4"],
        gold_trajectories)
    d = run.run_dir
    boot = read_jsonl(d / "iter_0/sft_reason.jsonl")
    assert len(boot) == gold_stats["records"]["reason"] > 0 and (d / "iter_0/sft_answer.jsonl").read_text() == ""
    assert all(r["prompt"] == self_ask.prompt(False) and r["trajectory_id"].endswith("#gold") for r in boot)
    m0 = json.loads((d / "iter_0/metrics.json").read_text())
    assert m0["train"]["bootstrap"]["records"] == len(boot)
    assert it["sft_records"]["reason"] > 0 and (d / "iter_1/adapters/reason/adapter_config.json").is_file()
