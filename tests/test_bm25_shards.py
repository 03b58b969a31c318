"""The sharded BM25 index (retrieval/bm25_shards.py): the same scores and rankings as today's one-piece index."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from knowtrace_train.data.corpus import read_corpus
from knowtrace_train.data.store import open_store
from knowtrace_train.retrieval import RetrievalError, RetrieverConfig, build_retriever, pair_to_query
from knowtrace_train.retrieval.bm25 import BM25Retriever, BM25Settings
from knowtrace_train.retrieval.bm25_shards import SHARDED_FORMAT, ShardedBM25Retriever

ROOT = Path(__file__).resolve().parents[1] / "data" / "world"


def world_queries() -> list[str]:
    out = []
    for line in (ROOT / "dev.jsonl").read_text().splitlines()[:100]:
        it = json.loads(line)
        out.append(it["question"])
        for (s, r, _o), sub in zip(it["evidence"]["triples"], it["evidence"]["sub_questions"]):
            out += [pair_to_query(s, r), pair_to_query(s, sub["question"])]
    return out + ["zzzunknownword", "the of and"]  # nothing matches these two


@pytest.mark.parametrize("settings", [BM25Settings(), BM25Settings(method="robertson", stemmer=None, k1=1.5, b=0.5)])
@pytest.mark.parametrize("shard_passages", [250, 100_000])
def test_shards_score_and_rank_as_one_piece(tmp_path, settings, shard_passages):
    store = open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path)
    one = BM25Retriever(read_corpus(ROOT / "corpus.jsonl"), settings, cache_dir=None)
    sharded = ShardedBM25Retriever(store, settings, cache_dir=tmp_path, shard_passages=shard_passages)
    assert len(sharded.meta["shards"]) == -(-len(store) // shard_passages)
    queries = world_queries()
    for k in (1, 5, 20):
        a, b = one.search(queries, k), sharded.search(queries, k)
        for q, x, y in zip(queries, a, b):
            assert [h.passage.id for h in x] == [h.passage.id for h in y], q
            assert all(abs(h.score - g.score) <= 1e-5 for h, g in zip(x, y)), q
    assert a[-1] == [] and a[-2] == [] and b[-1] == [] and b[-2] == []
    # one query per call gives what the batch gave; shards searched on two threads too
    assert [sharded.search([q], 5)[0] for q in queries[:20]] == sharded.search(queries[:20], 5)
    sharded.threads = 2
    assert sharded.search(queries, 20) == b  # b: the k=20 results on one thread


def test_build_retriever_on_a_store_is_sharded_and_reloads(tmp_path):
    store = open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path)
    r = build_retriever(RetrieverConfig(cache_dir=str(tmp_path)), store)
    assert isinstance(r, ShardedBM25Retriever)
    again = build_retriever(RetrieverConfig(cache_dir=str(tmp_path)), store)
    assert again.index_dir == r.index_dir
    assert r.search(["capital of Drelovia"], 3) == again.search(["capital of Drelovia"], 3)


def test_index_of_another_format_is_rebuilt_with_a_warning(tmp_path, caplog):
    store = open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path)
    r = ShardedBM25Retriever(store, cache_dir=tmp_path, shard_passages=1000)
    meta = r.index_dir / "knowtrace_bm25_shards.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "format": SHARDED_FORMAT + 99}))
    with caplog.at_level(logging.WARNING):
        again = ShardedBM25Retriever(store, cache_dir=tmp_path, shard_passages=1000)
    assert "rebuilding" in caplog.text and again.meta["format"] == SHARDED_FORMAT


def test_a_list_is_refused(tmp_path):
    with pytest.raises(RetrievalError, match="passage store"):
        ShardedBM25Retriever(read_corpus(ROOT / "corpus.jsonl"), cache_dir=tmp_path)


def test_a_full_disk_is_one_line_and_the_half_built_index_is_removed(tmp_path, monkeypatch):
    import errno

    from knowtrace_train.retrieval import bm25_shards

    store = open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bm25_shards.np, "save", full)
    from knowtrace_train.io import DiskFullError

    with pytest.raises(DiskFullError, match=r"bm25-shards: the disk filled while building the BM25 index: it needs about [\d,]+ bytes"):
        ShardedBM25Retriever(store, cache_dir=tmp_path, shard_passages=1000)
    assert list((tmp_path / "bm25-shards").iterdir()) == []


# -- MaxScore (pruning="maxscore") against the exhaustive search (pruning="none") -----------------------------


def hard_queries(retriever) -> list[str]:
    """Queries MaxScore could get wrong: every term common (no rare term to start from), one term, a term
    repeated, a word the corpus never had beside known ones."""
    counts = retriever._postings
    vocab = {i: w for w, i in retriever._analyzer.get_vocab_dict().items()}
    common = [vocab[int(t)] for t in np.argsort(-counts)[:30] if int(t) in vocab and vocab[int(t)]]
    rare = [vocab[int(t)] for t in np.argsort(counts)[:5] if int(t) in vocab and vocab[int(t)]]
    return (
        [" ".join(common[i:i + n]) for n in (2, 3, 5) for i in range(0, 15, 5)]  # all common
        + common[:8] + rare[:3]  # one term
        + [f"{common[0]} {common[0]} {common[3]}", f"{rare[0]} {common[1]} zzzunknownword", "zzzunknownword"]
    )


def assert_same_rows(a, b, where):
    for i, ((da, va), (db, vb)) in enumerate(zip(a, b)):
        assert da.tolist() == db.tolist(), (where, i)
        assert np.allclose(va, vb, rtol=0, atol=1e-5), (where, i)
        assert va.tolist() == vb.tolist(), (where, i)  # in fact bit for bit: the product's float32 sums


@pytest.fixture(scope="module")
def distractor_store(tmp_path_factory):
    from knowtrace_train.data.generated import generate_corpus

    tmp = tmp_path_factory.mktemp("distractors")
    generate_corpus(tmp / "corpus.jsonl", 3000, seed=1, base=ROOT / "corpus.jsonl")
    return open_store(tmp / "corpus.jsonl", cache_dir=tmp), tmp


@pytest.mark.parametrize("corpus", ["world", "distractors"])
@pytest.mark.parametrize("shard_passages", [500, 100_000])
def test_maxscore_ranks_and_scores_as_the_exhaustive_search(tmp_path, corpus, shard_passages, distractor_store, monkeypatch):
    from knowtrace_train.retrieval import postings as bm25

    # small corpora: block maxima for terms of 16 postings on, blocks of 16 passages, 8 passages scored first
    monkeypatch.setattr(bm25, "_BLOCK_TERM", 16)
    monkeypatch.setattr(bm25, "_BLOCK_BITS", 4)
    monkeypatch.setattr(bm25, "_FIRST_BLOCK", 8)
    if corpus == "world":
        store, cache = open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path), tmp_path
    else:
        store, cache = distractor_store
    r = ShardedBM25Retriever(store, cache_dir=cache, shard_passages=shard_passages, pruning="none")
    queries = world_queries() + hard_queries(r)
    term_ids = r.analyze(queries)
    assert [] in term_ids and any(len(set(t)) == 1 for t in term_ids)
    for k in (1, 5, 20):
        r.pruning = "none"
        exhaustive = r.search_rows(term_ids, k)
        r.pruning = "maxscore"
        assert_same_rows(exhaustive, r.search_rows(term_ids, k), (corpus, shard_passages, k))
    assert (r.index_dir / "upper_bounds.npy").exists()
    # one query a call, two threads, and the default: the same
    assert_same_rows([r.search_rows([t], 5)[0] for t in term_ids[:40]], r.search_rows(term_ids[:40], 5), "one per call")
    one_thread = r.search_rows(term_ids, 5)
    r.threads = 2
    assert_same_rows(r.search_rows(term_ids, 5), one_thread, "threads")
    again = ShardedBM25Retriever(store, cache_dir=cache, shard_passages=shard_passages)
    assert again.pruning == "maxscore"
    assert again.search(queries, 5) == r.search(queries, 5)


def test_maxscore_in_the_one_piece_index(tmp_path, monkeypatch):
    from knowtrace_train.retrieval import postings as bm25

    monkeypatch.setattr(bm25, "_BLOCK_TERM", 16)
    monkeypatch.setattr(bm25, "_BLOCK_BITS", 4)
    monkeypatch.setattr(bm25, "_FIRST_BLOCK", 8)
    passages = read_corpus(ROOT / "corpus.jsonl")
    for cache_dir in (None, tmp_path):
        exhaustive = BM25Retriever(passages, cache_dir=cache_dir, pruning="none")
        pruned = BM25Retriever(passages, cache_dir=cache_dir, pruning="maxscore")
        queries = world_queries() + hard_queries(pruned)
        for k in (1, 5, 20):
            a, b = exhaustive.search(queries, k), pruned.search(queries, k)
            assert [[h.passage.id for h in x] for x in a] == [[h.passage.id for h in x] for x in b]
            assert [[h.score for h in x] for x in a] == [[h.score for h in x] for x in b]
    assert (pruned.index_dir / "upper_bounds.npy").exists()


def test_pruning_must_be_known(tmp_path):
    with pytest.raises(RetrievalError, match="pruning"):
        BM25Retriever(read_corpus(ROOT / "corpus.jsonl"), cache_dir=None, pruning="wand")


def test_maxscore_sorts_postings_that_are_not_sorted_by_passage(tmp_path, caplog):
    import scipy.sparse as sp

    passages = read_corpus(ROOT / "corpus.jsonl")
    exhaustive = BM25Retriever(passages, cache_dir=tmp_path, pruning="none")
    pruned = BM25Retriever(passages, cache_dir=tmp_path)
    m = pruned._matrix
    rng = np.random.default_rng(0)
    indices, data = np.array(m.indices), np.array(m.data)
    for t in range(0, m.shape[0], 3):  # every third term's postings shuffled
        lo, hi = m.indptr[t], m.indptr[t + 1]
        perm = lo + rng.permutation(hi - lo)
        indices[lo:hi], data[lo:hi] = indices[perm], data[perm]
    pruned._shards = [(0, sp.csr_matrix((data, indices, m.indptr), shape=m.shape))]
    queries = world_queries()
    with caplog.at_level(logging.WARNING):
        got = pruned.search(queries, 5)
    assert "not sorted by passage" in caplog.text
    assert got == exhaustive.search(queries, 5)
    assert not (pruned.index_dir / "upper_bounds.npy").exists()  # kept only where no shard needed sorting
