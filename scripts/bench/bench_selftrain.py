"""Benchmark: the main job's wall time by stage, on a cold machine or from finished run folders.

    python scripts/bench/bench_selftrain.py [--cold] [--output_dir runs/bench_default] [--key value ...]
    python scripts/bench/bench_selftrain.py --read RUN [RUN ...]

The first form runs `recipes/selftrain.py` (the embedded default, with any config override after the
options) in a child process and times it from launch to exit. `--cold` gives the child an empty cache
home ($KNOWTRACE_CACHE in a temporary folder: the GGUF is dequantized again, the BM25 index rebuilt,
nothing is reused across runs), which is what a new user's first run meets; without it the machine's
caches serve as they would a second run. `--read` only reads finished run folders.

Either way it prints, per run, the seconds of each phase (from summary.json: the raw base's evaluation,
the bootstrap's records, training and merge, every evaluation, rollouts, rationalizing, iteration
training), their shares, the time outside the stages (start-up, model conversion, index building) when
the wall time is known, the bootstrap's optimizer steps and where `plateau_steps` stopped it, and the load
average (other work on the machine slows every figure). Two runs read together are also set side by side
with the ratio of each phase. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.stages import read_done  # noqa: E402

PHASES = ("bootstrap", "eval", "train", "rollout", "rationalize")


def run_times(run_dir: Path, wall: float | None = None) -> dict[str, Any]:
    """The phase seconds of a finished run folder (summary.json), the base evaluation's share of the
    evaluations, and the bootstrap's training steps and plateau stop (iter_0's train markers)."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise SystemExit(f"{run_dir}: no summary.json (the run has not finished)")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    phases = {k: float(summary["seconds"].get(k, 0.0)) for k in PHASES}
    staged = sum(phases.values())
    base_eval = 0.0
    base_marker = run_dir / "base" / "DONE.eval"
    if base_marker.is_file():
        base_eval = float(read_done(run_dir / "base", "eval").get("seconds", 0.0))
    bootstrap_train = {}
    for marker in sorted((run_dir / "iter_0").glob("DONE.train_*")):
        info = read_done(run_dir / "iter_0", marker.name.removeprefix("DONE."))
        bootstrap_train[marker.name.removeprefix("DONE.train_")] = {
            k: info.get(k) for k in ("steps", "plateau_stop_step", "loss", "tokens", "train_seconds", "reused_from")
        }
    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "phases": {k: round(v, 1) for k, v in phases.items()},
        "staged_seconds": round(staged, 1),
        "base_eval_seconds": round(base_eval, 1),
        "bootstrap_train": bootstrap_train,
        "dev_em": {"base": (summary.get("base") or {}).get("em"), "m0": (summary.get("bootstrap") or {}).get("em"),
                   "iterations": [r.get("em") for r in summary.get("iterations", [])]},
    }
    if wall is not None:
        out["wall_seconds"] = round(wall, 1)
        out["outside_stages_seconds"] = round(wall - staged, 1)
    return out


def print_times(t: dict[str, Any]) -> None:
    total = t.get("wall_seconds") or t["staged_seconds"]
    print(f"\n{t['run_dir']}: {total / 60:.1f} min" + (" wall" if "wall_seconds" in t else " of stage time"))
    print("| phase | seconds | share |\n|---|---|---|")
    rows = [(k, v) for k, v in t["phases"].items()]
    if "outside_stages_seconds" in t:
        outside = t["outside_stages_seconds"]
        rows.append(("outside the stages (start-up, model conversion, index)" if outside >= 0 else
                     "stages beside each other (eval_beside): their seconds exceed the wall by", abs(outside)))
    for name, secs in rows:
        extra = f" (raw base {t['base_eval_seconds']:.0f} s)" if name == "eval" and t["base_eval_seconds"] else ""
        print(f"| {name}{extra} | {secs:.0f} | {secs / total:.0%} |" if total else f"| {name} | {secs:.0f} | |")
    for adapter, info in t["bootstrap_train"].items():
        stop = info.get("plateau_stop_step")
        print(f"bootstrap adapter {adapter}: {info.get('steps')} steps"
              + (f", stopped on a flat loss at step {stop}" if stop else ", trained to the end")
              + (f", loss {info['loss']:.3f}" if isinstance(info.get("loss"), float) else "")
              + (f" (reused from {info['reused_from']})" if info.get("reused_from") else ""))


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """b's seconds over a's, per phase and in total (None where a spent none)."""
    ratios: dict[str, float | None] = {}
    for k in PHASES:
        ratios[k] = round(b["phases"][k] / a["phases"][k], 3) if a["phases"][k] else None
    ta, tb = a.get("wall_seconds") or a["staged_seconds"], b.get("wall_seconds") or b["staged_seconds"]
    ratios["total"] = round(tb / ta, 3) if ta else None
    return ratios


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--read", nargs="+", metavar="RUN", help="only read these finished run folders")
    parser.add_argument("--cold", action="store_true", help="an empty cache home, as on a fresh machine")
    parser.add_argument("--output_dir", default="runs/bench_default", help="the timed run's folder (must not exist)")
    parser.add_argument("--processes", type=int, default=None,
                        help="start the recipe under torchrun with this many processes (default: as the recipe starts)")
    args, overrides = parser.parse_known_args(argv)
    load_before = os.getloadavg()
    if args.read:
        times = [run_times(Path(r)) for r in args.read]
    else:
        out = Path(args.output_dir)
        if out.exists():
            raise SystemExit(f"{out} exists: a timed run starts from nothing (remove it or name another --output_dir)")
        env = dict(os.environ)
        with tempfile.TemporaryDirectory(prefix="knowtrace_cold_cache_") as cache:
            if args.cold:
                env["KNOWTRACE_CACHE"] = cache
            launcher = [] if args.processes is None else [
                "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.processes)]
            cmd = [sys.executable, *launcher, str(REPO / "recipes" / "selftrain.py"), "--output_dir", str(out), *overrides]
            print("running:", " ".join(cmd), "(cold cache home)" if args.cold else "", flush=True)
            start = time.perf_counter()
            subprocess.run(cmd, env=env, check=True)
            wall = time.perf_counter() - start
        times = [run_times(out, wall)]
    for t in times:
        print_times(t)
    ratios = None
    if len(times) == 2:
        ratios = compare(times[0], times[1])
        print("\nsecond / first: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in ratios.items()))
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min; 2 cores idle is ~0)")
    print(json.dumps({"runs": times, "ratios": ratios, "load_before": load_before[0], "load_after": load_after[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
