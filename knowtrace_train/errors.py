"""Errors a user causes (a config, a data file, a corpus, a run folder, a model, a missing extra): one line, no traceback.

Every error class a user's input or install can raise derives from `UserError`. `guarded(call, debug)` is the one
boundary every command goes through (`user_errors` wraps a command's `main`; `config.run_recipe` and the data
command line call it): it first checks the toolkit's environment variables (`check_environment`), then runs the
command; a user's error ends it with one line, `<label>: <message>` on stderr, and exit status 2. A user's error is
a `UserError`, and what `as_user_error` takes for one where no reader wrapped it: bytes that are not UTF-8, an OS
error on a path (a folder where a file was meant, a path that cannot be written, a missing file), a JSON document
cut short. Ctrl-C ends with one line saying that the same command continues the run (exit status 130). The
program's own errors (a bug: KeyError, AssertionError, ...) keep their traceback. `--debug` on any command line,
or `KNOWTRACE_DEBUG=1`, brings the traceback back for user errors too.

`import_extra(module, extra, feature)` imports what an optional extra installs, or raises
`MissingExtraError` naming `pip install 'knowtrace-train[<extra>]'`: every import of an extra's package
goes through it (tests/test_dependencies.py holds the package to that).
"""

from __future__ import annotations

import errno
import functools
import importlib
import json
import os
import sys
from types import ModuleType
from typing import Callable, Sequence, TypeVar

DEBUG_ENV = "KNOWTRACE_DEBUG"
DEBUG_FLAG = "--debug"

R = TypeVar("R")


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


class EnvironmentVariableError(UserError, ValueError):
    """One of the toolkit's environment variables holds a value it cannot use."""

    label = "environment error"


class InputFileError(UserError, ValueError):
    """A file the user gave could not be read or written as it is (not UTF-8, a folder, not writable, cut short)."""

    label = "file error"


#: the toolkit's environment variables with a number for a value: name -> (what it is, the least value)
NUMBER_ENVS: dict[str, tuple[str, float]] = {
    "KNOWTRACE_PROGRESS_SECONDS": ("seconds between two progress lines", 0.0),
    "KNOWTRACE_REUSE_WAIT_LOG_S": ("seconds between two lines of a run waiting for a reuse-cache entry", 0.0),
}


def env_number(name: str, default: float) -> float:
    """The number environment variable `name` holds (`default` where unset or empty), or an
    `EnvironmentVariableError` naming the variable, its value and what to do."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    what, least = NUMBER_ENVS.get(name, ("a number", float("-inf")))
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= least or value == float("inf"):
        raise EnvironmentVariableError(f"{name}={text!r}: expected {what}, a number >= {least:g}; "
                                       f"unset it (export -n {name}) or give a number")
    return value


def check_environment() -> None:
    """Every toolkit environment variable with a number for a value parses (`env_number`): a bad value stops a
    command in its first second, not at the first progress line hours in."""
    for name in NUMBER_ENVS:
        env_number(name, 0.0)


_WHAT_TO_DO = {
    errno.EISDIR: "it is a folder: name a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder: name another path",
    errno.ENOENT: "no such file or folder: check the path",
    errno.EACCES: "permission denied: choose a path you may use or change its permissions",
    errno.EPERM: "not permitted: choose a path you may use or change its permissions",
    errno.EROFS: "a read-only file system: choose a writable path",
    errno.EEXIST: "it exists already: remove it or name another path",
    errno.ENAMETOOLONG: "the name is too long: name a shorter path",
}


def _shown(b: bytes) -> str:
    return "0x" + b.hex()


def as_user_error(e: BaseException) -> UserError | None:
    """The one-line user error `e` stands for, or None where `e` is the program's own (a bug keeps its traceback)."""
    if isinstance(e, UserError):
        return e
    if isinstance(e, UnicodeDecodeError):
        return InputFileError(f"a file given is not UTF-8 text (byte {_shown(e.object[e.start:e.start + 1])} at "
                              f"offset {e.start}): save it as UTF-8, or name the right file")
    if isinstance(e, json.JSONDecodeError):
        return InputFileError(f"a JSON file is damaged ({e.msg} at line {e.lineno}, column {e.colno}): restore it "
                              "or remove it so that what wrote it writes it again")
    if isinstance(e, OSError) and (e.filename is not None or e.errno in _WHAT_TO_DO or e.errno in (errno.ENOSPC, errno.EDQUOT)):
        where = e.filename if e.filename is not None else "a path"
        if e.filename2 is not None and e.errno in (errno.EISDIR, errno.ENOTDIR, errno.EEXIST):
            where = e.filename2  # a rename onto a folder: the destination is the user's path
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            todo = "no space left on the device: free some space and rerun the same command"
        else:
            todo = _WHAT_TO_DO.get(e.errno, e.strerror or str(e))
        return InputFileError(f"{where}: {todo} ({e.strerror or type(e).__name__})")
    return None


INTERRUPTED = ("interrupted: rerun the same command to continue (a run goes on at its first unfinished stage; "
               "nothing half-written is read)")


def guarded(call: Callable[[], R], debug: bool) -> R | int:
    """The boundary of every command: `call()`'s result, or, for a user's error, its one line on stderr and 2
    (Ctrl-C: one line and 130). With `debug` a user's error keeps its traceback."""
    try:
        check_environment()
        return call()
    except KeyboardInterrupt:
        if debug:
            raise
        print(INTERRUPTED, file=sys.stderr)
        return 130
    except Exception as e:
        err = as_user_error(e)
        if err is None or debug:
            raise
        return report_user_error(err)



def user_errors(main: Callable[..., R]) -> Callable[..., R | int]:
    """Wrap a command's `main(argv=None)` in the boundary (`guarded`): a user's error prints one line and
    returns 2 (unless debugging). `--debug` is taken off the command line before `main` sees it."""

    @functools.wraps(main)
    def wrapped(argv: Sequence[str] | None = None, *args, **kwargs):
        given = list(sys.argv[1:] if argv is None else argv)
        return guarded(lambda: main([a for a in given if a != DEBUG_FLAG], *args, **kwargs), debug_requested(given))

    return wrapped
