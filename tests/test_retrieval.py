"""BM25 retrieval (bm25s), the retriever factory and the protocol's argument checks."""

from __future__ import annotations

import math
import random

import pytest

from knowtrace_train.data.schema import Passage, passage_id
from knowtrace_train.retrieval import (
    RetrievalError,
    Retriever,
    RetrieverConfig,
    ScoredPassage,
    build_retriever,
    pair_to_query,
    passage_text,
)
from knowtrace_train.retrieval import postings as postings_mod
from knowtrace_train.retrieval.bm25 import BM25Retriever, BM25Settings


def P(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


CORPUS = [
    P("Paris", "Paris is the capital and largest city of France."),
    P("Berlin", "Berlin is the capital of Germany and its largest city."),
    P("Marathon", "The runners were running a marathon; each runner runs 42 kilometres."),
    P("Stopwords", "the of and to in"),
    P("Ada Lovelace", "Ada Lovelace was an English mathematician who wrote about the Analytical Engine."),
]


def titles(results: list[ScoredPassage]) -> list[str]:
    return [r.passage.title for r in results]


@pytest.fixture
def bm25(tmp_path) -> BM25Retriever:
    return BM25Retriever(CORPUS, cache_dir=tmp_path)


# -- the analyzer: one tokenizer, stemmer and stopword list on both sides --------------------


def test_query_words_are_stemmed_like_passage_words(bm25):
    # "run" occurs nowhere verbatim: it matches only because both sides stem to "run"
    for q in ["run", "RUNS", "running runners"]:
        assert titles(bm25.search([q], 5)[0]) == ["Marathon"], q


def test_every_passage_term_is_found_again_by_the_query_analyzer(bm25):
    """The terms a passage was indexed under are exactly the terms its own text gives as a query."""
    matrix = bm25._matrix.tocsc()  # terms x passages
    for j, p in enumerate(CORPUS):
        indexed = set(matrix.indices[matrix.indptr[j] : matrix.indptr[j + 1]].tolist())
        queried = set(bm25.analyze([passage_text(p)])[0])
        assert indexed == queried, p.title


def test_the_analyzer_survives_the_cache_round_trip(tmp_path):
    built = BM25Retriever(CORPUS, cache_dir=tmp_path)
    loaded = BM25Retriever(CORPUS, cache_dir=tmp_path)  # from the cache folder
    assert loaded.index_dir == built.index_dir
    assert loaded.memory_mapped
    queries = ["running", "capitals of Germany", "mathematicians", "the"]
    assert loaded.analyze(queries) == built.analyze(queries)
    assert loaded.search(queries, 3) == built.search(queries, 3)
    assert titles(loaded.search(["mathematicians"], 1)[0]) == ["Ada Lovelace"]


def test_without_stemming_an_inflected_query_does_not_match(tmp_path):
    r = BM25Retriever(CORPUS, BM25Settings(stemmer=None), cache_dir=tmp_path)
    assert r.search(["run"], 5) == [[]]
    assert titles(r.search(["runs"], 5)[0]) == ["Marathon"]


def test_stopwords_are_dropped_from_queries(tmp_path):
    with_sw = BM25Retriever(CORPUS, cache_dir=tmp_path)
    assert with_sw.search(["the of and"], 5) == [[]]
    without_sw = BM25Retriever(CORPUS, BM25Settings(stopwords=None), cache_dir=tmp_path)
    assert "Stopwords" in titles(without_sw.search(["the of and"], 5)[0])


# -- scores ---------------------------------------------------------------------------------


def test_scores_follow_the_lucene_bm25_formula(tmp_path):
    docs = [P("", "apple banana apple"), P("", "banana cherry"), P("", "cherry cherry cherry date")]
    s = BM25Settings(stemmer=None, stopwords=None, k1=1.2, b=0.75)
    r = BM25Retriever(docs, s, cache_dir=None)
    lengths = [3, 2, 4]
    avg = sum(lengths) / 3

    def term(tf, df, dl):
        idf = math.log(1 + (3 - df + 0.5) / (df + 0.5))
        return idf * tf / (tf + s.k1 * (1 - s.b + s.b * dl / avg))

    [hits] = r.search(["apple cherry"], 5)
    got = {h.passage.text: h.score for h in hits}
    assert got["apple banana apple"] == pytest.approx(term(2, 1, 3), rel=1e-5)
    assert got["banana cherry"] == pytest.approx(term(1, 2, 2), rel=1e-5)
    assert got["cherry cherry cherry date"] == pytest.approx(term(3, 2, 4), rel=1e-5)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def _random_corpus(n: int, seed: int) -> list[Passage]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(300)]
    weights = [1 / (i + 1) for i in range(300)]
    return [P(f"doc {i}", " ".join(rng.choices(vocab, weights, k=rng.randint(5, 40)))) for i in range(n)]


