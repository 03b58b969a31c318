"""Generate the synthetic multi-hop world (questions, corpus and facts) into a folder of JSON Lines.

The generator is scripts/world/ (beside this script); the package ships only the files it writes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from knowtrace_train.errors import user_errors  # noqa: E402
from world import DEFAULT_SIZES, make_world, write_world  # noqa: E402  (scripts/world/)


@user_errors
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0: the committed data/world)")
    ap.add_argument("--out", type=Path, default=Path("data/world"), help="output folder")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies entities and passages (1.0: ~2,400 passages)")
    for split, n in DEFAULT_SIZES.items():
        ap.add_argument(f"--{split}", type=int, default=n, help=f"number of {split} questions (default {n})")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    world = make_world(args.seed, args.scale, n_train=args.train, n_dev=args.dev, n_test=args.test)
    write_world(world, args.out)
    stats = world.stats()
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    stats["out"] = str(args.out)
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
