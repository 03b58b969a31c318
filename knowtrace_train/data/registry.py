"""The paper's benchmarks and corpora by name: per name its source (a hub dataset repo at a revision, or the
official download address), its files, and the reader that maps them to `QAItem`s or `Passage`s.

`python -m knowtrace_train.data fetch NAME...` (data/fetch.py) downloads a name into
``$KNOWTRACE_CACHE/data/<name>/<revision>/`` and writes ``fetch.lock.json`` there last; a config names
what it fetched as ``hotpotqa:train`` (a split) or ``corpus: {source: name, name: wiki2018-dpr}``.

Sizes and hashes are written here where a publisher gives them (HotpotQA's abstracts: size and MD5), each
with its source named; where they are None the first fetch computes the SHA-256, records it in the lock file,
and every later fetch of that revision is checked against the lock ("pinned at first fetch"). A hub source's
files carry their SHA-256 in the hub's listing (the LFS object id), which is checked on download. No hash here
is guessed.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from knowtrace_train.io import DataFileError, cache_home

LOCK_NAME = "fetch.lock.json"
FETCH_COMMAND = "python -m knowtrace_train.data fetch"
#: a reference to a fetched split: "<name>:<split>" (a path that exists as a file is always a path)
_REF = re.compile(r"^([a-z0-9][a-z0-9-]*):([a-z_]+)$")


class FetchError(DataFileError):
    """A name that is unknown or not fetched, a download that failed or does not match its checksum."""

    label = "fetch error"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a source: `path` inside the hub repo (a glob for sharded files) or the URL's file name."""

    path: str
    url: str | None = None
    size: int | None = None  # bytes, where the publisher gives them (checked after download)
    sha256: str | None = None  # None: pinned at first fetch (the lock file)
    md5: str | None = None  # where the publisher gives an MD5 (checked after download, beside the SHA-256)
    #: zip archives: the members to extract (matched by base name, wherever the archive keeps them)
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    kind: str  # "hub" (a dataset repo served by $HF_ENDPOINT) or "url" (official download addresses)
    revision: str
    files: tuple[RemoteFile, ...]
    repo: str | None = None
    #: split -> the files (paths after extraction, globs allowed) that hold it
    splits: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the reader: a loaders.FORMATS name for questions, a corpus reader name for passages
    reader: str = ""
    why: str = ""


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # "qa" or "corpus"
    sources: tuple[Source, ...]  # the first is the default; `fetch --source KIND` picks another
    licence: str
    keeps: str  # what its reader keeps
    size: str = ""  # the published counts; bytes and SHA-256 are pinned at first fetch
    unavailable: str = ""  # why there is no source (the name is known, but cannot be fetched)

    def source(self, kind: str | None = None) -> Source:
        if not self.sources:
            raise FetchError(f"{self.name}: {self.unavailable}")
        if kind is None:
            return self.sources[0]
        for s in self.sources:
            if s.kind == kind:
                return s
        raise FetchError(f"{self.name} has no source {kind!r} (sources: {', '.join(s.kind for s in self.sources)})")


_HOTPOT_URL = "http://curtis.ml.cmu.edu/datasets/hotpot/"
_MINTQA_URL = "https://raw.githubusercontent.com/probe2/multi-hop/main/"
_QA_KEEPS = "question, answer, type; context paragraphs; supporting facts (title, sentence) and their paragraphs"

