"""What KnowTrace's gold trajectories look like at given noise rates: pairs and rounds, needed and extraneous
triplets, and what backtracing filters of them (FA decomposed). No model is loaded.

    python scripts/lab/gold_shape.py                          # 64 world train questions, noise 0, 0.5 and 1.0
    python scripts/lab/gold_shape.py --questions 128 --noise 0 0.25 --prompts paper

One line per noise rate (pairs and triplets both at that rate), the last line JSON.
"""

from __future__ import annotations

import argparse
import json

from knowtrace_train.data.corpus import read_corpus
from knowtrace_train.data.facts import load_facts
from knowtrace_train.data.loaders import load_items
from knowtrace_train.methods.knowtrace.config import GoldNoise
from knowtrace_train.methods.knowtrace.gold import gold_trajectory_records
from knowtrace_train.retrieval import RetrieverConfig, build_retriever


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="data/world/train.jsonl")
    ap.add_argument("--corpus", default="data/world/corpus.jsonl")
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--passages", type=int, default=5)
    ap.add_argument("--prompts", default="short")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    items = load_items(a.train)[: a.questions]
    retriever = build_retriever(RetrieverConfig(), read_corpus(a.corpus))
    facts = load_facts(None, a.corpus, items)
    out = []
    for rate in a.noise:
        res = gold_trajectory_records(items, retriever, k=a.passages, facts=facts, noise=GoldNoise(rate, rate),
                                      prompt_set=a.prompts, seed=a.seed)
        st, check = res.stats, res.stats["backtrace_check"]
        row = {"noise": rate, "trajectories": st["trajectories"], "skipped": st["skipped"], **st["shape"],
               "fa_ratio": round(check["fa_ratio"], 4),
               "fa_decomposed": {k: round(v, 4) for k, v in (check["fa_decomposed"] or {}).items()}}
        print(f"noise {rate}: {row['trajectories']} trajectories, {row['rounds']} rounds, pairs needed "
              f"{row['pairs_needed']} unneeded {row['pairs_unneeded']}, triplets needed {row['triplets_needed']} "
              f"extraneous {row['triplets_extraneous']}, backtracing filters {row['fa_ratio']:.3f} "
              f"{row['fa_decomposed']}", flush=True)
        out.append(row)
    print(json.dumps({"facts": facts.source, "questions": len(items), "rows": out}))


if __name__ == "__main__":
    main()
