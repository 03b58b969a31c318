"""Benchmark: TRACE's KG generator, documents/s batched vs one at a time, and the cache hit rate of a second pass.

    python scripts/bench/bench_trace.py [--documents 16] [--max-new-tokens 64] [--model smollm2-135m]

The documents are the first distinct passages of BM25's top 10 for the world's first dev questions.
In one process, with greedy decoding: (1) one document per `generate` call, on a generator without
the shared-prefix cache and with the triple cache off (the obvious way), (2) all documents in one
batched call, filling an empty triple cache, then (3) a second batched pass over the same documents,
which must generate nothing (hit rate 1.0). Prints documents/s of (1) and (2),
their ratio, whether the triples agree, and the hit rates; the last line is one JSON object. Wall
times on a shared machine carry its load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowtrace_train.data.corpus import read_corpus  # noqa: E402
from knowtrace_train.data.loaders import load_items  # noqa: E402
from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.generation import GeneratorConfig, build_generator  # noqa: E402
from knowtrace_train.methods.trace.kg_generator import KGGenerator, ContentCache  # noqa: E402
from knowtrace_train.retrieval import RetrieverConfig, build_retriever  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class OneAtATime:
    """Sends each request of a batch to the wrapped generator on its own."""

    def __init__(self, generator) -> None:
        self.generator, self.config = generator, generator.config

    def generate(self, requests):
        return [self.generator.generate([r])[0] for r in requests]

    def count_tokens(self, text):
        return self.generator.count_tokens(text)


def documents(n: int):
    corpus = read_corpus(REPO / "data/world/corpus.jsonl")
    items = load_items(REPO / "data/world/dev.jsonl")
    retriever = build_retriever(RetrieverConfig(), corpus)
    out, seen = [], set()
    for hits in retriever.search([it.question for it in items[:n]], 10):
        for h in hits:
            if h.passage.id not in seen and len(out) < n:
                seen.add(h.passage.id)
                out.append(h.passage)
    return out


@user_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--documents", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompt-format", default="plain")
    args = p.parse_args(argv)
    docs = documents(args.documents)
    cfg = GeneratorConfig(model=args.model, prompt_format=args.prompt_format, progress=False)

    def kg(cache: ContentCache) -> KGGenerator:
        return KGGenerator(role="kg", demonstrations=3, max_triples=12, max_new_tokens=args.max_new_tokens, seed=0,
                           cache=cache, encoder=None, selection="fixed")

    with build_generator(cfg) as batched, build_generator(dataclasses.replace(cfg, share_prefix=False)) as plain, \
            tempfile.TemporaryDirectory() as tmp:
        cache = ContentCache(Path(tmp) / "kg")
        timings = {}
        results = {}
        for name, gen, c in (("one_at_a_time", OneAtATime(plain), ContentCache(None)), ("batched", batched, cache)):
            t0 = time.perf_counter()
            results[name] = kg(c).run(docs, gen)
            timings[name] = time.perf_counter() - t0
            print(f"{name:14s} {len(docs)} documents in {timings[name]:.1f}s: {len(docs) / timings[name]:.2f} documents/s")
        agree = sum(results["batched"][d.id].triples == results["one_at_a_time"][d.id].triples for d in docs)
        fill_rate = cache.hit_rate
        cache.hits = cache.misses = 0
        second = kg(cache)
        t0 = time.perf_counter()
        second.run(docs, batched)
        cached_time = time.perf_counter() - t0
        hit_rate, generated = cache.hit_rate, second.generated
    ratio = timings["one_at_a_time"] / timings["batched"]
    print(f"batched / one at a time: {ratio:.2f}x; triples agree on {agree}/{len(docs)} documents")
    print(f"cache: first pass hit rate {fill_rate:.2f}, second pass hit rate {hit_rate:.2f} "
          f"({generated} documents generated, {cached_time:.2f}s)")
    print(json.dumps({
        "documents": len(docs), "max_new_tokens": args.max_new_tokens, "model": args.model,
        "docs_per_s_one_at_a_time": round(len(docs) / timings["one_at_a_time"], 3),
        "docs_per_s_batched": round(len(docs) / timings["batched"], 3), "speedup": round(ratio, 2),
        "triples_agree": agree, "first_pass_hit_rate": fill_rate, "second_pass_hit_rate": hit_rate,
        "second_pass_generated": generated, "second_pass_s": round(cached_time, 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
