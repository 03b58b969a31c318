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
