"""Elasticsearch / OpenSearch retrieval: bulk indexing with BM25 and batched multi-search, for
corpora that outgrow one machine (the KnowTrace paper retrieved through Elasticsearch).

At a cluster's shape: the index's shards and replicas come from the config (`retriever.shards`, `retriever.replicas`;
over several shards each search gathers the corpus-wide term statistics first, `dfs_query_then_fetch`, so the
ranking is one shard's). Many processes may start on the same corpus at once (data-parallel training, several
evaluations): the index's creation is atomic on the server, so exactly one process creates it and bulk-indexes the
passages, then sets the ready mark in the index's `_meta`; the others wait for the mark, polling with a bound
(`retriever.index_wait_s`), and reuse the index.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterator, Sequence

from knowtrace_train.data.schema import Passage
from knowtrace_train.errors import import_extra
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage, check_search_args, passage_text
from knowtrace_train.retrieval.cache import cache_key, corpus_fingerprint

log = logging.getLogger(__name__)

FLAVORS = ("elasticsearch", "opensearch")
URL_ENV = "KNOWTRACE_ES_URL"
INDEX_FORMAT = 1
#: the `_meta` key of the ready mark: false while the builder indexes, true once every passage is searchable (an
#: index of an older version has no key and is judged by its document count)
READY_KEY = "knowtrace_ready"


class ElasticRetriever:
    """BM25 search in an Elasticsearch or OpenSearch index built from the passages.

    The index is named after the corpus content and settings unless `index` names it, and an
    index that already holds this very corpus is reused rather than rebuilt. Each passage is
    one document whose `contents` (title, newline, paragraph) is analysed by the server's
    `english` analyzer (lowercase, English stopwords, Porter stemming).
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        url: str | None = None,
        index: str | None = None,
        flavor: str = "elasticsearch",
        k1: float = 1.2,
        b: float = 0.75,
        recreate: bool = False,
        batch_size: int = 256,
        timeout_s: float = 30.0,
        show_progress: bool = False,
        bulk_chunk: int = 1000,
        shards: int = 1,
        replicas: int = 0,
        wait_s: float = 3600.0,
    ) -> None:
        if flavor not in FLAVORS:
            raise RetrievalError(f"flavor must be one of {FLAVORS}, got {flavor!r}")
        client_module, self._helpers = client_modules(flavor)
        if len(passages) == 0:
            raise RetrievalError(f"cannot build an {flavor} index over an empty corpus")
        if batch_size <= 0 or bulk_chunk <= 0:
            raise RetrievalError(f"batch_size and bulk_chunk must be positive, got {batch_size} and {bulk_chunk}")
        if shards < 1 or replicas < 0 or wait_s < 0:
            raise RetrievalError(f"shards must be >= 1, replicas and wait_s >= 0, got {shards}, {replicas} and {wait_s}")
        self.shards, self.replicas, self.wait_s = shards, replicas, wait_s
        #: whether this process built the index (False: it reused one, or waited for another process to build it)
        self.built = False
        # a passage store (data.store.PassageStore) is kept as it is: indexed by streaming it in bulk
        # requests of `bulk_chunk` passages, hits read back by row; any other sequence is copied, as before
        self.passages = passages if _is_store(passages) else list(passages)
        self.bulk_chunk = bulk_chunk
        self.flavor = flavor
        self.url = url or os.environ.get(URL_ENV, "")
        if not self.url:
            raise RetrievalError(
                f"no {flavor} server given: set the retriever's `url` or the {URL_ENV} environment "
                "variable (for example http://localhost:9200)"
            )
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.client = _connect(client_module, flavor, self.url, timeout_s)
        # the shard count changes a search's statistics where dfs is not run, so it names another index (one shard
        # keeps the name an index had before shards were configurable); replicas change nothing a search returns
        key = {"format": INDEX_FORMAT, "k1": k1, "b": b, **({"shards": shards} if shards != 1 else {})}
        self._fingerprint = cache_key(corpus_fingerprint(self.passages), key)
        self.index = (index or f"knowtrace-{self._fingerprint[:16]}").lower()
        self._ensure_index(k1, b, recreate)

    # -- indexing --------------------------------------------------------
    def _ensure_index(self, k1: float, b: float, recreate: bool) -> None:
        """Reuse the index of this corpus, or create and fill it; where another process is filling it, wait for its
        ready mark. `recreate` deletes an index that is not this corpus' finished one (meant for one process: a
        sibling's half-built index would be deleted under it)."""
        if recreate and self.client.indices.exists(index=self.index) and self._state(self._index_meta())[0] != "ready":
            log.info("deleting %s index %s (recreate=True)", self.flavor, self.index)
            self.client.indices.delete(index=self.index)
        deadline = time.monotonic() + self.wait_s
        poll = 0.2
        while True:
            if self._create_index(k1, b):
                try:
                    self._bulk_index()
                    self._mark_ready()
                except BaseException:  # never leave a half-built index others would wait for: remove it, best effort
                    try:
                        self.client.indices.delete(index=self.index)
                    except Exception:  # noqa: BLE001 - the first error is the one to report
                        log.warning("could not delete the half-built %s index %s", self.flavor, self.index)
                    raise
                self.built = True
                return
            try:
                state, count = self._state(self._index_meta())
            except Exception as e:  # deleted between our create and this read: try to create it again
                if _not_found(e):
                    continue
                raise
            if state == "ready":
                log.info("reusing %s index %s (%d passages)", self.flavor, self.index, count)
                return
            if state != "building":
                why = {"other": "holds another corpus", "partial": "was left half-built"}[state]
                raise RetrievalError(f"{self.flavor} index {self.index!r} at {self.url} exists but {why} ({count} "
                                     "documents); pass recreate=True to rebuild it, or name another index")
            if time.monotonic() >= deadline:
                raise RetrievalError(
                    f"{self.flavor} index {self.index!r} at {self.url} is not ready after {self.wait_s:.0f} s "
                    f"(retriever.index_wait_s): another process is still building it, or one died while building "
                    "it; where none is building it, delete the index or set retriever.recreate: true")
            if poll == 0.2:
                log.info("%s index %s is being built by another process; waiting for its ready mark", self.flavor, self.index)
            time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))
            poll = min(poll * 2, 5.0)

    def _state(self, meta: dict[str, Any]) -> tuple[str, int]:
        """The existing index's state and document count: "ready" (this corpus, finished), "building" (this corpus,
        no ready mark yet), "other" (another corpus) or "partial" (this corpus, marked ready or of an older version
        without the mark, but not every passage in it)."""
        count = int(_body(self.client.count(index=self.index))["count"])
        if meta.get("knowtrace_corpus") != self._fingerprint:
            return "other", count
        if meta.get(READY_KEY) is False:
            return "building", count
        return ("ready" if count == len(self.passages) else "partial"), count

    def _create_index(self, k1: float, b: float) -> bool:
        """Create the (empty, not ready) index; False where it exists already (the server refuses a second
        create, so of processes starting together exactly one gets True)."""
        settings = {
            "number_of_shards": self.shards,
            "number_of_replicas": self.replicas,
            "similarity": {"default": {"type": "BM25", "k1": k1, "b": b}},
        }
        mappings = {
            "_meta": self._meta(ready=False),
            "dynamic": "strict",
            "properties": {
                "contents": {"type": "text", "analyzer": "english"},
                "pid": {"type": "keyword"},
                "pos": {"type": "integer", "index": False},
            },
        }
        try:
            if self.flavor == "elasticsearch":
                self.client.indices.create(index=self.index, settings=settings, mappings=mappings)
            else:
                self.client.indices.create(index=self.index, body={"settings": settings, "mappings": mappings})
        except Exception as e:
            if "resource_already_exists_exception" in f"{getattr(e, 'error', '')} {e}":
                return False
            raise
        log.info("created %s index %s (%d shards, %d replicas)", self.flavor, self.index, self.shards, self.replicas)
        return True

    def _meta(self, ready: bool) -> dict[str, Any]:
        return {"knowtrace_corpus": self._fingerprint, "num_docs": len(self.passages), READY_KEY: ready}

    def _mark_ready(self) -> None:
        if self.flavor == "elasticsearch":
            self.client.indices.put_mapping(index=self.index, meta=self._meta(ready=True))
        else:
            self.client.indices.put_mapping(index=self.index, body={"_meta": self._meta(ready=True)})

    def _index_meta(self) -> dict[str, Any]:
        body = _body(self.client.indices.get_mapping(index=self.index)).get(self.index, {})
        return dict(body.get("mappings", {}).get("_meta", {}))

    def _actions(self) -> Iterator[dict[str, Any]]:
        for pos, p in enumerate(self.passages):  # a store streams its rows: one bulk chunk in memory at a time
            yield {"_index": self.index, "_id": str(pos), "_source": {"contents": passage_text(p), "pid": p.id, "pos": pos}}

    def _bulk_index(self) -> None:
        from tqdm.auto import tqdm

        from knowtrace_train.progress import stderr_is_terminal

        streaming_bulk = self._helpers.streaming_bulk
        log.info("bulk-indexing %d passages into %s index %s", len(self.passages), self.flavor, self.index)
        failed: list = []
        n_failed = 0
        progress = tqdm(total=len(self.passages), desc=f"{self.flavor} bulk index", disable=not (self.show_progress and stderr_is_terminal()))
        for ok, info in streaming_bulk(self.client, self._actions(), chunk_size=self.bulk_chunk, raise_on_error=False):
            progress.update(1)
            if not ok and len(failed) < 10:  # a few kept to name: a store's failures are not all held
                failed.append(info)
            n_failed += not ok
        progress.close()
        if n_failed:
            raise RetrievalError(f"{n_failed} passages failed to index into {self.index!r}; first: {failed[0]}")
        self.client.indices.refresh(index=self.index)

    # -- search ------------------------------------------------------------
    def search(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]:
        check_search_args(queries, k)
        size = min(k, len(self.passages))
        out: list[list[ScoredPassage]] = []
        for start in range(0, len(queries), self.batch_size):
            batch = queries[start : start + self.batch_size]
            lines: list[dict[str, Any]] = []
            # over several shards, the corpus-wide term statistics first: the ranking one shard would give
            head = {"index": self.index, **({"search_type": "dfs_query_then_fetch"} if self.shards > 1 else {})}
            for q in batch:
                lines.append(head)
                lines.append({"query": {"match": {"contents": {"query": q}}}, "size": size, "_source": ["pos"]})
            try:
                responses = _body(self.client.msearch(body=lines))["responses"]
            except Exception as e:  # transport errors of either client
                raise RetrievalError(f"{self.flavor} multi-search at {self.url} failed: {type(e).__name__}: {e}") from e
            for i, resp in enumerate(responses):
                if "error" in resp:
                    raise RetrievalError(f"{self.flavor} search for query {start + i} failed: {resp['error']}")
                out.append(
                    [
                        ScoredPassage(self.passages[int(h["_source"]["pos"])], float(h["_score"]))
                        for h in resp["hits"]["hits"]
                    ]
                )
        return out

    def delete_index(self) -> None:
        """Remove this retriever's index from the server."""
        self.client.indices.delete(index=self.index)


