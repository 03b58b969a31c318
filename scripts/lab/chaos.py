"""Fault injection: the main job on the tiny model, SIGKILLed at named points of every stage and at random times, rerun
by the same command, and its run folder compared file by file with an uninterrupted run's (issue 64, item 2).

    python scripts/lab/chaos.py                                   # the smoke size CI runs (tests/test_chaos.py)
    python scripts/lab/chaos.py --points all --random 3           # every point the runs reach, each on its own
    python scripts/lab/chaos.py --modes grpo --points iter_1/train_explore:step,iter_1/rollout:record#3
    python scripts/lab/chaos.py --modes none --torchrun           # two processes (torchrun), mid-training, mid-rollout

Each mode (backtrace with the bootstrap and the raw base's evaluation; star, kto and grpo from the raw base) runs once
uninterrupted through the main job's command (`tests/selftrain_helpers.py --main-job`: the oracle generator over the
tiny random Llama of tests/conftest.py, fp32 training and decoding, two torch threads, the evaluation beside the next
rollouts, reuse on with a cache home of the run's own), listing every point it passes (the hook
`KNOWTRACE_TEST_KILL_AT` of tests/selftrain_helpers.py: "<folder>/<stage>:start|record|step|save|store|end|marked",
"run/summary", "run/report"). Then, per point, a run in a new folder kills its own process group with SIGKILL there,
the same command runs again (and again, until it ends), and the folder must equal the uninterrupted run's
(`run_outputs`: every JSONL, metrics.json, summary.json, config and model card as text, the adapters' and M0's
safetensors bit for bit; left out only timings, the reuse provenance of a stage and the DONE markers).

`--points smoke` (the default) chains the mode's few smoke points in one folder: the run is killed at the first, its
rerun at the next, and so on, then the last rerun ends and the folder is compared once; every link resumes what the
kill before it left. `--points all` runs each point the reference reached (its first time) in a folder of its own,
kill, rerun, compare; `--random N` adds N kills at seeded random times (uniform over the reference's wall time). The
summary, per mode: points tried, killed there, runs resumed, outputs identical; the last line is one JSON object.
Exit 1 where a run failed or a folder differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
for p in (REPO, TESTS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from selftrain_helpers import KILL_ENV, differing, run_outputs, tiny_overrides  # noqa: E402

HELPER = [sys.executable, str(TESTS / "selftrain_helpers.py")]
MODES = ("backtrace", "star", "kto", "grpo")
#: fp32 everywhere, two torch threads (the evaluation beside the next rollouts), one iteration, reuse on
COMMON: dict[str, object] = {
    "iterations": 1, "threads": 2, "reuse": True, "generator.dtype": "float32",
    "train.precision": "fp32", "bootstrap.train.precision": "fp32", "eval_base": True,
    "data.train_questions": 4, "data.dev_questions": 2, "bootstrap.questions": 4,
}
#: per mode: backtrace bootstraps M0 and evaluates the raw base too; the others start from the raw base, whose
#: few-shot prompts the oracle then knows (fewshot_trained); GRPO samples two trajectories per question
MODE_VALUES: dict[str, dict[str, object]] = {
    "backtrace": {"mode": "backtrace"},
    "star": {"mode": "star", "bootstrap.mode": "never", "fewshot_trained": True},
    "kto": {"mode": "kto", "bootstrap.mode": "never", "fewshot_trained": True, "data.train_questions": 3},
    "grpo": {"mode": "grpo", "bootstrap.mode": "never", "fewshot_trained": True, "rollout.samples": 2,
             "rollout.temperature": 1.0, "grpo.batch_size": 8, "grpo.learning_rate": 1e-3},
}
#: the smoke size's points, chained in one folder per mode (in the order a run reaches them): between them every
#: kind of stage (the bootstrap's training and merge, rollouts, rationalizing, each trainer's role training, an
#: evaluation beside the next rollouts and one after training, the calibration, a cache store, the summary, the
#: report) and every kind of point (start, record, step, save, store, end)
SMOKE: dict[str, tuple[str, ...]] = {
    "backtrace": ("iter_0/merge:save", "iter_0/merge:store#3", "iter_0/eval:record", "iter_1/train_complete:save",
                  "run/report"),
    "star": ("iter_1/rollout:record#2", "iter_1/rationalize:end", "iter_1/train_explore:step"),
    "kto": ("base/eval:store", "iter_1/train_complete:step", "iter_1/calibrate:end"),
    "grpo": ("iter_1/rollout:record#5", "iter_1/train_explore:step", "iter_1/eval:start"),
}
#: two processes (torchrun --nproc_per_node 2, gloo on the CPU): killed mid-rollout and mid-training
TORCHRUN_VALUES: dict[str, object] = {
    "mode": "star", "bootstrap.mode": "never", "fewshot_trained": True, "threads": 1, "eval_base": False,
}
TORCHRUN_POINTS = ("iter_1/rollout:record", "iter_1/train_explore:step")


@dataclass
class Tally:
    """One mode's figures."""

    mode: str
    tried: int = 0
    killed: int = 0
    resumed: int = 0
    identical: int = 0
    compared: int = 0
    seconds: float = 0.0
    reference_seconds: float = 0.0
    points: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.mode:10s} points tried {self.tried:3d}, killed there {self.killed:3d}, runs resumed "
                f"{self.resumed:3d}, outputs identical {self.identical}/{self.compared} ({self.seconds:.0f} s; "
                f"an uninterrupted run {self.reference_seconds:.0f} s)")


