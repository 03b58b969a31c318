"""The readers' contexts: TRACE-Triple (the chains' triples), TRACE-Doc (the chains' documents by votes), all documents, none."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from knowtrace_train.data.schema import Passage
from knowtrace_train.kg import TracedTriplet
from knowtrace_train.methods.trace.chains import Chain
from knowtrace_train.methods.trace.prompts import render_document, render_triple


def chain_triples(chains: Sequence[Chain]) -> list[int]:
    """The distinct triples of the chains, best chain first, each chain in its order."""
    out: list[int] = []
    for c in chains:
        out += [i for i in c.triples if i not in out]
    return out


def triple_context(chains: Sequence[Chain], triplets: Sequence[TracedTriplet]) -> str | None:
    """TRACE-Triple: one triple per line; None where every chain is empty."""
    idx = chain_triples(chains)
    return "\n".join(render_triple(triplets[i].triplet) for i in idx) if idx else None


def document_votes(chains: Sequence[Chain], triplets: Sequence[TracedTriplet]) -> Counter[str]:
    """Votes per document: each occurrence of one of its triples in a chain is one vote."""
    votes: Counter[str] = Counter()
    for c in chains:
        for i in c.triples:
            for pid in triplets[i].passage_ids:
                votes[pid] += 1
    return votes


def doc_context_passages(chains: Sequence[Chain], triplets: Sequence[TracedTriplet],
                         documents: Sequence[Passage]) -> list[Passage]:
    """TRACE-Doc: the documents the chains' triples came from, most votes first (ties: the
    question's document order)."""
    votes = document_votes(chains, triplets)
    order = {p.id: i for i, p in enumerate(documents)}
    kept = [p for p in documents if votes[p.id] > 0]
    return sorted(kept, key=lambda p: (-votes[p.id], order[p.id]))


def documents_context(documents: Sequence[Passage]) -> str | None:
    return "\n\n".join(render_document(p.title, p.text) for p in documents) if documents else None
