"""scripts/lab/package_lines.py: a module's lines and its code lines (no docstring, comment or blank line)."""

from __future__ import annotations

import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lab" / "package_lines.py"


def test_docstrings_comments_and_blank_lines_are_not_code(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""A module.\n\nTwo lines of doc."""\n\n# a comment\nX = 1\n\n\nclass A:\n    """Doc."""\n\n'
                   '    def f(self):\n        """Its\n        doc."""\n        return "not a docstring"\n')
    assert runpy.run_path(str(SCRIPT))["file_lines"](src) == (15, 4)  # X = 1, class A:, def f, return
