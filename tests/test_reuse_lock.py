"""The reuse cache under concurrent runs (selftrain/reuse.py, issue 64 item 1): one flock per entry. A run that
needs an entry another live run holds waits for it (saying who holds it) and then reuses it; a lock left by a dead
process is taken at once; and two runs of the default job side by side, `--mode backtrace` and `--mode star`
with one cache home, compute each shared stage once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knowtrace_train.selftrain.reuse import KEY_FILE, LOCKS, ReuseCache

from selftrain_helpers import tiny_overrides

REPO = Path(__file__).resolve().parents[1]

#: a process that claims an entry of the cache at argv[1], says so on stdout, then with argv[2] == "store"
#: computes it (sleeping argv[3] seconds) and stores it; with "hold" it holds the lock until it is killed
CLAIMER = r"""
import json, logging, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from knowtrace_train.selftrain.reuse import ReuseCache
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
c = ReuseCache(Path(sys.argv[1]))
e = c.entry("eval", {{"seed": 0}})
c.claim(e, "base/eval", "runs/" + sys.argv[2])
got = c.lookup(e, "base/eval")
print("claimed", json.dumps(got), flush=True)
if got is None and sys.argv[2] == "store":
    time.sleep(float(sys.argv[3]))
    src = Path(sys.argv[1]).parent / "eval.jsonl"
    src.write_text('{{"q": 1}}\n')
    c.store(e, {{"eval.jsonl": src}}, {{"em": 0.5}}, "runs/store")
elif sys.argv[2] == "hold":
    time.sleep(600)
c.release(e)
print("released", flush=True)
"""


def _claimer(root: Path, how: str, seconds: float = 0.0, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLAIMER.format(repo=str(REPO)), str(root), how, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **env})


def _wait_line(proc: subprocess.Popen, prefix: str) -> str:
    line = proc.stdout.readline()
    assert line.startswith(prefix), (line, proc.stderr.read() if proc.poll() is not None else "")
    return line


def test_a_run_waits_for_an_entry_another_computes_then_reuses_it(tmp_path):
    root = tmp_path / "runs"
    first = _claimer(root, "store", 3.0)
    _wait_line(first, "claimed null")  # a miss: it computes the entry, holding its lock
    lock = root / LOCKS / "eval" / f"{ReuseCache(root).entry('eval', {'seed': 0}).path.name}.lock"
    holder = json.loads(lock.read_text())
    assert holder["pid"] == first.pid and holder["run"] == "runs/store" and holder["host"] and holder["since"]

    t0 = time.monotonic()
    second = _claimer(root, "read", KNOWTRACE_REUSE_WAIT_LOG_S="0.5")
    assert _wait_line(second, "claimed ").strip() == 'claimed {"em": 0.5}'  # waited, then reused what the first stored
    assert time.monotonic() - t0 > 1.0
    assert second.wait(60) == 0 and first.wait(60) == 0
    err = second.stderr.read()
    assert f"base/eval: run runs/store (pid {first.pid} on " in err and "is computing it; waiting for it" in err
    assert err.count("waiting for it") >= 2  # said again every KNOWTRACE_REUSE_WAIT_LOG_S
    assert "the other run is done with it after" in err and "not in the reuse cache" not in err
    assert lock.read_text() == ""  # nobody holds it
    assert sorted(p.name for p in (root / "eval").iterdir()) == [lock.stem]  # the stage's folder: entries only
    assert json.loads((root / "eval" / lock.stem / KEY_FILE).read_text())["made_by"] == "runs/store"


def test_a_lock_left_by_a_dead_process_is_taken_at_once(tmp_path):
    root = tmp_path / "runs"
    dead = _claimer(root, "hold")
    _wait_line(dead, "claimed null")
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    t0 = time.monotonic()
    after = _claimer(root, "store", 0.0)
    _wait_line(after, "claimed null")  # the entry was never stored: computed anew
    assert after.wait(60) == 0 and time.monotonic() - t0 < 30
    assert "waiting for it" not in after.stderr.read()


def test_claims_of_one_process_nest_and_release_is_safe(tmp_path):
    c = ReuseCache(tmp_path / "runs")
    e = c.entry("eval", {"seed": 1})
    c.claim(e, "x", "runs/a")
    c.claim(e, "x", "runs/a")  # does not wait for itself
    c.release(e)
    assert c._held and json.loads(c.lock_path(e).read_text())["pid"] == os.getpid()
    c.release(e)
    c.release(e)  # one more: nothing
    c.release(None)
    assert not c._held and c.lock_path(e).read_text() == ""


# -- the README's side-by-side pair ------------------------------------------------------------------------

SHARED = ("base/eval", "M0 (iter_0/model)", "iter_0/eval", "iter_1/rollout")


def stage_counts(log: str) -> dict[str, dict[str, int]]:
    """Per shared stage, how often a run's log says it computed it and reused it."""
    counts = {s: {"computed": log.count(f"{s}: not in the reuse cache"), "reused": log.count(f"reused {s} from ")}
              for s in SHARED}
    counts["waits"] = log.count("is computing it; waiting for it")  # the first of each wait, then every 5 s
    return counts


@pytest.mark.slow
def test_two_runs_side_by_side_compute_each_shared_stage_once(tmp_path, tiny_model_dir):
    """The README's pair: the default job at a smoke size, --mode backtrace and --mode star, started together
    with one cache home. Each shared stage is computed by one and reused by the other (who waits for whom
    depends on the machine's timing: the sums are what is fixed)."""
    from knowtrace_train.config import dump_config, load_config
    from knowtrace_train.selftrain.config import SelfTrainConfig

    cache = tmp_path / "cache"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "KNOWTRACE_CACHE": str(cache), "OMP_NUM_THREADS": "1",
           "KNOWTRACE_REUSE_WAIT_LOG_S": "5"}
    procs = {}
    for mode in ("backtrace", "star"):
        cfg = load_config(SelfTrainConfig, None, tiny_overrides(
            tmp_path, tiny_model_dir, reuse=True, iterations=1, mode=mode, threads=1, output_dir=str(tmp_path / mode)))
        path = tmp_path / f"{mode}.yaml"
        path.write_text(dump_config(cfg))
        procs[mode] = subprocess.Popen([sys.executable, str(REPO / "tests" / "selftrain_helpers.py"), str(path)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    logs = {}
    for mode, p in procs.items():
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-4000:]
        logs[mode] = err
    counts = {mode: stage_counts(log) for mode, log in logs.items()}
    print(json.dumps(counts))
    for s in SHARED:
        assert sum(c[s]["computed"] for c in counts.values()) == 1, (s, counts)
        assert sum(c[s]["reused"] for c in counts.values()) == 1, (s, counts)
    for s, folder, stage in [("base/eval", "base", "eval"), ("M0", "iter_0", "merge"), ("iter_0/eval", "iter_0", "eval"),
                             ("iter_1/rollout", "iter_1", "rollout")]:
        marks = [json.loads((tmp_path / m / folder / f"DONE.{stage}").read_text()) for m in procs]
        assert sorted("reused_from" in d for d in marks) == [False, True], s
    for f in ("base/eval.jsonl", "iter_0/eval.jsonl", "iter_1/rollouts.jsonl"):
        assert (tmp_path / "backtrace" / f).read_bytes() == (tmp_path / "star" / f).read_bytes(), f
    # one entry per shared stage, no leftovers
    assert [len(list((cache / "runs" / s).iterdir())) for s in ("eval", "m0", "rollout")] == [2, 1, 1]
    assert not list((cache / "runs").rglob(".*"))
