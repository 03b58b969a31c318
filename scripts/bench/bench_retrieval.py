"""Benchmark of the BM25 backend against a straightforward reference, side by side in one run.

Builds a corpus of at least --passages passages from the synthetic world (make_world, scaled
up) and queries of the KnowTrace kind (an entity and a guidance sentence, via pair_to_query,
from the world's gold chains). Then, each in a fresh subprocess so that peak memory is its own:

- bm25s backend (`BM25Retriever`): index build time (tokenize, index, save to the cache),
  reload time (memory-mapped), peak memory, queries/s for one batched call over all queries,
  queries/s one query per call, and bm25s' own `BM25.retrieve` on the same index for scale;
- reference: rank_bm25's BM25Okapi with Lucene's idf (the formula bm25s uses), over the very
  same analysed terms, scoring one query at a time.

Both break ties by corpus order; top-5 agreement is the share of the reference's queries where
both return the same set of passages. The last line is JSON with qps, reference_qps, ratio and
top5_agreement (and the rest). Targets: qps >= 1,000 on 2 cores and ratio >= 50.

    python scripts/bench/bench_retrieval.py [--passages 100000] [--queries 5000] [--ref-queries 200]

Needs rank-bm25 and psutil (the dev extra).

Scale mode, `--scale N`: the world's passages (data/world/corpus.jsonl) inside N synthetic
distractors (`data.generated.generate_corpus`, the corpus source `generated`: 30-90 words each drawn
from the world's vocabulary plus coined words at Zipf frequencies, titles of coined words,
deterministic by --seed), then, each in a fresh subprocess: the passage store's conversion
(data/store.py) and the sharded BM25 build (retrieval/bm25_shards.py), each with its seconds and
peak RSS (getrusage in the child), the store's and index's size on disk, queries/s batched and one
query per call (the world's dev questions and KnowTrace-style entity-relation queries from its gold
chains), and the world dev questions' gold-passage recall@5 (a gold passage among the top 5). The
last line is JSON. Search runs with MaxScore (`pruning="maxscore"`, the default) and exhaustively
(`"none"`) side by side, taken in turn, their top k checked equal (`--pruning` for one of them).
`--cached` only searches the open-world store of N distractors already in the cache home (the corpus
source `generated`, `--seed`) with its index there, generating and building nothing.

    python scripts/bench/bench_retrieval.py --scale 1000000 [--shard-passages 250000] [--workdir DIR]
    python scripts/bench/bench_retrieval.py --scale 1000000 --cached

With `--pyserini PYTHON` (the python of a separate environment with Pyserini, a benchmark-only
dependency; `--java-home` picks its JDK), the same run also builds Lucene's BM25 index on the same
passages, as FlashRAG does (`PYTHON -m pyserini.index.lucene`, JsonCollection of {"id", "contents":
passage_text}, DefaultLuceneDocumentGenerator, one thread; seconds, CPU seconds and peak RSS of
that child by os.wait4), searches the same queries with Pyserini's LuceneSearcher
(scripts/bench/bench_lucene.py, in that environment) at Pyserini's default k1 0.9 b 0.4 and at ours,
1.2 and 0.75 (batch_search on one thread, and one search call a query), and reports Lucene's dev
recall@5, the mean top-5 overlap with ours (|ours & Lucene's| / 5 a query), the share of
differing queries where Lucene's 5th and 6th hits tie, and where the two analyzers part: the query
words that Snowball's English stemmer (ours) and Porter's (Lucene's) stem apart, and the queries
whose terms still differ with ours given Porter's. `--also-porter` also builds and searches ours
with PyStemmer's "porter" for the overlap with that difference gone. Then ours is searched once
more, to show how far the shared machine moved the figures meanwhile. Without --pyserini the Lucene
side is skipped with a line that says so, and the JSON's "lucene" is null.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # the synthetic world's generator, scripts/world/

import numpy as np  # noqa: E402

from knowtrace_train.data.corpus import read_corpus, write_corpus  # noqa: E402
from knowtrace_train.data.generated import generate_corpus  # noqa: E402
from knowtrace_train.data.schema import Passage  # noqa: E402
from knowtrace_train.errors import import_extra, user_errors  # noqa: E402
from knowtrace_train.retrieval import pair_to_query, passage_text  # noqa: E402
from knowtrace_train.retrieval.bm25 import BM25Retriever, BM25Settings, make_analyzer  # noqa: E402


# -- corpus and queries ---------------------------------------------------------------------


def make_corpus_and_queries(min_passages: int, n_queries: int, seed: int):
    """The world scaled until its corpus has at least `min_passages` passages, and up to
    `n_queries` distinct KnowTrace-style queries drawn from its gold chains."""
    from world import make_world

    probe = make_world(seed, scale=1.0)
    scale = max(1.0, min_passages / len(probe.corpus) * 1.02)
    while True:
        world = make_world(seed, scale=scale)
        if len(world.corpus) >= min_passages:
            break
        scale *= 1.1
    queries: list[str] = []
    seen: set[str] = set()
    for items in world.splits.values():
        for it in items:
            candidates = [it.question]
            for (subject, relation, _obj), sub in zip(it.evidence.triples, it.evidence.sub_questions):
                candidates.append(pair_to_query(subject, sub.question))
                candidates.append(pair_to_query(subject, relation))
            for q in candidates:
                if q.strip() and q not in seen:
                    seen.add(q)
                    queries.append(q)
    # the questions do not grow with scale: add entity-relation pairs over the whole corpus
    rng = random.Random(seed)
    relations = sorted({t[1] for items in world.splits.values() for it in items for t in it.evidence.triples})
    titles = sorted({p.title for p in world.corpus if p.title})
    while len(queries) < n_queries and relations and titles:
        q = pair_to_query(rng.choice(titles), rng.choice(relations))
        if q not in seen:
            seen.add(q)
            queries.append(q)
    rng.shuffle(queries)
    return world.corpus, queries[:n_queries], scale


# -- workers (each in its own process) -------------------------------------------------------


def rss_mb() -> float:
    psutil = import_extra("psutil", "dev", "scripts/bench/bench_retrieval.py's memory figures")
    return psutil.Process().memory_info().rss / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_s() -> float:
    """User plus system CPU seconds of this process so far (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def worker_bm25s(passages: list[Passage], queries: list[str], k: int, cache: Path) -> dict:
    base = rss_mb()
    t0 = time.perf_counter()
    BM25Retriever(passages, BM25Settings(), cache_dir=cache)
    build_s = time.perf_counter() - t0
    build_peak = peak_mb()
    t0 = time.perf_counter()
    r = BM25Retriever(passages, BM25Settings(), cache_dir=cache)  # from the cache, memory-mapped
    load_s = time.perf_counter() - t0
    r.search(queries[:100], k)  # warm the page cache and the analyzer's word cache
    t0 = time.perf_counter()
    results = r.search(queries, k)
    search_s = time.perf_counter() - t0
    single = queries[: min(len(queries), 1000)]
    t0 = time.perf_counter()
    for q in single:
        r.search([q], k)
    single_s = time.perf_counter() - t0
    # bm25s' own retrieve over the same index (dense score vector per query), for scale
    ids = [t for t in r.analyze(single) if t]
    t0 = time.perf_counter()
    r.model.retrieve(ids, k=k, show_progress=False, n_threads=os.cpu_count() or 1)
    lib_s = time.perf_counter() - t0
    pos = {id(p): i for i, p in enumerate(r.passages)}
    return {
        "build_s": build_s,
        "load_s": load_s,
        "memory_mapped": r.memory_mapped,
        "baseline_mb": base,
        "build_peak_mb": build_peak,
        "peak_mb": peak_mb(),
        "qps": len(queries) / search_s,
        "qps_one_query_per_call": len(single) / single_s,
        "bm25s_retrieve_qps": len(ids) / lib_s,
        "top": [[pos[id(h.passage)] for h in hits] for hits in results],
    }


def worker_reference(passages: list[Passage], queries: list[str], k: int) -> dict:
    BM25Okapi = import_extra("rank_bm25", "dev", "scripts/bench/bench_retrieval.py's reference").BM25Okapi

    class LuceneBM25Okapi(BM25Okapi):
        """rank_bm25's Okapi BM25 with Lucene's idf, log(1 + (N - df + 0.5) / (df + 0.5))."""

        def _calc_idf(self, nd):
            for word, freq in nd.items():
                self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))

    settings = BM25Settings()
    base = rss_mb()
    t0 = time.perf_counter()
    analyzer = make_analyzer(settings)
    texts = [passage_text(p) for p in passages]
    docs = analyzer.tokenize(texts, update_vocab=True, return_as="string", show_progress=False, allow_empty=False)
    ref = LuceneBM25Okapi(docs, k1=settings.k1, b=settings.b)
    build_s = time.perf_counter() - t0
    build_peak = peak_mb()
    t0 = time.perf_counter()
    top = []
    order = np.arange(len(passages))
    for q in analyzer.tokenize(queries, update_vocab=False, return_as="string", show_progress=False, allow_empty=False):
        scores = ref.get_scores(q) if q else np.zeros(len(passages))
        best = np.lexsort((order, -scores))[:k]
        top.append([int(i) for i in best if scores[i] > 0])
    search_s = time.perf_counter() - t0
    return {
        "build_s": build_s,
        "baseline_mb": base,
        "build_peak_mb": build_peak,
        "peak_mb": peak_mb(),
        "qps": len(queries) / search_s,
        "top": top,
    }


