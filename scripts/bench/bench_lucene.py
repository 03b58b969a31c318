"""Lucene's BM25 through Pyserini, the other side of `scripts/bench/bench_retrieval.py --scale N --pyserini PYTHON`.

Run by that bench with the python of a separate environment that has Pyserini (a benchmark-only
dependency, never the package's; it needs a JDK, found through JAVA_HOME). Uses nothing from
knowtrace_train, only the standard library and Pyserini, so that environment needs none of ours.

    PYTHON scripts/bench/bench_lucene.py search --index DIR --queries Q.json --out OUT.json [--k1 0.9 --b 0.4]

searches the queries (a JSON list of strings) with Pyserini's `LuceneSearcher` on a Lucene index
that the bench built with `PYTHON -m pyserini.index.lucene` (JsonCollection,
DefaultLuceneDocumentGenerator): the first 50 to warm up, then all of them in one `batch_search`
(threads 1), then the first --single one `search` call each, and writes the seconds, the top k
docids of every query, whether hit k+1 ties with hit k, each query's terms after Lucene's analysis, peak RSS (getrusage: the JVM
runs inside this process, through pyjnius) and the Pyserini, Anserini, Lucene and Java versions.

Pyserini's `pyserini.search` package imports its dense retrievers too (faiss, torch, transformers,
onnxruntime ...). Where those are not installed, `LuceneSearcher` is taken from its own module
(`pyserini/search/lucene/_searcher.py`, unchanged) without running those package inits: the class
and the Anserini jar are the same; only the imports that BM25 never uses are skipped.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import types
from pathlib import Path


def lucene_searcher_class():
    """Pyserini's LuceneSearcher and how it was imported."""
    try:
        from pyserini.search.lucene import LuceneSearcher

        return LuceneSearcher, "pyserini.search.lucene"
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
    import pyserini
    from pyserini.pyclass import autoclass

    # the Java classes those package inits name, by the names _searcher.py imports them from
    # (pyserini.search in 0.2x, pyserini.search.lucene in 1.x)
    java = {}
    for name, cls in (("JQuery", "org.apache.lucene.search.Query"), ("JQueryGenerator", "io.anserini.search.query.QueryGenerator"),
                      ("JScoredDoc", "io.anserini.search.ScoredDoc")):
        try:
            java[name] = autoclass(cls)
        except Exception:  # noqa: BLE001 - a class this Anserini does not have (JScoredDoc before 1.x)
            pass
    search_dir = Path(pyserini.__file__).parent / "search"
    for name, folder in (("pyserini.search", search_dir), ("pyserini.search.lucene", search_dir / "lucene")):
        module = types.ModuleType(name)
        module.__path__ = [str(folder)]
        module.__dict__.update(java)
        sys.modules[name] = module
    from pyserini.search.lucene._searcher import LuceneSearcher

    return LuceneSearcher, f"pyserini.search.lucene._searcher (package inits skipped: no {missing})"


def versions() -> dict:
    from importlib.metadata import version

    import pyserini
    from jnius import autoclass  # pyserini.pyclass has put the Anserini jar on the class path

    jars = sorted((Path(pyserini.__file__).parent / "resources" / "jars").glob("anserini-*-fatjar.jar"))
    system = autoclass("java.lang.System")
    return {
        "pyserini": version("pyserini"),
        "anserini_jar": jars[-1].name if jars else None,
        "lucene": str(autoclass("org.apache.lucene.util.Version").LATEST.toString()),
        "java": f"{system.getProperty('java.vm.name')} {system.getProperty('java.version')}",
        "java_home": system.getProperty("java.home"),
        "python": sys.version.split()[0],
    }


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def search(args) -> dict:
    LuceneSearcher, how = lucene_searcher_class()
    queries = json.loads(Path(args.queries).read_text())
    qids = [str(i) for i in range(len(queries))]
    t0 = time.perf_counter()
    searcher = LuceneSearcher(args.index)
    searcher.set_bm25(args.k1, args.b)
    load_s = time.perf_counter() - t0
    searcher.batch_search(queries[:50], qids[:50], k=args.k, threads=1)  # warm the JIT and the page cache
    for q in queries[:50]:
        searcher.search(q, k=args.k)
    t0, c0 = time.perf_counter(), time.process_time()
    batched = searcher.batch_search(queries, qids, k=args.k, threads=1)
    top = [[hit.docid for hit in batched[qid]] for qid in qids]
    batched_s, batched_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    single = queries[: min(len(queries), args.single)]
    t0 = time.perf_counter()
    single_top = [[hit.docid for hit in searcher.search(q, k=args.k)] for q in single]
    single_s = time.perf_counter() - t0
    return {
        "k1": args.k1,
        "b": args.b,
        "load_s": load_s,
        "queries": len(queries),
        "qps_batched": len(queries) / batched_s,
        "batched_cpu_s": batched_cpu_s,
        "qps_one_query_per_call": len(single) / single_s,
        "single_same_as_batched": single_top == top[: len(single)],
        "search_peak_mb": peak_mb(),
        "num_docs": int(searcher.num_docs),
        "searcher_import": how,
        "versions": versions(),
        "top": top,
        "tie_at_cut": ties_at_cut(searcher, queries, args.k),
        "analyzed": analyzed(queries),
    }


def ties_at_cut(searcher, queries: list[str], k: int) -> list[bool]:
    """Per query, whether hit k+1 scores the same as hit k (an untimed second pass): then which of
    the tied passages make the top k is up to the tie-break (Lucene's internal doc order)."""
    qids = [str(i) for i in range(len(queries))]
    hits = searcher.batch_search(queries, qids, k=k + 1, threads=1)
    out = []
    for qid in qids:
        scores = [h.score for h in hits[qid]]
        out.append(len(scores) > k and abs(scores[k - 1] - scores[k]) <= 1e-6 * max(1.0, abs(scores[k - 1])))
    return out


def analyzed(queries: list[str]) -> list[list[str]]:
    """Each query's terms by Pyserini's default English analyzer (the one its indexer and searcher
    use: Anserini's DefaultEnglishAnalyzer, Porter stemmer and Lucene's English stopwords)."""
    from pyserini.analysis import Analyzer, get_lucene_analyzer

    analyzer = Analyzer(get_lucene_analyzer())
    return [analyzer.analyze(q) for q in queries]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search", help="search the queries on a Lucene index, batched and one at a time")
    s.add_argument("--index", required=True)
    s.add_argument("--queries", required=True, help="a JSON list of query strings")
    s.add_argument("--out", required=True)
    s.add_argument("--k", type=int, default=5)
    s.add_argument("--k1", type=float, default=0.9, help="BM25 k1 (Pyserini's default 0.9)")
    s.add_argument("--b", type=float, default=0.4, help="BM25 b (Pyserini's default 0.4)")
    s.add_argument("--single", type=int, default=300, help="queries searched one call each")
    args = ap.parse_args(argv)
    result = search(args)
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
