"""A generated open-domain corpus: a small corpus (the synthetic world's, by default) placed at random rows
among N generated distractor passages, deterministic by seed, written once into the cache home and opened
as a passage store (data/store.py), so that BM25 over it is sharded and bounded in memory.

A distractor has 30-90 words drawn at Zipf frequencies from a vocabulary of the base corpus' words (by
falling count) followed by 20,000 coined words, and a title of two coined words, capitalised. The words
overlap the base corpus' own, so distractors compete with its passages for a query's terms.

Config: ``corpus: {source: generated, passages: 1000000, seed: 0}`` (the base is `corpus.path`, default
the world's corpus). The store is found again by a record ``<cache>/store/generated/<key>.json``, the key
hashing the count, the seed, the generator's format and the base corpus' content fingerprint; an OS file
lock on the key makes two runs that start together generate it once (the second waits, then opens it).
Command line (the same generator, to a file): ``python -m knowtrace_train.data.generated N --out corpus.jsonl``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from knowtrace_train.data.corpus import CorpusError, read_corpus
from knowtrace_train.data.store import PassageStore, StoreFormatError, convert_corpus, store_root
from knowtrace_train.io import disk_space

log = logging.getLogger(__name__)

#: the synthetic world's corpus (shipped in the package: data/bundled.py), the default base
WORLD_CORPUS = Path(__file__).resolve().parent / "world_files" / "corpus.jsonl"
#: Bumped whenever the generator writes another corpus for the same parameters (a new key: generated anew).
GENERATED_FORMAT = 1
COINED_WORDS = 20_000
_SYLLABLES = ["ka", "lo", "mi", "ra", "ten", "vo", "shu", "dre", "pol", "ix", "an", "bel", "cor", "dun", "eth", "fy"]


def _coined_words(rng: np.random.Generator, n: int) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 5)))))
    return sorted(out)


def generate_corpus(out: str | Path, n: int, seed: int = 0, base: str | Path = WORLD_CORPUS, chunk: int = 20_000) -> int:
    """Write the passages of `base` inside `n` distractors to `out` (JSON Lines, streamed `chunk` rows at a
    time); returns the count (n plus the base's). The base is read whole (it is meant to be small); its
    passages keep their ids and sit at rows drawn by `seed`, in their own order; distractor ids are
    ``syn-00000000`` on, in row order."""
    if n < 0:
        raise ValueError(f"generate_corpus: n must be >= 0, got {n}")
    rng = np.random.default_rng(seed)
    world = read_corpus(base)
    counts = Counter(w for p in world for w in re.findall(r"[A-Za-z]+", p.title + " " + p.text))
    coined = _coined_words(rng, COINED_WORDS)
    vocab = np.array([w for w, _ in counts.most_common()] + coined, dtype=object)
    prob = 1.0 / np.arange(1, len(vocab) + 1)
    prob /= prob.sum()
    cap = np.array([w.capitalize() for w in coined], dtype=object)
    total = n + len(world)
    world_rows = set(rng.choice(total, size=len(world), replace=False).tolist())
    world_iter = iter(world)
    written = syn = 0
    with open(out, "w", encoding="utf-8") as f:
        for start in range(0, total, chunk):
            stop = min(total, start + chunk)
            lengths = rng.integers(30, 91, size=stop - start)
            words = vocab[rng.choice(len(vocab), size=int(lengths.sum()), p=prob)]
            titles = cap[rng.integers(0, len(cap), size=(stop - start, 2))]
            ends = np.cumsum(lengths)
            lines = []
            for j, row in enumerate(range(start, stop)):
                if row in world_rows:
                    lines.append(json.dumps(next(world_iter).to_dict(), ensure_ascii=False))
                    continue
                text = " ".join(words[ends[j] - lengths[j] : ends[j]]) + "."
                lines.append(json.dumps({"id": f"syn-{syn:08d}", "title": f"{titles[j, 0]} {titles[j, 1]}", "text": text}))
                syn += 1
            f.write("\n".join(lines) + "\n")
            written += len(lines)
    return written


def generated_key(n: int, seed: int, base: str | Path = WORLD_CORPUS) -> str:
    """The generated corpus' name in the cache: a hash of the count, the seed, the generator's format and
    the base corpus' content fingerprint (its passages' ids, titles and texts, so a moved file keeps it)."""
    from knowtrace_train.retrieval.cache import corpus_fingerprint

    blob = json.dumps({"format": GENERATED_FORMAT, "passages": int(n), "seed": int(seed),
                       "base": corpus_fingerprint(read_corpus(base))}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive OS file lock (flock) on `path`, waited for; released when the block ends or the process dies."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is generating %s; waiting for it", path.with_suffix(""))
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _recorded(root: Path, record: Path) -> PassageStore | None:
    """The store a generation record names, if it is there, finished and of this format."""
    try:
        folder = root / json.loads(record.read_text())["fingerprint"][:24]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (folder / "DONE").exists():
        return None
    try:
        return PassageStore(folder)
    except StoreFormatError as e:
        log.warning("%s; generating the corpus again", e)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def find_generated(n: int, seed: int = 0, base: str | Path = WORLD_CORPUS, cache_dir: str | os.PathLike | None = "") -> PassageStore | None:
    """The store `open_generated` would open, if it is already in the cache (None, never generating it)."""
    root = store_root(cache_dir)
    return _recorded(root, root / "generated" / f"{generated_key(n, seed, base)}.json")


def open_generated(n: int, seed: int = 0, base: str | Path = WORLD_CORPUS, cache_dir: str | os.PathLike | None = "") -> PassageStore:
    """The passage store of `base` inside `n` generated distractors (`generate_corpus`), generated and
    converted on first use into `<cache_dir>/store` ('' = retrieval/store in the cache home) and found again
    by its key without generating. The corpus file is written to a temporary folder and removed once
    converted (the store holds the same passages); the record is written last, by an atomic rename."""
    if n < 1:
        raise CorpusError(f"a generated corpus needs at least one distractor passage, got {n}")
    base = Path(base)
    if not base.is_file():
        raise CorpusError(f"{base}: no such corpus file (the passages to place among the generated ones)")
    root = store_root(cache_dir)
    key = generated_key(n, seed, base)
    record = root / "generated" / f"{key}.json"
    found = _recorded(root, record)
    if found is not None:
        return found
    with _locked(record.with_suffix(".lock")):
        found = _recorded(root, record)  # another process finished it while this one waited
        if found is not None:
            return found
        tmp = Path(tempfile.mkdtemp(prefix=".generate.", dir=record.parent))
        try:
            t0 = time.perf_counter()
            with disk_space(record.parent, f"the generated corpus ({n:,} distractors)"):
                total = generate_corpus(tmp / "corpus.jsonl", n, seed, base)
            log.info("generated %d passages (%s inside %d distractors, seed %d) in %.1f s", total, base, n, seed,
                     time.perf_counter() - t0)
            folder = convert_corpus(tmp / "corpus.jsonl", root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        store = PassageStore(folder)
        part = record.with_suffix(f".{os.getpid()}.tmp")
        part.write_text(json.dumps({"passages": n, "seed": seed, "base": str(base.resolve()), "format": GENERATED_FORMAT,
                                    "num_passages": len(store), "fingerprint": store.fingerprint}, indent=2) + "\n")
        os.replace(part, record)
        return store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m knowtrace_train.data.generated", description=__doc__.split("\n")[0])
    ap.add_argument("passages", type=int, help="how many distractor passages")
    ap.add_argument("--out", required=True, help="the corpus file to write (JSON Lines: id, title, text)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", default=str(WORLD_CORPUS), help="the corpus placed among them (default: the world's)")
    args = ap.parse_args(argv)
    try:
        n = generate_corpus(args.out, args.passages, args.seed, args.base)
    except (CorpusError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {n} passages ({args.passages} generated, seed {args.seed}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
