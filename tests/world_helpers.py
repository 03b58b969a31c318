"""The synthetic world's generator for the tests: scripts/world/, what scripts/make_world.py runs (the package ships
only the files it writes, knowtrace_train/data/world_files/). Importing this module puts scripts/ on the import path,
as running scripts/make_world.py does, so that `world` and its modules (world.kb, world.names, world.passages,
world.questions) import after it."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from world import DEFAULT_SIZES, SPLITS, World, make_world, world_facts, write_world  # noqa: E402

__all__ = ["DEFAULT_SIZES", "SPLITS", "World", "make_world", "world_facts", "write_world"]
