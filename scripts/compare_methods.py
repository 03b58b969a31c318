"""Compare methods (KnowTrace, the paper's baselines, any registered one) on datasets with one model, in the paper's Table 1 and Table 5 layouts.

    python scripts/compare_methods.py --config recipes/configs/compare_world.yaml
    python scripts/compare_methods.py --config recipes/configs/compare_world.yaml --limit 10 --generator.model /work/runs/m0/iter_0/model
    python scripts/compare_methods.py --config recipes/configs/compare_fair_world.yaml   # the fair table of self-training runs

The config (`knowtrace_train.compare.CompareConfig`) lists the methods (strategy sections; the first is
the reference of the paired tests), the datasets (dataset + corpus sections), one generator, one
retriever and a question limit. Each cell's trajectories go to <output_dir>/<dataset>/<method>.jsonl;
a rerun resumes them. Prints markdown tables (Table 1: EM/F1 per dataset and EM with its 95% interval;
EM by question kind; EM difference from the reference with its exact McNemar p; Table 5: rounds,
retrieved tokens, seconds per question; Mechanism: per dataset and method, the method's own statistics
of whether its mechanism runs, each "name: numerator/denominator = value"); the last line is one JSON
object of every figure (a cell's statistics under "mechanism").

A config with a top-level `runs:` key is a `FairConfig` of scripts/lab/fair.py instead: it names self-training
run folders (label: folder) and reads their evaluations, running no model; the script prints the fair
table (per label and stage: n, EM with its interval, bridge and comparison EM, F1, the mechanism
statistics, the seconds the run spent) and each label's best stage against the reference's; the last line
is one JSON object of it (docs/baselines.md, "The fair table").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent / "lab"))  # the fair table (lab/fair.py)

from knowtrace_train.compare import CompareConfig, compare, figures, format_tables, load_compare_config  # noqa: E402
from knowtrace_train.config import RecipeArgs, read_yaml, run_recipe  # noqa: E402
from fair import FairConfig, fair_figures, fair_table, format_fair_table, load_fair_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_recipe(argv, __doc__, "YAML config (recipes/configs/compare_*.yaml)", load, run,
                      config_class=CompareConfig)


def load(path: str | None, overrides: list[str]) -> CompareConfig | FairConfig:
    """A FairConfig where the file has a top-level `runs:` key, else a CompareConfig."""
    if path is not None and "runs" in read_yaml(path):
        return load_fair_config(path, overrides)
    return load_compare_config(path, overrides)


def run(config: CompareConfig | FairConfig, args: RecipeArgs) -> int:
    if isinstance(config, FairConfig):
        rows = fair_table(config)
        print(format_fair_table(rows, config.reference))
        print(json.dumps(fair_figures(rows, config)))
        return 0
    cells = compare(config, progress=not args.quiet)
    print(format_tables(cells))
    print(json.dumps(figures(cells, config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
