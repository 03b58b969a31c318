"""The arithmetic floor of a self-training run on this CPU: the model work its files record, at this CPU's own
measured peak for the model's matrix products, against the seconds the run took.

    python scripts/bench/bench_floor.py runs/<name> [--wall SECONDS] [--cores N] [--rate GFLOPS] [--dtype D] [--json FILE]

Work, counted from the run's files (a lower bound: attention, norms and every elementwise operation are left
out, so the true work is larger and the floor below it):
- training, per adapter (`knowtrace_training.json`): the positions its passes computed x (forward + input
  gradient of the frozen linear layers, 4 x their parameters) plus LoRA's forward and gradients (6 x its
  parameters), and the LM head's forward and input gradient on the completion tokens;
- decoding, per stage (`base/eval.jsonl`, `iter_<z>/eval.jsonl`, `iter_<z>/rollouts.jsonl`): the prompt positions
  of a prefix tree over the stage's rendered prompts (each shared prefix computed once, however the engine
  batched them: fewer than any engine prefills), one LM-head row per call, and one row through every linear
  layer and the LM head per output token after the first.

The rate: one thread's mean rate over the products of the model's first decoder layer ([in, out] weights, the
decoding layout) at 512 rows, in fp32 or in bf16 (`--dtype bfloat16`: the dtype a run on a CPU with native bf16
trains and decodes in), measured here unless --rate is given: once with the other cores idle, and once on
every core at once (--cores, default the cores this process may use; one pinned worker process each), since cores
that share a clock, a cache or a physical core deliver less together than each alone. The floor of a stage is its
work at the first rate on one core; the run's floor is all its work at the most the machine delivered (one core
alone, or all together) with nothing idle: no schedule of that work on this machine finishes sooner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_train's meta_model

from knowtrace_train.errors import UserError  # noqa: E402
from knowtrace_train.io import iter_jsonl  # noqa: E402
from knowtrace_train.train.config import LoraTrainConfig  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """What the work per position depends on, read from an empty (meta-device) copy of the model, so any
    architecture counts: the decoder's linear parameters, the LM head, one decoder layer's products."""

    linear: int  # parameters of every linear product but the LM head, all layers
    head: int  # the LM head's (vocab x hidden; also when tied to the input embedding)
    layer_products: tuple[tuple[int, int], ...]  # (in, out) of the first decoder layer's products
    folder: Path | None = None  # the model folder, for lora_params

    @classmethod
    def of(cls, folder: Path) -> "Shape":
        import torch
        from bench_train import meta_model

        model = meta_model(folder)
        head = model.get_output_embeddings()
        linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
        if not linears or head is None:
            raise UserError(f"{folder}: the model has no linear layers or no LM head to count")
        # the first decoder layer: the modules under the first numbered block (model.layers.0.)
        blocks = [b for b in (_block(n) for n, _ in linears) if b]
        products = tuple((m.in_features, m.out_features) for n, m in linears if not blocks or _block(n) == blocks[0])
        return cls(linear=sum(m.weight.numel() for _, m in linears), head=head.weight.numel(),
                   layer_products=products, folder=Path(folder))

    def lora_params(self, rank: int, target_modules) -> int:
        """The parameters of a rank-`rank` LoRA on `target_modules`, as peft places it on this model."""
        return _lora_params(self.folder, rank, json.dumps(target_modules))


def _block(name: str) -> str | None:
    """The numbered block a module is in ("model.layers.0." for "model.layers.0.mlp.up_proj"), None outside one."""
    parts = name.split(".")
    return next((".".join(parts[: i + 1]) + "." for i, part in enumerate(parts) if part.isdigit()), None)


@lru_cache(maxsize=None)
def _lora_params(folder: Path, rank: int, target_modules: str) -> int:
    from bench_train import meta_model
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(meta_model(folder), LoraConfig(r=rank, target_modules=json.loads(target_modules)))
    return sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)


@dataclass
class Stage:
    name: str
    kind: str  # training or decoding
    flop: float
    seconds: float | None  # as the run recorded it (alone or beside another stage)
    counts: dict


def training_stages(run: Path, shape: Shape) -> list[Stage]:
    out = []
    for info in sorted(run.glob("iter_*/*adapters/*/knowtrace_training.json")):
        data = json.loads(info.read_text())
        res, cfg = data["result"], data["config"]
        lora = shape.lora_params(cfg["rank"], cfg.get("target_modules", LoraTrainConfig().target_modules))
        positions, completion = res.get("computed_tokens") or res["tokens"], res.get("completion_tokens", 0)
        flop = positions * (4 * shape.linear + 6 * lora) + completion * 4 * shape.head
        name = f"{info.parent.parent.parent.name}/train {data.get('role', info.parent.name)}"
        out.append(Stage(name, "training", flop, res.get("seconds"),
                         {"positions": positions, "tokens": res["tokens"], "completion_tokens": completion}))
    return out


def decoding_stage(path: Path, name: str, shape: Shape, tokenizer, prompt_format: str, seconds: float | None) -> Stage:
    from knowtrace_train.train.lora import prefix_tree_tokens, render_prompt_ids

    prompts, rows, calls, prompt_tokens = [], 0, 0, 0
    for _, row in iter_jsonl(path):
        for call in row.get("calls") or []:
            if not isinstance(call, dict) or not call.get("prompt"):
                continue
            prompts.append(render_prompt_ids(tokenizer, call["prompt"], prompt_format))
            prompt_tokens += int(call.get("prompt_tokens") or len(prompts[-1]))
            rows += max(int(call.get("output_tokens") or 0) - 1, 0)
            calls += 1
    positions = prefix_tree_tokens([{"input_ids": ids} for ids in prompts])  # each shared prefix once
    flop = positions * 2 * shape.linear + calls * 2 * shape.head + rows * 2 * (shape.linear + shape.head)
    return Stage(name, "decoding", flop, seconds, {"calls": calls, "prompt_tokens": prompt_tokens,
                                                   "prefill_positions": positions, "decode_rows": rows})


def _metric_seconds(metrics: Path, key: str) -> float | None:
    if not metrics.is_file():
        return None
    return (json.loads(metrics.read_text()).get(key) or {}).get("seconds")


def decoding_stages(run: Path, shape: Shape, tokenizer, prompt_format: str) -> list[Stage]:
    out = []
    for folder in [run / "base"] + sorted(run.glob("iter_*"), key=lambda p: int(p.name.split("_")[1])):
        for file, key in (("rollouts.jsonl", "rollout"), ("eval.jsonl", "eval")):
            if (folder / file).is_file():
                out.append(decoding_stage(folder / file, f"{folder.name}/{key}", shape, tokenizer, prompt_format,
                                          _metric_seconds(folder / "metrics.json", key)))
    return out


def gemm_rate(shape: Shape, rows: int = 512, seconds: float = 3.0, start_at: float | None = None,
              dtype: str = "float32") -> float:
    """One thread's mean GFLOP/s in `dtype` over `seconds` of one decoder layer's products at `rows` rows ([in, out]
    weights, the decoding layout), after one untimed round; `start_at` (a time.time()) aligns several workers."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kind = getattr(torch, dtype)
        weights = [(torch.randn(a, b) * 0.02).to(kind) for a, b in shape.layer_products]
        xs = [torch.randn(rows, a).to(kind) for a, _ in shape.layer_products]
        flop = 2.0 * rows * sum(a * b for a, b in shape.layer_products)
        for x, w in zip(xs, weights):
            x @ w
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.time()))
        t, rounds = time.perf_counter(), 0
        while rounds == 0 or time.perf_counter() - t < seconds:
            for x, w in zip(xs, weights):
                x @ w
            rounds += 1
        return flop * rounds / (time.perf_counter() - t) / 1e9
    finally:
        torch.set_num_threads(before)


