"""Command line for benchmark files: ``python -m knowtrace_train.data <command> ...``.

Commands:
  fetch NAME... [--mirror DIR] [--source hub|url] [--verify] [--skip_bad]
      download a benchmark or corpus by name into $KNOWTRACE_CACHE/data/<name>/<revision>/
      (names: hotpotqa, 2wikimultihopqa, musique, wiki2017-abstracts, wiki2018-dpr; data/registry.py)
  list
      the names fetch knows, their sources and whether they are fetched
  stats PATH... [--format F] [--limit N] [--skip-bad]
      counts by dataset, type and hop count; the last line is one JSON object
      {"items": N, "by_dataset": {...}, "by_type": {...}, "by_hops": {...}, "skipped": K}.
      A PATH may be a fetched split, NAME:SPLIT (hotpotqa:dev).

To add a command, write ``add_<name>_command(subparsers)`` beside the code it runs (it adds its
parser and sets ``func``, a function of the parsed arguments returning the exit status) and
append it to `COMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from typing import Callable, Iterable, Sequence

from ..errors import DEBUG_FLAG, debug_requested, guarded
from .corpus import add_build_corpus_command
from .fetch import add_fetch_commands
from .loaders import FORMATS, load_items_report
from .schema import QAItem


def item_counts(items: Iterable[QAItem]) -> dict:
    """{"items", "by_dataset", "by_type", "by_hops"}; a missing type or hop count is "unknown"."""
    items = list(items)
    by_hops = Counter("unknown" if it.hops is None else str(it.hops) for it in items)
    return {
        "items": len(items),
        "by_dataset": dict(sorted(Counter(it.dataset for it in items).items())),
        "by_type": dict(sorted(Counter(it.type or "unknown" for it in items).items())),
        "by_hops": dict(sorted(by_hops.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0))),
    }


def _stats(args: argparse.Namespace) -> int:
    items: list[QAItem] = []
    skipped = 0
    for path in args.paths:
        report = load_items_report(path, args.format, limit=args.limit, skip_bad=args.skip_bad)
        note = f", {len(report.skipped)} skipped" if report.skipped else ""
        print(f"{path}: {len(report.items)} items ({report.format}{note})")
        for where, reason in report.skipped:
            print(f"  skipped {where}: {reason}")
        items += report.items
        skipped += len(report.skipped)
    counts = item_counts(items)
    for key, label in (("by_dataset", "dataset"), ("by_type", "type"), ("by_hops", "hops")):
        width = max(len(k) for k in counts[key]) if counts[key] else 0
        print(f"by {label}:")
        for name, n in counts[key].items():
            print(f"  {name:<{width}}  {n}")
    print(json.dumps({**counts, "skipped": skipped}))
    return 0


def add_stats_command(subparsers) -> None:
    p = subparsers.add_parser("stats", help="count items by dataset, type and hop count")
    p.add_argument("paths", nargs="+", metavar="PATH", help="benchmark file(s): JSON array or JSON Lines")
    p.add_argument("--format", choices=FORMATS, help="row format (default: told from the content)")
    p.add_argument("--limit", type=int, help="read at most this many items per file")
    p.add_argument("--skip-bad", action="store_true", help="skip and list bad records instead of stopping")
    p.set_defaults(func=_stats)


#: one registration function per command, in the order `--help` lists them.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_fetch_commands, add_stats_command, add_build_corpus_command]


PROG = "python -m knowtrace_train.data"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Inspect and prepare benchmark files.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """The command line (`prog`: the name `--help` shows, `knowtrace-train data` from the console script)."""
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(prog).parse_args([a for a in given if a != DEBUG_FLAG])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return guarded(lambda: args.func(args), debug_requested(given))  # a user's error: one line, exit 2


if __name__ == "__main__":
    sys.exit(main())
