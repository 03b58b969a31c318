"""The fault-injection harness at its smoke size (scripts/lab/chaos.py; issue 64, item 2): per mode, the main job on the
tiny model killed with SIGKILL at a few named points of its stages (chained in one run folder: each rerun resumes what
the kill before it left, and is killed at the next point), rerun to its end, and its folder compared file by file with
an uninterrupted run's: every JSONL and JSON file, the config, the adapters' and M0's safetensors bit for bit.
`python scripts/lab/chaos.py --points all --random 3` tries every point the runs reach, each in a folder of its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "lab"))

import chaos  # noqa: E402


@pytest.mark.parametrize("mode", chaos.MODES)
def test_a_run_killed_at_each_smoke_point_resumes_to_the_uninterrupted_runs_folder(mode, tmp_path, tiny_model_dir):
    tally = chaos.run_mode(chaos.Chaos(tmp_path, tiny_model_dir), mode, "smoke", randoms=0, seed=0)
    print(tally.line())
    assert tally.failures == []
    assert tally.tried == len(chaos.SMOKE[mode]) == tally.killed == tally.resumed
    assert tally.identical == tally.compared == 1
