"""`knowtrace-train`, the toolkit's one command line (as TRL has `trl sft`): a subcommand per recipe and script.

    knowtrace-train selftrain [--config FILE] [--key value ...]    recipes/selftrain.py
    knowtrace-train evaluate --config FILE [--run RUN] [...]       recipes/evaluate.py
    knowtrace-train report RUN_OR_ROLLOUTS... [--out FILE]         scripts/report.py
    knowtrace-train export RUN [--iteration Z]                     scripts/export.py
    knowtrace-train compare RUN... [--out FIGURE]                  scripts/compare_runs.py
    knowtrace-train data fetch|list|stats|build-corpus ...         python -m knowtrace_train.data
    knowtrace-train doctor [--size small|smoke]                    scripts/doctor.py

Each subcommand runs what its recipe or script runs (their `main`, in knowtrace_train/commands/), with the same
options, output and exit status; `knowtrace-train <command> --help` lists its options. The recipes and scripts
stay, and `accelerate launch recipes/selftrain.py` stays the main command (`accelerate launch -m
knowtrace_train.cli selftrain` launches the same from an installed package). An unknown command is one line on
stderr and exit status 2; every command's user errors go through the one boundary (errors.guarded).
"""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from typing import Iterator, Sequence

from knowtrace_train.errors import debug_requested, guarded

PROG = "knowtrace-train"

#: command -> (module whose `main(argv)` it runs, what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "selftrain": ("knowtrace_train.commands.selftrain",
                  "self-train a method (KnowTrace's Algorithm 2) and print its per-iteration table"),
    "evaluate": ("knowtrace_train.commands.evaluate",
                 "evaluate a method or a run's model on a dataset split: EM, F1 and the cost columns"),
    "report": ("knowtrace_train.commands.report", "write the HTML report of runs or trajectory files"),
    "export": ("knowtrace_train.commands.export", "export a run's adapters as merged, checked models"),
    "compare": ("knowtrace_train.commands.compare",
                "compare runs (seeds as arms): the table, the paired tests, the paper's Figure 2"),
    "data": ("knowtrace_train.data.__main__", "fetch, inspect and prepare benchmark files (fetch, list, stats, build-corpus)"),
    "doctor": ("knowtrace_train.commands.doctor", "what works on this machine, and how fast"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} <command> [options]", "",
             "Self-train retrieval-augmented LLMs on knowledge they trace themselves (KnowTrace).", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", f"`{PROG} <command> --help` lists a command's options."]
    return "\n".join(lines)


@contextmanager
def _program_name(name: str) -> Iterator[None]:
    """sys.argv[0] as `name` inside the block: argparse names the program after it in usage lines and --help."""
    before = sys.argv[0] if sys.argv else None
    if sys.argv:
        sys.argv[0] = name
    else:
        sys.argv.append(name)
    try:
        yield
    finally:
        if before is None:
            sys.argv.pop(0)
        else:
            sys.argv[0] = before


def main(argv: Sequence[str] | None = None) -> int:
    """Run `argv`'s command with the rest of `argv`; its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "--version":
        from importlib import metadata

        try:
            print(f"{PROG} {metadata.version('knowtrace-train')}")
        except metadata.PackageNotFoundError:
            print(f"{PROG} (not installed: run from a checkout)")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"{PROG}: no command {name!r} (the commands: {', '.join(COMMANDS)}; {PROG} --help)", file=sys.stderr)
        return 2
    return guarded(lambda: _run_command(name, rest), debug_requested(rest))  # each command's main is guarded too


def _run_command(name: str, rest: list[str]) -> int:
    module = importlib.import_module(COMMANDS[name][0])
    prog = f"{PROG} {name}"
    if name == "data":
        return module.main(rest, prog=prog)
    with _program_name(prog):
        return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