def test_batched_search_agrees_with_bm25s_own_retrieve():
    import bm25s

    corpus = _random_corpus(400, seed=1)
    rng = random.Random(2)
    queries = [" ".join(rng.choices([f"w{i}" for i in range(60)], k=rng.randint(1, 6))) for _ in range(60)]
    r = BM25Retriever(corpus, cache_dir=None)
    ours = r.search(queries, 10)

    ids = r.analyze(queries)
    assert all(ids)  # bm25s' retrieve refuses a query without a known word
    assert isinstance(r.model, bm25s.BM25)
    docs, scores = r.model.retrieve(ids, k=10, show_progress=False)
    for q, hits in enumerate(ours):
        expected = {int(d): float(s) for d, s in zip(docs[q], scores[q]) if s > 0}
        got = {corpus.index(h.passage): h.score for h in hits}
        assert sorted(got.values(), reverse=True) == pytest.approx(sorted(expected.values(), reverse=True), rel=1e-5)
        # the same passages, except where a tie at the 10th score let either side pick another
        kth = min(expected.values())
        assert {d for d, s in got.items() if s > kth * (1 + 1e-6)} == {d for d, s in expected.items() if s > kth * (1 + 1e-6)}


def test_one_batch_equals_one_query_at_a_time_and_chunking_changes_nothing(tmp_path, monkeypatch):
    corpus = _random_corpus(300, seed=3)
    r = BM25Retriever(corpus, cache_dir=tmp_path)
    rng = random.Random(4)
    queries = [" ".join(rng.choices([f"w{i}" for i in range(300)], k=3)) for _ in range(40)]
    batched = r.search(queries, 5)
    assert batched == [r.search([q], 5)[0] for q in queries]
    monkeypatch.setattr(postings_mod, "POSTINGS_PER_CHUNK", 50)
    assert len(list(r._chunks(r.analyze(queries)))) > 5
    assert r.search(queries, 5) == batched


def test_ties_are_broken_by_corpus_order(tmp_path):
    same = "a tie between identical passages"
    corpus = [P("x", "unrelated words here"), Passage("second", "t", same), Passage("first", "t", same)]
    r = BM25Retriever(corpus, cache_dir=tmp_path)
    [hits] = r.search(["tie identical"], 1)
    assert [h.passage.id for h in hits] == ["second"]
    [hits] = r.search(["tie identical"], 5)
    assert [h.passage.id for h in hits] == ["second", "first"]
    assert hits[0].score == hits[1].score


def test_k_larger_than_the_corpus_returns_every_match(bm25):
    [hits] = bm25.search(["capital"], 50)
    assert sorted(titles(hits)) == ["Berlin", "Paris"]


# -- the cache --------------------------------------------------------------------------------


def test_the_cache_key_follows_content_and_settings(tmp_path):
    a = BM25Retriever(CORPUS, cache_dir=tmp_path).index_dir
    assert BM25Retriever(list(CORPUS), cache_dir=tmp_path).index_dir == a
    changed = CORPUS[:-1] + [P("Ada Lovelace", CORPUS[-1].text + " She died in 1852.")]
    assert BM25Retriever(changed, cache_dir=tmp_path).index_dir != a
    assert BM25Retriever(CORPUS, BM25Settings(stemmer="porter"), cache_dir=tmp_path).index_dir != a
    assert BM25Retriever(CORPUS, BM25Settings(k1=0.9), cache_dir=tmp_path).index_dir != a
    assert len(list((tmp_path / "bm25").iterdir())) == 4  # no temporary folders left behind


def test_an_unfinished_cache_folder_is_rebuilt(tmp_path):
    first = BM25Retriever(CORPUS, cache_dir=tmp_path)
    (first.index_dir / "DONE").unlink()
    (first.index_dir / "data.csc.index.npy").write_bytes(b"garbage")
    again = BM25Retriever(CORPUS, cache_dir=tmp_path)
    assert again.index_dir == first.index_dir
    assert titles(again.search(["Germany"], 1)[0]) == ["Berlin"]


def test_no_cache_dir_builds_in_memory(tmp_path):
    r = BM25Retriever(CORPUS, cache_dir=None)
    assert r.index_dir is None and not r.memory_mapped
    assert titles(r.search(["France"], 1)[0]) == ["Paris"]


