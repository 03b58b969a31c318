"""BM25 retrieval with bm25s: one analyzer for passages and queries, a cached memory-mapped
index, and batched search (`postings.PostingsSearch`: exact MaxScore by default, or every posting scored)."""

from __future__ import annotations

import functools
import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from knowtrace_train.data.schema import Passage
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage, passage_text
from knowtrace_train.retrieval.cache import build_once, cache_key, corpus_fingerprint, resolve_cache_dir
from knowtrace_train.retrieval.postings import DEFAULT_PRUNING, PRUNING, PostingsSearch

log = logging.getLogger(__name__)

#: Bumped whenever the files written into a cached index change meaning.
INDEX_FORMAT = 1
#: bm25s scoring variants whose scores live entirely in the stored matrix (BM25L and BM25+
#: add a score to every document, which a sparse product cannot see).
METHODS = ("lucene", "robertson", "atire")
#: How many postings one sparse product may touch before the batch is split (bounds memory).


#: the modules bm25s tries for its optional JAX top-k (bm25s/selection.py: `import jax.lax`)
_JAX_MODULES = ("jax", "jax.lax")
_ABSENT = object()


def _bm25s():
    """The bm25s module, imported without JAX.

    Where JAX is installed, `import bm25s` imports it (bm25s.selection, for an optional top-k
    that `BM25.retrieve` would pick with `backend_selection="auto"`) and runs one JAX op right
    there, which starts JAX's GPU backend: that reserves 75% of the GPU's memory for JAX, and
    the models trained next to the retriever then run out of it. This retriever never calls
    `retrieve` (its search is a scipy sparse product and its top-k `np.partition`, below), so
    JAX would be of no use to it: during bm25s' import `jax` and `jax.lax` read as absent
    (None in `sys.modules`, which makes an import of them raise ImportError, as if not
    installed), and then what was there before is put back. A JAX that another library had
    imported already stays imported, but bm25s does not start its backend.

    Importing bm25s also sets its logger to DEBUG, which sends a debug line per index build
    to whatever handler an application configures: reset it to inherit the application's level.
    """
    if "bm25s" not in sys.modules:
        saved = {name: sys.modules.get(name, _ABSENT) for name in _JAX_MODULES}
        sys.modules.update(dict.fromkeys(_JAX_MODULES))
        try:
            import bm25s  # noqa: F401
        finally:
            for name, module in saved.items():
                if module is _ABSENT:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
    bm25s = sys.modules["bm25s"]
    logging.getLogger("bm25s").setLevel(logging.NOTSET)
    if getattr(getattr(bm25s, "selection", None), "JAX_IS_AVAILABLE", False):
        _warn_jax_once()
    return bm25s


@functools.cache
def _warn_jax_once() -> None:
    log.warning(
        "bm25s was imported before knowtrace_train's BM25 retriever, with JAX available: JAX may "
        "have reserved most of the GPU's memory. The retriever itself never uses JAX; import "
        "bm25s through it (knowtrace_train.retrieval.bm25) or set XLA_PYTHON_CLIENT_PREALLOCATE=false."
    )


