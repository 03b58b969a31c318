"""Benchmark: the batched KnowTrace engine against a one-question, one-call-at-a-time reference.

    python scripts/bench/bench_rollout.py [--config recipes/configs/eval_world.yaml] [--questions 16] [--key value ...]

Both run the same questions, prompts and greedy decoding in one process. The engine advances all
questions together (one batch of calls per step, the generator's batching and shared-prefix
cache). The reference handles one question at a time and sends every model call and every
retrieval query alone, on a generator without the shared-prefix cache, as the authors' code
does. Prints questions per minute of each, their ratio (target: at least 4 on 2 CPU cores with
the default model) and how many predictions agree; the last line is one JSON object.

    python scripts/bench/bench_rollout.py --pipelined 32 [--order lockstep,pipelined] [--questions 100] [--key value ...]

times two schedules of the same engine instead, at most WIDTH questions in flight: lockstep (groups of
WIDTH, each run until its slowest question ends: the engine before pipelining) and pipelined (a finished
question's place goes to the next one at once). Prints each one's questions per minute, the generate()
calls and the requests per call, their ratio and whether every call's output agrees. Run two processes
with opposite --order side by side on two cores to cancel the machine's drift.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.evaluate import load_corpus, load_eval_config, load_eval_items, set_threads  # noqa: E402
from knowtrace_train.generation import GenerationRequest, build_generator  # noqa: E402
from knowtrace_train.metrics import normalize_answer  # noqa: E402
from knowtrace_train.retrieval import build_retriever  # noqa: E402
from knowtrace_train.methods.knowtrace import KnowTrace  # noqa: E402

TARGET = 4.0


class OneCallAtATime:
    """Sends each request of a batch to the wrapped generator on its own."""

    def __init__(self, generator) -> None:
        self.generator = generator

    def generate(self, requests: Sequence[GenerationRequest]):
        return [self.generator.generate([r])[0] for r in requests]

    def count_tokens(self, text: str) -> int:
        return self.generator.count_tokens(text)


class OneQueryAtATime:
    """Sends each query of a batch to the wrapped retriever on its own."""

    def __init__(self, retriever) -> None:
        self.retriever = retriever

    def search(self, queries, k):
        return [self.retriever.search([q], k)[0] for q in queries]


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="recipes/configs/eval_world.yaml")
    parser.add_argument("--questions", type=int, default=16, help="questions both sides run")
    parser.add_argument("--pipelined", type=int, default=0, metavar="WIDTH",
                        help="time lockstep groups of WIDTH against the pipelined engine at WIDTH (no reference)")
    parser.add_argument("--order", default="lockstep,pipelined", help="with --pipelined: which schedule runs first")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = load_eval_config(args.config, overrides + ["--dataset.limit", str(args.questions)])
    config.generator.progress = False

    set_threads(config.threads)
    items, everything = load_eval_items(config)
    retriever = build_retriever(config.retriever, load_corpus(config, everything))
    engine_gen = build_generator(config.generator)
    if args.pipelined:
        return schedules(config, items, engine_gen, retriever, args.pipelined, args.order.split(","))
    reference_gen = build_generator(dataclasses.replace(config.generator, share_prefix=False, batch_size=1))
    warm = [GenerationRequest(prompt="Question: warm up\nAnswer:", role="explore", max_new_tokens=4)]
    engine_gen.generate(warm)
    reference_gen.generate(warm)

    import torch

    print(f"{len(items)} questions from {config.dataset.path}, model {config.generator.model}, "
          f"L={config.strategy.max_rounds}, N={config.strategy.passages}, torch threads {torch.get_num_threads()}")
    load = {"before": os.getloadavg()[0]}
    t0 = time.perf_counter()
    batched = KnowTrace(config.strategy).run(items, engine_gen, retriever)
    engine_s = time.perf_counter() - t0
    load["after_engine"] = os.getloadavg()[0]
    print(f"engine     {engine_s:8.1f}s  {60 * len(items) / engine_s:7.2f} questions/min")

    t0 = time.perf_counter()
    reference = []
    for it in items:
        reference += KnowTrace(config.strategy).run([it], OneCallAtATime(reference_gen), OneQueryAtATime(retriever))
    reference_s = time.perf_counter() - t0
    load["after_reference"] = os.getloadavg()[0]
    print(f"reference  {reference_s:8.1f}s  {60 * len(items) / reference_s:7.2f} questions/min")

    same = [normalize_answer(a.prediction or "") == normalize_answer(b.prediction or "") for a, b in zip(batched, reference)]
    same_calls = [[c.output for c in a.calls] == [c.output for c in b.calls] for a, b in zip(batched, reference)]
    ratio = reference_s / engine_s
    print(f"ratio      {ratio:.2f}x (target {TARGET:.0f}x)")
    print(f"agreement  predictions {sum(same)}/{len(same)}, every call's output {sum(same_calls)}/{len(same_calls)}")
    print(f"load avg   {load} (other jobs on the machine skew the ratio; compare like with like)")
    print(json.dumps({
        "questions": len(items),
        "engine_qpm": round(60 * len(items) / engine_s, 3),
        "reference_qpm": round(60 * len(items) / reference_s, 3),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "predictions_agree": sum(same),
        "trajectories_agree": sum(same_calls),
        "threads": torch.get_num_threads(),
        "load_avg": {k: round(v, 2) for k, v in load.items()},
    }))
    return 0


class Counting:
    """Counts the generate() calls and requests that pass to the wrapped generator."""

    def __init__(self, generator) -> None:
        self.generator, self.calls, self.requests = generator, 0, 0

    def generate(self, requests: Sequence[GenerationRequest]):
        self.calls += 1
        self.requests += len(requests)
        return self.generator.generate(requests)

    def count_tokens(self, text: str) -> int:
        return self.generator.count_tokens(text)


def schedules(config, items, generator, retriever, width: int, order: list[str]) -> int:
    """Lockstep groups of `width` against the pipelined engine at `width`, in `order`."""
    import torch

    if sorted(order) != ["lockstep", "pipelined"]:
        raise SystemExit(f"--order takes lockstep,pipelined or pipelined,lockstep, got {','.join(order)}")
    print(f"{len(items)} questions from {config.dataset.path}, model {config.generator.model}, width {width}, "
          f"torch threads {torch.get_num_threads()}, order {','.join(order)}")
    generator.generate([GenerationRequest(prompt="Question: warm up\nAnswer:", role="explore", max_new_tokens=4)])
    seconds, runs, counts = {}, {}, {}
    for name in order:
        gen = Counting(generator)
        t0 = time.perf_counter()
        if name == "pipelined":
            runs[name] = KnowTrace(config.strategy).run(items, gen, retriever, width=width)
        else:
            runs[name] = [t for start in range(0, len(items), width)
                          for t in KnowTrace(config.strategy).run(items[start : start + width], gen, retriever)]
        seconds[name] = time.perf_counter() - t0
        counts[name] = (gen.calls, gen.requests)
        print(f"{name:10} {seconds[name]:8.1f}s  {60 * len(items) / seconds[name]:7.2f} questions/min  "
              f"{gen.calls} generate calls, {gen.requests / max(1, gen.calls):.1f} requests per call")
    same = sum([c.output for c in a.calls] == [c.output for c in b.calls]
               for a, b in zip(runs["lockstep"], runs["pipelined"]))
    ratio = seconds["lockstep"] / seconds["pipelined"]
    print(f"ratio      {ratio:.3f}x (lockstep seconds / pipelined seconds)")
    print(f"agreement  every call's output {same}/{len(items)}")
    print(json.dumps({"questions": len(items), "width": width, "order": order,
                      "seconds": {k: round(v, 1) for k, v in seconds.items()}, "ratio": round(ratio, 3),
                      "generate_calls": {k: c for k, (c, _) in counts.items()},
                      "requests_per_call": {k: round(r / max(1, c), 2) for k, (c, r) in counts.items()},
                      "trajectories_agree": same, "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
