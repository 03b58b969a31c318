"""Corpus building: the retrievable passages of a set of items, and corpus files (ours and FlashRAG's).

A corpus built from items is the union of their context paragraphs, one passage per
(title, text), de-duplicated, each with the content id `schema.passage_id(title, text)`: the
reduced open-domain setting IRCoT used for 2WikiMultihopQA and MuSiQue.

Command line: ``python -m knowtrace_train.data.corpus build ITEMS... --out corpus.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable

from knowtrace_train.data.schema import Passage, QAItem, passage_id
from knowtrace_train.io import DataFileError, iter_jsonl, write_jsonl


class CorpusError(DataFileError):
    """A corpus that cannot be used: empty, or a file line that is not a passage."""


def build_corpus(items: Iterable[QAItem]) -> list[Passage]:
    """One passage per distinct (title, text) among the items' contexts, in first-seen order."""
    seen: set[tuple[str, str]] = set()
    corpus: list[Passage] = []
    n_items = 0
    for item in items:
        n_items += 1
        for p in item.context:
            key = (p.title, p.text)
            if key in seen:
                continue
            seen.add(key)
            corpus.append(Passage(id=passage_id(p.title, p.text), title=p.title, text=p.text))
    if not corpus:
        raise CorpusError(f"the corpus is empty: none of the {n_items} items has context passages")
    return corpus


def write_corpus(passages: Iterable[Passage], path: str | Path) -> int:
    """Write passages as JSON Lines ``{"id", "title", "text"}``; returns how many."""
    rows = [p.to_dict() for p in passages]
    if not rows:
        raise CorpusError(f"{path}: refusing to write an empty corpus")
    write_jsonl(path, rows)
    return len(rows)


def read_corpus(path: str | Path) -> list[Passage]:
    """Read a corpus file: ours (``{"id", "title", "text"}``) or FlashRAG's (``{"id", "contents"}``,
    contents = title, newline, text; a title in double quotes, as in FlashRAG's Wikipedia
    dump, is unquoted; contents without a newline is all text). Errors name file:line and
    field; duplicate ids and an empty file are errors too."""
    passages: list[Passage] = []
    first_line: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path):
        where = f"{path}:{lineno}"
        p = _passage_from_row(obj, where)
        if p.id in first_line:
            raise CorpusError(f"{where}: field 'id': {p.id!r} already used on line {first_line[p.id]}")
        first_line[p.id] = lineno
        passages.append(p)
    if not passages:
        raise CorpusError(f"{path}: the corpus is empty (no passages)")
    return passages


def _passage_from_row(obj: dict[str, Any], where: str) -> Passage:
    if "id" not in obj or obj["id"] is None:
        raise CorpusError(f"{where}: missing field 'id'")
    pid = obj["id"]
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or str(pid) == "":
        raise CorpusError(f"{where}: field 'id' must be a non-empty string or integer, got {pid!r}")
    if "title" in obj or "text" in obj:
        for name in ("title", "text"):
            if name not in obj:
                raise CorpusError(f"{where}: missing field {name!r}")
            if not isinstance(obj[name], str):
                raise CorpusError(f"{where}: field {name!r} must be a string, got {type(obj[name]).__name__}")
        title, text = obj["title"], obj["text"]
    elif "contents" in obj:
        if not isinstance(obj["contents"], str):
            raise CorpusError(f"{where}: field 'contents' must be a string, got {type(obj['contents']).__name__}")
        title, text = split_contents(obj["contents"])
    else:
        raise CorpusError(f"{where}: expected fields 'title' and 'text' (or FlashRAG's 'contents'), got {sorted(obj)}")
    if not (title.strip() or text.strip()):
        raise CorpusError(f"{where}: field 'text': the passage is empty")
    return Passage(id=str(pid), title=title, text=text)


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG's ``contents`` into (title, text): the first line is the title, unquoted if
    it is wrapped in double quotes; contents without a newline is all text."""
    if "\n" not in contents:
        return "", contents
    title, text = contents.split("\n", 1)
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text


def _build(args: argparse.Namespace) -> int:
    from knowtrace_train.data.loaders import load_items

    items: list[QAItem] = []
    for path in args.items:
        loaded = load_items(path, format=args.format)
        print(f"{path}: {len(loaded)} items")
        items.extend(loaded)
    corpus = build_corpus(items)
    write_corpus(corpus, args.out)
    print(f"wrote {len(corpus)} passages from {len(items)} items to {args.out}")
    return 0


def add_build_corpus_command(subparsers, name: str = "build-corpus") -> None:
    """Register the corpus-building command (``build`` here, ``build-corpus`` in the data CLI)."""
    p = subparsers.add_parser(name, help="build a retrieval corpus from the context passages of item files")
    p.add_argument("items", nargs="+", metavar="ITEMS", help="item files (HotpotQA, 2Wiki, MuSiQue, generic JSONL, ...)")
    p.add_argument("--out", required=True, help="corpus file to write (JSON Lines: id, title, text)")
    p.add_argument("--format", default=None, help="item file format (default: told from the content)")
    p.set_defaults(func=_build)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m knowtrace_train.data.corpus", description=__doc__.split("\n")[0])
    add_build_corpus_command(ap.add_subparsers(dest="command", required=True, metavar="COMMAND"), name="build")
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except (DataFileError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
