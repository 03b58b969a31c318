"""Dense retrieval over a passage store of any size: embeddings encoded streaming, written in shards
(.npy, float32 or float16) and memory-mapped; searched exactly over the shards with the top k merged
(`index="flat"`), or through a faiss IVF-PQ index whose candidates are re-scored exactly from the
shards (`index="ivfpq"`, for corpora whose embeddings do not fit in memory: docs/retrieval.md).

Build, one pass over the store: `encode_chunk` passages' texts at a time (a multiple of the encoder's
batch) are encoded and appended to the current shard's .npy file by plain writes (a full disk is an
OSError, not the SIGBUS of a memory map), `shard_passages` rows a shard. Memory: one chunk of texts and
its embeddings, whatever the corpus size. All of it is written into a temporary folder renamed into
place when finished (`cache.build_once`), so a killed build leaves nothing that is loaded.

Search, flat: the queries are encoded, then each shard is searched in blocks of `search_block` rows by
faiss' exact inner product (`faiss.knn`, the very computation of the in-memory `IndexFlatIP` of
`DenseRetriever`), and the per-block top k merged, ties by corpus row. Passages come back read by row
from the store.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from knowtrace_train.data.schema import Passage
from knowtrace_train.io import FULL_ERRNOS, DiskFullError, free_bytes, model_identity
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage, check_search_args, passage_text
from knowtrace_train.retrieval.cache import build_once, cache_key, drop_other_format, resolve_cache_dir
from knowtrace_train.retrieval.dense import _load_encoder, default_encoder_path, dense_modules, encode

log = logging.getLogger(__name__)

#: Bumped whenever the files of a sharded dense index change meaning; another version is rebuilt.
DENSE_SHARDS_FORMAT = 1
DEFAULT_SHARD_PASSAGES = 1_000_000
DTYPES = ("float32", "float16")
INDEX_TYPES = ("flat", "ivfpq")
_META = "knowtrace_dense_shards.json"
_IVF_META = "knowtrace_ivfpq.json"


def ivfpq_lists(n: int) -> int:
    """The IVF lists for `n` passages: about 4 sqrt(n), a power of two, at least 1 and at most n // 39
    (faiss' k-means wants 39 training points a centroid)."""
    want = 2 ** round(math.log2(max(1.0, 4 * math.sqrt(n))))
    return int(max(1, min(want, n // 39 or 1)))


class ShardedDenseRetriever:
    """Cosine search over a passage store's normalised sentence-transformer embeddings, built once into
    `cache_dir/dense-shards/<key>` (key: the store's fingerprint, the encoder's identity, normalisation,
    dtype and shard size) and memory-mapped from there.

    `index="flat"`: exact, every shard searched, in blocks. `index="ivfpq"`: a faiss IVF-PQ index
    (`nlist` lists, `pq_m` bytes a passage) built from the shards into `<key>.ivfpq-<nlist>x<pq_m>`; a
    search takes `refine` x k candidates from `nprobe` lists and re-scores them exactly from the shards,
    so the scores are exact and only the recall is approximate.
    """

    def __init__(
        self,
        store: Sequence[Passage],
        encoder: str = "",
        cache_dir: str | Path | None = "",
        batch_size: int = 64,
        device: str | None = "cpu",
        normalize: bool = True,
        show_progress: bool = False,
        shard_passages: int = DEFAULT_SHARD_PASSAGES,
        dtype: str = "float32",
        index: str = "flat",
        nlist: int = 0,
        pq_m: int = 0,
        nprobe: int = 64,
        refine: int = 16,
        encode_chunk: int = 0,
        search_block: int = 65_536,
    ) -> None:
        if len(store) == 0:
            raise RetrievalError("cannot build a dense index over an empty corpus")
        fingerprint = getattr(store, "fingerprint", None)
        if not fingerprint:
            raise RetrievalError("a sharded dense index needs a passage store (data.store.open_store), not a list")
        if batch_size <= 0:
            raise RetrievalError(f"batch_size must be positive, got {batch_size}")
        if shard_passages < 1:
            raise RetrievalError(f"shard_passages must be >= 1, got {shard_passages}")
        if dtype not in DTYPES:
            raise RetrievalError(f"dense dtype must be one of {DTYPES}, got {dtype!r}")
        if index not in INDEX_TYPES:
            raise RetrievalError(f"dense index must be one of {INDEX_TYPES}, got {index!r}")
        root = resolve_cache_dir(cache_dir)
        if root is None:
            raise RetrievalError("a sharded dense index lives on disk: cache_dir cannot be None")
        self.store = store
        self.encoder_name = encoder or str(default_encoder_path())
        self.batch_size, self.normalize, self.show_progress = batch_size, normalize, show_progress
        self.shard_passages, self.dtype, self.index_type = shard_passages, dtype, index
        self.nprobe, self.refine = max(1, int(nprobe)), max(1, int(refine))
        self.encode_chunk = max(batch_size, encode_chunk or batch_size * 32)
        self.search_block = max(1, int(search_block))
        self.model = _load_encoder(self.encoder_name, device)
        settings = {
            "format": DENSE_SHARDS_FORMAT,
            "encoder": model_identity(self.encoder_name),
            "normalize": normalize,
            "dtype": dtype,
            "shard_passages": shard_passages,
        }
        key = cache_key(fingerprint, settings)
        folder = root / "dense-shards" / key
        drop_other_format(folder, _META, DENSE_SHARDS_FORMAT, "sharded dense index")
        self.index_dir = self._build(folder, self._build_into, "the dense index's embedding shards")
        self._load(self.index_dir)
        self.ivf = None
        if index == "ivfpq":
            n = len(store)
            self.nlist = int(nlist) or ivfpq_lists(n)
            dim = self.meta["dim"]
            self.pq_m = int(pq_m) or max(1, dim // 8)
            if dim % self.pq_m:
                raise RetrievalError(f"pq_m must divide the embedding size {dim}, got {self.pq_m}")
            ivf_dir = root / "dense-shards" / f"{key}.ivfpq-{self.nlist}x{self.pq_m}"
            drop_other_format(ivf_dir, _IVF_META, DENSE_SHARDS_FORMAT, "IVF-PQ index")
            self.ivf_dir = self._build(ivf_dir, self._build_ivfpq_into, "the dense IVF-PQ index")
            faiss = dense_modules()[1]
            self.ivf = faiss.read_index(str(self.ivf_dir / "ivfpq.faiss"))
            self.ivf.nprobe = min(self.nprobe, self.nlist)

    # -- building ------------------------------------------------------------------------------
    def _build(self, folder: Path, build, what: str) -> Path:
        try:
            return build_once(folder, build, what)
        except (OSError, DiskFullError) as e:
            if isinstance(e, OSError) and e.errno not in FULL_ERRNOS:
                raise
            need = self.bytes_needed()
            free = free_bytes(folder.parent)
            free_text = f"{free:,}" if free is not None else "an unknown number of"
            raise DiskFullError(
                f"{folder.parent}: the disk filled while building {what}: it needs about {need:,} bytes "
                f"({len(self.store):,} passages x {self._dim_guess()} dims x {np.dtype(self.dtype).itemsize} bytes); "
                f"{free_text} are free; the half-built index was removed"
            ) from None

    def _dim_guess(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = getattr(self, "meta", {}).get("dim") or get()
        return int(dim or 384)

    def bytes_needed(self) -> int:
        """The embedding shards' size on disk (the IVF-PQ index adds pq_m + 8 bytes a passage)."""
        return len(self.store) * self._dim_guess() * np.dtype(self.dtype).itemsize

    def _encode(self, texts: list[str], kind: str) -> np.ndarray:
        return encode(self.model, texts, kind, self.batch_size, self.normalize, False)

    def _chunks(self) -> Iterator[list[str]]:
        texts: list[str] = []
        for p in self.store:  # streamed in corpus order, never the whole corpus in memory
            texts.append(passage_text(p))
            if len(texts) == self.encode_chunk:
                yield texts
                texts = []
        if texts:
            yield texts

    def _build_into(self, folder: Path) -> None:
        from tqdm.auto import tqdm

        from knowtrace_train.progress import stderr_is_terminal

        n = len(self.store)
        need = self.bytes_needed()
        free = free_bytes(folder)
        if free is not None and free < need:
            raise OSError(28, "No space left on device (checked before building)")
        log.info("encoding %d passages with %s into shards of %d in %s", n, self.encoder_name, self.shard_passages, folder)
        progress = tqdm(total=n, desc="dense encode", disable=not (self.show_progress and stderr_is_terminal()))
        shards: list[dict] = []
        out = None
        dim = 0
        row = 0
        for texts in self._chunks():
            emb = self._encode(texts, "document").astype(self.dtype, copy=False)
            dim = emb.shape[1]
            i = 0
            while i < len(emb):
                if out is None:  # a new shard: its .npy header, then rows appended by plain writes
                    s = len(shards)
                    rows = min(self.shard_passages, n - row)
                    shards.append({"start": row, "stop": row + rows, "file": f"emb_{s:05d}.npy"})
                    out = open(folder / shards[-1]["file"], "wb")
                    np.lib.format.write_array_header_1_0(
                        out, {"descr": np.dtype(self.dtype).str, "fortran_order": False, "shape": (rows, dim)}
                    )
                take = min(len(emb) - i, shards[-1]["stop"] - row)
                out.write(np.ascontiguousarray(emb[i : i + take]).tobytes())
                i += take
                row += take
                if row == shards[-1]["stop"]:
                    out.close()
                    out = None
            progress.update(len(texts))
        progress.close()
        if out is not None:
            out.close()
        if row != n:
            raise RetrievalError(f"the store gave {row} passages while it holds {n}")
        meta = {
            "format": DENSE_SHARDS_FORMAT,
            "encoder": self.encoder_name,
            "num_docs": n,
            "dim": dim,
            "dtype": self.dtype,
            "normalize": self.normalize,
            "shards": shards,
        }
        (folder / _META).write_text(json.dumps(meta, indent=2) + "\n")

    def _load(self, folder: Path) -> None:
        meta = json.loads((folder / _META).read_text())
        if meta.get("num_docs") != len(self.store):
            raise RetrievalError(
                f"the sharded dense index in {folder} holds {meta.get('num_docs')} passages, not {len(self.store)}; "
                "delete that folder to rebuild it"
            )
        self.meta = meta
        self._shards = [(s["start"], np.load(folder / s["file"], mmap_mode="r")) for s in meta["shards"]]

    def _rows(self, rows: np.ndarray) -> np.ndarray:
        """The embeddings (float32) of corpus rows `rows` (sorted ascending), read from the shards."""
        out = np.empty((len(rows), self.meta["dim"]), dtype=np.float32)
        starts = np.array([s for s, _ in self._shards])
        which = np.searchsorted(starts, rows, side="right") - 1
        for j in np.unique(which):
            sel = which == j
            start, arr = self._shards[j]
            out[sel] = arr[rows[sel] - start]
        return out

    def _blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, float32 block) over the whole corpus, `search_block` rows at a time, memory-mapped."""
        for start, arr in self._shards:
            for lo in range(0, len(arr), self.search_block):
                block = arr[lo : lo + self.search_block]
                yield start + lo, np.ascontiguousarray(block, dtype=np.float32)

    def _build_ivfpq_into(self, folder: Path) -> None:
        faiss = dense_modules()[1]
        n, dim = len(self.store), self.meta["dim"]
        n_train = min(n, max(64 * self.nlist, 256 * 39))
        train_rows = np.unique(np.linspace(0, n - 1, n_train).round().astype(np.int64))
        log.info("training an IVF%d,PQ%d index on %d of %d embeddings", self.nlist, self.pq_m, len(train_rows), n)
        quantizer = faiss.IndexFlatIP(dim)
        ivf = faiss.IndexIVFPQ(quantizer, dim, self.nlist, self.pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        ivf.train(self._rows(train_rows))
        for _, block in self._blocks():
            ivf.add(block)
        faiss.write_index(ivf, str(folder / "ivfpq.faiss"))
        meta = {"format": DENSE_SHARDS_FORMAT, "nlist": self.nlist, "pq_m": self.pq_m, "trained_on": int(len(train_rows)), "num_docs": n}
        (folder / _IVF_META).write_text(json.dumps(meta, indent=2) + "\n")

    # -- search --------------------------------------------------------------------------------
    def search_rows(self, queries: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (rows, scores) of its k best passages, best first, ties by row."""
        return self.search_vectors(self._encode(list(queries), "query"), k)

    def search_vectors(self, q: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """`search_rows` for queries already encoded (float32, one row a query)."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        k = min(k, len(self.store))
        if self.ivf is not None:
            return self._search_ivfpq(q, k)
        faiss = dense_modules()[1]
        parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(len(q))]
        for start, block in self._blocks():
            kb = min(k, len(block))
            scores, ids = faiss.knn(q, block, kb, metric=faiss.METRIC_INNER_PRODUCT)
            for i in range(len(q)):
                ok = ids[i] >= 0
                parts[i].append((ids[i][ok].astype(np.int64) + start, scores[i][ok]))
        return [_merge(p, k) for p in parts]

    def _search_ivfpq(self, q: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        _, cand = self.ivf.search(q, min(len(self.store), k * self.refine))
        out = []
        for i in range(len(q)):
            rows = np.unique(cand[i][cand[i] >= 0])
            if len(rows) == 0:
                out.append((np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)))
                continue
            exact = self._rows(rows) @ q[i]  # the candidates re-scored from the shards: exact scores
            out.append(_merge([(rows, exact.astype(np.float32))], k))
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]:
        check_search_args(queries, k)
        if not queries:
            return []
        return [
            [ScoredPassage(self.store[int(r)], float(s)) for r, s in zip(rows, scores)]
            for rows, scores in self.search_rows(queries, k)
        ]


def _merge(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    vals = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=np.float32)
    order = np.lexsort((rows, -vals))[:k]
    return rows[order], vals[order]


