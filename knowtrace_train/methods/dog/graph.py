"""The graph a DoG run answers over (`DoGConfig.graph`), and a question's topic entity."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.kg_store import EndpointStore, GraphStore
from knowtrace_train.methods.dog.config import ENDPOINT_SCHEMES


def graph_triples(source: str, items: Sequence[QAItem]) -> list[tuple[str, str, str]]:
    """The triples `source` names: 'world' (the bundled world's facts, seed 0), 'items' (the gold
    triples of `items`: 2Wiki's evidences, MINTQA's triplets, the world's chains), or a file
    (MetaQA's kb.txt `s|r|o`; JSONL [s, r, o] or .tsv through the corpus's triples reader). A
    missing file is a FileNotFoundError naming it."""
    from knowtrace_train.data.corpus import item_triples, read_triples

    if source == "world":
        from knowtrace_train.data.bundled import world_triples

        return world_triples()
    if source == "items":
        return item_triples(items)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"strategy.graph: {source!r} is neither world, items, an http(s) endpoint nor a file")
    if path.suffix == ".txt":
        from knowtrace_train.kg_store.sources import read_metaqa_kb

        return read_metaqa_kb(path)
    return read_triples(path)


def is_endpoint(source: str) -> bool:
    return source.startswith(ENDPOINT_SCHEMES)


def build_store(source: str, items: Sequence[QAItem], timeout: float = 10.0) -> GraphStore:
    """An EndpointStore for an http(s) URL (nothing is sent until the first lookup), else an embedded
    GraphStore of `graph_triples(source, items)`."""
    if is_endpoint(source):
        return EndpointStore(source, timeout=timeout)
    return GraphStore(graph_triples(source, items))


def topic_entity(item: QAItem) -> str | None:
    """Where the walk starts: the subject of the item's first gold triple (the world's chains start
    at the question's initial entity; 2Wiki's first evidence triple's subject); None without triples."""
    triples = item.evidence.triples
    return triples[0][0] if triples and triples[0][0].strip() else None