def run_worker(name: str, workdir: Path, k: int, n_queries: int) -> dict:
    out = workdir / f"{name}.json"
    cmd = [sys.executable, __file__, "--worker", name, "--workdir", str(workdir), "--k", str(k), "--queries", str(n_queries)]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def worker_main(args) -> int:
    workdir = Path(args.workdir)
    passages = read_corpus(workdir / "corpus.jsonl")
    queries = json.loads((workdir / "queries.json").read_text())[: args.queries]
    if args.worker == "bm25s":
        result = worker_bm25s(passages, queries, args.k, workdir / "cache")
    else:
        result = worker_reference(passages, queries, args.k)
    (workdir / f"{args.worker}.json").write_text(json.dumps(result))
    return 0


# -- scale mode: the world inside N generated distractors --------------------------------------------

WORLD_DIR = ROOT / "data" / "world"


def _world_queries(n_queries: int) -> tuple[list[str], list[set[str]]]:
    """The dev questions (with their gold passage ids) first, then entity-relation queries from the
    gold chains of every split, up to `n_queries` in all."""
    dev = [json.loads(line) for line in (WORLD_DIR / "dev.jsonl").read_text().splitlines() if line.strip()]
    queries = [it["question"] for it in dev]
    gold = [set(it["evidence"]["paragraph_ids"]) for it in dev]
    seen = set(queries)
    for split in ("dev", "train", "test"):
        for line in (WORLD_DIR / f"{split}.jsonl").read_text().splitlines():
            if not line.strip():
                continue
            ev = json.loads(line)["evidence"]
            for (subject, relation, _o), sub in zip(ev["triples"], ev["sub_questions"]):
                for q in (pair_to_query(subject, relation), pair_to_query(subject, sub["question"])):
                    if q not in seen:
                        seen.add(q)
                        queries.append(q)
    return queries[: max(n_queries, len(dev))], gold


