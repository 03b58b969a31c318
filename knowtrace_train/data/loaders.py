"""Read benchmark files (HotpotQA, 2WikiMultihopQA, MuSiQue, MINTQA, generic JSONL) into `QAItem`s (over 500 lines: one reader per format, sharing the row-error machinery, is easier to audit in one file).

A file is a JSON array or JSON Lines (told apart by its first character, `[` or not); its row
format is told by the keys of its first record (`detect_format`), or named with `format=`:

- ``hotpotqa``: ``_id, answer, question, supporting_facts [[title, sent_idx]],
  context [[title, [sentences]]], type, level``. Passage text = the sentences joined with ""
  (HotpotQA's sentences carry their own leading whitespace, so this gives back the original
  paragraph). ``hops`` = 2. Evidence: ``titles`` (supporting titles, ordered, unique),
  ``sentences`` (the supporting facts), ``paragraph_ids`` (those titles' passages).
- ``2wikimultihopqa``: as HotpotQA plus ``evidences [[s, r, o]]``, which become
  ``evidence.triples``. Its sentences carry no whitespace, so passage text = sentences joined
  with " ". ``hops`` = 2 for every type: bridge_comparison items list four triples, but as two
  parallel two-hop chains (the triple count stays readable as ``len(evidence.triples)``).
  Where an ``id_aliases.json`` lies beside the file (the release zip ships it; JSON Lines
  ``{Q_id, aliases, demonyms}``), ``answers`` = the answer, then the aliases and demonyms of its
  ``answer_id``: the gold set 2Wiki's v1.1 evaluation script scores against.
- ``musique``: ``id, paragraphs [{idx, title, paragraph_text, is_supporting}], question,
  question_decomposition [{id, question, answer, paragraph_support_idx}], answer,
  answer_aliases, answerable``. ``answers`` = answer + aliases; ``hops`` = number of
  decomposition steps; ``type`` = the id's prefix ("2hop", "3hop1", ...). Evidence:
  ``paragraph_ids``/``titles`` of the supporting paragraphs (decomposition order first) and one
  ``sub_questions`` entry per step, its "#1" references kept as they are.
- ``mintqa``: the authors' release (github.com/probe2/multi-hop: ``MINTQA-POP.json`` and
  ``MINTQA-TI.json``, one JSON object a line, ``question, answer, type, num_hops, subquestion,
  subanswer, triple, facts``; read by `_mintqa_release` into the layout below), or one JSON object
  per item in the layout this reader took before the release was known::

      {"id": "...",                      # optional; default "<dataset>-<i>", i = array index
                                         #   or 0-based line number
       "subset": "MINTQA-POP",           # optional, informational
       "question": "...",                # the main question
       "answer": "..." or ["...", ...],  # the main answer (a list: first canonical, rest aliases)
       "hops": 2,                        # optional; must equal len(triplets)
       "triplets": [[s, r, o], ...],     # the fact chain, in order
       "sub_questions": [{"question", "answer", "type"}, ...],  # one per triplet (hops >= 2)
       "type": "new"}                    # the fact's knowledge type, for 1-hop items

  Knowledge types are "new"/"old" (MINTQA-TI) or "popular"/"unpopular" (MINTQA-POP), any
  case. A 1-hop item gets one sub-question, the main question itself, carrying its type, so
  every item has a knowledge type per hop in ``evidence.sub_questions``. ``type`` = the
  per-hop knowledge types joined with "-" (e.g. "new-old"), the breakdown the paper reports.
- ``generic``: our own ``QAItem.to_dict()`` lines, or just ``{id, question, answers}``.
- ``flashrag``: FlashRAG's ``{id, question, golden_answers, metadata}`` (metadata is ignored).

Every context passage's id is `passage_id(title, text)`, so item contexts and corpora built from
them share ids; a passage repeated within an item is kept once.

A path of the form ``<name>:<split>`` (``hotpotqa:train``) that is not a file reads the fetched files of that
registry name (data/registry.py: ``python -m knowtrace_train.data fetch NAME``); a ``.parquet`` file (the hub's
HotpotQA) is read row by row, its nested columns mapped back to the official layout (data/formats.py).

A bad record raises `DataFileError` naming the file, the line (JSON Lines) or item index (JSON
array) and the field; with ``skip_bad=True`` it is skipped instead, logged and listed in
`LoadReport.skipped`. A file that cannot be read as a whole (an empty file, a broken JSON array,
an unknown format) always raises.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from tqdm.auto import tqdm

from ..io import DataFileError, iter_json_array, iter_jsonl, read_text
from .formats import parquet_records
from .registry import parse_ref, split_files
from .schema import GoldEvidence, Passage, QAItem, SchemaError, SubQuestion, passage_id

log = logging.getLogger(__name__)

FORMATS = ("hotpotqa", "2wikimultihopqa", "musique", "mintqa", "generic", "flashrag")
#: dataset name each benchmark format gives its items (generic/flashrag: the row's or the file's).
DATASET_OF_FORMAT = {"hotpotqa": "hotpotqa", "2wikimultihopqa": "2wikimultihopqa", "musique": "musique", "mintqa": "mintqa"}
MINTQA_KNOWLEDGE_TYPES = ("new", "old", "popular", "unpopular")

_SPLIT_WORDS = {"train": "train", "dev": "dev", "validation": "dev", "val": "dev", "test": "test"}
_MUSIQUE_TYPE = re.compile(r"\d+hop\d*")


@dataclass
class LoadReport:
    """What `load_items_report` read: the items, and each skipped record as (where, reason)."""

    path: str
    format: str
    items: list[QAItem] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


class _RowError(Exception):
    """A record that does not fit its format; the message names the field, not the place."""


# -- public API -----------------------------------------------------------------


def detect_format(path: str | Path) -> str:
    """The row format of `path` (one of `FORMATS`), told from the keys of its first record."""
    path = Path(path)
    for _where, _index, row in _records(path, on_error=None):
        return _format_of(path, row)
    raise DataFileError(f"{path}: empty file (no records)")


def load_items(
    path: str | Path,
    format: str | None = None,
    *,
    dataset: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
) -> list[QAItem]:
    """The items of one benchmark file (see `load_items_report`)."""
    return load_items_report(path, format, dataset=dataset, split=split, limit=limit, skip_bad=skip_bad).items


def load_items_report(
    path: str | Path,
    format: str | None = None,
    *,
    dataset: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
) -> LoadReport:
    """Read `path` into `QAItem`s, with the records skipped (only with `skip_bad`).

    `format`: one of `FORMATS`, else told from the content. `dataset`/`split` override what the
    format, the rows or the file name say (split from the name: train/dev/validation/test, else
    "unknown"). `limit`: stop after that many items.
    """
    report = LoadReport(path=str(path), format=format or "")
    report.items = list(iter_items(path, format, dataset=dataset, split=split, limit=limit, skip_bad=skip_bad, report=report))
    return report


def iter_items(
    path: str | Path,
    format: str | None = None,
    *,
    dataset: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
    report: LoadReport | None = None,
) -> Iterator[QAItem]:
    """`load_items_report`'s items one at a time, none kept (the post-fetch check counts 2Wiki's 167,454
    train items this way); `report`, where given, gets the format and the skipped records, not the items."""
    report = report if report is not None else LoadReport(path=str(path), format=format or "")
    ref = parse_ref(str(path))
    if ref is not None:  # "<name>:<split>": the fetched files of a registry name (data/registry.py)
        yield from _named_items(*ref, format=format, dataset=dataset, split=split, limit=limit, skip_bad=skip_bad, report=report)
        return
    path = Path(path)
    if format is not None and format not in FORMATS:
        raise DataFileError(f"{path}: unknown format {format!r} (known: {', '.join(FORMATS)})")
    if path.is_dir():
        raise DataFileError(f"{path}: a folder, not a data file: name a JSON Lines, JSON or parquet file")
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()}: run from the repository root or give an absolute path)"
        raise DataFileError(f"{path}: no such data file{where}")
    if limit is not None and limit < 0:
        raise DataFileError(f"{path}: the limit must be >= 0, got {limit}")
    fmt = format or ""
    skipped_before = len(report.skipped)
    on_error = (lambda where, reason: report.skipped.append((where, reason))) if skip_bad else None
    seen_ids: dict[str, str] = {}
    default_split = split or split_from_name(path)
    aliases: dict[str, tuple[str, ...]] | None = None
    records = kept = 0
    progress = tqdm(_records(path, on_error), desc=path.name, unit="record", leave=False, disable=None, mininterval=1.0)
    for where, index, row in progress:
        records += 1
        if limit is not None and kept >= limit:
            break
        try:
            if not isinstance(row, dict):
                raise _RowError(f"expected a JSON object, got {type(row).__name__}")
            if not fmt:
                fmt = report.format = _format_of(path, row)
            item = _convert(fmt, row, index, path, dataset, split, default_split)
            if fmt == "2wikimultihopqa":
                aliases = read_2wiki_aliases(path.parent / WIKI2_ALIASES) if aliases is None else aliases
                extra = aliases.get(str(row.get("answer_id"))) if aliases else None
                if extra:
                    item = dataclasses.replace(item, answers=_unique(item.answers + extra))
            if item.id in seen_ids:
                raise _RowError(f"duplicate id {item.id!r} (first at {seen_ids[item.id]})")
        except (_RowError, SchemaError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            # a field of the wrong type that a format's converter met (a string where a list was meant): the record's
            # error too, as are those the schema names
            if isinstance(e, DataFileError):  # another file's error (2Wiki's aliases) names that file
                raise
            reason = str(e) if isinstance(e, (_RowError, SchemaError)) else f"a field of the wrong type or shape ({type(e).__name__}: {e})"
            if not skip_bad:
                raise DataFileError(f"{where}: {reason}") from e
            report.skipped.append((where, reason))
            continue
        seen_ids[item.id] = where
        kept += 1
        yield item
    skipped = report.skipped[skipped_before:]
    if records == 0 and not skipped:
        raise DataFileError(f"{path}: empty file (no records)")
    if skipped:
        first = "; ".join(f"{w}: {r}" for w, r in skipped[:3])
        log.warning("%s: skipped %d bad record(s) (first: %s)", path, len(skipped), first)
        if not kept and limit != 0:
            raise DataFileError(f"{path}: every record is bad ({len(skipped)} skipped; first: {first})")
    if not report.format:
        report.format = format or "unknown"


def _named_items(name: str, split_name: str, *, format, dataset, split, limit, skip_bad, report: LoadReport) -> Iterator[QAItem]:
    """The items of a fetched split, over its files (sharded parquet: in order)."""
    files, reader = split_files(name, split_name)
    report.format = report.format or format or reader
    kept = 0
    for f in files:
        left = None if limit is None else limit - kept
        if left == 0:
            break
        inner = LoadReport(path=str(f), format=format or reader)
        for item in iter_items(f, format or reader, dataset=dataset or name, split=split or split_name, limit=left,
                               skip_bad=skip_bad, report=inner):
            kept += 1
            yield item
        report.skipped += inner.skipped


#: 2Wiki's alias file, shipped in its release zip beside train.json and dev.json
WIKI2_ALIASES = "id_aliases.json"


def read_2wiki_aliases(path: Path) -> dict[str, tuple[str, ...]]:
    """{Wikidata id: its aliases then demonyms} from 2Wiki's ``id_aliases.json`` (JSON Lines ``{Q_id, aliases,
    demonyms}``, as its v1.1 evaluation script reads it); {} where there is no such file."""
    if not path.is_file():
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for lineno, row in iter_jsonl(path):
        qid, names, demonyms = row.get("Q_id"), row.get("aliases") or [], row.get("demonyms") or []
        if not isinstance(qid, str) or not isinstance(names, list) or not isinstance(demonyms, list):
            raise DataFileError(f"{path}:{lineno}: expected {{Q_id: string, aliases: [strings], demonyms: [strings]}}")
        found = _unique(str(a) for a in names + demonyms if isinstance(a, str) and a.strip())
        if found:
            out[qid] = found
    return out


def split_from_name(path: str | Path) -> str:
    """"train", "dev" or "test" where the file name says so unambiguously, else "unknown"."""
    words = {_SPLIT_WORDS[w] for w in re.split(r"[^a-z]+", Path(path).name.lower()) if w in _SPLIT_WORDS}
    return words.pop() if len(words) == 1 else "unknown"


# -- reading records --------------------------------------------------------------


def _records(path: Path, on_error: Callable[[str, str], None] | None) -> Iterator[tuple[str, int, Any]]:
    """Yield (where, index, record) from a JSON array or JSON Lines file: `where` is "file:line"
    or "file: item i"; `index` is the array index or the 0-based line number. Broken JSON Lines
    lines go to `on_error` where given, else raise."""
    if path.suffix == ".parquet":
        yield from parquet_records(path)
        return
    with path.open("rb") as f:
        head = f.read(4096).decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if head.startswith("["):
        yield from _array_records(path)
        return
    line_error = None if on_error is None else (lambda lineno, reason: on_error(f"{path}:{lineno}", reason))
    try:
        for lineno, obj in iter_jsonl(path, on_error=line_error):
            yield f"{path}:{lineno}", lineno - 1, obj
    except DataFileError as e:
        # a pretty-printed single object reads as broken JSON Lines: say what it is instead
        try:
            whole = json.loads(read_text(path))
        except (json.JSONDecodeError, DataFileError):
            raise e from None
        if isinstance(whole, dict):
            raise DataFileError(f"{path}: one JSON object; expected a JSON array of items or JSON Lines") from None
        raise


def _array_records(path: Path) -> Iterator[tuple[str, int, Any]]:
    """A JSON array's items one at a time (`iter_json_array`: 2Wiki's 708 MB train file is never held whole)."""
    try:
        for i, _line, row in iter_json_array(path):
            yield f"{path}: item {i}", i, row
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start:e.start + 1].hex()}): save it as "
                            "UTF-8, or name the right file") from e


def _format_of(path: Path, row: Any) -> str:
    if isinstance(row, dict):
        keys = set(row)
        if {"paragraphs", "question_decomposition"} <= keys:
            return "musique"
        if "context" in keys and ("supporting_facts" in keys or "_id" in keys):
            return "2wikimultihopqa" if keys & {"evidences", "entity_ids", "answer_id"} else "hotpotqa"
        if "triplets" in keys or "triple" in keys and keys & {"subquestion", "num_hops"}:
            return "mintqa"
        if "golden_answers" in keys:
            return "flashrag"
        if "answers" in keys:
            return "generic"
        seen = f"keys {sorted(keys)}"
    else:
        seen = f"a {type(row).__name__}"
    raise DataFileError(
        f"{path}: cannot tell the format from the first record ({seen}); pass format= one of {', '.join(FORMATS)}"
    )


# -- one record -> QAItem -----------------------------------------------------------


def _convert(
    fmt: str, row: dict, index: int, path: Path, dataset: str | None, split: str | None, default_split: str
) -> QAItem:
    if fmt in DATASET_OF_FORMAT:
        name = dataset or DATASET_OF_FORMAT[fmt]
        return _CONVERTERS[fmt](row, index, name, split or default_split)
    row_split = row.get("split") if isinstance(row.get("split"), str) and row.get("split") != "unknown" else None
    row_dataset = row.get("dataset") if isinstance(row.get("dataset"), str) and row.get("dataset") != "unknown" else None
    name = dataset or row_dataset or _dataset_from_name(path)
    return _CONVERTERS[fmt](row, index, name, split or row_split or default_split)


def _dataset_from_name(path: Path) -> str:
    """The file stem, or the folder's name where the stem is only a split ("hotpotqa/dev.jsonl")."""
    if path.stem.lower() in _SPLIT_WORDS and path.parent.name:
        return path.parent.name
    return path.stem


