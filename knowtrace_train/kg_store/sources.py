"""Triples for a graph store from files users bring: MetaQA's kb.txt and its qa_*.txt questions."""

from __future__ import annotations

import re
from pathlib import Path

_TOPIC = re.compile(r"\[([^\]]+)\]")


def read_metaqa_kb(path: str | Path) -> list[tuple[str, str, str]]:
    """MetaQA's kb.txt: one `subject|relation|object` a line. A malformed line is a ValueError
    naming file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            parts = line.split("|")
            if len(parts) != 3 or not all(p.strip() for p in parts):
                raise ValueError(f"{path}:{i}: expected 'subject|relation|object', got {line!r}")
            out.append((parts[0].strip(), parts[1].strip(), parts[2].strip()))
    return out


def read_metaqa_questions(path: str | Path, hops: int | None = None) -> list[dict]:
    """MetaQA's qa_*.txt: `question with [topic entity]<TAB>answer1|answer2` a line. Returns rows
    {"id", "question" (brackets removed), "topic", "answers", "hops"}; a malformed line is a
    ValueError naming file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            q, sep, ans = line.partition("\t")
            m = _TOPIC.search(q)
            answers = [a.strip() for a in ans.split("|") if a.strip()]
            if not sep or m is None or not answers:
                raise ValueError(f"{path}:{i}: expected 'question with [topic]<TAB>answer|...', got {line!r}")
            rows.append({"id": f"{Path(path).stem}-{i}", "question": _TOPIC.sub(r"\1", q).strip(),
                         "topic": m.group(1).strip(), "answers": answers, "hops": hops})
    return rows
