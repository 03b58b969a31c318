"""Export a run's adapters: merged ready-to-serve models (checked against the adapters) and adapter copies.

    python scripts/export.py runs/<name> [--iteration z]

The script is `knowtrace_train.commands.export` (also `knowtrace-train export`, the console script):
its docstring, or `--help`, says what it does and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.commands.export import main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
