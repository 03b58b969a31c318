"""Evaluate KnowTrace on a dataset split and print EM, F1 and the paper's cost columns.

    python recipes/evaluate.py --config recipes/configs/eval_world.yaml --limit 16 --output runs/eval/world_dev.jsonl

Any config key can be overridden (`--strategy.max_rounds 3`, `--generator.adapters.explore DIR`).
Trajectories are appended to --output as each question finishes; a rerun skips the questions
already there. The last line printed is one JSON object: em, f1, rounds, retrieved_tokens,
sec_per_question, questions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from knowtrace_train.config import ConfigError  # noqa: E402
from knowtrace_train.evaluate import evaluate, format_summary, load_eval_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Other --key value pairs override the config.")
    parser.add_argument("--config", help="YAML config (recipes/configs/eval_*.yaml)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_eval_config(args.config, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    summary = evaluate(config, progress=not args.quiet)
    print(format_summary(summary))
    print(json.dumps(summary.headline()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