# -- bad input ----------------------------------------------------------------------------------


def test_empty_corpus_is_an_error():
    with pytest.raises(RetrievalError, match="empty corpus"):
        BM25Retriever([], cache_dir=None)
    with pytest.raises(RetrievalError, match="empty corpus"):
        build_retriever(RetrieverConfig(), [])


def test_a_corpus_without_any_indexable_word_is_an_error():
    with pytest.raises(RetrievalError, match="no passage of the 2 has an indexable word"):
        BM25Retriever([P("", "the"), P("", "of a")], cache_dir=None)


@pytest.mark.parametrize("queries, message", [(["France", ""], "query 1 is empty"), (["   "], "query 0 is empty")])
def test_empty_query_is_an_error_naming_it(bm25, queries, message):
    with pytest.raises(RetrievalError, match=message):
        bm25.search(queries, 5)


@pytest.mark.parametrize("k", [0, -3])
def test_k_must_be_positive(bm25, k):
    with pytest.raises(RetrievalError, match="k must be a positive"):
        bm25.search(["France"], k)


def test_one_string_instead_of_a_list_is_an_error(bm25):
    with pytest.raises(RetrievalError, match="not one string"):
        bm25.search("France", 5)


def test_a_query_that_matches_nothing_returns_an_empty_list(bm25):
    assert bm25.search(["zyzzyva quux", "France"], 5)[0] == []
    assert bm25.search([], 5) == []


def test_bad_settings_name_the_setting():
    with pytest.raises(ValueError, match="unknown stemmer 'klingon'"):
        BM25Settings(stemmer="klingon")
    with pytest.raises(ValueError, match="method must be one of"):
        BM25Settings(method="bm25+")


# -- factory and config ------------------------------------------------------------------------


def test_factory_builds_bm25_by_default(tmp_path):
    r = build_retriever(RetrieverConfig(cache_dir=str(tmp_path)), CORPUS)
    assert isinstance(r, BM25Retriever) and isinstance(r, Retriever)
    query = pair_to_query("Ada Lovelace", "What did she write about?")
    assert titles(r.search([query], RetrieverConfig().k)[0])[0] == "Ada Lovelace"


def test_factory_passes_bm25_settings(tmp_path):
    r = build_retriever(RetrieverConfig(cache_dir=str(tmp_path), stemmer=None, k1=0.5), CORPUS)
    assert r.settings.stemmer is None and r.settings.k1 == 0.5


def test_config_checks_its_fields():
    with pytest.raises(ValueError, match="'backend' must be one of"):
        RetrieverConfig(backend="splade")
    with pytest.raises(ValueError, match="'k' must be a positive integer"):
        RetrieverConfig(k=0)
    from knowtrace_train.config import load_config

    with pytest.raises(ValueError, match=r"unknown key 'top_k' for RetrieverConfig"):
        load_config(RetrieverConfig, data={"backend": "bm25", "top_k": 3})
    assert load_config(RetrieverConfig, data={"backend": "dense", "k": 3}).k == 3


def test_no_es_url_is_a_clear_error(monkeypatch):
    pytest.importorskip("elasticsearch")
    monkeypatch.delenv("KNOWTRACE_ES_URL", raising=False)
    with pytest.raises(RetrievalError, match="KNOWTRACE_ES_URL"):
        build_retriever(RetrieverConfig(backend="elasticsearch"), CORPUS)


def test_pair_to_query_joins_entity_and_guidance():
    assert pair_to_query(" Ada Lovelace ", "who taught her? ") == "Ada Lovelace: who taught her?"
    assert pair_to_query("Ada Lovelace", "") == "Ada Lovelace"


# -- properties -----------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PROPERTY_RETRIEVER = BM25Retriever(CORPUS, cache_dir=None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(min_size=1, max_size=40).filter(str.strip), min_size=1, max_size=8), st.integers(1, 7))
def test_any_non_empty_query_text_gives_at_most_k_matching_passages_best_first(queries, k):
    results = _PROPERTY_RETRIEVER.search(queries, k)
    assert len(results) == len(queries)
    for q, hits in zip(queries, results):
        assert len(hits) <= k
        assert all(h.score > 0 for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        terms = set(_PROPERTY_RETRIEVER.analyze([q])[0])
        for h in hits:  # a hit shares at least one analysed term with its query
            assert terms & set(_PROPERTY_RETRIEVER.analyze([passage_text(h.passage)])[0])