def _hotpotqa(row: dict, index: int, dataset: str, split: str) -> QAItem:
    return _sentence_item(row, dataset, split, sep="", triples=())


def _2wikimultihopqa(row: dict, index: int, dataset: str, split: str) -> QAItem:
    triples = ()
    if row.get("evidences") is not None:
        ev = _list(row, "evidences")
        for i, t in enumerate(ev):
            if not (isinstance(t, list) and len(t) == 3 and all(isinstance(x, (str, int, float)) for x in t)):
                raise _RowError(f"field 'evidences'[{i}] must be [subject, relation, object]")
        triples = tuple((str(s), str(r), str(o)) for s, r, o in ev)
    return _sentence_item(row, dataset, split, sep=" ", triples=triples)


def _sentence_item(row: dict, dataset: str, split: str, sep: str, triples: tuple) -> QAItem:
    """HotpotQA and 2Wiki: context [[title, [sentences]]] and supporting facts [[title, i]]."""
    passages: list[Passage] = []
    by_title: dict[str, list[str]] = {}
    for i, entry in enumerate(_list(row, "context")):
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], list)
            and all(isinstance(s, str) for s in entry[1])
        ):
            raise _RowError(f"field 'context'[{i}] must be [title, [sentences]]")
        title, sentences = entry
        p = _passage(title, sep.join(sentences).strip())
        passages.append(p)
        by_title.setdefault(title, []).append(p.id)
    facts = []
    for i, fact in enumerate(row.get("supporting_facts") or ()):
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str) and isinstance(fact[1], int)):
            raise _RowError(f"field 'supporting_facts'[{i}] must be [title, sentence index]")
        facts.append((fact[0], fact[1]))
    titles = _unique(t for t, _ in facts)
    evidence = GoldEvidence(
        titles=titles,
        sentences=tuple(facts),
        paragraph_ids=_unique(pid for t in titles for pid in by_title.get(t, ())),
        triples=triples,
    )
    return QAItem(
        id=_id(row, "_id"),
        question=_text(row, "question"),
        answers=(_answer(row, "answer"),),
        dataset=dataset,
        split=split,
        type=_optional_str(row, "type"),
        hops=2,
        context=_dedupe(passages),
        evidence=evidence,
    )


