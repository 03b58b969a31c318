"""Compare methods (KnowTrace, the paper's baselines, any registered one) on datasets with one model, in the paper's Table 1 and Table 5 layouts.

    python scripts/compare_methods.py --config recipes/configs/compare_world.yaml
    python scripts/compare_methods.py --config recipes/configs/compare_world.yaml --limit 10 --generator.model /work/runs/m0/iter_0/model

The config (`knowtrace_train.compare.CompareConfig`) lists the methods (strategy sections; the first is
the reference of the paired tests), the datasets (dataset + corpus sections), one generator, one
retriever and a question limit. Each cell's trajectories go to <output_dir>/<dataset>/<method>.jsonl;
a rerun resumes them. Prints markdown tables (Table 1: EM/F1 per dataset and EM with its 95% interval;
EM by question kind; EM difference from the reference with its exact McNemar p; Table 5: rounds,
retrieved tokens, seconds per question; Mechanism: per dataset and method, the method's own statistics
of whether its mechanism runs, each "name: numerator/denominator = value"); the last line is one JSON
object of every figure (a cell's statistics under "mechanism").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.compare import CompareConfig, compare, figures, format_tables, load_compare_config  # noqa: E402
from knowtrace_train.config import RecipeArgs, run_recipe  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return run_recipe(argv, __doc__, "YAML config (recipes/configs/compare_*.yaml)", load_compare_config, run,
                      config_class=CompareConfig)


def run(config: CompareConfig, args: RecipeArgs) -> int:
    cells = compare(config, progress=not args.quiet)
    print(format_tables(cells))
    print(json.dumps(figures(cells, config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
