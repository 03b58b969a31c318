"""Where a corpus file read whole into memory starts to cost more than the passage store: `corpus.store: auto`'s
crossover (docs/retrieval.md, "In memory or on disk").

For each size, the world's passages inside generated distractors (data/generated.py) are written to a JSONL
file; then, each in a fresh process, (a) `read_corpus` + `BM25Retriever` (in memory) and (b) `open_store` +
`ShardedBM25Retriever` (the store), each from an empty cache, give their seconds and peak RSS (getrusage).

    OMP_NUM_THREADS=1 nice -n 10 python scripts/bench/bench_store_crossover.py --sizes 20000,100000,300000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def child(mode: str, corpus: str, cache: str) -> None:
    from knowtrace_train.retrieval import RetrieverConfig, build_retriever

    t0 = time.perf_counter()
    if mode == "memory":
        from knowtrace_train.data.corpus import read_corpus

        passages = read_corpus(corpus)
    else:
        from knowtrace_train.data.store import open_store

        passages = open_store(corpus, cache_dir=cache)
    build_retriever(RetrieverConfig(cache_dir=cache), passages)
    print(json.dumps({"seconds": round(time.perf_counter() - t0, 1),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="20000,100000,300000", help="distractor counts, comma-separated")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    from knowtrace_train.data.generated import generate_corpus

    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="crossover-") as tmp:
            corpus = Path(tmp) / "corpus.jsonl"
            count = generate_corpus(corpus, n)
            row = {"passages": count, "file_mib": round(corpus.stat().st_size / 2**20, 1)}
            for mode in ("memory", "store"):
                out = subprocess.run([sys.executable, __file__, "--child", mode, str(corpus), str(Path(tmp) / f"cache_{mode}")],
                                     capture_output=True, text=True, check=True)
                row[mode] = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
