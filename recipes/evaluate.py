"""Evaluate a method (KnowTrace by default) on a dataset split and print EM, F1 and the paper's cost columns.

    python recipes/evaluate.py --config recipes/configs/eval_*.yaml [--key value ...]

The recipe is `knowtrace_train.commands.evaluate` (also `knowtrace-train evaluate`, the console script):
its docstring, or `--help`, says what it does and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.commands.evaluate import main, run  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
