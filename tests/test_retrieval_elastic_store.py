"""Elasticsearch / OpenSearch on a passage store: the index is fed by streaming the store in bulk
requests, never a list of all its passages, and hits come back as the store's `Passage`s.

A stand-in server (an in-process HTTP server that answers the few endpoints the toolkit calls) lets the
real clients and their real bulk helpers run; it scores a match by the words a query shares with a
passage, nothing like BM25, so it tests the indexing path and the mapping of hits, not the engine's
ranking (tests/test_retrieval_elastic.py does that against a real server)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from knowtrace_train.data.schema import Passage
from knowtrace_train.data.store import PassageStore, open_store
from knowtrace_train.retrieval import RetrieverConfig, build_retriever
from knowtrace_train.retrieval.elastic import ElasticRetriever

ROOT = Path(__file__).resolve().parents[1] / "data" / "world"
CLIENT_MODULE = {"elasticsearch": "elasticsearch", "opensearch": "opensearchpy"}


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


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


class FakeServer:
    """Answers info, index exists/create/refresh/mapping/count/delete, _bulk (recording, per request, how
    many documents it carried and how many passages the store had handed out by then) and _msearch."""

    def __init__(self, flavor: str, store: CountingStore | None = None) -> None:
        self.flavor, self.store = flavor, store
        self.indices: dict[str, dict] = {}
        self.bulk_requests: list[dict] = []
        self.received = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _reply(self, status: int, body=None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Elastic-Product", "Elasticsearch")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_HEAD(self):
                name = self.path.strip("/").split("?")[0]
                self._reply(200 if name in server.indices else 404)

            def do_GET(self):
                self.route("GET")

            def do_POST(self):
                self.route("POST")

            def do_PUT(self):
                self.route("PUT")

            def do_DELETE(self):
                name = self.path.strip("/").split("?")[0]
                server.indices.pop(name, None)
                self._reply(200, {"acknowledged": True})

            def route(self, method):
                path = self.path.split("?")[0].strip("/")
                body = self._body()
                parts = path.split("/")
                if path == "":
                    dist = {"distribution": "opensearch"} if server.flavor == "opensearch" else {}
                    return self._reply(200, {"version": {"number": "9.0.0" if not dist else "2.19.0", **dist}, "tagline": "fake"})
                if path == "_bulk":
                    return self._reply(200, server.bulk(body))
                if path == "_msearch":
                    return self._reply(200, server.msearch(body))
                name = parts[0]
                if len(parts) == 1 and method == "PUT":
                    spec = json.loads(body)
                    server.indices[name] = {"mappings": spec.get("mappings", {}), "docs": {}}
                    return self._reply(200, {"acknowledged": True, "index": name})
                if parts[1:] == ["_refresh"]:
                    return self._reply(200, {"_shards": {"total": 1, "successful": 1, "failed": 0}})
                if parts[1:] == ["_mapping"]:
                    return self._reply(200, {name: {"mappings": server.indices[name]["mappings"]}})
                if parts[1:] == ["_count"]:
                    return self._reply(200, {"count": len(server.indices[name]["docs"])})
                self._reply(400, {"error": f"fake server: no route {method} {self.path}"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def bulk(self, body: bytes) -> dict:
        lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
        items = []
        for action, doc in zip(lines[::2], lines[1::2]):
            meta = action["index"]
            self.indices[meta["_index"]]["docs"][meta["_id"]] = doc
            items.append({"index": {"_index": meta["_index"], "_id": meta["_id"], "status": 201, "result": "created"}})
        streamed = self.store.streamed if self.store is not None else None
        # passages the store had handed out and this server had not yet received: what the client held at once
        held = None if streamed is None else streamed - self.received
        self.received += len(items)
        self.bulk_requests.append({"docs": len(items), "held": held})
        return {"took": 1, "errors": False, "items": items}

    def msearch(self, body: bytes) -> dict:
        lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
        responses = []
        for head, q in zip(lines[::2], lines[1::2]):
            docs = self.indices[head["index"]]["docs"]
            qw = words(q["query"]["match"]["contents"]["query"])
            scored = [(len(qw & words(d["contents"])), int(i), d) for i, d in docs.items()]
            scored = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[: q["size"]]
            hits = [{"_id": str(i), "_score": float(s), "_source": {"pos": d["pos"]}} for s, i, d in scored]
            responses.append({"hits": {"total": {"value": len(hits)}, "hits": hits}, "status": 200})
        return {"took": 1, "responses": responses}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def store(tmp_path) -> CountingStore:
    return CountingStore(open_store(ROOT / "corpus.jsonl", cache_dir=tmp_path).folder)


@pytest.mark.parametrize("flavor", ["elasticsearch", "opensearch"])
def test_a_store_is_indexed_by_streaming_bulk_requests_and_hits_are_its_passages(store, flavor):
    pytest.importorskip(CLIENT_MODULE[flavor])
    server = FakeServer(flavor, store)
    try:
        r = ElasticRetriever(store, url=server.url, flavor=flavor, bulk_chunk=300)
        assert r.passages is store  # not copied into a list
        n = len(store)
        assert [b["docs"] for b in server.bulk_requests] == [300] * (n // 300) + [n % 300]
        assert store.streamed == n and store.rows_read == 0  # one pass, nothing read by row while indexing
        # what was held at once: one bulk request's passages (elasticsearch's helper reads the next one first)
        assert max(b["held"] for b in server.bulk_requests) <= 300 + 1
        assert sum(b["docs"] for b in server.bulk_requests) == n
        [hits] = r.search(["University of Krarion economics"], 3)
        assert hits and all(isinstance(h.passage, Passage) for h in hits)
        assert hits[0].passage.title == "University of Krarion"
        assert hits[0].passage == store.by_id[hits[0].passage.id]
        assert store.rows_read >= 3  # hits read back by row from the store
        # an index of this very store is reused without streaming it again
        before = store.streamed
        again = ElasticRetriever(store, url=server.url, flavor=flavor)
        assert again.index == r.index and store.streamed == before and len(server.bulk_requests) == -(-n // 300)
    finally:
        server.close()


def test_the_factory_hands_the_store_through(store, monkeypatch):
    pytest.importorskip("elasticsearch")
    server = FakeServer("elasticsearch", store)
    try:
        r = build_retriever(RetrieverConfig(backend="elasticsearch", url=server.url), store)
        assert isinstance(r, ElasticRetriever) and r.passages is store
        assert max(b["held"] for b in server.bulk_requests) <= 1000 + 1
    finally:
        server.close()
