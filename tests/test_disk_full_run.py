"""A full disk met by the tiny-model self-training run (issue 64 item 3), at a rollout's JSONL append, at
M0's merge (a model save) and at its first reuse-cache store: the run stops with one line (exit 2) naming the
folder and what it was writing, and the rerun of the same command, space freed, ends with the run folder an
uninterrupted run makes, file by file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from selftrain_helpers import DISK_FULL_ENV, differing, run_outputs
from test_selftrain import _config_file

REPO = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(REPO / "tests" / "selftrain_helpers.py")]
# on the CPU on every machine (adapters compared bit for bit), as the kill/resume test
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
VALUES = {"iterations": 1, "eval_base": False}


@pytest.fixture(scope="module")
def whole(tmp_path_factory, tiny_model_dir) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("whole")
    cfg = _config_file(tmp, "whole", tiny_model_dir, output_dir=str(tmp / "whole"), **VALUES)
    r = subprocess.run([*SCRIPT, str(cfg)], capture_output=True, text=True, cwd=REPO, timeout=900, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_outputs(tmp / "whole")


@pytest.mark.parametrize("point,folder,what", [
    ("append:iter_1/rollouts.jsonl.parts/rank0.jsonl:2", "iter_1/rollouts.jsonl.parts", "a record of rank0.jsonl"),
    ("save", "iter_0", "the merged model"),
    ("store", "cache/runs", "the reuse cache's"),  # with reuse on and a cache home of the test's own
])
def test_a_full_disk_stops_in_one_line_and_the_rerun_gives_the_same_run(tmp_path, tiny_model_dir, whole,
                                                                         point, folder, what):
    run = tmp_path / "cut"
    store = point == "store"
    cfg = _config_file(tmp_path, "cut", tiny_model_dir, output_dir=str(run), **VALUES,
                       **({"reuse": True} if store else {}))
    env = {**ENV, "KNOWTRACE_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([*SCRIPT, str(cfg)], capture_output=True, text=True, cwd=REPO, timeout=900,
                       env={**env, DISK_FULL_ENV: point})
    assert r.returncode == 2, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    where = tmp_path / folder if store else run / folder
    assert re.match(rf"disk full: no space left on the device of {re.escape(str(where))}(/\w+)? while writing "
                    rf"{re.escape(what)}", last), last
    assert not (run / "iter_1" / "DONE.rollout").exists()
    if point == "save":  # no half model where the resumed run looks for M0
        assert not (run / "iter_0" / "DONE.merge").exists()
        assert not any(p.name.startswith(".") for p in (run / "iter_0").iterdir())
    if store:  # no entry a rerun would take, no temporary folder
        cache = tmp_path / "cache" / "runs"
        assert not list(cache.rglob("key.json")) and not [p for p in cache.rglob(".*")]

    r = subprocess.run([*SCRIPT, str(cfg)], capture_output=True, text=True, cwd=REPO, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    if store:
        assert "stored" in r.stderr and "in the reuse cache" in r.stderr
    got = run_outputs(run)
    if store:  # the one setting the runs differ in
        assert "\nreuse: true\n" in got["config.yaml"]
        got["config.yaml"] = got["config.yaml"].replace("\nreuse: true\n", "\nreuse: false\n")
    assert differing(got, whole) == []
