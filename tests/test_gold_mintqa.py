"""Gold trajectories of MINTQA's decomposing strategies: each call's prompt and completion on a hand-built 2-hop
item, the engine's own parsers reading every gold output back, the passages as the strategy retrieves them,
and the skip reasons."""

from __future__ import annotations

from collections import Counter

import pytest

from knowtrace_train.decisions import decision_weights
from knowtrace_train.generation.base import BASE_ROLE, GenerationError
from knowtrace_train.methods import get_method
from knowtrace_train.methods.mintqa import MintQADecomposeConfig, MintQADynamicConfig, MintQARagConfig
import knowtrace_train.methods.mintqa.prompts as prompts
from knowtrace_train.methods.mintqa.gold import TOO_MANY_HOPS, UNREADABLE_STEP, mintqa_gold_records
from knowtrace_train.methods.mintqa.parsing import parse_answer, parse_selfanswer, parse_step
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP
from knowtrace_train.selftrain.config import has_gold_trajectories

from scripted import Scripted
from gold_helpers import ASKED_TWICE, HOTPOT, ITEM, NO_ENTITY, RATIONALE_STATS, P, Q, Mapped, read_jsonl, words
from gold_helpers import bootstrap_and_one_star_iteration

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


# -- the dynamic strategy's certainty: what the raw model answers right ---------------------------------------

class RawModel(Scripted):
    """The raw model's self-answers: `answers` maps a sub-question to its output (an Exception is raised)."""

    def __init__(self, answers):
        def script(role, prompt):
            assert role == BASE_ROLE
            q = prompt.rsplit("Question: ", 1)[1].split("\n", 1)[0]
            return answers[q]

        super().__init__(script)
        self.closed = 0

    def close(self):
        self.closed += 1


def test_dynamic_gold_is_certain_where_the_raw_model_answers_the_hop_right():
    """Hop 1 the raw model answers right (its own casing: EM-normalised), hop 2 wrong: hop 1's self-answer is
    certain and does not retrieve, its answer in the history; hop 2's is uncertain and answered over passages."""
    raw = RawModel({S1: " odile farrant\nConfidence: uncertain", S2: " Paris\nConfidence: certain"})
    retriever = Mapped(HITS)
    res = gold(MintQADynamicConfig(passages=2), retriever=retriever, make_generator=lambda: raw)
    assert res.stats["trajectories"] == 1 and res.stats["skipped"] == {}
    # measured once, in one batch, greedy, with the raw model's own prompts (its exemplars), then closed
    assert len(raw.batches) == 1 and raw.closed == 1
    assert [r.prompt for r in raw.batches[0]] == [prompts.selfanswer_prompt(S1, True), prompts.selfanswer_prompt(S2, True)]
    assert all(r.temperature == 0.0 and r.stop == prompts.SELFANSWER_STOP for r in raw.batches[0])
    # the engine's replay: hop 1 answered from the model's knowledge, only hop 2 retrieves
    assert retriever.queries == [S2]
    history = [(S1, "odile farrant"), (S2, "Castelbrun")]
    want = [
        ("decompose", prompts.decompose_prompt(Q, [], False), f" {S1}"),
        ("selfanswer", prompts.selfanswer_prompt(S1, False), " odile farrant\nConfidence: certain"),
        ("decompose", prompts.decompose_prompt(Q, history[:1], False), f" {S2}"),
        ("selfanswer", prompts.selfanswer_prompt(S2, False), " unknown\nConfidence: uncertain"),
        ("subanswer", prompts.rag_prompt(S2, [P["odile"], P["zentor"]], False), " Castelbrun"),
        ("decompose", prompts.decompose_prompt(Q, history, False), " finish"),
        ("answer", prompts.final_prompt(Q, history, False), " Castelbrun"),
    ]
    traj = res.trajectories[0]
    assert [(c.role, c.prompt, c.output) for c in traj.calls] == want
    assert [c.parsed for c in traj.calls if c.role == "selfanswer"] == [
        {"answer": "odile farrant", "confidence": "certain"}, {"answer": "unknown", "confidence": "uncertain"}]
    assert traj.meta["subquestions"] == [
        {"step": 1, "question": S1, "answer": "odile farrant", "retrieved": False, "confidence": "certain",
         "self_answer": "odile farrant"},
        {"step": 2, "question": S2, "answer": "Castelbrun", "retrieved": True, "confidence": "uncertain",
         "self_answer": "unknown"}]
    assert [(e["step"], e["answer"], e["outcome"], e["known"]) for e in traj.meta["certainty"]] == [
        (1, "odile farrant", "right", "odile farrant"), (2, "Paris", "wrong", None)]
    # the records: the self-answers' confidence marked as the certainty decision, counted per label and reason
    own = res.records_by_role["selfanswer"]
    assert [r["completion"] for r in own] == [want[1][2], want[3][2]]
    assert [r["decision"] for r in own] == [
        {"kind": "certainty", "label": "certain", "start": 26, "end": 34},
        {"kind": "certainty", "label": "uncertain", "start": 20, "end": 30}]
    assert [r["completion"][r["decision"]["start"]:r["decision"]["end"]] for r in own] == [" certain", " uncertain"]
    assert all("decision" not in r for k, rs in res.records_by_role.items() if k != "selfanswer" for r in rs)
    assert res.stats["records"] == {"decompose": 3, "selfanswer": 2, "subanswer": 1, "answer": 1}
    assert res.stats["decisions"] == {"certainty": {"certain": 1, "uncertain": 1}}
    assert res.stats["certainty"] == {"measured": True, "hops": 2, "certain": {"right": 1}, "uncertain": {"wrong": 1}}
    # balanced over the two labels where training weighs decisions (decision_weight)
    assert decision_weights([r for rs in res.records_by_role.values() for r in rs if "decision" in r], 4.0) == [4.0, 4.0]