def _du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20


def scale_worker(args) -> dict:
    from knowtrace_train.data.store import open_store
    from knowtrace_train.retrieval.bm25_shards import ShardedBM25Retriever

    workdir = Path(args.workdir)
    cache = workdir / "cache"
    if args.worker == "convert":
        t0 = time.perf_counter()
        store = open_store(workdir / "corpus.jsonl", cache_dir=cache)
        return {"convert_s": time.perf_counter() - t0, "convert_peak_mb": peak_mb(), "passages": len(store),
                "store_mb": _du_mb(store.folder)}
    store = open_store(workdir / "corpus.jsonl", cache_dir=cache)  # from the sidecar: no conversion
    if args.worker == "build":
        t0 = time.perf_counter()
        r = ShardedBM25Retriever(store, BM25Settings(stemmer=args.stemmer), cache_dir=cache, shard_passages=args.shard_passages)
        return {"build_s": time.perf_counter() - t0, "build_cpu_s": cpu_s(), "build_peak_mb": peak_mb(), "index_mb": _du_mb(r.index_dir),
                "shards": len(r.meta["shards"]), "terms": r.meta["num_terms"]}
    t0 = time.perf_counter()
    r = ShardedBM25Retriever(store, BM25Settings(stemmer=args.stemmer), cache_dir=cache, shard_passages=args.shard_passages,
                             threads=args.threads)
    load_s = time.perf_counter() - t0
    return {"load_s": load_s, **search_figures(r, args)}


def search_figures(r, args) -> dict:
    """Queries/s batched and one query per call of each pruning asked (`--pruning`; with both, the two taken
    in turn, exhaustive first, so that the machine's load falls on both alike), the top k of each (which must
    be the same), and the dev questions' recall@5. The first pruning's figures keep the plain keys."""
    prunings = ("none", "maxscore") if args.pruning == "both" else (args.pruning,)
    queries, gold = _world_queries(args.queries)
    single = queries[: min(len(queries), 300)]
    out: dict = {"queries": len(queries), "dev_questions": len(gold), "pruning": {}}
    t0 = time.perf_counter()
    r.pruning = "maxscore"
    r.search(queries[:1], args.k)  # MaxScore's upper bounds and block maxima (kept beside the index after the first)
    out["maxscore_prepare_s"] = time.perf_counter() - t0
    tops = {}
    for name in prunings:
        r.pruning = name
        r.search(queries[:50], args.k)  # warm the page cache
        t0, c0 = time.perf_counter(), time.process_time()
        results = r.search(queries, args.k)
        batched_s, batched_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        for q in single:
            r.search([q], args.k)
        single_s = time.perf_counter() - t0
        tops[name] = [[(h.passage.id, h.score) for h in res] for res in results]
        out["pruning"][name] = {"qps_batched": len(queries) / batched_s, "batched_cpu_s": batched_cpu_s,
                                "qps_one_query_per_call": len(single) / single_s}
    first = tops[prunings[0]]
    if len(prunings) > 1:
        a, b = (tops[p] for p in prunings)
        out["same_results"] = all([d for d, _ in x] == [d for d, _ in y] and all(abs(u - v) <= 1e-5 for (_, u), (_, v) in zip(x, y))
                                  for x, y in zip(a, b))
        out["maxscore_speedup_batched"] = out["pruning"]["maxscore"]["qps_batched"] / out["pruning"]["none"]["qps_batched"]
        out["maxscore_speedup_one_query_per_call"] = (out["pruning"]["maxscore"]["qps_one_query_per_call"]
                                                      / out["pruning"]["none"]["qps_one_query_per_call"])
    out.update(out["pruning"][prunings[-1]])  # the plain keys: the last asked (with both, MaxScore, the default)
    hits = [bool(g & {d for d, _ in res[:5]}) for g, res in zip(gold, first)]
    full = [g <= {d for d, _ in res[:5]} for g, res in zip(gold, first)]
    out.update(recall_at_5=float(np.mean(hits)), all_gold_at_5=float(np.mean(full)), search_peak_mb=peak_mb(),
               top=[[d for d, _ in res] for res in first])
    return out


