"""MINTQA's breakdown of evaluated trajectories: accuracy, EM and F1 by hop count, question kind and share of popular/new facts.

    python scripts/lab/mintqa_breakdown.py runs/eval/world_mintqa_rag.jsonl runs/eval/world_mintqa_decompose.jsonl
    python scripts/lab/mintqa_breakdown.py runs/eval/mintqa.jsonl --dataset my_mintqa_pop.jsonl --format mintqa

Each FILE is a trajectory file of recipes/evaluate.py (any method). The questions' hop counts and
knowledge types come from the dataset file (`--dataset`; by default the one evaluate recorded in
the trajectories' meta). Accuracy is MINTQA's metric (the gold answer appears, as whole tokens, in
the normalised output); every EM carries its 95% bootstrap interval (none under 20 questions).
Sub-questions and retrievals per question come from the trajectories' meta where the method records
them (the MINTQA strategies do). The popularity/newness breakdown needs MINTQA's own files (the
synthetic world has no such labels). The last line printed is one JSON object: {file: figures}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from knowtrace_train.data.loaders import load_items  # noqa: E402
from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.io import DataFileError  # noqa: E402
from knowtrace_train.report import breakdown, breakdown_table  # noqa: E402
from knowtrace_train.trajectory import read_trajectories  # noqa: E402


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="trajectory files (recipes/evaluate.py --output)")
    parser.add_argument("--dataset", default=None, help="the benchmark file (default: meta.dataset_path of the trajectories)")
    parser.add_argument("--format", default=None, help="the benchmark file's format (default: told from its first record)")
    args = parser.parse_args(argv)
    out = {}
    try:
        for f in args.files:
            trajs = [t for t in read_trajectories(f) if t.id == t.question_id]  # hinted reruns are not evaluations
            if not trajs:
                print(f"error: {f}: no trajectories", file=sys.stderr)
                return 2
            dataset = args.dataset or trajs[0].meta.get("dataset_path")
            if not dataset:
                print(f"error: {f}: no dataset_path in the trajectories' meta; pass --dataset", file=sys.stderr)
                return 2
            items = {it.id: it for it in load_items(dataset, args.format)}
            figures = breakdown(trajs, items)
            print(f"== {f} ({trajs[0].strategy}, {dataset})")
            print(breakdown_table(figures))
            out[f] = {"strategy": trajs[0].strategy, "dataset": dataset, **figures}
    except (DataFileError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
