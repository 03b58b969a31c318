"""Elasticsearch / OpenSearch on a passage store: the index is fed by streaming the store in bulk requests, never a
list of all its passages, and hits come back as the store's `Passage`s. Against a real OpenSearch-compatible server
(osmem-server on loopback, tests/conftest.py's `search_server`) with the real client and its real bulk helper; each
bulk request the client sends is recorded on its way out (how many documents, and how many passages the store had
handed out by then)."""

from __future__ import annotations

from pathlib import Path

import pytest

from knowtrace_train.data.schema import Passage
from knowtrace_train.data.store import PassageStore, open_store
from knowtrace_train.retrieval import RetrieverConfig, build_retriever
from knowtrace_train.retrieval.elastic import ElasticRetriever

ROOT = Path(__file__).resolve().parents[1] / "data" / "world"


class CountingStore(PassageStore):
    """A passage store that counts the passages it has handed out, by iteration and by row."""

    def __init__(self, folder) -> None:
        super().__init__(folder)
        self.streamed = 0
        self.rows_read = 0

    def __iter__(self):
        for p in super().__iter__():
            self.streamed += 1
            yield p

    def __getitem__(self, i):
        self.rows_read += 1
        return super().__getitem__(i)


@pytest.fixture
def store(tmp_path) -> CountingStore:
    return CountingStore(open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path).folder)


@pytest.fixture
def bulk_requests(store, monkeypatch) -> list[dict]:
    """Every bulk request opensearch-py sends: its documents, and the passages the store had handed out and the
    server had not yet received (what the client held at once)."""
    opensearchpy = pytest.importorskip("opensearchpy")
    requests: list[dict] = []
    real = opensearchpy.OpenSearch.bulk

    def bulk(self, *args, **kwargs):
        body = kwargs["body"]
        lines = body if isinstance(body, list) else [x for x in body.splitlines() if x.strip()]
        received = sum(r["docs"] for r in requests)
        requests.append({"docs": len(lines) // 2, "held": store.streamed - received})
        return real(self, *args, **kwargs)

    monkeypatch.setattr(opensearchpy.OpenSearch, "bulk", bulk)
    return requests


def test_a_store_is_indexed_by_streaming_bulk_requests_and_hits_are_its_passages(store, bulk_requests, search_server):
    r = ElasticRetriever(store, url=search_server, flavor="opensearch", bulk_chunk=300)
    try:
        assert r.passages is store and r.built  # not copied into a list
        n = len(store)
        assert [b["docs"] for b in bulk_requests] == [300] * (n // 300) + [n % 300]
        assert store.streamed == n and store.rows_read == 0  # one pass, nothing read by row while indexing
        # what was held at once: one bulk request's passages (the helper may read the next one first)
        assert max(b["held"] for b in bulk_requests) <= 300 + 1
        assert r.client.count(index=r.index)["count"] == n
        [hits] = r.search(["University of Krarion economics"], 3)
        assert hits and all(isinstance(h.passage, Passage) for h in hits)
        assert hits[0].passage.title == "University of Krarion"
        assert hits[0].passage == store.by_id[hits[0].passage.id]
        assert store.rows_read >= 3  # hits read back by row from the store
        # an index of this very store is reused without streaming it again
        before = store.streamed
        again = ElasticRetriever(store, url=search_server, flavor="opensearch")
        assert again.index == r.index and not again.built
        assert store.streamed == before and len(bulk_requests) == -(-n // 300)
    finally:
        r.delete_index()


def test_the_factory_hands_the_store_through(store, bulk_requests, search_server):
    r = build_retriever(RetrieverConfig(backend="opensearch", url=search_server, index="knowtrace-store-factory"), store)
    try:
        assert isinstance(r, ElasticRetriever) and r.passages is store
        assert max(b["held"] for b in bulk_requests) <= 1000 + 1
    finally:
        r.delete_index()
