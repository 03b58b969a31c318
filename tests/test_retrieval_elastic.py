"""Elasticsearch / OpenSearch retrieval. The integration tests run against a real server when
KNOWTRACE_ES_URL is set (the flavor is read from the server's own answer) and skip otherwise;
nothing stands in for the server."""

from __future__ import annotations

import json
import os
import urllib.request
import uuid

import pytest

from knowtrace_train.data.schema import Passage, passage_id
from knowtrace_train.retrieval import RetrievalError, RetrieverConfig, build_retriever
from knowtrace_train.retrieval.elastic import ElasticRetriever


def P(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


CORPUS = [
    P("Paris", "Paris is the capital and largest city of France."),
    P("Berlin", "Berlin is the capital of Germany."),
    P("Marathon", "The runners were running a marathon."),
    P("Ada Lovelace", "Ada Lovelace was an English mathematician."),
]

CLIENT_MODULE = {"elasticsearch": "elasticsearch", "opensearch": "opensearchpy"}


@pytest.mark.parametrize("flavor", ["elasticsearch", "opensearch"])
def test_an_unreachable_server_is_a_clear_error(flavor):
    pytest.importorskip(CLIENT_MODULE[flavor])
    # port 9 (discard) has no listener here: the real client gets a refused connection
    with pytest.raises(RetrievalError, match=rf"cannot reach {flavor} at http://127\.0\.0\.1:9\b.*running"):
        ElasticRetriever(CORPUS, url="http://127.0.0.1:9", flavor=flavor, timeout_s=5)


def test_empty_corpus_and_unknown_flavor_are_errors():
    with pytest.raises(RetrievalError, match="empty corpus"):
        ElasticRetriever([], url="http://127.0.0.1:9")
    with pytest.raises(RetrievalError, match="flavor must be one of"):
        ElasticRetriever(CORPUS, url="http://127.0.0.1:9", flavor="solr")


# -- against a real server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> tuple[str, str]:
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
    r = ElasticRetriever(CORPUS, url=url, flavor=flavor, index=f"knowtrace-test-{uuid.uuid4().hex[:8]}")
    yield r
    r.delete_index()


def test_bm25_search_through_the_server(retriever):
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
    assert again.search(["France"], 1)[0][0].passage.title == "Paris"
    with pytest.raises(RetrievalError, match="exists but holds another corpus"):
        ElasticRetriever(CORPUS[:2], url=url, flavor=flavor, index=retriever.index)
    rebuilt = ElasticRetriever(CORPUS[:2], url=url, flavor=flavor, index=retriever.index, recreate=True)
    assert rebuilt.search(["marathon"], 3) == [[]]


def test_the_factory_builds_the_server_backend(server):
    url, flavor = server
    r = build_retriever(RetrieverConfig(backend=flavor, url=url, index=f"knowtrace-test-{uuid.uuid4().hex[:8]}"), CORPUS)
    try:
        assert isinstance(r, ElasticRetriever)
        assert r.search(["Lovelace"], 1)[0][0].passage.title == "Ada Lovelace"
    finally:
        r.delete_index()
