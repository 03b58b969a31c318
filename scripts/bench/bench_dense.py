"""Dense retrieval on a passage store at scale: the sharded, memory-mapped embeddings
(retrieval/dense_shards.py) built and searched flat and through IVF-PQ, each step in a fresh
subprocess with its peak RSS (getrusage in the child).

The corpus is the world's passages inside N generated distractors (`data.generated.open_generated`,
the corpus source `generated`, deterministic by --seed), as scripts/bench/bench_retrieval.py --scale. Steps:

1. probe: the encoder's passages/s on the first --probe passages at each of --batch-sizes;
2. build: encode the whole store into shards at --batch-size (seconds, passages/s, peak RSS, size on disk);
3. flat: exact search over the memory-mapped shards, batched and one query a call (queries/s, the
   queries' encoding apart), the world dev questions' gold-passage recall@5;
4. ivfpq: the IVF-PQ index built from the shards (train + add seconds, peak RSS, size), searched at each
   of --nprobe with its candidates re-scored exactly: queries/s, recall@5, top-5 overlap with flat.

The last line is JSON.

    OMP_NUM_THREADS=1 python scripts/bench/bench_dense.py --scale 50000 [--workdir DIR] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_retrieval beside it

WORLD_DIR = ROOT / "data" / "world"


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _du_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20


def world_queries(n: int) -> tuple[list[str], list[set[str]]]:
    from bench_retrieval import _world_queries

    return _world_queries(n)


def open_corpus(args):
    from knowtrace_train.data.generated import open_generated

    return open_generated(args.scale, args.seed, cache_dir=args.workdir)


def retriever(args, store, **kw):
    from knowtrace_train.retrieval.dense_shards import ShardedDenseRetriever

    return ShardedDenseRetriever(store, cache_dir=args.workdir, batch_size=args.batch_size, dtype=args.dtype, device=args.device,
                                 shard_passages=args.shard_passages, **kw)


def step_probe(args) -> dict:
    from knowtrace_train.retrieval.base import passage_text
    from knowtrace_train.retrieval.dense import _load_encoder, default_encoder_path

    store = open_corpus(args)
    texts = [passage_text(store[i]) for i in range(min(args.probe, len(store)))]
    model = _load_encoder(str(default_encoder_path()), args.device)
    model.encode(texts[:64], batch_size=64)  # warm
    wall = {b: 0.0 for b in args.batch_sizes}
    cpu = {b: 0.0 for b in args.batch_sizes}
    for r in range(args.probe_rounds):  # batch sizes interleaved, in turn, so that a change of load hits all alike
        for b in (args.batch_sizes if r % 2 == 0 else args.batch_sizes[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            model.encode(texts, batch_size=b, normalize_embeddings=True, convert_to_numpy=True)
            wall[b] += time.perf_counter() - t0
            cpu[b] += time.process_time() - c0
    n = len(texts) * args.probe_rounds
    out = {str(b): n / wall[b] for b in args.batch_sizes}
    out_cpu = {str(b): n / cpu[b] for b in args.batch_sizes}
    tok = model.tokenizer(texts[:500])["input_ids"]
    return {"passages_per_s_by_batch": out, "passages_per_cpu_s_by_batch": out_cpu, "probe_passages": len(texts),
            "rounds": args.probe_rounds, "mean_tokens": float(np.mean([len(t) for t in tok]))}


def step_build(args) -> dict:
    store = open_corpus(args)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    r = retriever(args, store)
    s = time.perf_counter() - t0
    return {"passages": len(store), "build_s": s, "cpu_s": time.process_time() - cpu0, "passages_per_s": len(store) / s,
            "peak_mb": peak_mb(), "index_mb": _du_mb(r.index_dir), "dim": r.meta["dim"], "shards": len(r.meta["shards"]),
            "store_mb": _du_mb(store.folder)}


def _search(r, queries, gold, args) -> dict:
    t0 = time.perf_counter()
    rows = [list(map(int, rs)) for rs, _ in r.search_rows(queries, 5)]
    batched_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    vecs = r._encode(queries, "query")
    enc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    r.search_vectors(vecs, 5)
    search_s = time.perf_counter() - t0
    one = queries[: args.one_per_call]
    t0 = time.perf_counter()
    for q in one:
        r.search_rows([q], 5)
    one_s = time.perf_counter() - t0
    ids = [[r.store[i].id for i in rs] for rs in rows]
    recall = float(np.mean([bool(set(ids[i]) & gold[i]) for i in range(len(gold))]))
    return {"queries": len(queries), "qps_batched": len(queries) / batched_s, "qps_one_per_call": len(one) / one_s,
            "query_encode_qps": len(queries) / enc_s, "search_only_qps": len(queries) / search_s,
            "recall_at_5": recall, "top5": ids}


def step_flat(args) -> dict:
    store = open_corpus(args)
    r = retriever(args, store)
    queries, gold = world_queries(args.queries)
    out = _search(r, queries, gold, args)
    out["peak_mb"] = peak_mb()
    return out


def step_ivfpq(args) -> dict:
    store = open_corpus(args)
    flat = json.loads(Path(args.flat_json).read_text())["top5"]
    t0 = time.perf_counter()
    r = retriever(args, store, index="ivfpq")
    built = {"build_s": time.perf_counter() - t0, "peak_mb_build": peak_mb(), "index_mb": _du_mb(r.ivf_dir),
             "nlist": r.nlist, "pq_m": r.pq_m}
    queries, gold = world_queries(args.queries)
    runs = {}
    for nprobe in args.nprobe:
        r.ivf.nprobe = min(nprobe, r.nlist)
        res = _search(r, queries, gold, args)
        res["overlap_with_flat"] = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(res.pop("top5"), flat)]))
        runs[str(nprobe)] = res
    return {**built, "by_nprobe": runs, "peak_mb": peak_mb()}


def plan(n: int, rate: float, gflops: float) -> str:
    """The computed needs of a dense index over `n` passages (markdown): embeddings flat at 384 and 768 dims,
    float32 and float16; IVF-PQ codes; encode time at `rate` passages/s; flat search and IVF-PQ build at
    `gflops` (a measured matrix-product rate)."""
    from knowtrace_train.retrieval.dense_shards import ivfpq_lists

    nlist = ivfpq_lists(n)
    gib = 2**30
    rows = ["| | 384 dims (MiniLM) | 768 dims (e5-base, DPR) |", "|---|---|---|"]
    rows.append(f"| flat float32 shards | {n * 384 * 4 / gib:,.1f} GiB | {n * 768 * 4 / gib:,.1f} GiB |")
    rows.append(f"| flat float16 shards | {n * 384 * 2 / gib:,.1f} GiB | {n * 768 * 2 / gib:,.1f} GiB |")
    m384, m768 = 384 // 8, 768 // 8
    rows.append(f"| IVF-PQ (IVF{nlist}, PQ dim/8 bytes + 8-byte id a passage) | {n * (m384 + 8) / gib:,.2f} GiB "
                f"(+ {nlist * 384 * 4 / 2**20:,.0f} MiB centroids) | {n * (m768 + 8) / gib:,.2f} GiB (+ {nlist * 768 * 4 / 2**20:,.0f} MiB) |")
    flops_q = {d: 2 * n * d for d in (384, 768)}
    rows.append(f"| flat search, one query: multiply-adds x2 | {flops_q[384] / 1e9:,.1f} GFLOP: {gflops * 1e9 / flops_q[384]:.1f} queries/s "
                f"at {gflops:.0f} GFLOP/s, if the shards were in memory | {flops_q[768] / 1e9:,.1f} GFLOP: {gflops * 1e9 / flops_q[768]:.1f} queries/s |")
    train = min(n, max(64 * nlist, 256 * 39))
    t = {d: (10 * train * nlist * d * 2 + n * nlist * d * 2) / (gflops * 1e9) for d in (384, 768)}
    rows.append(f"| IVF-PQ build: k-means (10 iterations, faiss' default for IVF, over {train:,} samples) + assigning every passage | "
                f"{t[384] / 3600:,.1f} h at {gflops:.0f} GFLOP/s | {t[768] / 3600:,.1f} h |")
    rows.append(f"| encode at {rate:,.1f} passages/s | {n / rate / 3600:,.0f} h ({n / rate / 86400:,.1f} days) | "
                f"{8 * n / rate / 86400:,.0f} days: a base encoder (12 layers, hidden 768) does about 8x MiniLM's "
                f"multiply-adds a token (layers x hidden^2); computed, not measured |")
    return "\n".join(rows)


def measure_gflops(size: int = 2048) -> float:
    """float32 matrix-product GFLOP/s on this process' threads: (size x 384) @ (384 x 16384), best of 3."""
    a = np.random.default_rng(0).standard_normal((size, 384), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((384, 16384), dtype=np.float32)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * size * 384 * 16384 / (time.perf_counter() - t0) / 1e9)
    return best


