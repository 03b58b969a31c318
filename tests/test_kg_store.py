"""The graph store: both calls, inverse relations, quotes and unicode that cannot inject SPARQL."""

import pytest

pytest.importorskip("pyoxigraph")

from knowtrace_train.kg_store import GraphStore

TRIPLES = [
    ("Ada Lovelace", "father", "Lord Byron"),
    ("Ada Lovelace", "born in", "London"),
    ("Lord Byron", "born in", "London"),
    ('O"Brien } . ?s ?p ?o #', "born in", "Zürich"),
    ("Zürich", "country", "Schweiz 🇨🇭"),
]


@pytest.fixture(scope="module")
def store():
    return GraphStore(TRIPLES)


def test_relations_outgoing_then_incoming(store):
    assert store.get_relations("Ada Lovelace") == ["born in", "father"]
    assert store.get_relations("London") == ["~born in"]
    assert store.get_relations("Lord Byron") == ["born in", "~father"]


def test_triple_filling_both_directions(store):
    assert store.triple_filling("Ada Lovelace", "father") == [("Ada Lovelace", "father", "Lord Byron")]
    assert store.triple_filling("London", "~born in") == [
        ("Ada Lovelace", "born in", "London"), ("Lord Byron", "born in", "London")]


def test_quotes_and_unicode_are_names_not_query_text(store):
    name = 'O"Brien } . ?s ?p ?o #'
    assert store.get_relations(name) == ["born in"]
    assert store.triple_filling(name, "born in") == [(name, "born in", "Zürich")]
    assert store.triple_filling("Zürich", "~born in") == [(name, "born in", "Zürich")]
    assert store.triple_filling("Zürich", "country") == [("Zürich", "country", "Schweiz 🇨🇭")]
    # an injection attempt is just an unknown name: nothing, not every triple
    assert store.get_relations('x> ?r ?o } UNION { ?s ?r ?o . ?r <urn:x') == []
    assert store.triple_filling("Ada Lovelace", '"father" } #') == []


def test_missing_entity_and_relation(store):
    assert not store.has_entity("Nobody")
    assert store.has_entity("Zürich")
    assert store.get_relations("Nobody") == []
    assert store.triple_filling("Ada Lovelace", "mother") == []


def _serve(store):
    """A loopback SPARQL endpoint answering from the embedded store, as JSON results."""
    import json
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            q = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
            sols = store.store.query(q)
            names = [v.value for v in sols.variables]
            rows = [{n: {"type": "literal", "value": s[n].value} for n in names if s[n] is not None} for s in sols]
            body = json.dumps({"head": {"vars": names}, "results": {"bindings": rows}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/sparql-results+json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_endpoint_answers_like_the_embedded_store(store):
    from knowtrace_train.kg_store import EndpointStore
    srv = _serve(store)
    try:
        ep = EndpointStore(f"http://127.0.0.1:{srv.server_port}/sparql", timeout=5)
        assert ep.get_relations("Lord Byron") == store.get_relations("Lord Byron")
        assert ep.triple_filling("Zürich", "~born in") == store.triple_filling("Zürich", "~born in")
        assert ep.has_entity("Ada Lovelace") and not ep.has_entity("Nobody")
    finally:
        srv.shutdown()


def test_unreachable_endpoint_is_a_clear_error():
    from knowtrace_train.kg_store import EndpointStore, KGStoreError
    ep = EndpointStore("http://127.0.0.1:9/sparql", timeout=2)
    with pytest.raises(KGStoreError, match="127.0.0.1:9"):
        ep.get_relations("Ada Lovelace")


def test_serialize_is_ntriples(store):
    assert b"urn:knowtrace:e:Z%C3%BCrich" in store.serialize()


def test_hits_at_1_matches_gold_or_alias_exactly():
    from knowtrace_train.metrics import hits_at_1, hits_at_1_by_hops
    assert hits_at_1("the Lord Byron", ["George Gordon Byron", "Lord Byron"]) == 1.0
    assert hits_at_1("Byron", ["Lord Byron"]) == 0.0
    assert hits_at_1(None, ["x"]) == 0.0
    by = hits_at_1_by_hops(["London", "Paris", None], [["London"], ["Rome"], ["x"]], [2, 2, 3])
    assert by["2"]["n"] == 2 and by["2"]["hits@1"] == 0.5 and by["3"]["hits@1"] == 0.0


def test_metaqa_files(tmp_path):
    from knowtrace_train.kg_store.sources import read_metaqa_kb, read_metaqa_questions
    kb = tmp_path / "kb.txt"
    kb.write_text("Kismet|directed_by|William Dieterle\nKismet|release_year|1944\n", encoding="utf-8")
    qa = tmp_path / "qa_dev.txt"
    qa.write_text("who directed [Kismet]\tWilliam Dieterle\n", encoding="utf-8")
    g = GraphStore(read_metaqa_kb(kb))
    rows = read_metaqa_questions(qa, hops=1)
    assert rows[0]["topic"] == "Kismet" and rows[0]["question"] == "who directed Kismet"
    assert g.triple_filling(rows[0]["topic"], "directed_by")[0][2] in rows[0]["answers"]
    (tmp_path / "bad.txt").write_text("Kismet|directed_by\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.txt:1"):
        read_metaqa_kb(tmp_path / "bad.txt")


def test_world_facts_load_and_answer():
    import time
    from world_helpers import make_world, world_facts
    facts = world_facts(make_world(seed=0, scale=0.2, n_train=1, n_dev=1, n_test=1).kb)
    t = time.perf_counter()
    g = GraphStore(facts)
    s, r, o = facts[0]
    assert r in g.get_relations(s) and "~" + r in g.get_relations(o)
    assert (s, r, o) in g.triple_filling(s, r) and (s, r, o) in g.triple_filling(o, "~" + r)
    assert time.perf_counter() - t < 30
