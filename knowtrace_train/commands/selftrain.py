"""Self-train KnowTrace (the paper's Algorithm 2, with a bootstrap stage) and print its per-iteration table.

    python recipes/selftrain.py                                   # the embedded default (CPU, minutes)
    python recipes/selftrain.py --config recipes/configs/selftrain_star.yaml --output_dir runs/star
    torchrun --nproc_per_node 2 recipes/selftrain.py --iterations 3          # data-parallel
    accelerate launch --num_processes 2 recipes/selftrain.py --config recipes/configs/selftrain_paper_gpu.yaml
    knowtrace-train selftrain --report_to '[tensorboard,trackio]'    # the console script; tracked

With no --config the defaults of SelfTrainConfig run (the same values as
recipes/configs/selftrain_default.yaml). Any config key can be overridden (`--iterations 3`,
`--strategy.max_rounds 3`, `--train.epochs 1`). The run folder is --output_dir, else runs/<name>;
rerunning the same command continues a killed run at its first unfinished stage. Each model's row of the
table is printed as it finishes; after the last stage the wall time, then the whole table once more, alone,
the small-dev-set note where the dev set is too small for the differences shown, and the report's path.
`--report_to` (tensorboard, trackio, wandb, mlflow or a list) tracks every trainer and the loop's figures per
iteration in <run folder>/tracking/ (knowtrace_train/tracking.py). The last line
printed is one JSON object: the run folder, dev EM of the raw base, of M0 and of every iteration,
the FA ratio of every iteration and the seconds per phase. A config with a `grid` (the paper's
search over epochs, batch size and learning rate) runs every combination in <run folder>/<point>
and prints one such object per point, then picks the point with the best final dev EM and, where
data.test is set, evaluates its final model on the held-out test questions (grid.json in the run folder).
`--seeds 0,1,2` runs the config once per seed in <run folder>/seed_<s> and prints the across-seed table
(mean dev EM per iteration, each seed's, the pooled paired test against M0); the last line is then one
object with every seed's line and the table.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from knowtrace_train.config import (
    ConfigError,
    RecipeArgs,
    load_config,
    parse_overrides,
    read_yaml,
    run_recipe,
)
from knowtrace_train.report import headline, run_table, shape_table, small_dev_note, table_header, table_row
from knowtrace_train.report_html import write_report
from knowtrace_train.selftrain import SelfTrain
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.selftrain.grid import GRID_FILE, evaluate_on_test, finish_grid


def load(config_path: str | None, overrides: list[str]) -> SelfTrainConfig:
    """The config: the file (or the defaults), the overrides; `name` defaults to the file's stem."""
    if config_path is not None and "name" not in read_yaml(config_path) and "name" not in parse_overrides(overrides):
        overrides = [*overrides, "--name", Path(config_path).stem]
    config = load_config(SelfTrainConfig, config_path, overrides)
    try:
        config.validate()
    except ValueError as e:
        raise ConfigError(f"{blamed(config_path, overrides, str(e))}: {e}") from e
    return config