def grid(args) -> dict:
    """On the index the main run built in --workdir: IVF-PQ at each nprobe x refine against flat on the same
    encoded queries (search alone), and flat search over one 1M-row shard of the real embeddings tiled
    (float32 and float16, in the page cache), in blocks of 65,536."""
    faiss = __import__("faiss")
    store = open_corpus(args)
    queries, gold = world_queries(args.queries)
    flat = retriever(args, store)
    vecs = flat._encode(queries, "query")

    def timed(r):
        t0 = time.perf_counter()
        res = r.search_vectors(vecs, 5)
        return res, len(queries) / (time.perf_counter() - t0)

    def recall(res):
        return float(np.mean([bool({store[int(i)].id for i in res[j][0]} & gold[j]) for j in range(len(gold))]))

    ref, qps = timed(flat)
    out = {"flat": {"qps": qps, "recall": recall(ref)}}
    ref_rows = [set(map(int, r)) for r, _ in ref]
    ivf = retriever(args, store, index="ivfpq")
    for nprobe in args.nprobe:
        for refine in (4, 16):
            ivf.ivf.nprobe, ivf.refine = min(nprobe, ivf.nlist), refine
            res, qps = timed(ivf)
            overlap = float(np.mean([len(set(map(int, r)) & ref_rows[j]) / 5 for j, (r, _) in enumerate(res)]))
            out[f"ivfpq nprobe {nprobe} refine {refine}"] = {"qps": qps, "overlap_with_flat": overlap, "recall": recall(res)}
            print(json.dumps(out), flush=True)
    emb = np.load(flat.index_dir / flat.meta["shards"][0]["file"])
    n = args.grid_rows
    for dtype in ("float32", "float16"):
        path = Path(args.workdir) / f"tiled_{dtype}.npy"
        m = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n, emb.shape[1]))
        for lo in range(0, n, len(emb)):
            m[lo : lo + len(emb)] = emb[: n - lo]
        m.flush()
        del m
        arr = np.load(path, mmap_mode="r")
        for rep in range(2):
            t0 = time.perf_counter()
            for lo in range(0, n, 65_536):
                faiss.knn(vecs, np.ascontiguousarray(arr[lo : lo + 65_536], dtype=np.float32), 5, metric=faiss.METRIC_INNER_PRODUCT)
            t = time.perf_counter() - t0
            out[f"flat {dtype} {n} rows, run {rep + 1}"] = {"qps": len(queries) / t, "gflops": 2 * len(queries) * n * emb.shape[1] / t / 1e9}
        del arr
        path.unlink()
    return out


