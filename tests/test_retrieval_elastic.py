"""Elasticsearch / OpenSearch retrieval against real servers: osmem-server (an OpenSearch-compatible server from
PyPI, the dev extra) started on loopback by the tests, and, where KNOWTRACE_ES_URL is set, that server too (the
flavor read from its own answer). Build, search, reuse, shards and replicas from the config, several processes
starting on one index at once; nothing stands in for the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from knowtrace_train.data.schema import Passage, passage_id
from knowtrace_train.retrieval import RetrievalError, RetrieverConfig, build_retriever
from knowtrace_train.retrieval.elastic import READY_KEY, ElasticRetriever

REPO = Path(__file__).resolve().parents[1]
WORLD_CORPUS = REPO / "data" / "world" / "corpus.jsonl"


def P(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


CORPUS = [
    P("Paris", "Paris is the capital and largest city of France."),
    P("Berlin", "Berlin is the capital of Germany."),
    P("Marathon", "The runners were running a marathon."),
    P("Ada Lovelace", "Ada Lovelace was an English mathematician."),
]

CLIENT_MODULE = {"elasticsearch": "elasticsearch", "opensearch": "opensearchpy"}


def fresh_index() -> str:
    return f"knowtrace-test-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("flavor", ["elasticsearch", "opensearch"])
def test_an_unreachable_server_is_a_clear_error(flavor):
    pytest.importorskip(CLIENT_MODULE[flavor])
    # port 9 (discard) has no listener here: the real client gets a refused connection
    with pytest.raises(RetrievalError, match=rf"cannot reach {flavor} at http://127\.0\.0\.1:9\b.*running"):
        ElasticRetriever(CORPUS, url="http://127.0.0.1:9", flavor=flavor, timeout_s=5)


def test_empty_corpus_unknown_flavor_and_bad_shapes_are_errors():
    with pytest.raises(RetrievalError, match="empty corpus"):
        ElasticRetriever([], url="http://127.0.0.1:9")
    with pytest.raises(RetrievalError, match="flavor must be one of"):
        ElasticRetriever(CORPUS, url="http://127.0.0.1:9", flavor="solr")
    with pytest.raises(ValueError, match="'shards' must be an integer >= 1, got 0"):
        RetrieverConfig(backend="opensearch", shards=0)
    with pytest.raises(ValueError, match="'replicas' must be an integer >= 0, got -1"):
        RetrieverConfig(backend="opensearch", replicas=-1)


# -- against real servers ------------------------------------------------------------------


@pytest.fixture(scope="module", params=["osmem", "KNOWTRACE_ES_URL"])
def server(request) -> tuple[str, str]:
    if request.param == "osmem":
        pytest.importorskip("opensearchpy")
        return request.getfixturevalue("search_server"), "opensearch"
    url = os.environ.get("KNOWTRACE_ES_URL")
    if not url:
        pytest.skip("KNOWTRACE_ES_URL is not set (see the README's retrieval section to start a server)")
    with urllib.request.urlopen(url, timeout=10) as resp:
        info = json.load(resp)
    flavor = "opensearch" if info.get("version", {}).get("distribution") == "opensearch" else "elasticsearch"
    pytest.importorskip(CLIENT_MODULE[flavor])
    return url, flavor


@pytest.fixture
def retriever(server):
    url, flavor = server
    r = ElasticRetriever(CORPUS, url=url, flavor=flavor, index=fresh_index())
    yield r
    r.delete_index()


def test_bm25_search_through_the_server(retriever):
    assert retriever.built
    queries = ["capital of France", "run", "mathematicians", "Germany capital city"]
    results = retriever.search(queries, 2)
    assert [hits[0].passage.title for hits in results] == ["Paris", "Marathon", "Ada Lovelace", "Berlin"]
    for hits in results:
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert all(isinstance(h.passage, Passage) and h.passage in CORPUS for h in hits)


def test_a_query_that_matches_nothing_returns_an_empty_list(retriever):
    assert retriever.search(["zyzzyva", "the of and"], 5) == [[], []]


def test_many_queries_in_several_multi_search_batches(retriever):
    retriever.batch_size = 3
    queries = [f"{t} please" for t in ["France", "Germany", "marathon", "Lovelace", "Paris", "Berlin", "runners"]]
    batched = retriever.search(queries, 1)
    assert [hits[0].passage.title for hits in batched] == [
        "Paris", "Berlin", "Marathon", "Ada Lovelace", "Paris", "Berlin", "Marathon"
    ]


def test_bad_queries_and_k(retriever):
    with pytest.raises(RetrievalError, match="query 1 is empty"):
        retriever.search(["France", " "], 3)
    with pytest.raises(RetrievalError, match="k must be a positive"):
        retriever.search(["France"], 0)


def test_an_index_of_the_same_corpus_is_reused_and_of_another_refused(server, retriever):
    url, flavor = server
    again = ElasticRetriever(CORPUS, url=url, flavor=flavor, index=retriever.index)
    assert not again.built
    assert again.search(["France"], 1)[0][0].passage.title == "Paris"
    with pytest.raises(RetrievalError, match="exists but holds another corpus"):
        ElasticRetriever(CORPUS[:2], url=url, flavor=flavor, index=retriever.index)
    rebuilt = ElasticRetriever(CORPUS[:2], url=url, flavor=flavor, index=retriever.index, recreate=True)
    assert rebuilt.built and rebuilt.search(["marathon"], 3) == [[]]
    kept = ElasticRetriever(CORPUS[:2], url=url, flavor=flavor, index=retriever.index, recreate=True)
    assert not kept.built  # recreate rebuilds another corpus' index, not this corpus' finished one


def test_the_factory_builds_the_server_backend_at_the_configured_shape(server):
    url, flavor = server
    r = build_retriever(RetrieverConfig(backend=flavor, url=url, index=fresh_index(), shards=3, replicas=1), CORPUS)
    try:
        assert isinstance(r, ElasticRetriever) and (r.shards, r.replicas) == (3, 1)
        body = r.client.indices.get_settings(index=r.index)
        index_settings = getattr(body, "body", body)[r.index]["settings"]["index"]
        assert (index_settings["number_of_shards"], index_settings["number_of_replicas"]) == ("3", "1")
        # over three shards, the same ranking as over one (corpus-wide statistics first)
        assert [h[0].passage.title for h in r.search(["capital of France", "Lovelace"], 1)] == ["Paris", "Ada Lovelace"]
    finally:
        r.delete_index()
    one = ElasticRetriever(CORPUS, url=url, flavor=flavor, timeout_s=10)
    three = ElasticRetriever(CORPUS, url=url, flavor=flavor, shards=3)
    try:
        assert one.index != three.index  # the shard count names another index of the same corpus
    finally:
        one.delete_index()
        three.delete_index()


def test_a_process_waits_for_the_one_that_builds_the_index(server, monkeypatch):
    """The builder is held inside its bulk indexing; a second retriever on the same index waits for the ready mark
    rather than failing, then reuses the index."""
    url, flavor = server
    index, release, started = fresh_index(), threading.Event(), threading.Event()
    real_bulk = ElasticRetriever._bulk_index

    def held_bulk(self):
        started.set()
        assert release.wait(30)
        real_bulk(self)

    monkeypatch.setattr(ElasticRetriever, "_bulk_index", held_bulk)
    out: dict[str, ElasticRetriever] = {}
    builder = threading.Thread(target=lambda: out.setdefault("builder", ElasticRetriever(CORPUS, url=url, flavor=flavor, index=index)))
    builder.start()
    assert started.wait(30)
    waiter = threading.Thread(target=lambda: out.setdefault("waiter", ElasticRetriever(CORPUS, url=url, flavor=flavor, index=index)))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive() and "waiter" not in out  # still waiting: the index exists, not ready
    release.set()
    builder.join(30)
    waiter.join(30)
    try:
        assert out["builder"].built and not out["waiter"].built
        assert out["waiter"].search(["Germany"], 1)[0][0].passage.title == "Berlin"
    finally:
        out["builder"].delete_index()


def test_an_index_never_marked_ready_is_a_clear_error_after_the_wait(server, monkeypatch):
    url, flavor = server
    index = fresh_index()
    monkeypatch.setattr(ElasticRetriever, "_mark_ready", lambda self: None)  # a builder that died before its mark
    dead = ElasticRetriever(CORPUS, url=url, flavor=flavor, index=index)
    monkeypatch.undo()
    try:
        meta = dead._index_meta()
        assert meta[READY_KEY] is False
        t0 = time.monotonic()
        with pytest.raises(RetrievalError, match=r"is not ready after 1 s \(retriever.index_wait_s\).*recreate: true"):
            ElasticRetriever(CORPUS, url=url, flavor=flavor, index=index, wait_s=1.0)
        assert time.monotonic() - t0 < 10
        rebuilt = ElasticRetriever(CORPUS, url=url, flavor=flavor, index=index, recreate=True)
        assert rebuilt.built and rebuilt._index_meta()[READY_KEY] is True
    finally:
        dead.delete_index()


#: one process: reads the world's corpus, says it is ready, waits for the go file, builds or reuses the index, searches
CHILD = r"""
import json, sys, time
from pathlib import Path
from knowtrace_train.data.corpus import read_corpus
from knowtrace_train.retrieval.elastic import ElasticRetriever
url, flavor, index, go, corpus = sys.argv[1:]
passages = read_corpus(corpus)
print("ready", flush=True)
while not Path(go).exists():
    time.sleep(0.005)
