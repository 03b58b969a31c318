"""scripts/bench/bench_quantized.py: each quantized kernel computes the product of the weights it holds."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))

from bench_quantized import measure  # noqa: E402


def test_each_kernel_is_timed_and_the_weight_only_ones_compute_their_weights_product():
    (r,) = measure([3], repeat=1)
    assert r["rows"] == 3
    assert set(r["us"]) == {"fp32", "dynamic_int8", "int8_weight_only", "int4_weight_only"}
    assert all(v > 0 for v in r["us"].values())
    assert set(r["time_vs_fp32"]) == set(r["us"]) - {"fp32"}
    # the weight-only kernels multiply by exactly the weights they hold (packing, scales and zeros right);
    # the dynamic kernel also rounds its activations to 8 bits, so it lands visibly further off
    assert r["max_error"]["int8_weight_only"] < 1e-3
    assert r["max_error"]["int4_weight_only"] < 1e-3
    assert r["max_error"]["dynamic_int8"] > 1e-3