def machine_rates(shape: Shape, cores: int, seconds: float = 3.0, delay: float = 5.0,
                  dtype: str = "float32") -> tuple[float, list[float]]:
    """(one thread's rate with the other cores idle, each thread's rate with `cores` threads running at once):
    one worker process per core, pinned to it, one torch thread each. Cores that share a clock, a cache or a
    physical core deliver less than `cores` x the first figure; the floor takes what they do deliver."""
    import subprocess

    cpus = sorted(os.sched_getaffinity(0))[:cores] if hasattr(os, "sched_getaffinity") else list(range(cores))
    products = json.dumps(shape.layer_products)

    def together(n: int) -> list[float]:
        start_at = time.time() + delay  # after every worker has imported torch
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", products, str(cpus[i % len(cpus)]),
                                   str(start_at), str(seconds), dtype], stdout=subprocess.PIPE, text=True)
                 for i in range(n)]
        return [float(p.communicate()[0].split()[-1]) for p in procs]

    return together(1)[0], together(cores)


def _worker(products: str, cpu: str, start_at: str, seconds: str, dtype: str) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(cpu)})
    shape = Shape(linear=0, head=0, layer_products=tuple(tuple(p) for p in json.loads(products)))
    print(gemm_rate(shape, start_at=float(start_at), seconds=float(seconds), dtype=dtype))


def model_of(run: Path, model: str | None) -> Path:
    """The model folder whose config.json gives the shapes: --model, else the run's M0 (iter_0/model)."""
    folder = Path(model) if model else run / "iter_0" / "model"
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder}/config.json: no model config there; pass --model FOLDER (a model folder of the "
                        "run's base model) or a run folder with iter_0/model")
    return folder


