"""BM25 over a passage store of any size, in bounded memory: the index built streaming in shards,
with global document frequencies and average length, so that every score equals a one-piece
bm25s index's (`BM25Retriever`); shards memory-mapped and searched together, top-k merged.

Build, two passes over the store, one shard (`shard_passages` passages) in memory at a time:

1. tokenize the shard with the index's one bm25s analyzer (its vocabulary grows across shards,
   so a word has one id everywhere), write its term ids to disk, add its document frequencies
   and lengths to the global counts;
2. with the global idf (bm25s' `_build_idf_array`) and average length, score the shard's
   postings by bm25s' own `_build_scores_and_indices_for_matrix` and save them as a term-by-passage
   CSR matrix (data, indices, indptr .npy: bm25s' layout), memory-mapped at search.

Each term's postings are sorted by passage (a shard's CSC matrix is sorted before it is saved), which
MaxScore's lookups need; the terms' upper bounds are computed at the first pruned search and kept
beside the index (`upper_bounds.npy`).

Peak memory is one shard's tokens and scores plus the vocabulary, whatever the corpus size.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from knowtrace_train.data.schema import Passage
from knowtrace_train.io import DiskFullError
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage, passage_text
from knowtrace_train.retrieval.bm25 import BM25Settings, _bm25s, make_analyzer
from knowtrace_train.retrieval.postings import DEFAULT_PRUNING, PRUNING, PostingsSearch
from knowtrace_train.retrieval.cache import build_once, cache_key, drop_other_format, resolve_cache_dir

log = logging.getLogger(__name__)

#: Bumped whenever the files of a sharded index change meaning; another version is rebuilt.
SHARDED_FORMAT = 1
DEFAULT_SHARD_PASSAGES = 250_000


def _store_bytes(store) -> int:
    folder = getattr(store, "folder", None)
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.is_file()) if folder else 0


class ShardedBM25Retriever(PostingsSearch):
    """BM25 over `store` (a `data.store.PassageStore`, or any sequence of passages with a
    `fingerprint`), built once into `cache_dir/bm25-shards/<key>` and memory-mapped from there."""

    def __init__(
        self,
        store: Sequence[Passage],
        settings: BM25Settings = BM25Settings(),
        cache_dir: str | Path | None = "",
        shard_passages: int = DEFAULT_SHARD_PASSAGES,
        show_progress: bool = False,
        threads: int = 1,
        pruning: str = DEFAULT_PRUNING,
    ) -> None:
        if len(store) == 0:
            raise RetrievalError("cannot build a BM25 index over an empty corpus")
        if shard_passages < 1:
            raise RetrievalError(f"shard_passages must be >= 1, got {shard_passages}")
        fingerprint = getattr(store, "fingerprint", None)
        if not fingerprint:
            raise RetrievalError("a sharded BM25 index needs a passage store (data.store.open_store), not a list")
        self.store, self.settings, self.shard_passages = store, settings, shard_passages
        #: shards searched at once on this many threads (the results do not depend on it)
        self.threads = max(1, int(threads))
        if pruning not in PRUNING:
            raise RetrievalError(f"pruning must be one of {PRUNING}, got {pruning!r}")
        #: "maxscore" (exact dynamic pruning) or "none" (every posting scored): the same results (PostingsSearch)
        self.pruning = pruning
        root = resolve_cache_dir(cache_dir)
        if root is None:
            raise RetrievalError("a sharded BM25 index lives on disk: cache_dir cannot be None")
        key = cache_key(fingerprint, {"format": "sharded", "shard_passages": shard_passages, **settings.to_dict()})
        folder = root / "bm25-shards" / key
        drop_other_format(folder, "knowtrace_bm25_shards.json", SHARDED_FORMAT, "sharded BM25 index")
        try:
            self.index_dir = build_once(folder, self._build_into)
        except (OSError, DiskFullError) as e:
            if isinstance(e, OSError) and e.errno != errno.ENOSPC:
                raise
            need = _store_bytes(store)
            raise DiskFullError(
                f"{folder.parent}: the disk filled while building the BM25 index: it needs about {need:,} bytes "
                f"(about the store's size, measured 0.7x plus the shards' term ids while building); "
                f"{shutil.disk_usage(folder.parent).free:,} are free; the half-built index was removed"
            ) from None
        self._load(self.index_dir)

    # -- indexing ----------------------------------------------------------
    def _build_into(self, folder: Path) -> None:
        bm25s = _bm25s()
        n = len(self.store)
        log.info("building a sharded BM25 index over %d passages in %s", n, folder)
        analyzer = make_analyzer(self.settings)
        df = np.zeros(0, dtype=np.int64)
        total_len = 0
        shards = []
        it = iter(self.store)
        for s, lo in enumerate(range(0, n, self.shard_passages)):
            hi = min(n, lo + self.shard_passages)
            texts = [passage_text(next(it)) for _ in range(lo, hi)]
            ids = analyzer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False, allow_empty=False)
            del texts
            lens = np.fromiter((len(t) for t in ids), dtype=np.int64, count=len(ids))
            flat = np.fromiter((t for doc in ids for t in doc), dtype=np.int32, count=int(lens.sum()))
            del ids
            n_vocab = len(analyzer.get_vocab_dict())
            if n_vocab > len(df):
                df = np.concatenate([df, np.zeros(n_vocab - len(df), dtype=np.int64)])
            # distinct (passage, term) pairs, by sorting (np.unique's hashing is slower here)
            keys = np.repeat(np.arange(hi - lo, dtype=np.int64), lens) * n_vocab + flat
            keys.sort()
            distinct = keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys
            df += np.bincount(distinct % n_vocab, minlength=len(df))
            total_len += int(lens.sum())
            np.save(folder / f"tokens_{s:05d}.npy", flat)
            np.save(folder / f"lengths_{s:05d}.npy", lens)
            shards.append({"start": lo, "stop": hi, "postings": int(len(distinct))})
            del flat, keys, distinct
            log.info("tokenized shard %d (%d-%d)", s, lo, hi)
        n_vocab = len(df)
        if n_vocab == 0:
            raise RetrievalError(f"no passage of the {n} has an indexable word (all are empty or stopwords)")
        model = self._model()
        avg_doc_len = total_len / n
        idf = bm25s.scoring._build_idf_array(
            doc_frequencies=dict(enumerate(df.tolist())),
            n_docs=n,
            compute_idf_fn=bm25s.scoring._select_idf_scorer(model.idf_method),
            dtype=model.dtype,
        )
        for s, shard in enumerate(shards):
            self._score_shard(folder, s, shard, idf, avg_doc_len, n_vocab, model)
        analyzer.save_vocab(folder)
        meta = {
            "format": SHARDED_FORMAT,
            "num_docs": n,
            "num_terms": n_vocab,
            "avg_doc_len": avg_doc_len,
            "shards": shards,
            "settings": self.settings.to_dict(),
        }
        (folder / "knowtrace_bm25_shards.json").write_text(json.dumps(meta, indent=2) + "\n")

    def _score_shard(self, folder, s, shard, idf, avg_doc_len, n_vocab, model) -> None:
        import scipy.sparse as sp

        bm25s = _bm25s()
        flat = np.load(folder / f"tokens_{s:05d}.npy")
        lens = np.load(folder / f"lengths_{s:05d}.npy")
        docs = np.split(flat, np.cumsum(lens)[:-1])
        scores, doc_idx, voc_idx = bm25s.scoring._build_scores_and_indices_for_matrix(
            corpus_token_ids=[d.tolist() for d in docs],
            idf_array=idf,
            avg_doc_len=avg_doc_len,
            doc_frequencies={0: shard["postings"]},  # bm25s sizes its arrays by the sum
            k1=model.k1,
            b=model.b,
            delta=model.delta,
            nonoccurrence_array=None,
            method=model.method,
            dtype=model.dtype,
            int_dtype=model.int_dtype,
            show_progress=False,
        )
        del docs, flat
        m = sp.csc_matrix((scores, (doc_idx, voc_idx)), shape=(len(lens), n_vocab))  # columns: terms
        m.sort_indices()
        sub = folder / f"shard_{s:05d}"
        sub.mkdir()
        for name in ("data", "indices", "indptr"):
            np.save(sub / f"{name}.npy", getattr(m, name))
        (folder / f"tokens_{s:05d}.npy").unlink()
        (folder / f"lengths_{s:05d}.npy").unlink()

    def _model(self):
        st = self.settings
        return _bm25s().BM25(k1=st.k1, b=st.b, method=st.method, backend="numpy")

    def _load(self, folder: Path) -> None:
        import scipy.sparse as sp

        meta = json.loads((folder / "knowtrace_bm25_shards.json").read_text())
        if meta.get("num_docs") != len(self.store):
            raise RetrievalError(
                f"the sharded BM25 index in {folder} holds {meta.get('num_docs')} passages, not {len(self.store)}; "
                "delete that folder to rebuild it"
            )
        self.meta = meta
        self._analyzer = make_analyzer(self.settings)
        self._analyzer.load_vocab(folder)
        n_terms = meta["num_terms"]
        self._shards = []
        #: postings of each term over all shards: what a query costs (bounds a batch's memory)
        self._postings = np.zeros(n_terms, dtype=np.int64)
        for s, shard in enumerate(meta["shards"]):
            sub = folder / f"shard_{s:05d}"
            arrays = [np.load(sub / f"{name}.npy", mmap_mode="r") for name in ("data", "indices", "indptr")]
            m = sp.csr_matrix(tuple(arrays), shape=(n_terms, shard["stop"] - shard["start"]))
            self._postings += np.diff(np.asarray(arrays[2], dtype=np.int64))
            self._shards.append((shard["start"], m))

    # -- search (PostingsSearch: analyze, search, search_rows, batches under the postings budget) ---------
    def _bounds_file(self) -> Path:
        # beside the index, not part of its format: an index without it gets it at its first pruned search
        return self.index_dir / "upper_bounds.npy"

    def _search_chunk(self, term_ids: list[list[int]], k: int) -> list[list[ScoredPassage]]:
        return [
            [ScoredPassage(self.store[int(d)], float(v)) for d, v in zip(docs, vals)]
            for docs, vals in self.search_rows(term_ids, k)
        ]
