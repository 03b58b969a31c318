"""Self-train KnowTrace (the paper's Algorithm 2, with a bootstrap stage) and print its per-iteration table.

    accelerate launch recipes/selftrain.py [--config recipes/configs/selftrain_*.yaml] [--key value ...]

The recipe is `knowtrace_train.commands.selftrain` (also `knowtrace-train selftrain`, the console script):
its docstring, or `--help`, says what it does and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.commands.selftrain import (  # noqa: E402,F401
    grid_points, load, main, point_name, run, run_all, run_one, run_seeds, yaml_scalar,
)

if __name__ == "__main__":
    sys.exit(main())
