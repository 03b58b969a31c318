"""Batched search over term-by-passage BM25 score matrices, shared by the one-piece index (bm25.py) and the
sharded one (bm25_shards.py): exact MaxScore (the default: the postings that cannot enter the top k are skipped,
a frequent term's bound taken per block of passages), or one sparse product scoring every posting
(`pruning="none"`); both give the same top k and scores, ties by row."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from knowtrace_train.retrieval.base import ScoredPassage, check_search_args

log = logging.getLogger(__name__)

#: a search batch's postings (bounds its memory) and queries at most
POSTINGS_PER_CHUNK = 8_000_000
MAX_QUERIES_PER_CHUNK = 4096

#: How a search finds each query's top k: "maxscore" (exact dynamic pruning: skips the postings that cannot
#: enter the top k) or "none" (every posting of every query term scored, one sparse product per shard).
PRUNING = ("maxscore", "none")
DEFAULT_PRUNING = "maxscore"
#: a bound test keeps a passage unless its bound is below the k-th score by more than this share (the
#: float32 sums of a score and the float64 sums of the bounds round apart by far less)
_BOUND_SLACK = 1e-4


class PostingsSearch:
    """Batched search over term-by-passage score matrices: queries analyzed by the index's own analyzer
    (`self._analyzer`), batched so that their postings (`self._postings`, per term) stay under the chunk
    budget, each batch scored by `self._search_chunk`. BM25Retriever and the sharded index share it, and
    its `search_rows` over `self._shards` (a list of (first row, term-by-passage CSR matrix)).

    Two searches, the same results (the same top k, ties by row, the same float32 scores, bit for bit):
    `pruning="none"` scores every posting of every query term (one sparse product per shard);
    `pruning="maxscore"` is MaxScore (Turtle and Flood 1995), exact. Each term's upper bound (its largest score
    over all passages, `_upper_bounds`) times its count in the query bounds what it can add to a score; with θ,
    a lower bound of the k-th best score, the *non-essential* terms are the most of the query's terms, smallest
    bounds first, whose bounds sum below θ: a passage holding only those cannot enter the top k, so their
    postings are never read whole. Per query, θ starts as the k-th best full score of a few real passages (the
    best postings of its term of largest bound, in every shard) and rises with every shard searched. Per shard,
    the essential terms' postings are summed by one sparse product (scipy, a group of queries at once); a
    candidate stays only while that sum plus the non-essential terms' bounds can reach θ, with the bound of a
    frequent term taken per block of 2**_BLOCK_BITS passages (its block maxima: Ding and Suel 2011's block-max
    idea); the rest are looked up in the non-essential terms' postings (binary search: a term's postings are sorted by
    passage), largest bound first, dropped as soon as they cannot reach θ, and the survivors scored in full
    in the sparse product's own order of terms and float32 arithmetic, so that a score equals the
    exhaustive one bit for bit and ties break alike.
    """

    #: "maxscore" or "none" (PRUNING); set per retriever
    pruning: str = DEFAULT_PRUNING
    #: shards searched at once on this many threads (the results do not depend on it)
    threads: int = 1

    def analyze(self, queries: Sequence[str]) -> list[list[int]]:
        """Term ids of each query, by the index's own analyzer; words the corpus never had drop out."""
        return self._analyzer.tokenize(
            list(queries), update_vocab=False, return_as="ids", show_progress=False, allow_empty=False
        )

    def search(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]:
        check_search_args(queries, k)
        term_ids = self.analyze(queries)
        out: list[list[ScoredPassage]] = []
        for start, stop in self._chunks(term_ids) if self.pruning == "none" else _count_chunks(len(term_ids)):
            out.extend(self._search_chunk(term_ids[start:stop], k))
        return out

    def _chunks(self, term_ids: list[list[int]]):
        """Consecutive query ranges whose postings together stay under the chunk budget."""
        start, budget = 0, 0
        for i, ids in enumerate(term_ids):
            cost = int(self._postings[ids].sum()) if ids else 0
            if i > start and (budget + cost > POSTINGS_PER_CHUNK or i - start >= MAX_QUERIES_PER_CHUNK):
                yield start, i
                start, budget = i, 0
            budget += cost
        if start < len(term_ids):
            yield start, len(term_ids)

    # -- search by rows -------------------------------------------------------------------------------
    def search_rows(self, term_ids: list[list[int]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query, (rows, scores) of its k best passages, best first, ties by row."""
        if self.pruning not in PRUNING:
            raise ValueError(f"pruning must be one of {PRUNING}, got {self.pruning!r}")
        if self.pruning == "maxscore":
            return self._search_rows_maxscore(term_ids, k)
        return self._search_rows_exhaustive(term_ids, k)

    def _search_rows_exhaustive(self, term_ids: list[list[int]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        q = query_matrix(term_ids, self._shards[0][1].shape[0], self._shards[0][1].dtype)
        found: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in term_ids]

        def one_shard(shard):
            offset, m = shard
            scores = q @ m  # scipy's sparse product releases the GIL: shards overlap on threads
            indptr, indices, data = scores.indptr, scores.indices, scores.data
            best = []
            for i in range(len(term_ids)):
                lo, hi = indptr[i], indptr[i + 1]
                if hi == lo:
                    continue
                docs, vals = indices[lo:hi], data[lo:hi]
                if hi - lo > k:
                    docs, vals = _top_k(docs, vals, k)
                best.append((i, docs.astype(np.int64) + offset, vals))
            return best

        if self.threads > 1 and len(self._shards) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(self.threads, len(self._shards))) as pool:
                per_shard = list(pool.map(one_shard, self._shards))
        else:
            per_shard = [one_shard(shard) for shard in self._shards]
        for best in per_shard:  # in shard order, so the merge never depends on the threads
            for i, docs, vals in best:
                found[i].append((docs, vals))
        out = []
        for parts in found:
            if not parts:
                out.append((np.zeros(0, dtype=np.int64), np.zeros(0, dtype=q.dtype)))
                continue
            docs = np.concatenate([p[0] for p in parts])
            vals = np.concatenate([p[1] for p in parts])
            if len(docs) > k:
                docs, vals = _top_k(docs, vals, k)
            order = np.lexsort((docs, -vals))
            out.append((docs[order], vals[order]))
        return out

    def _bounds_file(self) -> Path | None:
        """Where the terms' upper bounds are kept beside the index (None: computed in memory only)."""
        return None

    def _upper_bounds(self) -> np.ndarray:
        """Each term's largest score over all its postings, all shards (0 for a term without one): computed
        once, checking on the way that every term's postings are sorted by passage (a shard whose are not
        is sorted in memory), and kept in `_bounds_file()` where there is one and no shard needed sorting (so a
        bounds file found means that the check passed)."""
        ub = getattr(self, "_ub", None)
        if ub is not None:
            return ub
        path = self._bounds_file()
        n_terms = self._shards[0][1].shape[0]
        if path is not None and path.exists():
            ub = np.load(path)
            if ub.shape != (n_terms,):
                ub = None
        need_check, sorted_here = ub is None, False
        shards = []
        for offset, m in self._shards:
            if need_check and not m.has_sorted_indices:  # scipy scans the indices in C
                log.warning("a BM25 shard's postings are not sorted by passage: sorting a copy in memory")
                m, sorted_here = m.sorted_indices(), True
            shards.append((offset, m))
        self._shards = shards
        if ub is None:
            ub = np.zeros(n_terms, dtype=np.float64)
            for _, m in self._shards:
                indptr = np.asarray(m.indptr, dtype=np.int64)
                data = np.asarray(m.data)
                nz = np.flatnonzero(indptr[1:] > indptr[:-1])
                if len(nz):
                    ub[nz] = np.maximum(ub[nz], np.maximum.reduceat(data, indptr[nz]))
            if path is not None and not sorted_here:
                try:  # written whole, then renamed: a reader never sees half a file
                    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npy")
                    np.save(tmp, ub)
                    os.replace(tmp, path)
                except OSError as e:
                    log.warning("could not keep the BM25 terms' upper bounds in %s (%s): computed at every load", path, e)
        self._ub = ub
        # plain arrays (not memmap views: slicing those costs per call), indptr as int64
        self._arrays = [
            (offset, np.asarray(m.indptr, dtype=np.int64), np.asarray(m.indices), np.asarray(m.data))
            for offset, m in self._shards
        ]
        self._block_max = [_block_maxima(*arrays[1:]) for arrays in self._arrays]
        return ub

    def _search_rows_maxscore(self, term_ids: list[list[int]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        ub = self._upper_bounds()
        if self.threads > 1 and len(term_ids) > 1:
            from concurrent.futures import ThreadPoolExecutor

            n = min(self.threads, len(term_ids))
            parts = [term_ids[i::n] for i in range(n)]
            with ThreadPoolExecutor(n) as pool:
                done = list(pool.map(lambda part: self._maxscore_batch(part, k, ub), parts))
            out: list = [None] * len(term_ids)
            for i, got in enumerate(done):
                out[i::n] = got
            return out
        return self._maxscore_batch(term_ids, k, ub)

    def _maxscore_batch(self, term_ids: list[list[int]], k: int, ub: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The queries' top k by MaxScore (the class docstring), the same as the exhaustive search's.

        Per query: θ first from a few real passages (the best-scoring postings of its term of largest bound,
        fully scored), then shard by shard: the essential terms' postings summed by one sparse product over
        the batch (scipy), a passage kept only while that partial sum plus the bounds of the other terms
        reaches θ, looked up in those terms (largest bound first) and scored in full; θ rises with each shard.
        """
        import scipy.sparse as sp

        dtype = self._shards[0][1].dtype
        n_terms = self._shards[0][1].shape[0]
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=dtype))
        queries = []  # per query: terms (ascending), counts, terms by decreasing bound, reach
        for ids in term_ids:
            if not ids:
                queries.append(None)
                continue
            terms, counts = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
            counts = counts.astype(dtype)
            bound = np.maximum(ub[terms], 0.0) * counts  # the most a term can add to a score
            order = np.argsort(-bound, kind="stable")
            # reach[r]: the most a passage holding only the r-th term (by decreasing bound) and those after it
            # can score; decreasing in r, reach[n] = 0
            reach = np.concatenate([np.cumsum(bound[order][::-1])[::-1], [0.0]])
            queries.append((terms, counts, order, reach))
        cuts = np.full(len(term_ids), -np.inf)  # θ less a hair for rounding: a bound below it cannot reach the k-th
        for i, q in enumerate(queries):
            if q is not None:
                cuts[i] = self._seed_cut(*q[:3], k)
        tops = [empty] * len(term_ids)
        for (offset, indptr, indices, data), (_, matrix), block_max in zip(self._arrays, self._shards, self._block_max):
            # the essential terms of each query: those whose reach is not below its cut
            ms = np.zeros(len(term_ids), dtype=np.int64)
            cost = np.zeros(len(term_ids), dtype=np.int64)  # the essential terms' postings in this shard
            for i, q in enumerate(queries):
                if q is not None:
                    terms, counts, order, reach = q
                    ms[i] = m = int(np.count_nonzero(reach[:-1] >= cuts[i]))
                    t = terms[order[:m]]
                    cost[i] = int((indptr[t + 1] - indptr[t]).sum())
            # one sparse product for a group of queries whose essential postings stay under the chunk budget
            start = 0
            while start < len(term_ids):
                stop = start + max(1, int(np.searchsorted(np.cumsum(cost[start:]), POSTINGS_PER_CHUNK, side="right")))
                group = []
                for i in range(start, stop):
                    if queries[i] is None or not ms[i]:
                        continue
                    if ms[i] > 1:
                        group.append(i)
                        continue
                    # one essential term: its postings are the candidates, no product needed
                    terms, counts, order, _ = queries[i]
                    t = terms[order[0]]
                    if indptr[t + 1] > indptr[t]:
                        docs, vals = indices[indptr[t]:indptr[t + 1]], data[indptr[t]:indptr[t + 1]]
                        tops[i], cuts[i] = self._shard_candidates(
                            docs, vals * counts[order[0]], queries[i], 1, tops[i], cuts[i], k,
                            (offset, indptr, indices, data), block_max, dtype,
                        )
                start = stop
                if not group:
                    continue
                # each query's essential terms in ascending id (np.sort of positions into its ascending terms): the
                # order the product sums them in, as the exhaustive product's
                at = [np.sort(queries[i][2][: ms[i]]) for i in group]
                q_ess = sp.csr_matrix(
                    (
                        np.concatenate([queries[i][1][a] for i, a in zip(group, at)]),
                        np.concatenate([queries[i][0][a] for i, a in zip(group, at)]),
                        np.concatenate([[0], np.cumsum(ms[group])]),
                    ),
                    shape=(len(group), n_terms),
                )
                partial = q_ess @ matrix
                for g, i in enumerate(group):
                    lo, hi = partial.indptr[g], partial.indptr[g + 1]
                    if hi > lo:
                        tops[i], cuts[i] = self._shard_candidates(
                            partial.indices[lo:hi], partial.data[lo:hi], queries[i], int(ms[i]), tops[i], cuts[i], k,
                            (offset, indptr, indices, data), block_max, dtype,
                        )
        out = []
        for docs, vals in tops:
            order = np.lexsort((docs, -vals))
            out.append((docs[order], vals[order]))
        return out

    @staticmethod
    def _shard_candidates(docs, part, query, m, top, cut, k, arrays, block_max, dtype):
        """A query's candidates in one shard (the passages of its `m` essential terms, `part` their sum there),
        into its top k: (the new top k, the new cut)."""
        terms, counts, order, reach = query
        offset, indptr, indices, data = arrays
        if m == len(terms):  # every term essential: the partial sums are the exhaustive scores
            if not part.all():  # the product leaves out a passage whose sum is exactly 0
                docs, part = docs[part != 0], part[part != 0]
            if len(docs) > k:
                docs, part = _top_k(docs, part, k)
            return _merge_top(top, docs.astype(np.int64) + offset, part, k, cut)
        # out: a passage whose partial sum plus the other terms' largest scores in its block falls below the cut
        b_rows, b_table = block_max
        per_block = np.zeros(b_table.shape[1], dtype=dtype)
        for r in range(m, len(terms)):
            row = b_rows[terms[order[r]]]
            per_block += (reach[r] - reach[r + 1]) if row < 0 else b_table[row] * counts[order[r]]
        keep = part + per_block[docs >> _BLOCK_BITS] >= cut  # float32 as the scores: the cut's hair covers it
        docs, part = docs[keep], part[keep]
        if not len(docs):
            return top, cut
        segs = [(indices[a:b], data[a:b]) for a, b in zip(indptr[terms].tolist(), indptr[terms + 1].tolist())]
        if len(docs) > _FIRST_BLOCK:
            # the passages of largest partial sum first: their full scores raise θ before the rest are looked up
            best = np.argpartition(part, len(part) - _FIRST_BLOCK)
            blocks = [best[len(part) - _FIRST_BLOCK:], best[: len(part) - _FIRST_BLOCK]]
        else:
            blocks = [slice(None)]
        for block in blocks:
            d, v = _full_scores(docs[block], part[block], segs, query, m, cut, dtype, block_max)
            top, cut = _merge_top(top, d.astype(np.int64) + offset, v, k, cut)
        return top, cut

    def _seed_cut(self, terms: np.ndarray, counts: np.ndarray, order: np.ndarray, k: int) -> float:
        """A first θ (less the rounding hair) for one query: the k-th best full score among the passages where its
        terms of largest bound score highest (_SEED_POSTINGS a term and shard), real scores of real passages, so never
        above the true k-th; -inf where fewer than k passages were found."""
        found_docs, found_vals = [], []
        m = max(k, _SEED_POSTINGS)
        for r in range(len(terms)):
            t = terms[order[r]]
            for offset, indptr, indices, data in self._arrays:
                docs, vals = indices[indptr[t]:indptr[t + 1]], data[indptr[t]:indptr[t + 1]]
                if len(docs) > m:
                    docs = np.sort(docs[np.argpartition(vals, len(vals) - m)[len(vals) - m:]])
                if not len(docs):
                    continue
                score = np.zeros(len(docs), dtype=vals.dtype)
                for t2, c in zip(terms.tolist(), counts):
                    seg = indices[indptr[t2]:indptr[t2 + 1]]
                    if len(seg):
                        score += _lookup(seg, data[indptr[t2]:indptr[t2 + 1]], docs)[1] * c
                found_docs.append(docs.astype(np.int64) + offset)
                found_vals.append(score)
            # one term's passages are distinct; with another term's they may repeat
            docs, first = np.unique(np.concatenate(found_docs or [np.zeros(0, np.int64)]), return_index=True)
            if len(docs) >= k:
                vals = np.concatenate(found_vals)[first]
                theta = float(np.partition(vals, len(vals) - k)[len(vals) - k])
                return theta - _BOUND_SLACK * abs(theta)
        return -np.inf


#: the postings of largest score, of a query's term of largest bound in each shard, that are scored in full for θ
_SEED_POSTINGS = 20


def _count_chunks(n: int):
    """MaxScore's batches: by count only (its sparse products are kept under the postings budget inside)."""
    for start in range(0, n, MAX_QUERIES_PER_CHUNK):
        yield start, min(n, start + MAX_QUERIES_PER_CHUNK)


#: passages scored in full first, of a query's candidates in a shard (those of largest partial sum)
_FIRST_BLOCK = 256


def _merge_top(top, docs, vals, k, cut):
    """`top` (a query's best k so far) with `docs` (new, distinct from top's) and their scores merged: the best k,
    ties by row; and the cut raised to the k-th score (less the rounding hair) once there are k."""
    if len(top[0]):
        docs, vals = np.concatenate([top[0], docs]), np.concatenate([top[1], vals])
    if len(docs) > k:
        docs, vals = _top_k(docs, vals, k)
    if len(docs) >= k:
        theta = float(vals.min())
        cut = max(cut, theta - _BOUND_SLACK * abs(theta))
    return (docs, vals), cut


#: block-max bounds: a term with at least _BLOCK_TERM postings in a shard keeps its largest score in each block of
#: 2**_BLOCK_BITS passages (Ding and Suel 2011's block-max idea, on fixed passage blocks)
_BLOCK_BITS = 8
_BLOCK_TERM = 1024


def _block_maxima(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One shard's block maxima: (row of each term in the table, -1 for a term with fewer postings; the table,
    terms by blocks of 2**_BLOCK_BITS passages, float32, 0 for a block without the term: never below a score
    there, nor below the 0 of a passage without the term)."""
    lengths = indptr[1:] - indptr[:-1]
    long = np.flatnonzero(lengths >= _BLOCK_TERM)
    rows = np.full(len(lengths), -1, dtype=np.int32)
    rows[long] = np.arange(len(long), dtype=np.int32)
    n_blocks = (int(indices.max()) >> _BLOCK_BITS) + 1 if len(indices) else 1
    table = np.zeros((len(long), n_blocks), dtype=data.dtype)
    for row, t in enumerate(long.tolist()):
        seg, sv = indices[indptr[t]:indptr[t + 1]], data[indptr[t]:indptr[t + 1]]
        block = seg >> _BLOCK_BITS
        starts = np.flatnonzero(np.concatenate([[True], block[1:] != block[:-1]]))
        table[row, block[starts]] = np.maximum(np.maximum.reduceat(sv, starts), 0)
    return rows, table


def _full_scores(docs, part, segs, query, m, cut, dtype, block_max):
    """Of a query's candidate passages in a shard (`docs`, their essential terms' sum `part`), those that can
    still reach `cut`, with their full scores: bounded by the non-essential terms' (from the `m`-th by decreasing
    bound) block maxima (or bounds), then looked up in those terms, largest bound first, dropping a passage as soon
    as its partial sum plus the bounds of the terms still unlooked falls below the cut; the survivors scored as
    the product sums."""
    terms, counts, order, reach = query
    rows, table = block_max

    def term_bound(r, docs):
        """The most the r-th term (by decreasing bound) can add to each of `docs`."""
        row = rows[terms[order[r]]]
        if row < 0:
            return reach[r] - reach[r + 1]
        return table[row][docs >> _BLOCK_BITS].astype(np.float64) * float(counts[order[r]])

    upper = part.astype(np.float64)
    for r in range(m, len(terms)):
        upper = upper + term_bound(r, docs)
    keep = upper >= cut
    if not keep.all():
        docs, upper = docs[keep], upper[keep]
    for r in range(m, len(terms)):
        if not len(docs):
            return docs, np.zeros(0, dtype=dtype)
        j = order[r]
        seg, sv = segs[j]
        upper = upper - term_bound(r, docs)
        if len(seg):
            upper += _lookup(seg, sv, docs)[1] * float(counts[j])
        keep = upper >= cut
        if not keep.all():
            docs, upper = docs[keep], upper[keep]
    if not len(docs):
        return docs, np.zeros(0, dtype=dtype)
    score = np.zeros(len(docs), dtype=dtype)  # float32, terms in ascending id: the product's sum, bit for bit
    for t in range(len(terms)):
        seg, sv = segs[t]
        if len(seg):
            score += _lookup(seg, sv, docs)[1] * counts[t]
    nonzero = score != 0  # the product leaves out a passage whose sum is exactly 0
    return docs[nonzero], score[nonzero]


def _lookup(seg: np.ndarray, sv: np.ndarray | None, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Which of `docs` (passages, in any order) a term's postings `seg` (sorted) hold, and their scores there (`sv`;
    0 where absent): a binary search of each passage."""
    pos = np.minimum(np.searchsorted(seg, docs), len(seg) - 1)
    hit = seg[pos] == docs
    return hit, None if sv is None else np.where(hit, sv[pos], sv.dtype.type(0))


def query_matrix(term_ids: list[list[int]], n_terms: int, dtype):
    """The queries as a sparse (queries x terms) matrix of term counts: a repeated query word counts as often as
    it occurs, as in bm25s' own scoring."""
    import scipy.sparse as sp

    rows = np.repeat(np.arange(len(term_ids)), [len(t) for t in term_ids])
    cols = np.fromiter((t for ids in term_ids for t in ids), dtype=np.int64, count=len(rows))
    return sp.csr_matrix((np.ones(len(rows), dtype=dtype), (rows, cols)), shape=(len(term_ids), n_terms))


def _top_k(docs: np.ndarray, vals: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (doc, score) pairs; among passages tied at the k-th score, the earliest in
    the corpus, so that results never depend on the order a sparse product left them in."""
    kth = np.partition(vals, len(vals) - k)[len(vals) - k]
    above = np.flatnonzero(vals > kth)
    tied = np.flatnonzero(vals == kth)
    if len(tied) > k - len(above):
        tied = tied[np.argsort(docs[tied], kind="stable")[: k - len(above)]]
    keep = np.concatenate([above, tied])
    return docs[keep], vals[keep]
