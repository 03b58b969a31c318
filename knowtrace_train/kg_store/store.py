"""An embedded SPARQL store (pyoxigraph) of named triples: relations of an entity, triple filling."""

from __future__ import annotations

import logging
from typing import Iterable
from urllib.parse import quote

from knowtrace_train.errors import UserError, import_extra

logger = logging.getLogger(__name__)

_NS = "urn:knowtrace:"
_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"


class KGStoreError(UserError, RuntimeError):
    """A store that cannot answer (missing dependency, unreachable endpoint)."""

    label = "graph error"


def oxigraph_module():
    """pyoxigraph, the kg extra's package (a `MissingExtraError` where absent)."""
    return import_extra("pyoxigraph", "kg", "the embedded knowledge-graph store (DoG's strategy.graph)")


def _iri(kind: str, name: str) -> str:
    """An IRI minted for a name: every character outside [A-Za-z0-9_.-~] percent-encoded, so no
    user text ever reaches a query unescaped."""
    return f"<{_NS}{kind}:{quote(name, safe='')}>"


class _Base:
    lookups = 0

    def _select(self, query: str) -> list[tuple[str, ...]]:
        raise NotImplementedError


class GraphStore(_Base):
    """Triples (subject, relation, object) by name in; names out. Identifiers stay inside.

    get_relations(entity) lists outgoing relations and incoming ones written "~relation" (the
    paper's inverse notation); triple_filling(entity, relation) lists the triples they complete."""

    def __init__(self, triples: Iterable[tuple[str, str, str]]):
        self._ox = ox = oxigraph_module()
        self.store = ox.Store()
        label = ox.NamedNode(_LABEL)
        quads = []
        seen: set[tuple[str, str]] = set()
        for s, r, o in triples:
            for kind, name in (("e", s), ("r", r), ("e", o)):
                if (kind, name) not in seen:
                    seen.add((kind, name))
                    quads.append(ox.Quad(self._node(kind, name), label, ox.Literal(name)))
            quads.append(ox.Quad(self._node("e", s), self._node("r", r), self._node("e", o)))
        self.store.extend(quads)
        self.lookups = 0

    def _node(self, kind: str, name: str):
        return self._ox.NamedNode(f"{_NS}{kind}:{quote(name, safe='')}")

    def _select(self, query: str) -> list[tuple[str, ...]]:
        self.lookups += 1
        return [tuple(term.value for term in sol) for sol in self.store.query(query)]

    def has_entity(self, entity: str) -> bool:
        return bool(self._select(f"SELECT ?l WHERE {{ {_iri('e', entity)} <{_LABEL}> ?l }} LIMIT 1"))

    def serialize(self) -> bytes:
        """The graph as N-Triples: what an endpoint (Virtuoso, QLever) loads to serve the same queries."""
        return self.store.dump(format=self._ox.RdfFormat.N_TRIPLES, from_graph=self._ox.DefaultGraph())

    def get_relations(self, entity: str) -> list[str]:
        """Outgoing relations of the entity, then incoming ones as "~relation"; sorted, unique."""
        e = _iri("e", entity)
        out = self._select(f"SELECT DISTINCT ?l WHERE {{ {e} ?r ?o . ?r <{_LABEL}> ?l }}")
        inc = self._select(f"SELECT DISTINCT ?l WHERE {{ ?s ?r {e} . ?r <{_LABEL}> ?l }}")
        return sorted({row[0] for row in out}) + sorted({"~" + row[0] for row in inc})

    def triple_filling(self, entity: str, relation: str) -> list[tuple[str, str, str]]:
        """The triples the (entity, relation) pair completes, by name; "~r" reads r backwards."""
        inverse = relation.startswith("~")
        rel = relation[1:] if inverse else relation
        e, r = _iri("e", entity), _iri("r", rel)
        if inverse:
            rows = self._select(f"SELECT ?l WHERE {{ ?s {r} {e} . ?s <{_LABEL}> ?l }}")
            return sorted((row[0], rel, entity) for row in rows)
        rows = self._select(f"SELECT ?l WHERE {{ {e} {r} ?o . ?o <{_LABEL}> ?l }}")
        return sorted((entity, rel, row[0]) for row in rows)


class EndpointStore(GraphStore):
    """The same SPARQL queries sent to an endpoint URL (SPARQL 1.1 protocol, JSON results) holding a
    graph built as GraphStore builds it (GraphStore.serialize). An unreachable endpoint or a bad
    answer is a KGStoreError naming the URL."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url, self.timeout, self.lookups = url, timeout, 0

    def _select(self, query: str) -> list[tuple[str, ...]]:
        import json
        import urllib.error
        import urllib.parse
        import urllib.request

        self.lookups += 1
        req = urllib.request.Request(
            self.url, data=urllib.parse.urlencode({"query": query}).encode(),
            headers={"Accept": "application/sparql-results+json",
                     "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = json.loads(resp.read().decode("utf-8"))
            rows = body["results"]["bindings"]
            names = body["head"]["vars"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as e:
            raise KGStoreError(f"SPARQL endpoint {self.url} did not answer: {e}") from e
        return [tuple(row[n]["value"] for n in names if n in row) for row in rows]
