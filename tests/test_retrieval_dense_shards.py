"""Dense retrieval on a passage store (retrieval/dense_shards.py): embeddings encoded streaming into
memory-mapped shards give the in-memory `DenseRetriever`'s top k and scores, with several shards."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("faiss")

from knowtrace_train.data.corpus import read_corpus  # noqa: E402
from knowtrace_train.data.store import open_store  # noqa: E402
from knowtrace_train.io import DiskFullError  # noqa: E402
from knowtrace_train.retrieval import RetrievalError, RetrieverConfig, build_retriever, pair_to_query, passage_text  # noqa: E402
from knowtrace_train.retrieval import dense_shards  # noqa: E402
from knowtrace_train.retrieval.dense import DenseRetriever  # noqa: E402
from knowtrace_train.retrieval.dense_shards import DENSE_SHARDS_FORMAT, ShardedDenseRetriever, ivfpq_lists  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] / "data" / "world"
OVERLAP = 0.9


def world_queries(n: int = 60) -> list[str]:
    out = []
    for line in (ROOT / "dev.jsonl").read_text().splitlines()[:n]:
        it = json.loads(line)
        out.append(it["question"])
        for (s, r, _o), sub in zip(it["evidence"]["triples"], it["evidence"]["sub_questions"]):
            out.append(pair_to_query(s, r))
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory, encoder_dir):
    """The world corpus' first 1,100 passages (each encoded twice, so not all 2,413) as a store, its sharded index
    (4 shards: 3 of 300, the last of 200; search blocks of 200) and today's in-memory one."""
    cache = tmp_path_factory.mktemp("cache")
    corpus = cache / "corpus.jsonl"
    corpus.write_text("".join(line + "\n" for line in (ROOT / "corpus.jsonl").read_text().splitlines()[:1100]))
    store = open_store(corpus, cache_dir=cache)
    sharded = ShardedDenseRetriever(store, encoder=str(encoder_dir), cache_dir=cache, shard_passages=300,
                                    batch_size=32, encode_chunk=96, search_block=200)
    one = DenseRetriever(read_corpus(corpus), encoder=str(encoder_dir), cache_dir=cache)
    return cache, store, sharded, one


def same_ranking(x, y, tol=1e-5):
    """The same passages in the same order with scores within `tol`, except that two neighbours whose scores
    are within `tol` may come in either order (float sums in another order)."""
    assert len(x) == len(y)
    assert all(abs(a.score - b.score) <= tol for a, b in zip(x, y))
    for i, (a, b) in enumerate(zip(x, y)):
        if a.passage.id != b.passage.id:
            near = [h.passage.id for h in y if abs(h.score - a.score) <= tol]
            assert a.passage.id in near or i == len(x) - 1, (i, a, b)
    # the same set, except at a tied last place
    assert {h.passage.id for h in x[:-1]} <= {h.passage.id for h in y} | {h.passage.id for h in x if abs(h.score - x[-1].score) <= tol}


def test_shards_give_the_in_memory_top_k_and_scores(world):
    _, store, sharded, one = world
    assert [s["stop"] - s["start"] for s in sharded.meta["shards"]] == [300, 300, 300, 200]
    emb = np.concatenate([np.load(sharded.index_dir / s["file"]) for s in sharded.meta["shards"]])
    assert np.allclose(emb, np.load(one.index_dir / "embeddings.npy"), atol=1e-5)  # the same vectors, in row order
    queries = world_queries()
    for k in (1, 5, 20):
        a, b = one.search(queries, k), sharded.search(queries, k)
        exact = 0
        for q, x, y in zip(queries, a, b):
            assert len(x) == len(y) == k, q
            same_ranking(x, y)
            exact += [h.passage.id for h in x] == [h.passage.id for h in y]
        assert exact >= len(queries) - 2  # near-ties aside, identical
    assert all(isinstance(h.passage, type(store[0])) and h.passage == store.by_id[h.passage.id] for h in b[0])
    # one query per call gives what the batch gave (a query encoded alone is padded otherwise: floats differ by ~1e-7)
    for x, y in zip([sharded.search([q], 5)[0] for q in queries[:10]], sharded.search(queries[:10], 5)):
        same_ranking(x, y)