def blamed(config_path: str | None, overrides: list[str], message: str) -> str:
    """Where a value that `message` names came from: the command line where one of its keys is named there,
    else the config file, else the defaults."""
    named = [k for k in parse_overrides(overrides) if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", message)]
    if named:
        return f"command line (--{named[0]})"
    return config_path or "defaults"


def grid_points(grid: dict[str, list]) -> list[dict[str, object]]:
    """Every combination of the grid's values, the first key varying slowest."""
    points: list[dict[str, object]] = [{}]
    for key, values in grid.items():
        points = [{**p, key: v} for p in points for v in values]
    return points


def yaml_scalar(v: object) -> str:
    """`v` as a command-line value that YAML reads back as the same type (YAML needs the dot in 1.0e-05)."""
    if isinstance(v, float):
        text = repr(v)
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exp = text.split("e")
            text = f"{mantissa}.0e{exp}"
        return text
    return json.dumps(v)


def point_name(point: dict[str, object]) -> str:
    """A folder name for a grid point: `epochs1_learning_rate0.0001`."""
    return "_".join(f"{k.split('.')[-1]}{v}" for k, v in point.items())


def run_one(config: SelfTrainConfig, quiet: bool) -> dict:
    """One run: its table row by row as the models finish, then, after the last stage, the wall time, the whole
    table once more alone, the small-dev-set note, the report's path (the caller prints the JSON line last)."""
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def show(m: dict[str, Any]) -> None:
        rows.append(m)
        print(table_row(m), flush=True)

    run = SelfTrain(config, progress=not quiet, on_metrics=show)
    if run.procs.is_main:
        print(f"run folder: {run.run_dir}\n{table_header()}", flush=True)
    summary = run.run()
    if run.procs.is_main:
        beside = " (evaluations ran beside the other stages, so the stages' seconds add up to more than the wall)"
        print(f"wall time {time.perf_counter() - t0:.0f}s this invocation; stage seconds"
              + (beside if run.evaluations.beside else "") + ": "
              + ", ".join(f"{k} {v:.0f}" for k, v in summary["seconds"].items()), flush=True)
        report = write_report([run.run_dir], run.run_dir / "report.html")
        sys.stderr.flush()  # the log's last lines before the table, on a terminal that shows both
        print(f"\n{run_table(rows)}", flush=True)
        shapes = shape_table(rows)
        if shapes:
            print(f"\nhow each model explores (dev) and why FA filtered (rollouts):\n{shapes}", flush=True)
        note = small_dev_note(summary)
        if note:
            print(f"note: {note}", flush=True)
        print(f"report: {report['report']} (the run view and every dev question's traced graph)", flush=True)
    return headline(summary)


def main(argv: list[str] | None = None) -> int:
    config_help = "YAML config (recipes/configs/selftrain_*.yaml); default: the embedded default"
    return run_recipe(argv, __doc__, config_help, load, run, config_class=SelfTrainConfig)


def run(config: SelfTrainConfig, args: RecipeArgs) -> int:
    line = run_all(config, args)  # a ConfigError here: a run folder started with another config
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(line))
    return 0


def run_seeds(config: SelfTrainConfig, args: RecipeArgs) -> dict:
    """One run per seed in <run folder>/seed_<s> (a finished seed is skipped, a killed one resumed), then the
    across-seed table of the arm (knowtrace_train/arms.py)."""
    from knowtrace_train.arms import arms_table, compare_arms, group_arms
    from knowtrace_train.report import load_run

    if config.grid:
        raise ConfigError(f"{args.config or 'defaults'}: seeds and grid together: run the grid point you chose over seeds")
    root = Path(config.output_dir or Path("runs") / config.name)
    lines = []
    for s in config.seeds:
        sub = load(args.config, [*args.overrides, "--seeds=[]", "--seed", str(s), "--output_dir",
                                 str(root / f"seed_{s}"), "--run_name", f"{config.run_name or root.name}/seed_{s}"])
        lines.append({"seed": s, **run_one(sub, args.quiet)})
    result = compare_arms(group_arms([load_run(root / f"seed_{s}") for s in config.seeds]))
    if int(os.environ.get("RANK", "0")) == 0:
        print(arms_table(result), flush=True)
    return {"run_dir": str(root), "seeds": lines, "arms": result["arms"]}


def run_all(config: SelfTrainConfig, args: RecipeArgs) -> dict:
    if config.seeds:
        return run_seeds(config, args)
    if not config.grid:
        line = run_one(config, args.quiet)
        if config.data.test and int(os.environ.get("RANK", "0")) == 0:
            line["test"] = evaluate_on_test(config, Path(line["run_dir"]), Path(line["run_dir"]) / "test",
                                            progress=not args.quiet)
    else:
        # the search grid: one run per combination, each in its own folder under the run folder
        root = Path(config.output_dir or Path("runs") / config.name)
        results = []
        for point in grid_points(config.grid):
            extra = [f"--{k}={yaml_scalar(v)}" for k, v in point.items()]
            sub = load(args.config, [*args.overrides, *extra, "--grid={}", "--output_dir",
                                     str(root / point_name(point)),
                                     "--run_name", f"{config.run_name or root.name}/{point_name(point)}"])
            results.append({"point": point, **run_one(sub, args.quiet)})
        # the point chosen on dev, its final model on data.test (dev only without it), grid.json
        line = {"run_dir": str(root), "points": results, **finish_grid(config, root, results, progress=not args.quiet)}
        if int(os.environ.get("RANK", "0")) == 0:
            test = f"test EM {line['test']['em']}" if line["test"] else "dev only (data.test is not set)"
            print(f"chosen on dev: {line['chosen']} (dev EM {line['dev_em']}); {test}; {root / GRID_FILE}", flush=True)
    return line