def _musique(row: dict, index: int, dataset: str, split: str) -> QAItem:
    item_id = _id(row, "id")
    by_idx: dict[int, Passage] = {}
    supporting: list[int] = []
    for i, p in enumerate(_list(row, "paragraphs")):
        if not isinstance(p, dict):
            raise _RowError(f"field 'paragraphs'[{i}] must be an object")
        for key in ("idx", "title", "paragraph_text"):
            if p.get(key) is None:
                raise _RowError(f"field 'paragraphs'[{i}] is missing {key!r}")
        if not isinstance(p["idx"], int) or not isinstance(p["title"], str) or not isinstance(p["paragraph_text"], str):
            raise _RowError(f"field 'paragraphs'[{i}] must have an int 'idx' and string 'title', 'paragraph_text'")
        by_idx[p["idx"]] = _passage(p["title"], p["paragraph_text"])
        if p.get("is_supporting"):
            supporting.append(p["idx"])  # paragraph order; the decomposition's order goes first
    steps = _list(row, "question_decomposition")
    if not steps:
        raise _RowError("field 'question_decomposition' is empty")
    subs = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("question"), str) or step.get("answer") is None:
            raise _RowError(f"field 'question_decomposition'[{i}] must have a 'question' and an 'answer'")
        support = step.get("paragraph_support_idx")
        if support is not None and support not in by_idx:
            raise _RowError(f"field 'question_decomposition'[{i}]: paragraph_support_idx {support!r} is not a paragraph idx")
        subs.append(
            SubQuestion(
                question=step["question"],
                answer=str(step["answer"]),
                paragraph_ids=() if support is None else (by_idx[support].id,),
            )
        )
    order = _unique([s["paragraph_support_idx"] for s in steps if s.get("paragraph_support_idx") is not None] + supporting)
    aliases = row.get("answer_aliases") or []
    if not isinstance(aliases, list):
        raise _RowError("field 'answer_aliases' must be a list of strings")
    prefix = item_id.split("__", 1)[0]
    return QAItem(
        id=item_id,
        question=_text(row, "question"),
        answers=_unique([_answer(row, "answer")] + [str(a) for a in aliases if str(a).strip()]),
        dataset=dataset,
        split=split,
        type=prefix if _MUSIQUE_TYPE.fullmatch(prefix) else f"{len(steps)}hop",
        hops=len(steps),
        context=_dedupe(by_idx.values()),
        evidence=GoldEvidence(
            titles=_unique(by_idx[i].title for i in order),
            paragraph_ids=_unique(by_idx[i].id for i in order),
            sub_questions=tuple(subs),
        ),
    )


