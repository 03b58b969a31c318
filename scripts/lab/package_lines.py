"""What bounds the package's size: lines of knowtrace_train/ per band, and of them the code lines (neither a
docstring, a comment nor blank), read with `ast`.

    python scripts/lab/package_lines.py

One row per band, the last line JSON.
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "knowtrace_train"


def _docstring_lines(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def file_lines(path: Path) -> tuple[int, int]:
    """(lines, code lines) of one module."""
    text = path.read_text()
    lines = text.splitlines()
    doc = _docstring_lines(ast.parse(text))
    code = sum(1 for i, line in enumerate(lines, 1)
               if line.strip() and not line.strip().startswith("#") and i not in doc)
    return len(lines), code


def band(path: Path) -> str:
    parts = path.relative_to(PKG).parts
    return parts[0] if len(parts) > 1 else "top-level modules"


def main() -> None:
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p in sorted(PKG.rglob("*.py")):
        lines, code = file_lines(p)
        rows[band(p)][0] += lines
        rows[band(p)][1] += code
    for name, (lines, code) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:20} {lines:7,} lines {code:7,} code")
    total = [sum(r[0] for r in rows.values()), sum(r[1] for r in rows.values())]
    print(f"{'total':20} {total[0]:7,} lines {total[1]:7,} code")
    print(json.dumps({"bands": {k: {"lines": v[0], "code": v[1]} for k, v in rows.items()},
                      "lines": total[0], "code": total[1]}))


if __name__ == "__main__":
    main()