def floor(run: Path, model: str | None = None, rate: float | None = None, cores: int | None = None,
          wall: float | None = None, dtype: str = "float32") -> dict:
    from transformers import AutoTokenizer

    if not run.is_dir():
        raise UserError(f"{run}: no such run folder")
    folder = model_of(run, model)
    shape = Shape.of(folder)
    prompt_format = "chat"
    config_file = run / "config.yaml"
    if config_file.is_file():
        import yaml

        prompt_format = ((yaml.safe_load(config_file.read_text()) or {}).get("generator") or {}).get(
            "prompt_format", "chat")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    stages = training_stages(run, shape) + decoding_stages(run, shape, tokenizer, prompt_format)
    if not stages:
        raise UserError(f"{run}: no trained adapter (knowtrace_training.json) and no eval.jsonl or rollouts.jsonl")
    cores = cores or len(os.sched_getaffinity(0))
    given = bool(rate)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") and not given else None
    alone, loaded = (rate, [rate] * cores) if given else machine_rates(shape, cores, dtype=dtype)
    rate = alone
    machine = max(alone, sum(loaded))  # the most the machine did per second, on one core or on all
    total = sum(s.flop for s in stages)
    rows = []
    for s in stages:
        floor_s = s.flop / (rate * 1e9)
        rows.append({**asdict(s), "tflop": s.flop / 1e12, "floor_seconds_one_core": floor_s,
                     "floor_share": floor_s / s.seconds if s.seconds else None})
    out = {"run": str(run), "dtype": dtype, "rate_gflops_one_thread": rate, "cores": cores,
           "rate_gflops_all_cores": loaded,
           "machine_gflops": machine, "rates_given": given, "load_average_before": load, "stages": rows,
           "tflop": total / 1e12, "floor_seconds": total / (machine * 1e9),
           "recorded_stage_seconds": sum(s.seconds or 0.0 for s in stages)}
    for kind in ("training", "decoding"):
        out[f"{kind}_tflop"] = sum(s.flop for s in stages if s.kind == kind) / 1e12
    if wall:
        out["wall_seconds"] = wall
        out["floor_share_of_wall"] = out["floor_seconds"] / wall
    return out


def report(r: dict) -> str:
    lines = [f"{r['run']}: one thread's {r.get('dtype', 'float32')} rate on the model's products "
             f"({'given' if r.get('rates_given') else 'measured'}) {r['rate_gflops_one_thread']:.1f} GFLOP/s "
             f"alone; with {r['cores']} core(s) busy at once "
             + " + ".join(f"{x:.1f}" for x in r["rate_gflops_all_cores"]) + f" = {sum(r['rate_gflops_all_cores']):.1f}",
             "a stage's floor is its work on one core alone (a stage that ran on two threads can exceed 1)",
             *([f"load average {r['load_average_before']:.1f} before measuring: other work ran beside the rates, "
                "which are then too low (measure on an otherwise idle machine)"]
               if (r.get("load_average_before") or 0.0) >= 0.5 else []),
             f"{'stage':<24} {'TFLOP':>7} {'floor (1 core)':>15} {'recorded':>9} {'floor/recorded':>15}  counts"]
    for s in r["stages"]:
        rec = f"{s['seconds']:.0f} s" if s["seconds"] else "-"
        share = f"{s['floor_share']:.2f}" if s["floor_share"] else "-"
        lines.append(f"{s['name']:<24} {s['tflop']:>7.2f} {s['floor_seconds_one_core']:>13.0f} s {rec:>9} {share:>15}  "
                     + ", ".join(f"{k} {v}" for k, v in s["counts"].items()))
    lines.append(f"work {r['tflop']:.1f} TFLOP (training {r['training_tflop']:.1f}, "
                 f"decoding {r['decoding_tflop']:.1f}): "
                 f"at least {r['floor_seconds']:.0f} s at {r['machine_gflops']:.1f} GFLOP/s, the most this machine did "
                 f"(the stages recorded {r['recorded_stage_seconds']:.0f} s)")
    if "wall_seconds" in r:
        lines.append(f"the run's wall {r['wall_seconds']:.0f} s: the floor is {r['floor_share_of_wall']:.2f} of it")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--worker":  # one core's measurement (machine_rates)
        return _worker(*sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--model", help="model folder for the shapes and tokenizer (default: RUN/iter_0/model)")
    ap.add_argument("--rate", type=float, help="one thread's GFLOP/s, taken for every core (default: measured here, "
                    "alone and with every core busy)")
    ap.add_argument("--cores", type=int, help="cores the run used (default: this process's)")
    ap.add_argument("--wall", type=float, help="the run's wall seconds, as the recipe printed them")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the products' dtype for the measured rate: bfloat16 for a run that trained and decoded in "
                         "bf16 (a CPU with native bf16)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    try:
        r = floor(args.run, args.model, args.rate, args.cores, args.wall, args.dtype)
    except UserError as e:
        raise SystemExit(f"error: {e}")
    print(report(r))
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
