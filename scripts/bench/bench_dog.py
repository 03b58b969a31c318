"""Benchmark: DoG's questions/min with the questions advancing together vs one question at a time, and the graph store's lookups/s.

    python scripts/bench/bench_dog.py [--questions 8] [--max-hops 2] [--debate-rounds 1] [--model smollm2-135m]

The questions are the world's first dev questions, over the world's knowledge graph (strategy.graph
world). In one process, with greedy decoding: (1) the engine run once per question (every call a
batch of one), (2) the engine run once over all questions (each step one batched call per call
kind). Then the store alone: `get_relations` and `triple_filling` over the world's entities (every
relation of each), lookups/s. Prints both rates, their ratio, how many predictions agree (batching
pads prompts, which may change a greedy token), the calls made; the last line is one JSON object.
Wall times on a shared machine carry its load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowtrace_train.data.loaders import load_items  # noqa: E402
from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.generation import GeneratorConfig, build_generator  # noqa: E402
from knowtrace_train.methods.dog import DoG, DoGConfig  # noqa: E402
from knowtrace_train.methods.dog.graph import build_store, graph_triples  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def store_rate(entities: int) -> dict:
    """Lookups/s of the embedded store: get_relations of `entities` world entities, then
    triple_filling of each of their relations."""
    triples = graph_triples("world", [])
    t0 = time.perf_counter()
    store = build_store("world", [])
    load_s = time.perf_counter() - t0
    names = list(dict.fromkeys(s for s, _, _ in triples))[:entities]
    t0 = time.perf_counter()
    rels = {e: store.get_relations(e) for e in names}
    rel_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    filled = sum(len(store.triple_filling(e, r)) for e, rs in rels.items() for r in rs)
    fill_s = time.perf_counter() - t0
    n_fill = sum(len(rs) for rs in rels.values())
    return {"facts": len(triples), "load_s": round(load_s, 3), "get_relations": len(names),
            "get_relations_per_s": round(2 * len(names) / rel_s, 1),  # two SPARQL queries each (out, in)
            "triple_filling": n_fill, "triple_filling_per_s": round(n_fill / fill_s, 1), "triples_filled": filled}


@user_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--max-hops", type=int, default=2)
    p.add_argument("--debate-rounds", type=int, default=1)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompt-format", default="plain")
    p.add_argument("--entities", type=int, default=1000, help="world entities the store benchmark looks up")
    args = p.parse_args(argv)
    items = load_items(REPO / "data/world/dev.jsonl")[: args.questions]
    cfg = DoGConfig(max_hops=args.max_hops, debate_rounds=args.debate_rounds, answer_from="tail")
    store = build_store("world", [])
    timings, preds, calls = {}, {}, {}
    with build_generator(GeneratorConfig(model=args.model, prompt_format=args.prompt_format, progress=False)) as gen:
        for name in ("one_at_a_time", "batched"):
            engine = DoG(cfg, store=store)
            t0 = time.perf_counter()
            if name == "batched":
                trajs = engine.run(items, gen)
            else:
                trajs = [t for it in items for t in engine.run([it], gen)]
            timings[name] = time.perf_counter() - t0
            preds[name] = [t.prediction for t in trajs]
            calls[name] = sum(len(t.calls) for t in trajs)
            print(f"{name:14s} {len(items)} questions, {calls[name]} calls in {timings[name]:.1f}s: "
                  f"{60 * len(items) / timings[name]:.2f} questions/min")
    ratio = timings["one_at_a_time"] / timings["batched"]
    agree = sum(a == b for a, b in zip(preds["batched"], preds["one_at_a_time"]))
    print(f"batched / one at a time: {ratio:.2f}x; predictions agree on {agree}/{len(items)} questions")
    kg = store_rate(args.entities)
    print(f"store: {kg['facts']} facts loaded in {kg['load_s']}s; get_relations {kg['get_relations_per_s']} SPARQL "
          f"lookups/s, triple_filling {kg['triple_filling_per_s']} lookups/s")
    print(json.dumps({
        "questions": len(items), "max_hops": args.max_hops, "debate_rounds": args.debate_rounds, "model": args.model,
        "questions_per_min_one_at_a_time": round(60 * len(items) / timings["one_at_a_time"], 3),
        "questions_per_min_batched": round(60 * len(items) / timings["batched"], 3), "speedup": round(ratio, 2),
        "calls_one_at_a_time": calls["one_at_a_time"], "calls_batched": calls["batched"], "predictions_agree": agree,
        "store": kg, "load_average": [round(x, 2) for x in os.getloadavg()],
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