REGISTRY: dict[str, Entry] = {e.name: e for e in (
    Entry(
        "hotpotqa", "qa",
        (
            Source(
                "hub", "main", repo="hotpotqa/hotpot_qa", reader="hotpotqa",
                files=(RemoteFile("distractor/train-*.parquet"), RemoteFile("distractor/validation-*.parquet"),
                       RemoteFile("fullwiki/validation-*.parquet")),
                splits={"train": ("distractor/train-*.parquet",), "dev": ("distractor/validation-*.parquet",),
                        "dev_fullwiki": ("fullwiki/validation-*.parquet",)},
                why="the dataset's own hub repo: every field of the official files (supporting facts as "
                    "{title, sent_id}, context as {title, sentences}), a revision the lock pins, HF_ENDPOINT mirrors",
            ),
            Source(
                "url", "v1.1", reader="hotpotqa",
                files=(RemoteFile("hotpot_train_v1.1.json", _HOTPOT_URL + "hotpot_train_v1.1.json"),
                       RemoteFile("hotpot_dev_distractor_v1.json", _HOTPOT_URL + "hotpot_dev_distractor_v1.json"),
                       RemoteFile("hotpot_dev_fullwiki_v1.json", _HOTPOT_URL + "hotpot_dev_fullwiki_v1.json")),
                splits={"train": ("hotpot_train_v1.1.json",), "dev": ("hotpot_dev_distractor_v1.json",),
                        "dev_fullwiki": ("hotpot_dev_fullwiki_v1.json",)},
                why="the official JSON arrays (the format today's loader reads)",
            ),
        ),
        licence="CC BY-SA 4.0", keeps=_QA_KEEPS, size="train 90,447; dev 7,405; fullwiki dev 7,405 questions",
    ),
    Entry(
        "2wikimultihopqa", "qa",
        (Source(
            "url", "2021-04-07", reader="2wikimultihopqa",
            files=(RemoteFile("data_ids_april7.zip", "https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1",
                              members=("train.json", "dev.json", "id_aliases.json")),),
            splits={"train": ("train.json",), "dev": ("dev.json",)},
            why="the authors' release (with evidences_id/answer_id): the only one known to keep the evidence "
                "triples the gold bootstrap reads; hub copies rename or drop fields",
        ),),
        licence="Apache-2.0", keeps=_QA_KEEPS + "; evidence triples", size="train 167,454; dev 12,576 questions",
    ),
    Entry(
        "musique", "qa",
        (Source(
            "url", "v1.0", reader="musique",
            files=(RemoteFile("musique_v1.0.zip",
                              "https://drive.usercontent.google.com/download?id=1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h&export=download&confirm=t",
                              members=("musique_ans_v1.0_train.jsonl", "musique_ans_v1.0_dev.jsonl")),),
            splits={"train": ("musique_ans_v1.0_train.jsonl",), "dev": ("musique_ans_v1.0_dev.jsonl",)},
            why="the authors' release (answerable subset): the question decompositions and supporting "
                "paragraphs the gold bootstrap reads; FlashRAG's copy keeps them only in metadata",
        ),),
        licence="CC BY 4.0", keeps="question, answer and aliases; 20 paragraphs; decomposition steps with their "
        "supporting paragraphs", size="answerable: train 19,938; dev 2,417 questions",
    ),
    Entry(
        "mintqa", "qa",
        (Source(
            "url", "main", reader="mintqa",
            files=(RemoteFile("MINTQA-POP.json", _MINTQA_URL + "MINTQA-POP.json"),
                   RemoteFile("MINTQA-TI.json", _MINTQA_URL + "MINTQA-TI.json")),
            splits={"pop": ("MINTQA-POP.json",), "ti": ("MINTQA-TI.json",)},
            why="the paper's own repository (github.com/probe2/multi-hop, named in the paper): JSON Lines with "
                "question, answer, per-hop knowledge types, hop count, sub-questions and answers, the Wikidata "
                "triple chain and facts; the hub's probejie/MINTQA is a parquet copy of the same rows",
        ),),
        licence="see github.com/probe2/multi-hop", keeps="question, answer, per-hop knowledge types (popular/unpopular "
        "or new/old), the triple chain, sub-questions with their answers", size="MINTQA-POP 17,887; MINTQA-TI 10,479 questions",
    ),
    Entry(
        "wiki2017-abstracts", "corpus",
        (Source(
            "url", "20171001", reader="wiki_abstracts",
            # size and MD5 as the publisher gives them (hotpotqa.github.io/wiki-readme.html, as quoted with that page
            # named in public repositories that checked their copies against it); the SHA-256 is recorded at first fetch
            files=(RemoteFile("enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
                              "https://nlp.stanford.edu/projects/hotpotqa/"
                              "enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
                              size=1_553_565_403, md5="01edf64cd120ecc03a2745352779514c"),),
            why="HotpotQA's own corpus (the first paragraph of every article, 2017-10-01), as IRCoT indexes it",
        ),),
        licence="CC BY-SA (Wikipedia)", keeps="one passage per article with text: title, the abstract's sentences joined",
        size="5,233,329 passages",
    ),
    Entry(
        "wiki2018-dpr", "corpus",
        (Source(
            "url", "dpr-psgs-w100", reader="dpr_tsv",
            files=(RemoteFile("psgs_w100.tsv.gz", "https://dl.fbaipublicfiles.com/dpr/wikipedia_split/psgs_w100.tsv.gz"),),
            why="DPR's 100-word passages of the 2018-12-20 dump, the corpus 2Wiki's and MuSiQue's open-domain "
                "runs use (FlashRAG's wiki18_100w is the same text as {id, contents})",
        ),),
        licence="CC BY-SA (Wikipedia)", keeps="title and text of every 100-word passage (content ids; a repeated passage once)", size="21,015,324 passages",
    ),
)}