def run_step(step: str, args, extra: list[str] = ()) -> dict:
    cmd = [sys.executable, __file__, "--step", step, *sys.argv[1:], *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=50_000, help="generated distractors")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="", help="cache folder of the store and the index ('' = a folder under /tmp)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[16, 32, 64, 128, 256])
    ap.add_argument("--probe", type=int, default=2048)
    ap.add_argument("--probe-rounds", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--shard-passages", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--one-per-call", type=int, default=100)
    ap.add_argument("--nprobe", type=int, nargs="*", default=[16, 64, 128])
    ap.add_argument("--skip", nargs="*", default=[], help="steps to skip (probe, ivfpq)")
    ap.add_argument("--only-probe", action="store_true", help="run the batch-size probe alone")
    ap.add_argument("--grid", action="store_true", help="after a run in --workdir: IVF-PQ nprobe x refine against flat, "
                    "and flat search over --grid-rows tiled rows")
    ap.add_argument("--grid-rows", type=int, default=1_000_000)
    ap.add_argument("--plan", type=int, default=0, help="print the computed needs of a dense index over PLAN passages and exit")
    ap.add_argument("--rate", type=float, default=0.0, help="--plan: encode passages/s (measured); 0: measure nothing, say so")
    ap.add_argument("--gflops", type=float, default=0.0, help="--plan: matrix-product GFLOP/s; 0: measured here")
    ap.add_argument("--device", default="cpu", help="the encoder's torch device")
    ap.add_argument("--step", default="", help=argparse.SUPPRESS)
    ap.add_argument("--flat-json", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plan:
        gflops = args.gflops or measure_gflops()
        print(f"matrix product: {gflops:.1f} GFLOP/s (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
        print(plan(args.plan, args.rate or float("nan"), gflops))
        return 0
    if args.grid:
        print(json.dumps(grid(args)))
        return 0
    if not args.workdir:
        args.workdir = f"/tmp/bench_dense_{args.scale}_{args.seed}"
        sys.argv += ["--workdir", args.workdir]
    if args.step:
        fn = {"probe": step_probe, "build": step_build, "flat": step_flat, "ivfpq": step_ivfpq}[args.step]
        print(json.dumps(fn(args)))
        return 0
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    store = open_corpus(args)
    report = {"scale": args.scale, "passages": len(store), "generate_and_convert_s": time.perf_counter() - t0,
              "batch_size": args.batch_size, "dtype": args.dtype, "omp_threads": os.environ.get("OMP_NUM_THREADS"),
              "loadavg_start": os.getloadavg()}
    del store
    if "probe" not in args.skip:
        report["probe"] = run_step("probe", args)
        print("probe", json.dumps(report["probe"]), flush=True)
    if args.only_probe:
        print(json.dumps(report))
        return 0
    report["gflops"] = measure_gflops()
    report["build"] = run_step("build", args)
    print("build", json.dumps(report["build"]), flush=True)
    flat = run_step("flat", args)
    flat_json = Path(args.workdir) / "flat_top5.json"
    flat_json.write_text(json.dumps({"top5": flat.pop("top5")}))
    report["flat"] = flat
    print("flat", json.dumps(flat), flush=True)
    if "ivfpq" not in args.skip:
        report["ivfpq"] = run_step("ivfpq", args, ["--flat-json", str(flat_json)])
        print("ivfpq", json.dumps(report["ivfpq"]), flush=True)
    report["loadavg_end"] = os.getloadavg()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