@dataclass(frozen=True)
class BM25Settings:
    """What shapes a BM25 index; all of it is part of the cache key."""

    #: PyStemmer algorithm ("english", "porter", ...) or None for no stemming.
    stemmer: str | None = "english"
    #: bm25s stopword list name ("english", "en_plus", ...) or None for none.
    stopwords: str | None = "english"
    lower: bool = True
    #: words are the regex's matches (scikit-learn's default: two or more word characters).
    token_pattern: str = r"(?u)\b\w\w+\b"
    #: k1 and b default to Lucene's and Elasticsearch's values, which the KnowTrace paper used.
    k1: float = 1.2
    b: float = 0.75
    method: str = "lucene"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"bm25 method must be one of {METHODS}, got {self.method!r}")
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ValueError(f"bm25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        if self.stemmer is not None:
            import Stemmer

            if self.stemmer not in Stemmer.algorithms():
                raise ValueError(f"unknown stemmer {self.stemmer!r}; PyStemmer has {sorted(Stemmer.algorithms())}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_analyzer(settings: BM25Settings):
    """The bm25s tokenizer for these settings. The same object (or one restored from the same
    saved vocabulary) turns passages into terms at indexing and queries into terms at search,
    so lowercasing, splitting, stopwords and stemming can never differ between the two."""
    Tokenizer = _bm25s().tokenization.Tokenizer
    stemmer = None
    if settings.stemmer is not None:
        import Stemmer

        stemmer = Stemmer.Stemmer(settings.stemmer)
    return Tokenizer(
        lower=settings.lower,
        splitter=settings.token_pattern,
        stopwords=settings.stopwords if settings.stopwords is not None else None,
        stemmer=stemmer,
    )


class BM25Retriever(PostingsSearch):
    """BM25 over a fixed list of passages (the embedded default backend).

    The index (bm25s' score matrix plus the analyzer's vocabulary) is written to
    `cache_dir/bm25/<key>`, where the key hashes the passages and the settings, and is loaded
    from there memory-mapped on the next run. `cache_dir=None` keeps everything in memory.
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        settings: BM25Settings = BM25Settings(),
        cache_dir: str | Path | None = "",
        show_progress: bool = False,
        pruning: str = DEFAULT_PRUNING,
    ) -> None:
        if len(passages) == 0:
            raise RetrievalError("cannot build a BM25 index over an empty corpus")
        if pruning not in PRUNING:
            raise RetrievalError(f"pruning must be one of {PRUNING}, got {pruning!r}")
        #: "maxscore" (exact dynamic pruning) or "none" (every posting scored): the same results (PostingsSearch)
        self.pruning = pruning
        self.passages = list(passages)
        self.settings = settings
        self.show_progress = show_progress
        root = resolve_cache_dir(cache_dir)
        if root is None:
            self._analyzer, model = self._build()
            self.index_dir: Path | None = None
        else:
            key = cache_key(corpus_fingerprint(self.passages), {"format": INDEX_FORMAT, **settings.to_dict()})
            self.index_dir = build_once(root / "bm25" / key, self._build_into, "the BM25 index")
            self._analyzer, model = self._load(self.index_dir)
        self._set_matrix(model)
        #: whether the score matrix is read from the cache folder on demand rather than held in memory
        self.memory_mapped = isinstance(model.scores["data"], np.memmap)

    # -- indexing --------------------------------------------------------
    def _build(self):
        analyzer = make_analyzer(self.settings)
        texts = [passage_text(p) for p in self.passages]
        term_ids = analyzer.tokenize(
            texts, update_vocab=True, return_as="ids", show_progress=self.show_progress, allow_empty=False
        )
        vocab = analyzer.get_vocab_dict()
        if not vocab:
            raise RetrievalError(
                f"no passage of the {len(texts)} has an indexable word (all are empty or stopwords)"
            )
        model = self._model()
        model.index((term_ids, vocab), create_empty_token=False, show_progress=self.show_progress)
        return analyzer, model

    def _build_into(self, folder: Path) -> None:
        log.info("building a BM25 index over %d passages in %s", len(self.passages), folder)
        analyzer, model = self._build()
        model.save(folder, show_progress=False)
        analyzer.save_vocab(folder)
        meta = {"format": INDEX_FORMAT, "num_docs": len(self.passages), "settings": self.settings.to_dict()}
        (folder / "knowtrace_bm25.json").write_text(json.dumps(meta, indent=2) + "\n")

    def _load(self, folder: Path):
        meta = json.loads((folder / "knowtrace_bm25.json").read_text())
        if meta.get("num_docs") != len(self.passages):
            raise RetrievalError(
                f"the cached BM25 index in {folder} holds {meta.get('num_docs')} passages, "
                f"not {len(self.passages)}; delete that folder to rebuild it"
            )
        analyzer = make_analyzer(self.settings)
        analyzer.load_vocab(folder)
        model = _bm25s().BM25.load(folder, mmap=True, load_vocab=False, show_progress=False)
        # the analyzer's vocabulary is the index's (saved twice by bm25s): share it, read once
        model.vocab_dict = analyzer.get_vocab_dict()
        model.unique_token_ids_set = set(model.vocab_dict.values())
        log.info("loaded the BM25 index in %s (memory-mapped)", folder)
        return analyzer, model

    def _model(self):
        s = self.settings
        return _bm25s().BM25(k1=s.k1, b=s.b, method=s.method, backend="numpy")

    def _set_matrix(self, model) -> None:
        """Term-by-passage matrix of BM25 term scores: bm25s stores it column-compressed by
        term, which is exactly a CSR matrix with one row per term."""
        import scipy.sparse as sp

        self.model = model  # the bm25s.BM25 holding the score matrix
        scores = model.scores
        n_terms = len(scores["indptr"]) - 1
        self._matrix = sp.csr_matrix(
            (scores["data"], scores["indices"], scores["indptr"]), shape=(n_terms, len(self.passages))
        )
        self._postings = np.diff(np.asarray(self._matrix.indptr, dtype=np.int64))
        self._shards = [(0, self._matrix)]  # PostingsSearch.search_rows: one shard

    def _bounds_file(self) -> Path | None:
        return None if self.index_dir is None else self.index_dir / "upper_bounds.npy"

    def _search_chunk(self, term_ids: list[list[int]], k: int) -> list[list[ScoredPassage]]:
        return [
            [ScoredPassage(self.passages[int(d)], float(v)) for d, v in zip(docs, vals)]
            for docs, vals in self.search_rows(term_ids, k)
        ]
