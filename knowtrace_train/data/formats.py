"""The files the registry's sources serve, as rows and passages: the hub's HotpotQA parquet (nested columns, mapped
back to the official layout so that one converter in loaders.py reads both), HotpotQA's Wikipedia 2017 abstracts
(a tar.bz2 of bz2 JSON Lines files) and DPR's Wikipedia 2018 passages (psgs_w100.tsv, gzipped or not).

Every corpus passage gets the content id `schema.passage_id(title, text)`, as corpora built from items do, so an
item's gold paragraphs and the open-domain corpus share ids where their text is the same (HotpotQA's contexts are
the 2017 abstracts, sentences joined with ""). A repeated (title, text) is kept once.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import logging
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterator

from knowtrace_train.io import DataFileError

from .schema import Passage, passage_id

log = logging.getLogger(__name__)


def parquet_records(path: Path) -> Iterator[tuple[str, int, Any]]:
    """(where, index, row) of a parquet file; the hub's HotpotQA columns become the official layout."""
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        i = 0
        for batch in batches:
            for row in batch.to_pylist():
                yield f"{path}: row {i}", i, official_hotpotqa(row)
                i += 1
    except (OSError, ValueError) as e:
        raise DataFileError(f"{path}: not a readable parquet file ({e})") from None


def official_hotpotqa(row: dict) -> dict:
    """A hub row ``{id, supporting_facts: {title, sent_id}, context: {title, sentences}, ...}`` as the official
    ``{_id, supporting_facts: [[title, i]], context: [[title, [sentences]]], ...}``; other rows unchanged. A
    malformed nested column is left as it is, for the converter to name the field."""
    ctx, facts = row.get("context"), row.get("supporting_facts")
    if not (isinstance(ctx, dict) and "sentences" in ctx):
        return row
    out = {k: v for k, v in row.items() if k not in ("id", "context", "supporting_facts")}
    out["_id"] = row.get("id", row.get("_id"))
    titles, sentences = ctx.get("title"), ctx.get("sentences")
    if isinstance(titles, list) and isinstance(sentences, list) and len(titles) == len(sentences):
        out["context"] = [[t, s] for t, s in zip(titles, sentences)]
    else:
        out["context"] = ctx
    if isinstance(facts, dict):
        t, i = facts.get("title"), facts.get("sent_id")
        out["supporting_facts"] = [[a, b] for a, b in zip(t, i)] if isinstance(t, list) and isinstance(i, list) and len(t) == len(i) else facts
    else:
        out["supporting_facts"] = facts
    return out


def wiki_abstracts(path: Path, skip_bad: bool = False) -> Iterator[Passage]:
    """HotpotQA's enwiki-2017 abstracts: a tar.bz2 whose members are bz2 files of JSON lines
    ``{id, url, title, text: [sentences], ...}``; an article without text is left out."""
    seen: set[str] = set()
    try:
        archive = tarfile.open(path, "r:bz2")
    except (tarfile.TarError, OSError) as e:
        raise DataFileError(f"{path}: not a tar.bz2 archive ({e})") from None
    with archive:
        for member in archive:
            if not member.isfile() or not member.name.endswith(".bz2"):
                continue
            data = bz2.decompress(archive.extractfile(member).read())  # type: ignore[union-attr]
            for lineno, line in enumerate(data.decode("utf-8").splitlines(), 1):
                where = f"{path}:{member.name}:{lineno}"
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    title, sentences = row["title"], row["text"]
                    if not isinstance(title, str) or not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
                        raise ValueError("field 'title' must be a string and 'text' a list of strings")
                except (ValueError, KeyError, TypeError) as e:
                    if skip_bad:
                        continue
                    raise DataFileError(f"{where}: {e if isinstance(e, ValueError) else f'missing field {e}'}") from None
                text = "".join(sentences).strip()
                if text:
                    p = Passage(passage_id(title, text), title, text)
                    if p.id not in seen:
                        seen.add(p.id)
                        yield p


def dpr_passages(path: Path, skip_bad: bool = False) -> Iterator[Passage]:
    """DPR's psgs_w100.tsv(.gz): a header ``id, text, title`` and one tab-separated, csv-quoted row per passage.
    A row with an empty text (nothing to retrieve) is skipped and counted in one log line at the end; a row
    that is not three columns is an error naming its line, unless `skip_bad`."""
    csv.field_size_limit(sys.maxsize)
    opener = gzip.open if path.suffix == ".gz" else open
    seen: set[str] = set()
    empty: list[int] = []
    with opener(path, "rt", encoding="utf-8", newline="") as f:  # type: ignore[operator]
        rows = csv.reader(f, delimiter="\t")
        header = next(rows, None)
        if header is None or [h.strip() for h in header[:3]] != ["id", "text", "title"]:
            raise DataFileError(f"{path}:1: expected the header id, text, title; got {header}")
        for lineno, row in enumerate(rows, 2):
            if len(row) == 3 and not row[1].strip():
                empty.append(lineno)
                continue
            if len(row) != 3:
                if skip_bad:
                    continue
                raise DataFileError(f"{path}:{lineno}: field 'columns': expected id, text, title, got {row[:3]!r}")
            title, text = row[2], row[1]
            pid = passage_id(title, text)
            if pid not in seen:
                seen.add(pid)
                yield Passage(pid, title, text)
    if empty:
        log.warning("%s: skipped %d passage(s) with an empty text (line %s%s)", path, len(empty),
                    ", ".join(map(str, empty[:5])), ", ..." if len(empty) > 5 else "")


CORPUS_READERS = {"wiki_abstracts": wiki_abstracts, "dpr_tsv": dpr_passages}

__all__ = ["CORPUS_READERS", "dpr_passages", "official_hotpotqa", "parquet_records", "wiki_abstracts"]
