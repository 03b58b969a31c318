"""Retrieval evaluation: recall@k of the gold supporting evidence, with the question as the query.

For each benchmark file, the corpus is built from its items' context passages (de-duplicated
across items, as IRCoT did for 2Wiki and MuSiQue) and every question is searched once. Recall
of one question = the share of its gold units found in the top k:
- supporting titles for HotpotQA and 2WikiMultihopQA (a retrieved passage with that title);
- supporting paragraphs for MuSiQue (the exact passage, by content id).
Macro-averaged over questions; items with no gold evidence are not counted.

    python scripts/eval_retrieval.py --data ../shared/data/hotpotqa/dev.json --retriever bm25 --k 5

The last line printed is one JSON object: {"recall@5": ..., "queries": ..., ...}; with several
--data files it is the average over all their questions, with a per-file breakdown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from knowtrace_train.data.corpus import build_corpus  # noqa: E402
from knowtrace_train.data.loaders import load_items  # noqa: E402
from knowtrace_train.data.schema import QAItem  # noqa: E402
from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.retrieval import BACKENDS, RetrieverConfig, ScoredPassage, build_retriever  # noqa: E402

PARAGRAPH_DATASETS = ("musique",)


def gold_units(item: QAItem, unit: str) -> tuple[str, set[str]]:
    """("titles" | "paragraphs", the gold set) for one item."""
    if unit == "auto":
        unit = "paragraphs" if item.dataset in PARAGRAPH_DATASETS or not item.evidence.titles else "titles"
    gold = set(item.evidence.titles) if unit == "titles" else set(item.evidence.paragraph_ids)
    return unit, gold


def item_recall(unit: str, gold: set[str], hits: list[ScoredPassage]) -> float:
    found = {h.passage.title for h in hits} if unit == "titles" else {h.passage.id for h in hits}
    return len(gold & found) / len(gold)


def evaluate_file(path: str, config: RetrieverConfig, unit: str, fmt: str | None, limit: int | None) -> dict:
    items = load_items(path, format=fmt, limit=limit)
    corpus = build_corpus(items)
    t0 = time.perf_counter()
    retriever = build_retriever(config, corpus)
    build_s = time.perf_counter() - t0
    scored = [(it, *gold_units(it, unit)) for it in items]
    scored = [(it, u, g) for it, u, g in scored if g]
    t0 = time.perf_counter()
    results = retriever.search([it.question for it, _, _ in scored], config.k)
    search_s = time.perf_counter() - t0
    recalls = [item_recall(u, g, hits) for (_, u, g), hits in zip(scored, results)]
    units = sorted({u for _, u, _ in scored})
    return {
        "file": path,
        "dataset": ",".join(sorted({it.dataset for it in items})),
        "unit": ",".join(units),
        f"recall@{config.k}": sum(recalls) / len(recalls) if recalls else 0.0,
        "all_found": sum(r == 1.0 for r in recalls) / len(recalls) if recalls else 0.0,
        "queries": len(recalls),
        "skipped_no_gold": len(items) - len(scored),
        "passages": len(corpus),
        "build_s": round(build_s, 3),
        "search_s": round(search_s, 3),
    }


@user_errors
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", action="append", required=True, help="benchmark file (repeatable)")
    ap.add_argument("--retriever", choices=BACKENDS, default="bm25")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--unit", choices=("auto", "titles", "paragraphs"), default="auto",
                    help="gold unit (auto: paragraphs for MuSiQue, titles otherwise)")
    ap.add_argument("--format", default=None, help="item file format (default: told from the content)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many items per file")
    ap.add_argument("--cache-dir", default="", help='index cache folder ("" = default; "none" = no cache)')
    ap.add_argument("--encoder", default="", help="dense encoder (model folder or hub id)")
    ap.add_argument("--url", default="", help="Elasticsearch/OpenSearch URL (default $KNOWTRACE_ES_URL)")
    args = ap.parse_args(argv)
    if args.k <= 0:
        ap.error(f"--k must be positive, got {args.k}")

    config = RetrieverConfig(
        backend=args.retriever,
        k=args.k,
        cache_dir=None if args.cache_dir == "none" else args.cache_dir,
        encoder=args.encoder,
        url=args.url,
    )
    rows = []
    for path in args.data:
        row = evaluate_file(path, config, args.unit, args.format, args.limit)
        rows.append(row)
        print(
            f"{path}: {row['dataset']} recall@{args.k} of {row['unit']} = {row[f'recall@{args.k}']:.4f} "
            f"(all gold found for {row['all_found']:.1%}) over {row['queries']} questions, "
            f"{row['passages']} passages, {args.retriever}"
        )
    total = sum(r["queries"] for r in rows)
    summary = {
        f"recall@{args.k}": (sum(r[f"recall@{args.k}"] * r["queries"] for r in rows) / total) if total else 0.0,
        "queries": total,
        "retriever": args.retriever,
    }
    if len(rows) > 1:
        summary["per_file"] = {r["file"]: {f"recall@{args.k}": r[f"recall@{args.k}"], "queries": r["queries"]} for r in rows}
    else:
        summary.update({k: v for k, v in rows[0].items() if k not in summary and k != "file"})
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