def run_scale_worker(name: str, args, workdir: Path, stemmer: str = "english") -> dict:
    cmd = [sys.executable, __file__, "--scale", str(args.scale), "--worker", name, "--workdir", str(workdir),
           "--k", str(args.k), "--queries", str(args.queries), "--shard-passages", str(args.shard_passages),
           "--threads", str(args.threads), "--stemmer", stemmer, "--pruning", args.pruning, "--seed", str(args.seed)]
    subprocess.run(cmd, check=True)
    return json.loads((workdir / f"scale_{name}.json").read_text())


# -- Lucene's BM25 through Pyserini on the same corpus (a benchmark-only dependency) ----------------

#: (k1, b): Pyserini's default, then ours (BM25Settings' default, Lucene's and Elasticsearch's own)
LUCENE_BM25 = ((0.9, 0.4), (BM25Settings().k1, BM25Settings().b))
LUCENE_SCRIPT = Path(__file__).resolve().with_name("bench_lucene.py")


def write_pyserini_collection(corpus: Path, out_dir: Path) -> int:
    """The corpus as Pyserini's JsonCollection (`out_dir/docs.jsonl`, one {"id", "contents"} line a
    passage), contents the very text our index gets (passage_text: title, newline, paragraph)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(corpus, encoding="utf-8") as f, open(out_dir / "docs.jsonl", "w", encoding="utf-8") as out:
        for line in f:
            if line.strip():
                p = Passage.from_dict(json.loads(line))
                out.write(json.dumps({"id": p.id, "contents": passage_text(p)}, ensure_ascii=False) + "\n")
                n += 1
    return n


def topk_overlap(ours: list[list[str]], theirs: list[list[str]], k: int) -> list[float]:
    """Per query, the share of the top k that both lists hold: |ours[:k] & theirs[:k]| / k (over the
    longer list's length where one has fewer than k hits; 1.0 where both are empty)."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} result lists against {len(theirs)}")
    out = []
    for a, b in zip(ours, theirs):
        a, b = set(a[:k]), set(b[:k])
        out.append(len(a & b) / max(len(a), len(b)) if a or b else 1.0)
    return out


def analysis_differences(ours_porter: list[list[str]], lucene: list[list[str]], overlap: list[float], top: int = 8) -> dict:
    """Where our tokenizer, given Lucene's stemmer (PyStemmer's "porter"), still turns a query into
    other terms than Lucene's analyzer: the share of queries analysed alike (the same terms, in any
    order), the mean overlap on those and on the others, and the terms most often on one side only.
    (With our own stemmer, "english", the stems are other strings for the same words, so comparing
    strings would count renamed terms as differences; what the stemmer changes in the rankings is
    measured instead by searching our index built with "porter", --also-porter.)"""
    from collections import Counter

    same = [sorted(a) == sorted(b) for a, b in zip(ours_porter, lucene)]
    only_ours, only_lucene = Counter(), Counter()
    for a, b, alike in zip(ours_porter, lucene, same):
        if not alike:
            only_ours.update(set(a) - set(b))
            only_lucene.update(set(b) - set(a))
    alike_ov = [o for o, alike in zip(overlap, same) if alike]
    other_ov = [o for o, alike in zip(overlap, same) if not alike]
    return {
        "queries_tokenized_alike": float(np.mean(same)) if same else 1.0,
        "overlap_tokenized_alike": float(np.mean(alike_ov)) if alike_ov else None,
        "overlap_tokenized_differently": float(np.mean(other_ov)) if other_ov else None,
        "terms_only_ours": only_ours.most_common(top),
        "terms_only_lucene": only_lucene.most_common(top),
    }


def stemmer_differences(queries: list[str], top: int = 8) -> dict:
    """The query words that our stemmer (Snowball's English, Porter2) and Lucene's (Porter's
    original algorithm; PyStemmer's "porter") stem apart, and the share of queries holding one."""
    import Stemmer
    from collections import Counter

    words = make_analyzer(BM25Settings(stemmer=None)).tokenize(queries, update_vocab=True, return_as="string",
                                                                show_progress=False, allow_empty=True)
    english, porter = Stemmer.Stemmer("english"), Stemmer.Stemmer("porter")
    pairs, touched = Counter(), 0
    for ws in words:
        diff = [w for w in ws if english.stemWord(w) != porter.stemWord(w)]
        touched += bool(diff)
        pairs.update(f"{w}: {english.stemWord(w)} / {porter.stemWord(w)}" for w in diff)
    return {"queries_with_such_a_word": touched / max(1, len(queries)), "words": pairs.most_common(top)}


def run_measured(cmd: list[str], env: dict | None = None, log: Path | None = None) -> dict:
    """Run `cmd` to its end: wall seconds, CPU seconds (user + system, all threads) and peak RSS of
    the child (os.wait4's rusage: the JVM runs inside the Python child, through pyjnius)."""
    with open(log, "w") if log else open(os.devnull, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log else ""
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed with exit code {proc.returncode}\n{tail}")
    return {"s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_mb": ru.ru_maxrss / 1024}


def lucene_env(args) -> dict:
    env = dict(os.environ)
    if args.java_home:
        env["JAVA_HOME"] = args.java_home
        env["PATH"] = f"{args.java_home}/bin{os.pathsep}{env.get('PATH', '')}"
    return env


def lucene_build(args, workdir: Path) -> dict:
    """Pyserini's JsonCollection of the corpus, then its Lucene index, as FlashRAG builds one:
    `python -m pyserini.index.lucene`, DefaultLuceneDocumentGenerator, one thread, nothing stored
    beyond the defaults (no -storeRaw, -storePositions, -storeDocvectors, no -optimize)."""
    t0 = time.perf_counter()
    n = write_pyserini_collection(workdir / "corpus.jsonl", workdir / "lucene_input")
    convert_s = time.perf_counter() - t0
    index = workdir / "lucene_index"
    cmd = [args.pyserini, "-m", "pyserini.index.lucene", "-collection", "JsonCollection", "-input",
           str(workdir / "lucene_input"), "-index", str(index), "-generator", "DefaultLuceneDocumentGenerator",
           "-threads", "1"]
    run = run_measured(cmd, env=lucene_env(args), log=workdir / "lucene_index.log")
    return {"convert_s": convert_s, "documents": n, "build_s": run["s"], "build_cpu_s": run["cpu_s"],
            "build_peak_mb": run["peak_mb"], "index_mb": _du_mb(index), "command": " ".join(cmd[1:])}


def lucene_search(args, workdir: Path, k1: float, b: float) -> dict:
    out = workdir / f"lucene_search_{k1}_{b}.json"
    cmd = [args.pyserini, str(LUCENE_SCRIPT), "search", "--index", str(workdir / "lucene_index"), "--queries",
           str(workdir / "queries.json"), "--out", str(out), "--k", str(args.k), "--k1", str(k1), "--b", str(b),
           "--single", "300"]
    run_measured(cmd, env=lucene_env(args), log=workdir / f"lucene_search_{k1}_{b}.log")
    return json.loads(out.read_text())


def cached_main(args) -> int:
    """`--cached`: search the open-world store already in the cache home and its index, nothing built."""
    from knowtrace_train.data.generated import find_generated
    from knowtrace_train.retrieval.bm25_shards import ShardedBM25Retriever

    store = find_generated(args.scale, args.seed)
    if store is None:
        raise SystemExit(f"no generated store of {args.scale} distractors (seed {args.seed}) in the cache home: "
                         "run without --cached, or open it once (data.generated.open_generated)")
    t0 = time.perf_counter()
    r = ShardedBM25Retriever(store, BM25Settings(), shard_passages=args.shard_passages, threads=args.threads)
    res = {"load_s": time.perf_counter() - t0, "passages": len(store), "shards": len(r.meta["shards"]),
           "index": str(r.index_dir), **search_figures(r, args)}
    res.pop("top")
    for name, got in res["pruning"].items():
        print(f"{name:>8}: {got['qps_batched']:.0f} queries/s batched over {res['queries']} (CPU {got['batched_cpu_s']:.1f} s), "
              f"{got['qps_one_query_per_call']:.0f} one per call")
    if "same_results" in res:
        print(f"same top {args.k} and scores: {res['same_results']}; MaxScore {res['maxscore_speedup_batched']:.2f}x batched, "
              f"{res['maxscore_speedup_one_query_per_call']:.2f}x one per call")
    print(f"dev gold-passage recall@5 {res['recall_at_5']:.3f}; {res['passages']} passages, {res['shards']} shards; "
          f"load {res['load_s']:.2f} s, MaxScore's first search {res['maxscore_prepare_s']:.2f} s; peak RSS {res['search_peak_mb']:.0f} MiB")
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    print(f"cores: {os.cpu_count()}, load average {load} (timings depend on what else runs on the machine)")
    print(json.dumps({"scale": args.scale, "cores": os.cpu_count(), "loadavg": load, "threads": args.threads,
                      **{key: _round(v) for key, v in res.items()}}))
    return 0


def scale_main(args) -> int:
    if args.worker:
        result = scale_worker(args)
        (Path(args.workdir) / f"scale_{args.worker}.json").write_text(json.dumps(result))
        return 0
    if args.cached:
        return cached_main(args)
    lucene: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench_scale_", dir=args.workdir) as tmp:
        workdir = Path(tmp)
        t0 = time.perf_counter()
        n = generate_corpus(workdir / "corpus.jsonl", args.scale, args.seed, WORLD_DIR / "corpus.jsonl")
        gen_s = time.perf_counter() - t0
        corpus_mb = (workdir / "corpus.jsonl").stat().st_size / 2**20
        print(f"corpus: {n} passages ({args.scale} distractors + the world's), {corpus_mb:.0f} MiB, generated in {gen_s:.1f}s")
        res = {}
        for name in ("convert", "build"):
            res.update(run_scale_worker(name, args, workdir))
        if args.pyserini:
            lucene = lucene_build(args, workdir)
        res.update(run_scale_worker("search", args, workdir))
        top = res.pop("top")
        if args.pyserini:
            queries, gold = _world_queries(args.queries)
            (workdir / "queries.json").write_text(json.dumps(queries))
            ours_porter_terms = make_analyzer(BM25Settings(stemmer="porter")).tokenize(
                queries, update_vocab=True, return_as="string", show_progress=False, allow_empty=True)
            lucene["stemmers"] = stemmer_differences(queries)
            lucene_tops = {}
            for k1, b in LUCENE_BM25:
                got = lucene_search(args, workdir, k1, b)
                lucene_tops[(k1, b)] = lucene_top = got.pop("top")
                overlap = topk_overlap(top, lucene_top, args.k)
                ties = got.pop("tie_at_cut")
                differ = [t for t, o in zip(ties, overlap) if o < 1]
                n_dev = len(gold)
                got.update(
                    recall_at_5=float(np.mean([bool(g & set(t[:5])) for g, t in zip(gold, lucene_top)])),
                    overlap_at_k=float(np.mean(overlap)),
                    overlap_at_k_dev_questions=float(np.mean(overlap[:n_dev])),
                    overlap_at_k_other_queries=float(np.mean(overlap[n_dev:])) if len(overlap) > n_dev else None,
                    analysis=analysis_differences(ours_porter_terms, got.pop("analyzed"), overlap),
                    queries_differing=len(differ) / len(overlap),
                    differing_with_lucene_tie_at_cut=float(np.mean(differ)) if differ else None,
                )
                lucene[f"bm25_k1_{k1}_b_{b}"] = got
            if args.also_porter:
                built = run_scale_worker("build", args, workdir, stemmer="porter")
                found = run_scale_worker("search", args, workdir, stemmer="porter")
                porter = {"build_s": built["build_s"], "qps_batched": found["qps_batched"], "recall_at_5": found["recall_at_5"]}
                for (k1, b), lucene_top in lucene_tops.items():
                    porter[f"overlap_at_k_with_k1_{k1}_b_{b}"] = float(np.mean(topk_overlap(found["top"], lucene_top, args.k)))
                lucene["ours_with_porter"] = porter
            # our search once more after Lucene's, to show how far the shared machine moved the figures
            again = run_scale_worker("search", args, workdir)
            res["qps_batched_after_lucene"] = again["qps_batched"]
            res["qps_one_query_per_call_after_lucene"] = again["qps_one_query_per_call"]
    per_m = 1e6 / res["passages"]
    rows = [
        ("convert to the store (s)", f"{res['convert_s']:.1f}"),
        ("  peak RSS (MiB)", f"{res['convert_peak_mb']:.0f}"),
        ("  store on disk (MiB)", f"{res['store_mb']:.0f}"),
        ("sharded BM25 build (s)", f"{res['build_s']:.1f} ({res['shards']} shards of <= {args.shard_passages}, {res['terms']} terms)"),
        ("  CPU (s)", f"{res['build_cpu_s']:.1f}"),
        ("  peak RSS (MiB)", f"{res['build_peak_mb']:.0f}"),
        ("  index on disk (MiB)", f"{res['index_mb']:.0f}"),
        ("load (s)", f"{res['load_s']:.2f}"),
        *[(f"queries/s batched ({name})", f"{got['qps_batched']:.0f} over {res['queries']} (CPU {got['batched_cpu_s']:.1f} s)")
          for name, got in res["pruning"].items()],
        *[(f"queries/s one per call ({name})", f"{got['qps_one_query_per_call']:.0f}") for name, got in res["pruning"].items()],
        *([("MaxScore: same results, speed-up", f"{res['same_results']}; {res['maxscore_speedup_batched']:.2f}x batched, "
                                                f"{res['maxscore_speedup_one_query_per_call']:.2f}x one per call")]
          if "same_results" in res else []),
        ("  peak RSS searching (MiB)", f"{res['search_peak_mb']:.0f}"),
        ("dev gold-passage recall@5", f"{res['recall_at_5']:.3f} ({res['dev_questions']} questions; all gold in top 5: {res['all_gold_at_5']:.3f})"),
    ]
    if lucene:
        rows += [
            ("queries/s again, after Lucene's", f"{res['qps_batched_after_lucene']:.0f} batched, {res['qps_one_query_per_call_after_lucene']:.0f} one per call"),
            ("Lucene (Pyserini): collection (s)", f"{lucene['convert_s']:.1f} (JsonCollection of {lucene['documents']} documents)"),
            ("  index build (s)", f"{lucene['build_s']:.1f} (CPU {lucene['build_cpu_s']:.1f} s; one indexing thread)"),
            ("  peak RSS (MiB)", f"{lucene['build_peak_mb']:.0f}"),
            ("  index on disk (MiB)", f"{lucene['index_mb']:.0f}"),
        ]
        for name, got in ((n, g) for n, g in lucene.items() if n.startswith("bm25_")):
            an = got["analysis"]
            rows += [
                (f"  {name}: queries/s batched", f"{got['qps_batched']:.0f} (batch_search, 1 thread; CPU {got['batched_cpu_s']:.1f} s)"),
                ("    queries/s one per call", f"{got['qps_one_query_per_call']:.0f}"),
                ("    peak RSS searching (MiB)", f"{got['search_peak_mb']:.0f}"),
                ("    dev gold-passage recall@5", f"{got['recall_at_5']:.3f}"),
                (f"    top-{args.k} overlap with ours", f"{got['overlap_at_k']:.3f} (dev questions {got['overlap_at_k_dev_questions']:.3f}); "
                                                     f"{got['queries_differing']:.3f} of the queries differ, "
                                                     f"{_fmt(got['differing_with_lucene_tie_at_cut'])} of those with a tie at Lucene's cut"),
                ("    queries analysed alike", f"{an['queries_tokenized_alike']:.3f} (ours with PyStemmer's porter; overlap there "
                                               f"{_fmt(an['overlap_tokenized_alike'])}, elsewhere {_fmt(an['overlap_tokenized_differently'])})"),
            ]
        st = lucene["stemmers"]
        rows.append(("stemmed apart (Porter2 / Porter)", f"{st['queries_with_such_a_word']:.3f} of the queries; "
                                                        + "; ".join(w for w, _ in st["words"][:4])))
        if "ours_with_porter" in lucene:
            po = lucene["ours_with_porter"]
            rows.append(("ours with Porter: overlap", ", ".join(f"{v:.3f} ({key.split('with_')[1]})" for key, v in po.items()
                                                            if key.startswith("overlap")) + f"; recall@5 {po['recall_at_5']:.3f}"))
        versions = next(v for n, v in lucene.items() if n.startswith("bm25_"))["versions"]
        rows.append(("Lucene side", ", ".join(f"{key} {val}" for key, val in versions.items() if key != "java_home")))
    else:
        print("lucene: skipped (give --pyserini PYTHON, the python of an environment with Pyserini, to compare with Lucene's BM25)")
    width = max(len(r[0]) for r in rows)
    for a, b in rows:
        print(f"{a:<{width}}  {b}")
    print(f"cores: {os.cpu_count()} (timings depend on what else runs on the machine)")
    summary = {"scale": args.scale, "generate_s": round(gen_s, 1), "corpus_mb": round(corpus_mb)}
    summary.update({key: _round(v) for key, v in res.items()})
    summary.update(convert_s_per_million=round(res["convert_s"] * per_m, 1), build_s_per_million=round(res["build_s"] * per_m, 1),
                   index_mb_per_million=round(res["index_mb"] * per_m), store_mb_per_million=round(res["store_mb"] * per_m),
                   shard_passages=args.shard_passages, threads=args.threads, cores=os.cpu_count())
    if lucene:
        same = lucene[f"bm25_k1_{BM25Settings().k1}_b_{BM25Settings().b}"]  # Lucene at our k1 and b
        summary.update(lucene_build_s=round(lucene["build_s"], 1), lucene_qps_batched=round(same["qps_batched"], 1),
                       lucene_qps_one_query_per_call=round(same["qps_one_query_per_call"], 1),
                       lucene_overlap_at_k=round(same["overlap_at_k"], 3), lucene_recall_at_5=round(same["recall_at_5"], 3),
                       qps_batched_vs_lucene=round(res["qps_batched"] / same["qps_batched"], 2))
        summary["lucene"] = _round(lucene)
    else:
        summary["lucene"] = None
    print(json.dumps(summary))
    return 0


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _round(v):
    if isinstance(v, float):
        return round(v, 3)
    if isinstance(v, dict):
        return {key: _round(x) for key, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


# -- the run -------------------------------------------------------------------------------------


@user_errors
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=100_000, help="at least this many passages")
    ap.add_argument("--queries", type=int, default=5000, help="queries for the bm25s backend")
    ap.add_argument("--ref-queries", type=int, default=200, help="queries for the (slow) reference")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=int, default=0, metavar="N",
                    help="scale mode: the world's passages inside N generated distractors, passage store and sharded BM25")
    ap.add_argument("--shard-passages", type=int, default=250_000, help="scale mode: passages per BM25 shard")
    ap.add_argument("--threads", type=int, default=1, help="scale mode: threads searching shards at once")
    ap.add_argument("--pruning", choices=("both", "maxscore", "none"), default="both",
                    help="scale mode: search with MaxScore, exhaustively, or both side by side (default)")
    ap.add_argument("--cached", action="store_true",
                    help="scale mode: only search the open-world store of N distractors already in the cache home "
                         "(corpus source `generated`, --seed) and its sharded index there: nothing generated or built")
    ap.add_argument("--pyserini", metavar="PYTHON", default=None,
                    help="scale mode: the python of an environment with Pyserini; also build and search Lucene's BM25 "
                         "on the same corpus and queries (skipped without it)")
    ap.add_argument("--also-porter", action="store_true",
                    help="scale mode, with --pyserini: also build and search ours with Lucene's stemmer (PyStemmer's "
                         "porter) for the overlap with one analysis difference fewer")
    ap.add_argument("--stemmer", default="english", help=argparse.SUPPRESS)
    ap.add_argument("--java-home", default=None, help="scale mode: JAVA_HOME for Pyserini (default: the environment's)")
    ap.add_argument("--worker", choices=("bm25s", "reference", "convert", "build", "search"), help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help="scale mode: the folder for the corpus and caches (a temporary folder in it)")
    args = ap.parse_args(argv)
    if args.scale:
        if args.scale < 0:
            raise SystemExit("--scale must be positive")
        return scale_main(args)
    if args.worker:
        return worker_main(args)

    with tempfile.TemporaryDirectory(prefix="bench_retrieval_") as tmp:
        workdir = Path(tmp)
        t0 = time.perf_counter()
        corpus, queries, scale = make_corpus_and_queries(args.passages, args.queries, args.seed)
        print(f"world: scale {scale:.1f}, {len(corpus)} passages, {len(queries)} queries ({time.perf_counter() - t0:.1f}s)")
        n_passages = write_corpus(corpus, workdir / "corpus.jsonl")
        (workdir / "queries.json").write_text(json.dumps(queries))
        del corpus

        ours = run_worker("bm25s", workdir, args.k, len(queries))
        n_ref = min(args.ref_queries, len(queries))
        ref = run_worker("reference", workdir, args.k, n_ref)

    same_set = [set(a) == set(b) for a, b in zip(ours["top"][:n_ref], ref["top"])]
    same_list = [a == b for a, b in zip(ours["top"][:n_ref], ref["top"])]
    no_match = sum(1 for t in ours["top"] if not t)
    rows = [
        ("", "bm25s backend", "rank_bm25 reference"),
        ("index build (s)", f"{ours['build_s']:.2f}", f"{ref['build_s']:.2f}"),
        ("reload from cache (s)", f"{ours['load_s']:.2f} (mmap={ours['memory_mapped']})", "-"),
        ("peak RSS during build (MiB)", f"{ours['build_peak_mb']:.0f}", f"{ref['build_peak_mb']:.0f}"),
        ("  of which above the loaded corpus", f"{ours['build_peak_mb'] - ours['baseline_mb']:.0f}",
         f"{ref['build_peak_mb'] - ref['baseline_mb']:.0f}"),
        ("queries/s (batched)", f"{ours['qps']:.0f} over {len(ours['top'])}", f"{ref['qps']:.1f} over {n_ref}"),
        ("queries/s (one per call)", f"{ours['qps_one_query_per_call']:.0f}", "-"),
        ("bm25s BM25.retrieve queries/s", f"{ours['bm25s_retrieve_qps']:.0f}", "-"),
    ]
    width = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{width}}  {r[1]:>28}  {r[2]:>22}")
    print(f"top-{args.k} agreement on {n_ref} queries: same set {np.mean(same_set):.3f}, same order {np.mean(same_list):.3f}; "
          f"{no_match} of {len(ours['top'])} queries matched nothing")
    print(f"cores: {os.cpu_count()} (timings depend on what else runs on the machine)")
    summary = {
        "qps": round(ours["qps"], 1),
        "reference_qps": round(ref["qps"], 2),
        "ratio": round(ours["qps"] / ref["qps"], 1),
        f"top{args.k}_agreement": round(float(np.mean(same_set)), 4),
    }
    summary.update(
        passages=n_passages,
        queries=len(ours["top"]),
        reference_queries=n_ref,
        build_s=round(ours["build_s"], 2),
        reference_build_s=round(ref["build_s"], 2),
        load_s=round(ours["load_s"], 3),
        peak_mb=round(ours["build_peak_mb"]),
        reference_peak_mb=round(ref["build_peak_mb"]),
        qps_one_query_per_call=round(ours["qps_one_query_per_call"], 1),
        bm25s_retrieve_qps=round(ours["bm25s_retrieve_qps"], 1),
        cores=os.cpu_count(),
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