_WORDS: dict[str, np.ndarray] = {}


def bag_encode(self, texts, kind):
    """A fast stand-in encoder for the tests of the build's mechanics: a normalised sum of one fixed
    random 48-dim vector per word (seeded by the word)."""
    out = np.zeros((len(texts), 48), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in re.findall(r"\w+", t.lower()):
            if w not in _WORDS:
                seed = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                _WORDS[w] = np.random.default_rng(seed).standard_normal(48).astype(np.float32)
            out[i] += _WORDS[w]
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture
def bag(monkeypatch, tmp_path, encoder_dir):
    """(store, kwargs) for a sharded index with the stand-in encoder in a cache of its own."""
    monkeypatch.setattr(ShardedDenseRetriever, "_encode", bag_encode)
    store = open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path)
    return store, dict(encoder=str(encoder_dir), cache_dir=tmp_path)


def test_the_factory_builds_it_on_a_store_and_reloads_it_from_the_cache(bag, monkeypatch):
    store, kw = bag
    r = build_retriever(RetrieverConfig(backend="dense", cache_dir=str(kw["cache_dir"])), store)
    assert isinstance(r, ShardedDenseRetriever)
    assert r.meta["num_docs"] == len(store) and r.meta["dim"] == 48 and len(r.meta["shards"]) == 1
    # a second build of the same store and encoder encodes nothing
    monkeypatch.setattr(ShardedDenseRetriever, "_build_into", lambda *a: pytest.fail("re-encoded"))
    again = build_retriever(RetrieverConfig(backend="dense", cache_dir=str(kw["cache_dir"])), store)
    assert again.index_dir == r.index_dir
    assert again.search(["capital of Drelovia"], 3) == r.search(["capital of Drelovia"], 3)


def test_float16_shards_and_the_ivfpq_index(bag):
    store, kw = bag
    full = ShardedDenseRetriever(store, shard_passages=1000, **kw)
    half = ShardedDenseRetriever(store, shard_passages=1000, dtype="float16", **kw)
    assert np.load(half.index_dir / half.meta["shards"][0]["file"], mmap_mode="r").dtype == np.float16
    queries = world_queries(30)
    a, h = full.search(queries, 5), half.search(queries, 5)
    assert sum(x[0].passage.id == y[0].passage.id for x, y in zip(a, h)) >= len(queries) - 1
    assert all(abs(x[0].score - y[0].score) < 2e-3 for x, y in zip(a, h))
    ivf = ShardedDenseRetriever(store, shard_passages=1000, index="ivfpq", nprobe=64, refine=10, **kw)  # every list: only PQ approximates
    assert ivf.index_dir == full.index_dir  # the embeddings are shared; the IVF-PQ index sits beside them
    assert ivf.nlist == ivfpq_lists(len(store)) == 61 and ivf.pq_m == 6  # 4 sqrt(n) capped at n // 39; dim / 8
    found = ivf.search(queries, 5)
    overlap = np.mean([len({p.passage.id for p in x} & {p.passage.id for p in y}) / 5 for x, y in zip(a, found)])
    assert overlap >= OVERLAP
    for flat, hits in zip(a, found):  # candidates re-scored exactly: a passage flat search found has its score
        scores = {p.passage.id: p.score for p in flat}
        assert [p.score for p in hits] == sorted((p.score for p in hits), reverse=True)
        assert all(abs(p.score - scores[p.passage.id]) <= 1e-5 for p in hits if p.passage.id in scores)


