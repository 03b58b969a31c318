"""The triple ranker: a bi-encoder scores every triple of a graph against the question plus the chain so far (inner product)."""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np

from knowtrace_train.kg import Triplet

log = logging.getLogger(__name__)

#: texts -> one embedding row per text (float32; the ranker takes inner products of rows)
Encoder = Callable[[Sequence[str]], np.ndarray]

_ENCODERS: dict[str, Encoder] = {}


def load_encoder(name: str = "") -> Encoder:
    """The sentence-transformers bi-encoder `name` (empty: the offline all-MiniLM-L6-v2 of the dense
    extra), loaded once per process through the dense retriever's loader, normalised embeddings."""
    from knowtrace_train.retrieval.dense import _load_encoder, default_encoder_path

    path = name or str(default_encoder_path())
    if path not in _ENCODERS:
        model = _load_encoder(path, "cpu")

        def encode(texts: Sequence[str]) -> np.ndarray:
            if not texts:
                return np.zeros((0, model.get_sentence_embedding_dimension() or 1), dtype=np.float32)
            emb = model.encode(list(texts), batch_size=64, convert_to_numpy=True, normalize_embeddings=True,
                               show_progress_bar=False)
            return np.asarray(emb, dtype=np.float32)

        _ENCODERS[path] = encode
    return _ENCODERS[path]


def triple_text(t: Triplet) -> str:
    """What the bi-encoder reads of a triple."""
    return f"{t.subject} {t.relation} {t.object}"


def chain_query(question: str, chain: Sequence[Triplet]) -> str:
    """The ranker's query at a step: the question, then the chain so far."""
    return " ".join([question.strip()] + [triple_text(t) for t in chain])


def top_candidates(scores: np.ndarray, exclude: Sequence[int], k: int) -> list[int]:
    """Indices of the `k` highest `scores` (ties: the earlier triple first), `exclude` left out:
    triples already in the chain are not offered again. Fewer than k where the graph is smaller."""
    banned = set(exclude)
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return [i for i in order if i not in banned][:k]


class TripleRanker:
    """Scores a question's triples against queries. The triples of each graph are encoded once;
    the queries of a whole step (every chain of every question) in one encoder call."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder

    def encode_triples(self, triples: Sequence[Triplet]) -> np.ndarray:
        return self.encoder([triple_text(t) for t in triples])

    def rank(self, queries: Sequence[str], triple_embeddings: Sequence[np.ndarray], exclude: Sequence[Sequence[int]],
             k: int) -> list[list[int]]:
        """For query i over graph i (its triples' embeddings): the top-k triple indices, not in exclude[i]."""
        if not queries:
            return []
        q = self.encoder(list(queries))
        out = []
        for row, emb, ex in zip(q, triple_embeddings, exclude):
            scores = emb @ row if len(emb) else np.zeros(0, dtype=np.float32)
            out.append(top_candidates(scores, ex, k))
        return out