def kill_launch(pid: int) -> None:
    """SIGKILL to the process group of `pid` (started in a session of its own) and of each process it started (torchrun
    starts every worker in a session of its own)."""
    from knowtrace_train.errors import import_extra

    psutil = import_extra("psutil", "dev", "scripts/lab/chaos.py (it finds the processes torchrun started)")

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for p in [*children, None]:
        try:
            os.killpg(pid if p is None else os.getpgid(p.pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Chaos:
    """Runs of one model in `work`, each with a cache home of its own beside its folder."""

    def __init__(self, work: Path, model_dir: Path, log=print) -> None:
        self.work, self.model_dir, self.log = Path(work), Path(model_dir), log
        self.work.mkdir(parents=True, exist_ok=True)

    def config(self, name: str, values: dict[str, object]) -> Path:
        from knowtrace_train.config import dump_config, load_config
        from knowtrace_train.selftrain.config import SelfTrainConfig

        overrides = tiny_overrides(self.work, self.model_dir, output_dir=str(self.work / name), **values)
        cfg = load_config(SelfTrainConfig, None, overrides)
        path = self.work / f"{name}.yaml"
        path.write_text(dump_config(cfg), encoding="utf-8")
        return path

    def launch(self, cfg: Path, mode: str, kill: str | None = None, after: float | None = None,
               processes: int = 1, timeout: float = 900) -> tuple[int, str]:
        """The main job on `cfg` in a session of its own: (exit code, the end of its stderr). `kill`: the hook's
        point; `after`: SIGKILL its process group after that many seconds (where it still runs)."""
        cmd = [*HELPER, "--main-job", *(["--coin"] if mode == "grpo" else []), str(cfg)]
        if processes > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                   *cmd[1:]]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "KNOWTRACE_CACHE": str(cfg.with_suffix(".cache"))}
        env.pop(KILL_ENV, None)
        if kill is not None:
            env[KILL_ENV] = kill
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True, env=env,
                                    start_new_session=True)
            try:
                proc.wait(timeout=after if after is not None else timeout)
            except subprocess.TimeoutExpired:
                kill_launch(proc.pid)
                proc.wait()
                if after is None:
                    raise
            err.seek(0)
            return proc.returncode, err.read()[-4000:]

    def reference(self, mode: str, values: dict[str, object], processes: int = 1) -> tuple[dict, list[str], float]:
        """The uninterrupted run: its outputs, every point it passed ("POINT#N", in order), its wall seconds."""
        name = f"{mode}_reference"
        cfg = self.config(name, values)
        listing = self.work / f"{name}.points"
        listing.unlink(missing_ok=True)
        t0 = time.perf_counter()
        rc, err = self.launch(cfg, mode, kill=f"list:{listing}", processes=processes)
        seconds = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"{mode}: the uninterrupted run failed (exit {rc}):\n{err}")
        points = listing.read_text(encoding="utf-8").splitlines()
        return run_outputs(self.work / name), points, seconds

    def until_done(self, cfg: Path, mode: str, kills: Sequence[str | float], tally: Tally,
                   processes: int = 1) -> bool:
        """Runs of `cfg`, the i-th killed at `kills[i]` (a point, or seconds for a kill from outside), then reruns
        until one ends; False (the failure in `tally`) where a run fails."""
        killed_before = False
        for kill in [*kills, None]:
            point = kill if isinstance(kill, str) else None
            after = float(kill) if kill is not None and point is None else None
            rc, err = self.launch(cfg, mode, kill=point, after=after, processes=processes)
            if killed_before and rc in (0, -signal.SIGKILL):
                tally.resumed += 1
            if rc == -signal.SIGKILL:
                tally.killed += 1
                killed_before = True
                continue
            if rc != 0:
                tally.failures.append(f"{mode} {cfg.stem}: the run after {kill!r} failed (exit {rc}):\n{err}")
                return False
            if kill is not None:  # ended before the point (a named one it never reached, or a late random time)
                self.log(f"  {mode} {cfg.stem}: {kill!r} was not reached; the run ended", flush=True)
                killed_before = False
                break
        return True

    def compare(self, mode: str, name: str, want: dict, tally: Tally) -> None:
        """The run folder against the uninterrupted run's (`want`); no temporary file a kill left in its cache home."""
        from knowtrace_train.stages import LEFTOVER

        tally.compared += 1
        diff = differing(want, run_outputs(self.work / name))
        cache = self.work / f"{name}.cache"
        left = sorted(str(p.relative_to(cache)) for p in cache.rglob(".*") if LEFTOVER.match(p.name))
        if diff:
            tally.failures.append(f"{mode} {name}: differs from the uninterrupted run in {diff}")
        elif left:
            tally.failures.append(f"{mode} {name}: temporary files left in the reuse cache: {left}")
        else:
            tally.identical += 1


