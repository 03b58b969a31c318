"""Per-request sampling seeds: `request_seed`."""

from __future__ import annotations

import pytest

from knowtrace_train.generation.base import request_seed

# -- request_seed --------------------------------------------------------------------------------


def test_request_seed_is_stable_across_processes():
    # sha256 of the JSON list [base, *keys]: fixed values, whatever PYTHONHASHSEED a process has
    assert request_seed(0) == 1354539281
    assert request_seed(0, "traj-17", 3) == 2026797657
    assert request_seed(12345, "hotpot/5a8b57f25542995d1e6f1371", 0) == 159176748


def test_request_seed_differs_with_every_key_and_stays_31_bit():
    seeds = {request_seed(b, t, c) for b in range(3) for t in ("q1", "q2", "q3") for c in range(4)}
    assert len(seeds) == 3 * 3 * 4
    assert all(0 <= s < 2**31 for s in seeds)
    assert request_seed(0, "1") != request_seed(0, 1)  # a key's type counts
    assert request_seed(0, "a", "b") != request_seed(0, "ab")  # keys stay apart
    assert request_seed(0, 1, 2) != request_seed(0, 2, 1)  # order counts
    assert request_seed(7, "q", 1) == request_seed(7, "q", 1)


def test_request_seed_rejects_keys_without_a_stable_text():
    with pytest.raises(TypeError, match="key 1"):
        request_seed(0, "q", 1.5)
    with pytest.raises(TypeError, match="base_seed"):
        request_seed("0", "q")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key 0"):
        request_seed(0, True)
