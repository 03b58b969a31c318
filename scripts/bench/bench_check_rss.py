"""Peak memory of the post-fetch check on a file the size of 2Wiki's train JSON (708 MB), generated in its layout.

    python scripts/bench/bench_check_rss.py make /tmp/2wiki_like/train.json                           # ~700 MB
    PYTHONPATH=$PWD /usr/bin/time -v python scripts/bench/bench_check_rss.py check /tmp/2wiki_like/train.json
    PYTHONPATH=<a checkout before the streamed check> /usr/bin/time -v python scripts/bench/bench_check_rss.py whole ...

(PYTHONPATH picks the code measured.) `check` is what `fetch` runs after a download (`loaders.iter_items`, counted, none kept); `whole` keeps every
item (`load_items_report`), as the check did before it streamed. The items are random words in 2Wiki's exact
fields (10 context paragraphs of 4 sentences, supporting facts, evidence triples, Wikidata ids).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ITEMS = 167_454  # 2Wiki's train split


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


_VOCAB = [f"w{i:05d}" for i in range(20_000)]


def make(path: Path, items: int = ITEMS, seed: int = 0) -> None:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.write("[")
        for i in range(items):
            context = [[_words(rng, 3), [_words(rng, 12) + "." for _ in range(4)]] for _ in range(10)]
            row = {"_id": f"{i:032x}", "type": rng.choice(["compositional", "comparison", "inference", "bridge_comparison"]),
                   "question": _words(rng, 12) + "?", "context": context, "entity_ids": f"Q{i}_Q{i + 1}",
                   "supporting_facts": [[context[0][0], 0], [context[1][0], 1]],
                   "evidences": [[context[0][0], "director", context[1][0]], [context[1][0], "mother", "x"]],
                   "answer": _words(rng, 2), "evidences_id": [], "answer_id": f"Q{i + 7}"}
            f.write(("," if i else "") + json.dumps(row))
        f.write("]")


def main(argv: list[str]) -> int:
    what, path = argv[0], Path(argv[1])
    if what == "make":
        make(path)
        print(f"{path}: {path.stat().st_size} bytes")
        return 0
    if what == "check":
        from knowtrace_train.data.loaders import LoadReport, iter_items

        report = LoadReport(path=str(path), format="")
        print(sum(1 for _ in iter_items(path, "2wikimultihopqa", report=report)), "items (streamed)")
    else:
        from knowtrace_train.data.loaders import load_items_report

        print(len(load_items_report(path, "2wikimultihopqa").items), "items (kept)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
