"""What works on this machine, and how fast: one command before a long run, on a GPU or on a CPU.

    python scripts/doctor.py [--size small|smoke] [--skip CHECK,...]

The script is `knowtrace_train.commands.doctor` (also `knowtrace-train doctor`, the console script):
its docstring, or `--help`, says what it does and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.commands.doctor import main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
