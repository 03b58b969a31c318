"""The synthetic world that ships inside the package (knowtrace_train/data/world_files/), found from anywhere.

The defaults of every config name the world as a checkout does, `data/world/<file>` (in a checkout `data/world` links
to the package's folder). Run outside a checkout, from an installed wheel, that relative path is not there:
`bundled_path` then gives the packaged copy, so `knowtrace-train selftrain` and `evaluate` run with their defaults
wherever they are installed. A path that exists as given, or that is not the world's, is left as it is.
"""

from __future__ import annotations

from pathlib import Path

#: the world's files in the installed package: train/dev/test.jsonl, corpus.jsonl, README.md
WORLD_DIR = Path(__file__).resolve().parent / "world_files"
#: how configs and the checkout name the world's folder
CHECKOUT_WORLD = ("data", "world")


def bundled_path(path: str | None) -> str | None:
    """`path`, or, where it is a relative `data/world/<file>` that does not exist from here, the packaged file."""
    if not path:
        return path
    p = Path(path)
    if p.is_absolute() or p.exists() or p.parts[:2] != CHECKOUT_WORLD or len(p.parts) != 3:
        return path
    packaged = WORLD_DIR / p.parts[2]
    return str(packaged) if packaged.is_file() else path