r = ElasticRetriever(passages, url=url, flavor=flavor, index=index, bulk_chunk=200)
[hits] = r.search(["University of Krarion economics"], 3)
print(json.dumps({"built": r.built, "top": hits[0].passage.title, "count": r.client.count(index=index)["count"]}), flush=True)
"""


def test_two_processes_starting_together_build_one_index(server, tmp_path):
    """Two processes started on one index at the same moment: neither crashes (no resource_already_exists_exception),
    exactly one builds, both search it."""
    url, flavor = server
    if flavor != "opensearch":
        pytest.skip("the child reads the count as opensearch-py returns it")
    index, go = fresh_index(), tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, url, flavor, index, str(go), str(WORLD_CORPUS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        go.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            p.kill()
    n = sum(1 for _ in WORLD_CORPUS.open())
    assert sorted(r["built"] for r in results) == [False, True]
    assert all(r["top"] == "University of Krarion" and r["count"] == n for r in results)
    from opensearchpy import OpenSearch

    OpenSearch(hosts=[url]).indices.delete(index=index)


def test_a_builder_that_fails_removes_its_half_built_index(server, monkeypatch):
    url, flavor = server
    index = fresh_index()

    def failing_bulk(self):
        raise RetrievalError("3 passages failed to index")

    monkeypatch.setattr(ElasticRetriever, "_bulk_index", failing_bulk)
    with pytest.raises(RetrievalError, match="3 passages failed to index"):
        ElasticRetriever(CORPUS, url=url, flavor=flavor, index=index)
    monkeypatch.undo()
    again = ElasticRetriever(CORPUS, url=url, flavor=flavor, index=index, wait_s=0)  # no unmarked index left to wait on
    try:
        assert again.built
    finally:
        again.delete_index()