_LABELS = re.compile(r"[\s,;/-]+")


def _mintqa_release(row: dict) -> dict:
    """A row of the authors' release (github.com/probe2/multi-hop, MINTQA-POP.json / MINTQA-TI.json: ``question,
    answer, type, num_hops, subquestion, subanswer, triple, facts``) in the layout `_mintqa` reads: ``triple`` ->
    triplets, ``num_hops`` -> hops, ``subquestion``/``subanswer`` with the per-hop labels of ``type`` ->
    sub_questions. ``type`` is a list of per-hop labels or one string of them ("popular-unpopular"); a 1-hop item
    may give one triple and one sub-question as bare values. ``facts`` is not read."""
    chain = row.get("triple")
    if isinstance(chain, list) and len(chain) == 3 and all(isinstance(x, str) for x in chain):
        chain = [chain]  # one hop, one triple
    subq, suba = row.get("subquestion"), row.get("subanswer")
    subq = [subq] if isinstance(subq, str) else subq
    suba = [suba] if isinstance(suba, (str, int, float)) and not isinstance(suba, bool) else suba
    labels = row.get("type")
    if isinstance(labels, str):
        labels = [x for x in _LABELS.split(labels) if x]
    out = {k: v for k, v in row.items() if k not in ("triple", "num_hops", "subquestion", "subanswer", "type")}
    out["triplets"], out["hops"] = chain, row.get("num_hops")
    if subq is None:
        raise _RowError("missing required field 'subquestion'")
    if not isinstance(subq, list) or not isinstance(suba, list) or len(subq) != len(suba):
        raise _RowError("fields 'subquestion' and 'subanswer' must be lists of the same length (one per hop)")
    if not isinstance(labels, list) or len(labels) != len(subq):
        raise _RowError(f"field 'type' must give one knowledge type per hop ({len(subq)}), got {row.get('type')!r}")
    out["sub_questions"] = [{"question": q, "answer": str(a), "type": t} for q, a, t in zip(subq, suba, labels)]
    return out


