"""A deterministic bag-of-words bi-encoder for TRACE's ranker in tests (no model)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np


def bag_of_words_encoder(vocab: Sequence[str]):
    """An encoder: texts -> unit vectors of the counts of `vocab`'s words (plus 1e-3, so none is zero)."""

    def encode(texts):
        rows = []
        for t in texts:
            words = re.findall(r"\w+", t.lower())
            v = np.array([float(words.count(w)) for w in vocab], dtype=np.float32) + 1e-3
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, dtype=np.float32)

    return encode