def entry(name: str) -> Entry:
    """The registry's entry for `name`; an unknown name is one line listing the known ones."""
    if name in REGISTRY:
        return REGISTRY[name]
    close = difflib.get_close_matches(name.lower(), list(REGISTRY), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise FetchError(f"unknown dataset name {name!r}: {hint}known names: {', '.join(REGISTRY)}")


def parse_ref(text: str) -> tuple[str, str] | None:
    """(name, split) where `text` reads as "<name>:<split>" and is not an existing file, else None."""
    m = _REF.match(text.strip()) if isinstance(text, str) else None
    if m is None or Path(text).exists():
        return None
    return m.group(1), m.group(2)


def data_home(cache: str | Path | None = None) -> Path:
    return cache_home(cache) / "data"


def fetched_dir(name: str, cache: str | Path | None = None) -> tuple[Path, dict]:
    """(folder, lock) of the fetched copy of `name` (any of its sources); one line naming the fetch
    command where there is none."""
    e = entry(name)
    for s in e.sources:
        folder = data_home(cache) / name / s.revision
        lock = folder / LOCK_NAME
        if lock.is_file():
            data = json.loads(lock.read_text(encoding="utf-8"))
            if data.get("complete"):
                return folder, data
    e.source()  # a name with no source says why
    raise FetchError(f"{name} is not fetched yet (nothing in {data_home(cache) / name}): run {FETCH_COMMAND} {name}")


def split_files(name: str, split: str, cache: str | Path | None = None) -> tuple[list[Path], str]:
    """(files, reader format) of a fetched split; each file is checked to be there, whole, as the lock says."""
    e = entry(name)
    if e.kind != "qa":
        raise FetchError(f"{name} is a corpus, not a question set: name it as corpus: {{source: name, name: {name}}}")
    folder, lock = fetched_dir(name, cache)
    source = e.source(lock.get("source"))
    if split not in source.splits:
        raise FetchError(f"{name} has no split {split!r} (splits: {', '.join(source.splits)})")
    files = sorted({p for pattern in source.splits[split] for p in folder.glob(pattern)})
    if not files:
        raise FetchError(f"{name}:{split}: no file matches {source.splits[split]} in {folder}: run {FETCH_COMMAND} {name}")
    for p in files:
        check_locked(folder, lock, p)
    return files, source.reader


def corpus_files(name: str, cache: str | Path | None = None) -> tuple[list[Path], str]:
    e = entry(name)
    if e.kind != "corpus":
        raise FetchError(f"{name} is a question set, not a corpus: name a split of it ({name}:dev) or use corpus source contexts")
    folder, lock = fetched_dir(name, cache)
    files = [folder / rel for rel in lock["files"]]
    for p in files:
        check_locked(folder, lock, p)
    return files, e.source(lock.get("source")).reader


def check_locked(folder: Path, lock: dict, path: Path) -> None:
    """`path` is there with the size its lock records (its SHA-256 was checked before the lock was written)."""
    rel = path.relative_to(folder).as_posix()
    want = lock.get("files", {}).get(rel)
    if want is None:
        raise FetchError(f"{path}: not in {folder / LOCK_NAME} (a file not written by fetch): run {FETCH_COMMAND} {lock.get('name', '')}")
    if not path.is_file() or path.stat().st_size != want["size"]:
        raise FetchError(f"{path}: missing or not the {want['size']} bytes fetched: run {FETCH_COMMAND} --verify {lock.get('name', '')}")


def check_data_ref(value: str | None, key: str, corpus: bool = False) -> bool:
    """Whether `value` names a registry split ("hotpotqa:train"), or with `corpus` a corpus name, that is fetched;
    False where it reads as a path. A known name not fetched, an unknown name or split: one line naming `key`."""
    if value is None:
        return False
    try:
        if corpus:
            corpus_files(value)
            return True
        ref = parse_ref(value)
        if ref is None:
            return False
        split_files(*ref)
        return True
    except FetchError as e:
        raise FetchError(f"{key}: {e}") from None