def _mintqa(row: dict, index: int, dataset: str, split: str) -> QAItem:
    if "triple" in row and "triplets" not in row:
        row = _mintqa_release(row)
    chain = _list(row, "triplets")
    if not chain:
        raise _RowError("field 'triplets' is empty")
    for i, t in enumerate(chain):
        if not (isinstance(t, list) and len(t) == 3 and all(isinstance(x, str) for x in t)):
            raise _RowError(f"field 'triplets'[{i}] must be [subject, relation, object]")
    hops = row.get("hops")
    if hops is not None and hops != len(chain):
        raise _RowError(f"field 'hops' is {hops!r} but 'triplets' has {len(chain)} facts")
    answer = row.get("answer")
    if isinstance(answer, list):
        if not answer or not all(isinstance(a, str) and a.strip() for a in answer):
            raise _RowError("field 'answer' must be a non-empty string or list of non-empty strings")
        answers = _unique(answer)
    else:
        answers = (_answer(row, "answer"),)
    question = _text(row, "question")
    raw_subs = row.get("sub_questions") or []
    if not isinstance(raw_subs, list):
        raise _RowError("field 'sub_questions' must be a list")
    if not raw_subs:
        if len(chain) > 1:
            raise _RowError(f"missing required field 'sub_questions' ({len(chain)} hops)")
        raw_subs = [{"question": question, "answer": answers[0], "type": row.get("type")}]
        type_field = "type"
    elif len(raw_subs) != len(chain):
        raise _RowError(f"field 'sub_questions' has {len(raw_subs)} entries but 'triplets' has {len(chain)}")
    else:
        type_field = "sub_questions[{}].type"
    subs = []
    for i, s in enumerate(raw_subs):
        if not isinstance(s, dict) or not isinstance(s.get("question"), str) or not isinstance(s.get("answer"), str):
            raise _RowError(f"field 'sub_questions'[{i}] must have a string 'question' and 'answer'")
        kind = s.get("type", s.get("knowledge_type"))
        if not isinstance(kind, str) or kind.strip().lower() not in MINTQA_KNOWLEDGE_TYPES:
            raise _RowError(f"field {type_field.format(i)!r} must be one of {', '.join(MINTQA_KNOWLEDGE_TYPES)}, got {kind!r}")
        subs.append(SubQuestion(question=s["question"], answer=s["answer"], knowledge_type=kind.strip().lower()))
    item_id = row.get("id")
    return QAItem(
        id=f"{dataset}-{index}" if item_id is None else str(item_id),
        question=question,
        answers=answers,
        dataset=dataset,
        split=split,
        type="-".join(str(s.knowledge_type) for s in subs),
        hops=len(chain),
        evidence=GoldEvidence(triples=tuple((s, r, o) for s, r, o in chain), sub_questions=tuple(subs)),
    )