def run_mode(chaos: Chaos, mode: str, points: str, randoms: int, seed: int) -> Tally:
    values = {**COMMON, **MODE_VALUES[mode]}
    tally = Tally(mode)
    t0 = time.perf_counter()
    want, passed, tally.reference_seconds = chaos.reference(mode, values)
    reached = set(passed)
    first = [p for p in dict.fromkeys(x.rsplit("#", 1)[0] for x in passed)]
    rng = random.Random(f"{seed}:{mode}")
    times = [round(rng.uniform(0.05, 0.95) * tally.reference_seconds, 2) for _ in range(randoms)]
    if points == "smoke":
        chosen = list(SMOKE[mode])
        for p in chosen:  # a smoke point the run no longer reaches is a stale list, not a pass
            if (p if "#" in p else f"{p}#1") not in reached:
                tally.failures.append(f"{mode}: the uninterrupted run never reached the smoke point {p}")
        chosen = [p for p in chosen if (p if "#" in p else f"{p}#1") in reached]
        tally.tried, tally.points = len(chosen) + len(times), [*chosen, *map(str, times)]
        name = f"{mode}_smoke"
        cfg = chaos.config(name, values)
        if chaos.until_done(cfg, mode, chosen, tally):
            chaos.compare(mode, name, want, tally)
        for i, t in enumerate(times):
            name = f"{mode}_random{i}"
            if chaos.until_done(chaos.config(name, values), mode, [t], tally):
                chaos.compare(mode, name, want, tally)
    else:
        chosen = first if points == "all" else [p for p in points.split(",") if p.split("#")[0] in {*first}]
        tally.points = [*chosen, *map(str, times)]
        for i, kill in enumerate([*chosen, *times]):
            tally.tried += 1
            name, failed = f"{mode}_{i}", len(tally.failures)
            if chaos.until_done(chaos.config(name, values), mode, [kill], tally):
                chaos.compare(mode, name, want, tally)
            if len(tally.failures) == failed:  # a failed point's folders are kept to look at
                shutil.rmtree(chaos.work / name, ignore_errors=True)
                shutil.rmtree(chaos.work / f"{name}.cache", ignore_errors=True)
            chaos.log(f"  {mode} {kill}: " + ("ok" if len(tally.failures) == failed else
                                              "FAILED: " + " / ".join(tally.failures[failed:])[:2000]), flush=True)
    tally.seconds = time.perf_counter() - t0
    return tally


def run_torchrun(chaos: Chaos) -> Tally:
    """Two processes: an uninterrupted run, then one killed mid-rollout and one killed mid-training, each rerun."""
    tally = Tally("torchrun")
    t0 = time.perf_counter()
    values = {**COMMON, **TORCHRUN_VALUES}
    want, passed, tally.reference_seconds = chaos.reference("torchrun", values, processes=2)
    for i, point in enumerate(TORCHRUN_POINTS):
        tally.tried += 1
        name = f"torchrun_{i}"
        if f"{point}#1" not in passed:
            tally.failures.append(f"torchrun: the uninterrupted run never reached {point}")
            continue
        if chaos.until_done(chaos.config(name, values), "torchrun", [point], tally, processes=2):
            chaos.compare("torchrun", name, want, tally)
    tally.points = list(TORCHRUN_POINTS)
    tally.seconds = time.perf_counter() - t0
    return tally


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated modes, or none")
    ap.add_argument("--points", default="smoke", help="smoke, all, or comma-separated points (POINT or POINT#N)")
    ap.add_argument("--random", type=int, default=None, help="kills at seeded random times per mode (smoke: 0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torchrun", action="store_true", help="also the two-process runs")
    ap.add_argument("--work", default=None, help="folder for the runs (default: a temporary one, removed after)")
    ap.add_argument("--model", default=None, help="the tiny model's folder (default: made in the work folder)")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m and m != "none"]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        ap.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="chaos."))
    try:
        model = Path(args.model) if args.model else None
        if model is None:
            from conftest import tiny_model

            model = tiny_model(work / "tiny_model")
        chaos = Chaos(work, model)
        t0 = time.perf_counter()
        tallies = [run_mode(chaos, m, args.points, args.random or 0, args.seed) for m in modes]
        if args.torchrun:
            tallies.append(run_torchrun(chaos))
        for t in tallies:
            print(t.line(), flush=True)
            for f in t.failures:
                print(f"  FAILED: {f}", flush=True)
        total = time.perf_counter() - t0
        print(json.dumps({"points": args.points, "seconds": round(total, 1), "modes": {
            t.mode: {"tried": t.tried, "killed": t.killed, "resumed": t.resumed, "identical": t.identical,
                     "compared": t.compared, "failures": len(t.failures), "seconds": round(t.seconds, 1)}
            for t in tallies}}))
        return 1 if any(t.failures for t in tallies) else 0
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
