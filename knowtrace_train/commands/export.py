"""Export a run's adapters: merged ready-to-serve models (checked against the adapters) and adapter copies.

    python scripts/export.py runs/<name> [--iteration z] [--prompts 3] [--max-new-tokens 32]

Writes runs/<name>/export/iter_<z>/<role>/ (merged model + tokenizer), .../adapters/<role>/ (copies) and
.../export.json; exits 1 where a merged model's greedy outputs differ from the adapter model's, 2 with one line
on stderr where the run folder cannot be exported (no adapters, no M0, no such iteration).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from knowtrace_train.errors import user_errors
from knowtrace_train.train.export import ExportCheckError, export_run


@user_errors
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the run folder (runs/<name>)")
    ap.add_argument("--iteration", type=int, default=None, help="iteration to export (default: the latest with adapters)")
    ap.add_argument("--prompts", type=int, default=3, help="sample prompts per role for the equality check")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="greedy tokens compared per prompt")
    ap.add_argument("--tie-tolerance", type=float, default=None,
                    help="top-2 logit margin under which a divergence counts as a tie (default: by dtype)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        exports = export_run(args.run, args.iteration, n_prompts=args.prompts,
                             max_new_tokens=args.max_new_tokens, tie_tolerance=args.tie_tolerance)
    except ExportCheckError as e:  # the merge's check; a user's error (ExportError) is one line and exit 2
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    for e in exports:
        ties = sum(c.diverged_at is not None for c in e.checks)
        worst = max((c.max_logit_diff for c in e.checks), default=0.0)
        print(f"{e.role}: {e.merged_dir} ({len(e.checks)} prompts, greedy outputs equal"
              f"{f' but for {ties} near ties' if ties else ''}, max logit difference {worst:.1e}); "
              f"adapter copied to {e.adapter_copy}")
    return 0