def _generic(row: dict, index: int, dataset: str, split: str) -> QAItem:
    _id(row, "id")
    _text(row, "question")
    answers = _list(row, "answers")
    if not answers or not all(isinstance(a, (str, int, float)) and str(a).strip() for a in answers):
        raise _RowError("field 'answers' must be a non-empty list of non-empty strings")
    return QAItem.from_dict({**row, "dataset": dataset, "split": split}, where="record")


def _flashrag(row: dict, index: int, dataset: str, split: str) -> QAItem:
    answers = _list(row, "golden_answers")
    if not answers or not all(isinstance(a, (str, int, float)) and str(a).strip() for a in answers):
        raise _RowError("field 'golden_answers' must be a non-empty list of non-empty strings")
    return QAItem(
        id=_id(row, "id"),
        question=_text(row, "question"),
        answers=_unique(str(a) for a in answers),
        dataset=dataset,
        split=split,
    )


_CONVERTERS: dict[str, Callable[[dict, int, str, str], QAItem]] = {
    "hotpotqa": _hotpotqa,
    "2wikimultihopqa": _2wikimultihopqa,
    "musique": _musique,
    "mintqa": _mintqa,
    "generic": _generic,
    "flashrag": _flashrag,
}


# -- field helpers -------------------------------------------------------------------


