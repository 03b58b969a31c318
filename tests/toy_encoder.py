"""A deterministic bag-of-words bi-encoder for TRACE's ranker in tests (no model)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np


def bag_of_words_encoder(vocab: Sequence[str], weights: dict[str, float] | None = None):
    """An encoder: texts -> unit vectors of the counts of `vocab`'s words (plus 1e-3, so none is zero), each count
    times its word's weight (1 unless `weights` names it): a weight keeps two texts from tying with a query, since
    which of two mathematically equal float32 scores comes out larger differs between CPUs."""
    w = [float((weights or {}).get(word, 1.0)) for word in vocab]

    def encode(texts):
        rows = []
        for t in texts:
            words = re.findall(r"\w+", t.lower())
            v = np.array([words.count(word) * k for word, k in zip(vocab, w)], dtype=np.float32) + 1e-3
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, dtype=np.float32)

    return encode
