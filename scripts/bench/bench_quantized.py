"""Quantized linear products on this CPU: SmolLM2-135M's decoder-layer products (and its LM head) at decoding's
row counts, fp32 on the decoding layout ([in, out] weights, generation.layout) against torch's quantized CPU kernels,
side by side in one process. One layer's weights stay warm in cache (a decoding step reads 30 layers'), so
the times compare kernels, not decoding steps. Each kernel's error is its largest absolute difference from the fp32 product of the
weights it holds: the weights' rounding is not counted, dynamic_int8's rounding of the activations is.

    python scripts/bench/bench_quantized.py [--rows 1,13,32,256] [--threads 1] [--repeat 50]

- fp32: `x @ w_t`, what decoding runs on CPUs in fp32;
- dynamic_int8: fbgemm's `quantized.dynamic.Linear` (per-channel int8 weights, activations quantized per call to
  uint8: what `torch.ao.quantization.quantize_dynamic` builds);
- int8_weight_only: `torch._weight_int8pack_mm` (int8 weights with per-channel scales, fp32 activations);
- int4_weight_only: `torch._weight_int4pack_mm_for_cpu` (int4 weights in groups of 32 with a scale and zero each,
  the layout of a Q4_1 GGUF block).
Prints one line per row count: microseconds for one layer's seven products plus the LM head (1/30 of its cost,
the head runs once per step for 30 layers), each kernel's time as a multiple of fp32's (below 1: faster), and its error.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

#: SmolLM2-135M's products per decoder layer: (in, out) of q, k, v, o, gate, up, down; the LM head apart
LAYER = ((576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576))
HEAD = (576, 49152)
LAYERS = 30
GROUP = 32


def _kernels(w: torch.Tensor) -> dict:
    """name -> (product of x, the fp32 weight [out, in] the kernel holds) for a weight `w` [out, in]."""
    out_features, in_features = w.shape
    kernels = {"fp32": (lambda x, wt=w.t().contiguous(): x @ wt, w)}
    scale = w.abs().amax(1).clamp(min=1e-8) / 127
    w8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    held8 = w8.float() * scale[:, None]
    qlinear = torch.ao.nn.quantized.dynamic.Linear(in_features, out_features)
    qlinear.set_weight_bias(torch.quantize_per_channel(held8, scale.double(), torch.zeros(out_features, dtype=torch.long),
                                                       0, torch.qint8), None)
    kernels["dynamic_int8"] = (qlinear, held8)
    kernels["int8_weight_only"] = (lambda x: torch._weight_int8pack_mm(x, w8, scale), held8)
    g = w.reshape(out_features, in_features // GROUP, GROUP)
    low, high = g.amin(-1), g.amax(-1)
    step = (high - low).clamp(min=1e-8) / 15
    q = torch.round((g - low[..., None]) / step[..., None]).clamp(0, 15)
    held4 = (q * step[..., None] + low[..., None]).reshape(out_features, in_features)
    packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).reshape(out_features, in_features), 1)
    scales_zeros = torch.stack([step.t(), (low + 8 * step).t()], -1).contiguous()  # (q - 8) * step + zero
    kernels["int4_weight_only"] = (lambda x: torch._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros), held4)
    return kernels


def _seconds(f, x: torch.Tensor, repeat: int) -> float:
    f(x)
    t0 = time.perf_counter()
    for _ in range(repeat):
        f(x)
    return (time.perf_counter() - t0) / repeat


def measure(rows_list: list[int], repeat: int, seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(s, 1.0) for s in LAYER] + [(HEAD, 1.0 / LAYERS)]
    weights = [(torch.randn(o, i, generator=gen) * 0.05, share) for (i, o), share in shapes]
    kernels = [(_kernels(w), share) for w, share in weights]
    results = []
    for rows in rows_list:
        total: dict[str, float] = {}
        error: dict[str, float] = {}
        for ks, share in kernels:
            x = torch.randn(rows, ks["fp32"][1].shape[1], generator=gen)
            for name, (f, held) in ks.items():
                total[name] = total.get(name, 0.0) + _seconds(f, x, max(1, round(repeat * share))) * share
                err = (f(x) - x @ held.t()).abs().max().item()
                error[name] = max(error.get(name, 0.0), err)
        results.append({
            "rows": rows,
            "us": {k: round(v * 1e6, 1) for k, v in total.items()},
            "time_vs_fp32": {k: round(v / total["fp32"], 2) for k, v in total.items() if k != "fp32"},
            "max_error": {k: float(f"{v:.2g}") for k, v in error.items()},
        })
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,13,32,256", help="comma-separated row counts (decoding rows per step)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--repeat", type=int, default=50, help="timed calls per product")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for r in measure([int(x) for x in args.rows.split(",")], args.repeat):
        print(f"{r['rows']:>4} rows: " + ", ".join(f"{k} {v:.0f} us" for k, v in r["us"].items())
              + "; time against fp32's: " + ", ".join(f"{k} {v}x" for k, v in r["time_vs_fp32"].items()))
        print(json.dumps(r))


if __name__ == "__main__":
    main()
