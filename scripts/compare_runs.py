"""Compare self-training runs: a table of dev EM, F1 and FA ratio per iteration, and the paper's Figure 2.

    python scripts/compare_runs.py RUN... [--out FIGURE]

The script is `knowtrace_train.commands.compare` (also `knowtrace-train compare`, the console script):
its docstring, or `--help`, says what it does and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.commands.compare import compare_seeds, draw, main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
