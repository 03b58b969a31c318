"""Write the HTML report of self-training runs or trajectory files: one self-contained page with the traced graphs.

    python scripts/report.py RUN_OR_ROLLOUTS... [--out report.html]

The script is `knowtrace_train.commands.report` (also `knowtrace-train report`, the console script):
its docstring, or `--help`, says what it does and prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.commands.report import main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