def test_dynamic_gold_uncertain_reasons_and_without_a_generator():
    """An empty self-answer and a refused request are uncertain (no_answer, error); a certain hop needs no
    passages stating it, an uncertain one does; with no generator every hop is uncertain, as before."""
    raw = RawModel({S1: "\n", S2: GenerationError("refused")})
    res = gold(MintQADynamicConfig(passages=2), make_generator=lambda: raw)
    assert res.stats["certainty"] == {"measured": True, "hops": 2, "certain": {}, "uncertain": {"no_answer": 1, "error": 1}}
    assert res.stats["decisions"] == {"certainty": {"uncertain": 2}}
    assert [c.output for c in res.trajectories[0].calls if c.role == "selfanswer"] == [
        " unknown\nConfidence: uncertain"] * 2
    # nothing retrieved for hop 1 states its answer: skipped where it retrieves, kept where the model knew it
    no_hop1 = {S2: ["odile"]}
    assert gold(MintQADynamicConfig(passages=2), retriever=Mapped(no_hop1)).stats["skipped"] == {UNSUPPORTED_HOP: 1}
    knows = RawModel({S1: " Odile Farrant\nConfidence: certain", S2: " unknown\nConfidence: uncertain"})
    res = gold(MintQADynamicConfig(passages=2), retriever=Mapped(no_hop1), make_generator=lambda: knows)
    assert res.stats["trajectories"] == 1 and res.stats["decisions"] == {"certainty": {"certain": 1, "uncertain": 1}}
    # no generator: today's labels, said in the statistics
    res = gold(MintQADynamicConfig(passages=2))
    assert res.stats["certainty"] == {"measured": False, "hops": 0, "certain": {}, "uncertain": {}}
    assert res.stats["decisions"] == {"certainty": {"uncertain": 2}}
    # the method entries pass the raw model to the dynamic strategy only (decompose never builds it)
    built = []
    for name in ("mintqa_decompose", "mintqa_dynamic"):
        m = get_method(name)
        out = m.gold_records(m.config_class(passages=2), [ITEM], Mapped(HITS), fewshot=False, require_support=True,
                             count_tokens=words, iteration=0,
                             make_generator=lambda: built.append(name) or RawModel({S1: " Odile Farrant", S2: " x"}))
        assert out.stats["trajectories"] == 1
    assert built == ["mintqa_dynamic"] and out.stats["decisions"] == {"certainty": {"certain": 1, "uncertain": 1}}


def test_the_certainty_decision_is_on_whole_tokens(real_tokenizer):
    """The marked confidence word is whole tokens of the completion, so training can weigh it."""
    from knowtrace_train.train.lora import load_records, tokenize_records

    raw = RawModel({S1: " Odile Farrant", S2: " unknown"})
    res = gold(MintQADynamicConfig(passages=2), make_generator=lambda: raw)
    rows, _ = tokenize_records(real_tokenizer, load_records(res.records_by_role["selfanswer"], "selfanswer"), "chat",
                               4096, 4.0)
    weighted = [real_tokenizer.decode([i for i, w in zip(r["input_ids"], r["loss_weights"]) if w == 4.0]) for r in rows]
    assert weighted == [" certain", " uncertain"]


def test_dynamic_bootstrap_measures_the_raw_base_and_one_star_iteration_on_the_tiny_model(tmp_path, tiny_model_dir):
    """The bootstrap builds the raw base for the gold's certainty: every hop of the gold chains is asked once, and
    the self-answer records mark their certainty (the random tiny model knows nothing: all uncertain)."""
    from knowtrace_train.methods.mintqa.gold import mintqa_gold_trajectories

    def gold_trajectories(run):
        return mintqa_gold_trajectories(run.config.strategy, run.questions.rollout, run.retriever,
                                        fewshot=run.config.fewshot_trained)[0]

    run, gold_stats, it = bootstrap_and_one_star_iteration(
        tmp_path, tiny_model_dir, "mintqa_dynamic",
        ["--strategy.passages", "2", "--strategy.answer_tokens", "6", "--strategy.subquestion_tokens", "8",
         "--strategy.confidence_tokens", "6"], gold_trajectories)
    c = gold_stats["certainty"]
    assert c["measured"] and c["hops"] > 0 and sum(c["certain"].values()) + sum(c["uncertain"].values()) == c["hops"]
    boot = read_jsonl(run.run_dir / "iter_0/sft_selfanswer.jsonl")
    assert len(boot) == gold_stats["records"]["selfanswer"] > 0 and all(r["decision"]["kind"] == "certainty" for r in boot)
    assert gold_stats["decisions"]["certainty"] == dict(Counter(r["decision"]["label"] for r in boot))
    assert it["status"] == "trained"
