"""Hits@1 of DoG evaluation files, overall and by hop count, with 95% bootstrap intervals (a Markdown table).

    python scripts/lab/dog_table.py runs/eval/world_dev_dog.jsonl [more.jsonl ...] [--data data/world/dev.jsonl]

Hits@1 is an exact match (after the official normalisation) of the single predicted answer against
the gold entity or any alias (`metrics.hits_at_1`). A question's hop count comes from the trajectory
(`meta["question_hops"]`, which DoG records) or else from the dataset file `--data`. The last line is
one JSON object: {file: {"n", "hits@1", "interval", "by_hops": {...}, "gold_in_chain", "stop_reasons": {...}}}.
`gold_in_chain` is the share of questions whose filled triples hold a gold answer (or alias) as an
entity: what an answer try that stopped at the right hop could have reached. With `--data`,
`first_relation_gold` is the share of questions whose first hop picked the relation of the item's
first gold triple (relation filtering at hop 1; null without gold triples).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.methods.dog.mechanism import first_relation_counts, gold_first_relations  # noqa: E402
from knowtrace_train.metrics import bootstrap_interval, hits_at_1, hits_at_1_by_hops  # noqa: E402
from knowtrace_train.trajectory import read_trajectories  # noqa: E402


def table(path: str, hops_of: dict[str, int | None], order: list[str] | None = None,
          gold_rel: dict[str, str] | None = None) -> dict:
    trajs = read_trajectories(path)
    if order is not None:  # the dataset's first questions, in its order
        by_id = {t.question_id: t for t in trajs}
        trajs = [by_id[q] for q in order if q in by_id]
    hops = [t.meta.get("question_hops", hops_of.get(t.question_id)) for t in trajs]
    hits = [hits_at_1(t.prediction, t.answers) for t in trajs]
    iv = bootstrap_interval(hits) if hits else None
    reached = [any(hits_at_1(e, t.answers) for x in t.graph.triplets for e in (x.triplet.subject, x.triplet.object))
               for t in trajs]
    return {"n": len(trajs), "hits@1": round(sum(hits) / len(hits), 4) if hits else None,
            "interval": None if iv is None or iv.low is None else [round(iv.low, 4), round(iv.high, 4)],
            "by_hops": hits_at_1_by_hops([t.prediction for t in trajs], [t.answers for t in trajs], hops),
            "gold_in_chain": round(sum(reached) / len(reached), 4) if reached else None,
            "first_relation_gold": _first_relation(trajs, gold_rel),
            "stop_reasons": dict(Counter(t.stop_reason.split(":")[0] for t in trajs))}


def _first_relation(trajs, gold_rel: dict[str, str] | None) -> float | None:
    right, n = first_relation_counts(trajs, gold_rel or {})
    return round(right / n, 4) if n else None


def cell(hits, interval) -> str:
    return "-" if hits is None else f"{hits:.3f}" + ("" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]")


@user_errors
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--data", default=None, help="the dataset file, for hop counts the trajectories lack")
    p.add_argument("--first", type=int, default=None,
                   help="only the dataset's first N questions (needs --data), so files of different lengths compare alike")
    args = p.parse_args(argv)
    hops_of: dict[str, int | None] = {}
    order = None
    gold_rel: dict[str, str] = {}
    if args.data:
        from knowtrace_train.data.loaders import load_items

        items = load_items(args.data)
        hops_of = {it.id: it.hops for it in items}
        order = [it.id for it in items[: args.first]] if args.first else None
        gold_rel = gold_first_relations(items)
    elif args.first:
        p.error("--first needs --data")
    out = {f: table(f, hops_of, order, gold_rel) for f in args.files}
    groups = sorted({g for r in out.values() for g in r["by_hops"]}, key=lambda g: (not g.isdigit(), g.zfill(3)))
    print("| file | n | Hits@1 | " + " | ".join(f"{g}-hop" for g in groups) + " | gold in chain | hop-1 relation right |")
    print("|---|---|---|" + "---|" * len(groups) + "---|---|")
    for f, r in out.items():
        by = [cell(r["by_hops"][g]["hits@1"], r["by_hops"][g]["interval"]) + f" (n={r['by_hops'][g]['n']})"
              if g in r["by_hops"] else "-" for g in groups]
        print(f"| {Path(f).name} | {r['n']} | {cell(r['hits@1'], r['interval'])} | " + " | ".join(by) + f" | {r['gold_in_chain']} | {r['first_relation_gold']} |")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