def _not_found(e: Exception) -> bool:
    return "index_not_found_exception" in f"{getattr(e, 'error', '')} {e}"


def _is_store(passages) -> bool:
    from knowtrace_train.data.store import PassageStore

    return isinstance(passages, PassageStore)


def _body(response) -> dict[str, Any]:
    """The JSON body of a response: elasticsearch-py wraps it (`.body`), opensearch-py does not."""
    return getattr(response, "body", response)


def client_modules(flavor: str):
    """The flavor's client package and its `helpers` module, from the extra of the flavor's name."""
    if flavor == "elasticsearch":
        feature = "retriever.backend: elasticsearch"
        return (import_extra("elasticsearch", "elasticsearch", feature),
                import_extra("elasticsearch.helpers", "elasticsearch", feature))
    feature = "retriever.backend: opensearch"
    return import_extra("opensearchpy", "opensearch", feature), import_extra("opensearchpy.helpers", "opensearch", feature)


def _connect(client_module, flavor: str, url: str, timeout_s: float):
    """A client (from the flavor's `client_module`) for the server at `url`, after checking that the server answers."""
    try:
        if flavor == "elasticsearch":
            client = client_module.Elasticsearch(url, request_timeout=timeout_s, max_retries=1, retry_on_timeout=False)
        else:
            client = client_module.OpenSearch(hosts=[url], timeout=timeout_s, max_retries=1, retry_on_timeout=False)
    except ValueError as e:
        raise RetrievalError(f"bad {flavor} URL {url!r}: {e}") from e
    try:
        info = client.info()
    except Exception as e:  # connection refused, DNS, TLS, auth: all mean "cannot use this server"
        raise RetrievalError(
            f"cannot reach {flavor} at {url}: {type(e).__name__}: {e}. Is the server running? "
            f"(see the README's retrieval section; the URL comes from the config's `url` or {URL_ENV})"
        ) from e
    version = _body(info).get("version", {})
    log.info("connected to %s %s at %s", version.get("distribution", flavor), version.get("number", "?"), url)
    return client