def test_a_list_a_bad_dtype_and_no_cache_are_refused(bag):
    store, kw = bag
    with pytest.raises(RetrievalError, match="passage store"):
        ShardedDenseRetriever(read_corpus(ROOT / "corpus.jsonl"), **kw)
    with pytest.raises(RetrievalError, match="dtype"):
        ShardedDenseRetriever(store, **{**kw, "dtype": "int8"})
    with pytest.raises(RetrievalError, match="cache_dir"):
        ShardedDenseRetriever(store, **{**kw, "cache_dir": None})
    with pytest.raises(ValueError, match="dense_index"):
        RetrieverConfig(backend="dense", dense_index="hnsw")


def test_another_format_is_rebuilt_and_a_killed_build_leaves_nothing_loaded(bag, caplog, monkeypatch):
    store, kw = bag
    small = dict(kw, shard_passages=1000, encode_chunk=256)
    r = ShardedDenseRetriever(store, **small)
    meta = r.index_dir / "knowtrace_dense_shards.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "format": DENSE_SHARDS_FORMAT + 99}))
    calls = {"n": 0}

    def dies(self, texts, kind):
        calls["n"] += 1
        if calls["n"] == 6:  # in the second shard
            raise KeyboardInterrupt  # a kill in the middle of the build
        return bag_encode(self, texts, kind)

    monkeypatch.setattr(ShardedDenseRetriever, "_encode", dies)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        ShardedDenseRetriever(store, **small)
    assert "rebuilding" in caplog.text
    assert not r.index_dir.exists()  # the old format removed, the killed build's folder gone
    assert [p.name for p in r.index_dir.parent.iterdir()] == []
    monkeypatch.setattr(ShardedDenseRetriever, "_encode", bag_encode)
    again = ShardedDenseRetriever(store, **small)
    assert again.meta["format"] == DENSE_SHARDS_FORMAT and (again.index_dir / "DONE").exists()
    assert [s["stop"] - s["start"] for s in again.meta["shards"]] == [1000, 1000, 413]


def test_a_full_disk_is_one_line_and_nothing_is_left(bag, monkeypatch):
    store, kw = bag
    monkeypatch.setattr(dense_shards, "free_bytes", lambda folder: 1000)
    with pytest.raises(DiskFullError, match=r"dense-shards: the disk filled while building the dense index's embedding shards: "
                                            r"it needs about 3,706,368 bytes .* 1,000 are free"):
        ShardedDenseRetriever(store, **kw)  # 2,413 passages x 384 dims (the encoder's) x 4 bytes
    assert list((kw["cache_dir"] / "dense-shards").iterdir()) == []


def test_the_build_holds_one_chunk_of_passages_at_a_time(bag, monkeypatch):
    """Memory while building: the texts of one encode chunk (here 100 passages), whatever the store's size;
    the store streamed once, no row read."""
    from knowtrace_train.data.store import PassageStore

    store, kw = bag
    seen = {"streamed": 0, "rows": 0, "encoded": 0, "held": []}

    class Counting(PassageStore):
        def __iter__(self):
            for p in super().__iter__():
                seen["streamed"] += 1
                yield p

        def __getitem__(self, i):
            seen["rows"] += 1
            return super().__getitem__(i)

    def counting_encode(self, texts, kind):
        seen["held"].append(seen["streamed"] - seen["encoded"])
        seen["encoded"] += len(texts)
        return bag_encode(self, texts, kind)

    monkeypatch.setattr(ShardedDenseRetriever, "_encode", counting_encode)
    r = ShardedDenseRetriever(Counting(store.folder), shard_passages=700, encode_chunk=100, **kw)
    assert max(seen["held"]) == 100 and len(seen["held"]) == 25
    assert seen["streamed"] == len(store) and seen["rows"] == 0
    assert [s["stop"] - s["start"] for s in r.meta["shards"]] == [700, 700, 700, 313]  # chunks split across shards
    emb = np.concatenate([np.load(r.index_dir / s["file"]) for s in r.meta["shards"]])
    assert np.allclose(emb, bag_encode(None, [t for t in map(passage_text, store)], "document"))
