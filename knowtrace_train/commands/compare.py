"""Compare self-training runs: a table of dev EM, F1 and FA ratio per iteration, and the paper's Figure 2.

    python scripts/compare_runs.py runs/selftrain_default runs/selftrain_star --out runs/figure2.png

Each RUN is a run folder of recipes/selftrain.py (its summary.json; a running run shows the
iterations finished so far). The figure has (a) dev EM per iteration, from M0 (iteration 0), with
its 95% bootstrap interval as an error bar where the run has one (none under 20 dev questions), and
(b) the FA ratio of each iteration's rollouts, one line per run: backtracing and non-backtracing
runs side by side when both are given. The table shows EM on bridge questions apart and the
evidence-supported EM. With two or more runs, each later run is compared with the first, model by
model, on the same dev questions (matched by id): the EM difference, its paired 95% interval, the
exact McNemar p-value and the questions only one run answered. `--kind bridge` adds each run's models
on the bridge questions alone, with their 95% intervals and the paired tests against the run's M0 and
the first run (each run a one-seed arm, as below). The last line printed is one JSON object (with
those comparisons under "between", and the kind's under "by_kind").

Several runs of one mode are the seeds of one arm (`recipes/selftrain.py --seeds 0,1,2` writes them as
RUN/seed_<s>):

    python scripts/compare_runs.py runs/scale/backtrace/seed_* runs/scale/star/seed_* --out runs/scale_seeds.png

Then it prints, per arm and model, the mean dev EM over the seeds with its 95% interval, each seed's EM and the
pooled paired test against M0; and each arm against the first on the seeds both ran (knowtrace_train/arms.py:
questions are the unit, a bootstrap over questions for the interval and a sign-flip permutation test over
questions for the p-value). The figure draws every seed as a thin line and the mean with its interval as a
thick one. An arm's runs must share their config but for the seed (a run of other settings is refused, the
differing keys named); a run that has not finished is listed and left out.

Runs stopped after iteration Z (a time limit) or still going are seeds for their models so far with `--upto Z`:
the table and tests then cover M0..MZ, and a run without one of those is still incomplete.

An ablation's arms differ in a config key: `--arm KEY` (dotted, repeatable) groups the runs by mode and by that
key's value, then compares the arms as above, M0 included (runs of `--iterations 0` compare their M0s):

    python scripts/compare_runs.py runs/q64_s0 runs/q64_s1 runs/q48_s0 runs/q48_s1 --arm bootstrap.questions --kind bridge
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from knowtrace_train.arms import (
    arms_table, compare_arms, group_arms, plot_arms, replicated, run_arms, started_run)
from knowtrace_train.errors import MissingExtraError, user_errors
from knowtrace_train.report import (
    between_runs_table,
    comparison_table,
    em_intervals,
    load_run,
    paired_between_runs,
    plot_runs,
    series,
)


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (runs/<name>)")
    parser.add_argument("--out", default="runs/compare_runs.png", help="figure file (.png, .svg, .pdf)")
    parser.add_argument("--title", default="", help="figure title")
    parser.add_argument("--kind", choices=("bridge", "comparison"), default=None,
                        help="also the table of this kind of dev question alone, with intervals and paired tests "
                             "(single runs: each run alone against its M0, and against the first run)")
    parser.add_argument("--upto", type=int, default=None, metavar="Z",
                        help="compare the seeds' models up to M<Z> only: a run stopped (or still going) after iteration Z "
                             "counts as a seed for them")
    parser.add_argument("--arm", action="append", default=[], metavar="KEY",
                        help="also group the runs into arms by this config key's value (dotted, e.g. bootstrap.questions; "
                             "repeatable): the arms of an ablation")
    args = parser.parse_args(argv)
    summaries, started = [], []
    try:
        for r in args.runs:
            if not (Path(r) / "summary.json").is_file() and (Path(r) / "config.yaml").is_file():
                started.append(r)  # still building M0: an incomplete seed of its arm
                summaries.append(started_run(r))
            else:
                summaries.append(load_run(r))
    except FileNotFoundError as e:  # not a run folder (a damaged file of one is a user error naming it: read_json)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.arm or args.upto is not None or replicated(summaries):  # seeds of one setting: arms (their other runs must be seeds of one setting too)
        return compare_seeds(group_arms(summaries, args.arm, args.upto), args)
    if started:
        print(f"error: {started[0]}: no summary.json yet (the run has evaluated no model)", file=sys.stderr)
        return 2
    print(comparison_table(summaries))
    between = paired_between_runs(summaries)
    if between:
        print()
        print(between_runs_table(between))
    by_kind = None
    if args.kind:
        by_kind = compare_arms(run_arms(summaries), kind=args.kind)
        print()
        print(arms_table(by_kind))
    figure = draw(plot_runs, summaries, args)
    runs = []
    for s in summaries:
        ex, ey, fx, fy = series(s)
        runs.append({"run_dir": s["run_dir"], "mode": s["mode"], "em": dict(zip(ex, ey)),
                     "em_interval": dict(zip(ex, em_intervals(s))), "fa_ratio": dict(zip(fx, fy))})
    print(json.dumps({"figure": figure, "runs": runs, "between": between,
                      **({"by_kind": by_kind} if by_kind else {})}))
    return 0


def draw(plot, figures, args) -> str | None:
    """The figure's path; without matplotlib one line says so and the tables printed above stand."""
    try:
        return str(plot(figures, args.out, args.title))
    except MissingExtraError as e:
        print(f"{e.label}: {e} (no figure; the tables stand)", file=sys.stderr)
        return None


def compare_seeds(arms, args) -> int:
    """Several runs (seeds) per arm: the across-seed table, the pooled tests and the figure of every seed."""
    result = compare_arms(arms)
    print(arms_table(result))
    line = {"figure": draw(plot_arms, result, args), **result}
    if args.kind:
        line["by_kind"] = compare_arms(arms, kind=args.kind)
        print()
        print(arms_table(line["by_kind"]))
    print(json.dumps(line))
    return 0