def _present(row: dict, key: str) -> Any:
    if row.get(key) is None:
        raise _RowError(f"missing required field {key!r}")
    return row[key]


def _id(row: dict, key: str) -> str:
    v = _present(row, key)
    if not isinstance(v, (str, int)) or not str(v).strip():
        raise _RowError(f"field {key!r} must be a non-empty string")
    return str(v)


def _text(row: dict, key: str) -> str:
    v = _present(row, key)
    if not isinstance(v, str):
        raise _RowError(f"field {key!r} must be a string, got {type(v).__name__}")
    if not v.strip():
        raise _RowError(f"field {key!r} is empty")
    return v


def _answer(row: dict, key: str) -> str:
    """`_text`, a number read as its text (an answer may be a year or a count)."""
    v = _present(row, key)
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else _text(row, key)


def _list(row: dict, key: str) -> list:
    v = _present(row, key)
    if not isinstance(v, list):
        raise _RowError(f"field {key!r} must be a list, got {type(v).__name__}")
    return v


def _optional_str(row: dict, key: str) -> str | None:
    v = row.get(key)
    return None if v is None else str(v)


def _passage(title: str, text: str) -> Passage:
    return Passage(id=passage_id(title, text), title=title, text=text)


def _dedupe(passages: Iterable[Passage]) -> tuple[Passage, ...]:
    """Each passage once, first occurrence first (ids are content hashes, so equal ids = equal passages)."""
    out: dict[str, Passage] = {}
    for p in passages:
        out.setdefault(p.id, p)
    return tuple(out.values())


def _unique(values) -> tuple:
    return tuple(dict.fromkeys(values))
