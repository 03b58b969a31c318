"""The one retrieval protocol every strategy uses, and how a guidance pair becomes a query."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from knowtrace_train.data.schema import Passage
from knowtrace_train.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoredPassage:
    passage: Passage
    score: float


class RetrievalError(UserError, ValueError):
    """Bad retrieval input (empty corpus, empty query, k <= 0) or an unreachable engine."""

    label = "retrieval error"


@runtime_checkable
class Retriever(Protocol):
    """Search a fixed corpus. `search` takes many queries at once and returns, per query,
    at most k passages, best first; a query that matches nothing returns an empty list."""

    def search(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]: ...


def passage_text(passage: Passage) -> str:
    """The text every backend indexes for a passage: title, newline, paragraph (FlashRAG's
    `contents` form), so that a title word matches in BM25, dense and Elasticsearch alike."""
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


def pair_to_query(entity: str, guidance: str) -> str:
    """The query for an entity-relation (guidance) pair; shared by all strategies."""
    entity, guidance = entity.strip(), guidance.strip()
    if not guidance:
        return entity
    if not entity:
        return guidance
    return f"{entity}: {guidance}"


def check_search_args(queries: Sequence[str], k: int) -> None:
    """The argument checks every backend makes before searching."""
    if isinstance(queries, str):
        raise RetrievalError("search() takes a sequence of queries, not one string")
    if k <= 0:
        raise RetrievalError(f"k must be a positive number of passages, got {k}")
    for i, q in enumerate(queries):
        if not isinstance(q, str) or not q.strip():
            raise RetrievalError(f"query {i} is empty")


def search_each(retriever: Retriever, queries: Sequence[str], k: int) -> list[list[ScoredPassage] | RetrievalError]:
    """`retriever.search(queries, k)` for a strategy that must not stop on one bad query: a batch the
    retriever refuses (RetrievalError) is retried query by query, and a query still refused comes
    back as its RetrievalError, in its place, for the caller to record. Each list is cut to k."""
    queries = list(queries)
    if not queries:
        return []
    try:
        hits: list = retriever.search(queries, k)
    except RetrievalError as e:
        log.warning("retrieval batch of %d refused (%s); retrying query by query", len(queries), e)
        hits = []
        for q in queries:
            try:
                hits.append(retriever.search([q], k)[0])
            except RetrievalError as e1:
                hits.append(e1)
    if len(hits) != len(queries):
        raise RuntimeError(f"retriever returned {len(hits)} result lists for {len(queries)} queries")
    return [h if isinstance(h, RetrievalError) else list(h)[:k] for h in hits]
