"""TRACE's comparison table: EM/F1 with 95% intervals, EM by question kind, context tokens, paired tests.

    python scripts/lab/trace_table.py runs/eval --datasets world hotpotqa 2wiki musique

Reads `<folder>/trace_<dataset>_<reader>.jsonl` (readers triple, doc, all_docs, no_docs) and
`<folder>/knowtrace_<dataset>.jsonl` (KnowTrace with the same model and retriever), as
recipes/evaluate.py writes them. Per dataset and system: questions, EM and F1 with bootstrap
intervals, EM of bridge and comparison questions apart, mean context tokens (TRACE: the reader's
context; KnowTrace: the passages its completion calls read), and the paired tests (McNemar on EM)
of each system against "all documents" on the same questions. Prints a Markdown table; the last line
is one JSON object of every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowtrace_train.data.loaders import load_items  # noqa: E402
from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.pairing import compare_scores, read_question_scores  # noqa: E402
from knowtrace_train.metrics import bootstrap_interval, em_by_kind, format_interval, question_kind  # noqa: E402
from knowtrace_train.trajectory import read_trajectories  # noqa: E402

SYSTEMS = {"trace_{d}_triple": "TRACE-Triple", "trace_{d}_doc": "TRACE-Doc", "trace_{d}_all_docs": "all documents",
           "trace_{d}_no_docs": "no documents", "knowtrace_{d}": "KnowTrace"}
BASELINE = "trace_{d}_all_docs"


def kinds_of(trajs) -> dict[str, str | None]:
    paths = {t.meta.get("dataset_path") for t in trajs} - {None}
    out: dict[str, str | None] = {}
    for p in paths:
        try:
            out.update({it.id: question_kind(it) for it in load_items(p)})
        except (OSError, ValueError):
            pass
    return out


@user_errors
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--datasets", nargs="+", default=["world", "hotpotqa", "2wiki", "musique"])
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    figures: dict = {}
    print("| data | system | n | EM [95%] | F1 [95%] | EM bridge | EM comparison | context tokens | EM vs all docs (McNemar p) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.datasets:
        base_path = folder / (BASELINE.format(d=d) + ".jsonl")
        base = read_question_scores(base_path) if base_path.exists() else None
        for pattern, label in SYSTEMS.items():
            path = folder / (pattern.format(d=d) + ".jsonl")
            if not path.exists():
                continue
            trajs = read_trajectories(path)
            if not trajs:
                continue
            scores = read_question_scores(path)
            em, f1 = bootstrap_interval(scores.em), bootstrap_interval(scores.f1)
            kinds = kinds_of(trajs)
            by_kind = em_by_kind(scores.em, [kinds.get(q) for q in scores.ids])
            tokens = sum(t.retrieved_tokens for t in trajs) / len(trajs)
            vs = None
            if base is not None and pattern != BASELINE and sorted(base.ids) == sorted(scores.ids):
                order = {q: i for i, q in enumerate(base.ids)}
                idx = sorted(range(len(scores.ids)), key=lambda i: order[scores.ids[i]])
                scores.ids[:] = [scores.ids[i] for i in idx]
                scores.em[:] = [scores.em[i] for i in idx]
                scores.f1[:] = [scores.f1[i] for i in idx]
                vs = compare_scores(base, scores)
            kind_text = {k: f"{iv.mean:.3f} (n={iv.n})" for k, iv in by_kind.items()}
            vs_text = "-" if vs is None else f"{vs['em']['diff']:+.3f} (p={vs['em']['p_value']:.3f})"
            print(f"| {d} | {label} | {len(trajs)} | {format_interval(em)} | {format_interval(f1)} | "
                  f"{kind_text.get('bridge', '-')} | {kind_text.get('comparison', '-')} | {tokens:.0f} | {vs_text} |")
            figures[f"{d}/{label}"] = {
                "n": len(trajs), "em": em.mean, "em_interval": [em.low, em.high], "f1": f1.mean,
                "f1_interval": [f1.low, f1.high], "em_by_kind": {k: [iv.mean, iv.n] for k, iv in by_kind.items()},
                "context_tokens": tokens, "vs_all_docs": vs,
            }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
