"""Errors a user causes (a config, a data file, a corpus, a run folder, a model, a missing extra): one line, no traceback.

Every error class a user's input or install can raise derives from `UserError`; a command's `main` wrapped
in `user_errors` prints such an error as `<label>: <message>` on stderr and exits 2. The program's own
errors (a bug: KeyError, AssertionError, ...) keep their traceback. `--debug` on any command line, or
`KNOWTRACE_DEBUG=1`, brings the traceback back for user errors too.

`import_extra(module, extra, feature)` imports what an optional extra installs, or raises
`MissingExtraError` naming `pip install 'knowtrace-train[<extra>]'`: every import of an extra's package
goes through it (tests/test_dependencies.py holds the package to that).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from types import ModuleType
from typing import Callable, Sequence, TypeVar

DEBUG_ENV = "KNOWTRACE_DEBUG"
DEBUG_FLAG = "--debug"


class UserError(Exception):
    """An error in what the user gave (config, data, corpus, run folder, model, install); `label` heads its line."""

    label = "error"


class RunError(UserError, ValueError):
    """What the user gave turns out unworkable only once the run is under way: no gold trajectory in the
    bootstrap's questions, a split with no question left, a run folder whose files were changed, a model
    the run cannot train or merge. A ValueError too, as these were before they had a class."""

    label = "run error"


class LaunchError(UserError, RuntimeError):
    """The processes were launched otherwise than the run can work with (torchrun's and accelerate's counts
    disagree). A RuntimeError too, as it was before it had a class."""

    label = "launch error"


class MissingExtraError(UserError, ImportError):
    """A feature was chosen whose optional extra is not installed."""

    label = "missing extra"


def import_extra(module: str, extra: str, feature: str) -> ModuleType:
    """`module`, imported; where it is absent, a `MissingExtraError` that says `feature` needs the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise MissingExtraError(
            f"{feature} needs {top} (not installed: {e.name or top}): pip install 'knowtrace-train[{extra}]'"
        ) from e


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (its pip name), None where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def debug_requested(argv: Sequence[str] = ()) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report_user_error(e: UserError) -> int:
    """Print `e` as its one line on stderr; the exit status of a command that stops on it (2)."""
    print(f"{e.label}: {e}  ({DEBUG_FLAG} or {DEBUG_ENV}=1 shows the traceback)", file=sys.stderr)
    return 2


R = TypeVar("R")


def user_errors(main: Callable[..., R]) -> Callable[..., R | int]:
    """Wrap a command's `main(argv=None)`: a `UserError` prints one line and returns 2 (unless debugging).
    `--debug` is taken off the command line before `main` sees it."""

    @functools.wraps(main)
    def wrapped(argv: Sequence[str] | None = None, *args, **kwargs):
        given = list(sys.argv[1:] if argv is None else argv)
        debug = debug_requested(given)
        try:
            return main([a for a in given if a != DEBUG_FLAG], *args, **kwargs)
        except UserError as e:
            if debug:
                raise
            return report_user_error(e)

    return wrapped
