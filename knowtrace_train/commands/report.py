"""Write the HTML report of self-training runs or trajectory files: one self-contained page with the traced graphs.

    python scripts/report.py runs/selftrain_default --out runs/selftrain_default/report.html
    python scripts/report.py runs/selftrain_default runs/selftrain_star --out runs/compare.html   # side by side
    python scripts/report.py runs/eval/world_dev.jsonl --data data/world/dev.jsonl --corpus data/world/corpus.jsonl

Each path is a run folder of recipes/selftrain.py (finished or running), a trajectory JSONL file of
any method, or a folder of such files (runs/eval/). The page reads records only; it needs no network when it is viewed. Open a question with
`report.html#q=<n>`. A bad record, a missing iteration or a run in progress is said on the page; the
script goes on. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from knowtrace_train.errors import UserError, user_errors
from knowtrace_train.report_html import write_report
from knowtrace_train.trajectory import TRAJECTORY_LINE_ERRORS, trajectory_from_line


def unreportable(path: Path) -> str | None:
    """Why `path` holds nothing a report shows (None where it does, or where it does not exist: a run not started
    yet beside others is a note on the page)."""
    if path.is_dir():
        if (path / "config.yaml").is_file() or any(path.glob("*.jsonl")) or any(path.glob("*/config.yaml")):
            return None
        return "a folder with no run (config.yaml) and no trajectory file (*.jsonl)"
    if not path.is_file():
        return None
    if path.suffix != ".jsonl":
        return "not a trajectory file (a .jsonl file)"
    with path.open("rb") as f:
        first = next((line for line in f if line.strip()), None)
    if first is None:
        return "an empty trajectory file"
    try:
        trajectory_from_line(first.decode("utf-8"))
    except (UnicodeDecodeError, *TRAJECTORY_LINE_ERRORS) as e:
        return f"its first line is not a trajectory ({type(e).__name__})"
    return None


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", metavar="RUN_OR_ROLLOUTS", help="run folders, trajectory JSONL files, folders of them")
    parser.add_argument("--out", default="report.html", help="the HTML file to write")
    parser.add_argument("--data", action="append", default=[], help="question file(s) for hop counts (a run's own are read from its config)")
    parser.add_argument("--corpus", default=None, help="corpus JSONL for passage texts (a run's own is read from its config)")
    parser.add_argument("--title", default=None, help="page title")
    args = parser.parse_args(argv)
    if not any(Path(p).exists() for p in args.paths):  # a typo; a run not started yet beside others is a note on the page
        raise UserError(f"no such run folder or trajectory file: {', '.join(args.paths)}")
    for p in args.paths:  # a report of nothing is an error, not an empty page
        why = unreportable(Path(p))
        if why:
            raise UserError(f"{p}: {why}: name a run folder of recipes/selftrain.py, a trajectory JSONL file or a "
                            "folder of them")
    if Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a folder: name the HTML file to write (e.g. {Path(args.out) / 'report.html'})")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    figures = write_report(args.paths, args.out, data_files=args.data, corpus=args.corpus, title=args.title)
    print(f"wrote {figures['report']} ({figures['bytes'] / 1e6:.1f} MB): {figures['runs']} run(s)/file(s), "
          f"{figures['questions']} trajectories, {figures['notes']} note(s) on the page")
    print(json.dumps(figures))
    return 0

