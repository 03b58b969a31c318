"""Corpus building: the retrievable passages of a set of items or of a knowledge graph, and corpus files (ours and FlashRAG's).

A corpus built from items is the union of their context paragraphs, one passage per
(title, text), de-duplicated, each with the content id `schema.passage_id(title, text)`: the
reduced open-domain setting IRCoT used for 2WikiMultihopQA and MuSiQue.

A corpus built from a knowledge graph (`kg_corpus`) is the graph turned into text as MINTQA does
(its App. F.2, after Yu et al. 2023): one passage per entity, the entity's 1-hop neighbourhood
(every triple it is the subject or the object of) written one sentence per triple, cut into
chunks of at most `max_triples` sentences. The triples come from the synthetic world's facts.jsonl
(`data.bundled.world_triples`), from the gold chains of benchmark items (`item_triples`: MINTQA's
`triplets`) or from a triples file (`read_triples`).

Command line: ``python -m knowtrace_train.data.corpus build ITEMS... --out corpus.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

from knowtrace_train.data.schema import Passage, QAItem, passage_id
from knowtrace_train.errors import DEBUG_FLAG, debug_requested, guarded
from knowtrace_train.io import DataFileError, iter_jsonl, read_text, write_jsonl

log = logging.getLogger(__name__)

#: where a run's passages come from (CorpusConfig.source)
CORPUS_SOURCES = ("contexts", "file", "generated", "kg", "name")
#: `store: auto` reads a corpus file of at least this many bytes as a passage store, a smaller one whole into memory:
#: the size where the in-memory path's peak RSS reaches the sharded store's plateau (about 700 MiB; measured with
#: scripts/bench/bench_store_crossover.py, docs/retrieval.md "In memory or on disk")
STORE_AUTO_BYTES = 100 * 2**20


@dataclass
class CorpusConfig:
    """The passages retrieval searches."""

    source: str = field(
        default="file",
        metadata={"help": "'file': the corpus JSONL at `path`; 'contexts': the context passages of every item in the dataset file (whatever `limit`); 'generated': the passages of `path` (the world's) at random rows among `passages` generated distractors (open-domain; written once into the cache home, read as a passage store); 'kg': a knowledge graph turned into text, one passage per entity neighbourhood (MINTQA's corpus; the graph is `triples`); 'name': a fetched corpus (`name`)"},
    )
    name: str | None = field(
        default=None,
        metadata={"help": "source 'name': a corpus fetched by `python -m knowtrace_train.data fetch NAME` (wiki2017-abstracts, wiki2018-dpr)"},
    )
    path: str | None = field(
        default="data/world/corpus.jsonl",
        metadata={"help": "the corpus JSONL (source 'file'; source 'generated': the passages placed among the distractors; unused otherwise)"},
    )
    store: Literal[True, False, "auto"] = field(
        default="auto",
        metadata={"help": "source 'file': true reads the corpus from a passage store on disk (converted once into retrieval/store/ in the cache home, memory-mapped; BM25 then built in shards in bounded memory: docs/retrieval.md), false whole into memory; 'auto': the store for a file of 100 MiB or more, memory below (the log says which; source 'generated' is always read as a store)"},
    )
    passages: int | None = field(
        default=None,
        metadata={"help": "source 'generated': how many distractor passages to generate (e.g. 1000000)"},
    )
    seed: int = field(
        default=0,
        metadata={"help": "source 'generated': the generator's seed (the same seed, `passages` and `path` give the same corpus)"},
    )
    triples: str = field(
        default="world",
        metadata={"help": "source 'kg': 'world' (the bundled world's facts, seed 0), 'items' (the gold triples of every item in the dataset file: MINTQA's triplets) or a triples file (JSONL [s, r, o] or .tsv)"},
    )

    def __post_init__(self) -> None:
        from knowtrace_train.data.bundled import bundled_path

        self.path = bundled_path(self.path)  # the world's default, from an installed package too
        if self.source not in CORPUS_SOURCES:
            raise ValueError(f"corpus.source must be one of {list(CORPUS_SOURCES)}, got {self.source!r}")
        if self.source == "file" and not self.path:
            raise ValueError("corpus.source is 'file' but corpus.path is empty")
        if not (isinstance(self.store, bool) or self.store == "auto"):
            raise ValueError(f"corpus.store must be true, false or 'auto', got {self.store!r}")
        if self.store is True and self.source not in ("file", "generated"):
            raise ValueError(f"corpus.store needs corpus.source 'file' or 'generated', got {self.source!r}")
        if self.source == "generated":
            if self.passages is None:
                raise ValueError("corpus.source is 'generated' but corpus.passages is not set (e.g. passages: 1000000)")
            if isinstance(self.passages, bool) or not isinstance(self.passages, int) or self.passages < 1:
                raise ValueError(f"corpus.passages must be an integer >= 1, got {self.passages!r}")
            if not self.path:
                raise ValueError("corpus.source is 'generated' but corpus.path (the passages placed among the distractors) is empty")
        elif self.passages is not None:
            raise ValueError(f"corpus.passages needs corpus.source 'generated', got {self.source!r}")
        elif self.seed != 0:
            raise ValueError(f"corpus.seed needs corpus.source 'generated', got {self.source!r}")
        if self.source == "name" and not self.name:
            raise ValueError("corpus.source is 'name' but corpus.name is empty (e.g. name: wiki2018-dpr)")


def use_store(store: bool | str, path: str | Path) -> bool:
    """Whether the corpus file `path` is read as a passage store: `store` true or false as set; 'auto' by the
    file's size against `STORE_AUTO_BYTES`, the choice logged."""
    if store != "auto":
        return bool(store)
    size = Path(path).stat().st_size
    chosen = size >= STORE_AUTO_BYTES
    log.info("corpus.store auto: %s is %.1f MiB, %s %d MiB: %s", path, size / 2**20, "at least" if chosen else "under",
             STORE_AUTO_BYTES // 2**20, "a passage store on disk (BM25 sharded)" if chosen else "read whole into memory")
    return chosen


def read_named_corpus(name: str, skip_bad: bool = False) -> list[Passage]:
    """The passages of a fetched corpus (data/registry.py), read by its source's reader (data/formats.py)."""
    from knowtrace_train.data.formats import CORPUS_READERS
    from knowtrace_train.data.registry import corpus_files

    files, reader = corpus_files(name)
    passages = [p for f in files for p in CORPUS_READERS[reader](f, skip_bad=skip_bad)]
    if not passages:
        raise CorpusError(f"{name}: the corpus is empty (no passages in {', '.join(map(str, files))})")
    return passages


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


def linearize_triple(triple: tuple[str, str, str]) -> str:
    """One triple as a sentence: subject, relation, object, full stop ("Drelovia capital Vamay.")."""
    s, r, o = (x.strip() for x in triple)
    return f"{s} {r} {o}".rstrip(".") + "."


def kg_corpus(triples: Iterable[tuple[str, str, str]], max_triples: int = 16) -> list[Passage]:
    """One passage per entity neighbourhood of the graph `triples`, in first-seen order of the
    entities: title = the entity, text = its triples (as subject, then as object) one sentence
    each, in the order given, repeated triples once. A neighbourhood over `max_triples` triples is
    cut into several passages of that many, titled alike. An empty graph is a `CorpusError`."""
    if max_triples < 1:
        raise ValueError(f"kg_corpus: max_triples must be >= 1, got {max_triples}")
    out_edges: dict[str, list[tuple[str, str, str]]] = {}
    in_edges: dict[str, list[tuple[str, str, str]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for t in triples:
        s, r, o = (str(x).strip() for x in t)
        if not (s and r and o) or (s, r, o) in seen:
            continue
        seen.add((s, r, o))
        out_edges.setdefault(s, []).append((s, r, o))
        in_edges.setdefault(s, [])
        out_edges.setdefault(o, [])
        in_edges.setdefault(o, []).append((s, r, o))
    corpus: list[Passage] = []
    for entity, facts in out_edges.items():
        neighbourhood = facts + [t for t in in_edges[entity] if t[0] != entity]
        for start in range(0, len(neighbourhood), max_triples):
            text = " ".join(linearize_triple(t) for t in neighbourhood[start : start + max_triples])
            corpus.append(Passage(id=passage_id(entity, text), title=entity, text=text))
    if not corpus:
        raise CorpusError("the knowledge graph is empty: no (subject, relation, object) triple to turn into text")
    return corpus


def item_triples(items: Iterable[QAItem]) -> list[tuple[str, str, str]]:
    """The gold triples of every item (`evidence.triples`, e.g. MINTQA's fact chains), in order."""
    return [t for it in items for t in it.evidence.triples]


def read_triples(path: str | Path) -> list[tuple[str, str, str]]:
    """A triples file: JSON Lines of ``[subject, relation, object]`` or ``{"subject", "relation",
    "object"}``, or a .tsv file of three tab-separated columns. Errors name file:line."""
    path = Path(path)
    out: list[tuple[str, str, str]] = []
    tsv = path.suffix == ".tsv"
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        if tsv:
            row: Any = line.split("\t")
        else:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if isinstance(row, dict):
                row = [row.get("subject"), row.get("relation"), row.get("object")]
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(x, str) and x.strip() for x in row)):
            want = "subject<TAB>relation<TAB>object" if tsv else "[subject, relation, object] of non-empty strings"
            raise CorpusError(f"{path}:{lineno}: expected {want}, got {line.strip()[:80]!r}")
        out.append((row[0].strip(), row[1].strip(), row[2].strip()))
    if not out:
        raise CorpusError(f"{path}: no triples")
    return out


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


def check_corpus_head(path: str | Path, lines: int = 200) -> None:
    """The first `lines` passages of a corpus file read as `read_corpus` reads them (a preflight: a binary, Latin-1
    or foreign file fails in its first second, not when the retriever is built)."""
    import itertools

    rows = list(itertools.islice(iter_jsonl(path), lines))
    if not rows:
        raise CorpusError(f"{path}: the corpus is empty (no passages)")
    for lineno, obj in rows:
        _passage_from_row(obj, f"{path}:{lineno}")


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
    given = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args([a for a in given if a != DEBUG_FLAG])
    return guarded(lambda: args.func(args), debug_requested(given))  # a user's error: one line, exit 2


if __name__ == "__main__":
    sys.exit(main())
