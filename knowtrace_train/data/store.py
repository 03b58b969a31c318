"""A passage store on disk: a corpus file of any size converted once, streamed, into a
memory-mapped store in the cache home, read back by row as `Passage`s.

Layout of a store folder (`<cache>/store/<fingerprint[:24]>/`):

- ``passages.jsonl``: one canonical ``{"id", "title", "text"}`` line per passage, in corpus order;
- ``offsets.i64``: little-endian int64 byte offsets, one per passage plus the end (memory-mapped);
- ``idhash.u64``, ``idrows.i64``: the id index, every passage's id hash (8 bytes of BLAKE2b) sorted, and
  the row of each (memory-mapped): `store.by_id[pid]` is a binary search, the id checked on the row read;
- ``meta.json``: the format version, the passage count, the content fingerprint, the lines skipped;
- ``DONE``: written last; a folder without it is never opened.

The fingerprint (SHA-256 over every passage's id, title and text, then the count) is computed once
while converting and kept in ``meta.json``; a sidecar keyed by the corpus file's absolute path, size
and mtime_ns (``<cache>/store/by-file/<key>.json``) maps the file to its store, so a second run
neither re-reads nor re-hashes the file. Why a plain offsets file and not Arrow: docs/retrieval.md
("The passage store"), measured.

Memory while converting: one line at a time, plus 8 bytes per passage (a hash of its id), then 16 at the
end (the hashes and their order, sorted into the id index and to refuse duplicate ids, as `read_corpus`
does).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Iterator, overload

import numpy as np

from knowtrace_train.data.corpus import CorpusError, _passage_from_row
from knowtrace_train.data.schema import Passage
from knowtrace_train.io import cache_home, iter_jsonl

log = logging.getLogger(__name__)

#: Bumped whenever the files of a store change meaning; a store of another version is rebuilt.
#: 2: the id index (idhash.u64 sorted, idrows.i64).
STORE_FORMAT = 2
_WRITE_BUFFER = 16384  # offsets and id hashes written per flush
_SORT_CHUNK = 1 << 16  # sorted id hashes written per flush


def store_root(cache_dir: str | os.PathLike | None = "") -> Path:
    """Where stores live: `<cache_dir>/store`, '' meaning retrieval/ in the cache home."""
    base = cache_home() / "retrieval" if cache_dir in ("", None) else Path(cache_dir).expanduser()
    return base / "store"


class PassageStore(Sequence):
    """The passages of a converted corpus, by row: `store[i]` is a `Passage`, read from the
    memory-mapped file on demand; `len(store)` is the count; iterating streams them in order."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        meta = json.loads((self.folder / "meta.json").read_text())
        if meta.get("format") != STORE_FORMAT:
            raise StoreFormatError(f"{self.folder}: passage store format {meta.get('format')}, expected {STORE_FORMAT}")
        self.meta = meta
        self.fingerprint: str = meta["fingerprint"]
        self._n = int(meta["num_passages"])
        self._offsets = np.memmap(self.folder / "offsets.i64", dtype="<i8", mode="r")
        if len(self._offsets) != self._n + 1:
            raise StoreFormatError(f"{self.folder}: offsets.i64 holds {len(self._offsets)} entries, not {self._n + 1}")
        self._file = open(self.folder / "passages.jsonl", "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._ids: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> Passage: ...
    @overload
    def __getitem__(self, i: slice) -> list[Passage]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"passage row {i} out of range (store of {self._n})")
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        d = json.loads(self._map[lo:hi])
        return Passage(id=d["id"], title=d["title"], text=d["text"])

    def __iter__(self) -> Iterator[Passage]:
        with open(self.folder / "passages.jsonl", "rb") as f:
            for line in f:
                d = json.loads(line)
                yield Passage(id=d["id"], title=d["title"], text=d["text"])

    @property
    def by_id(self) -> "StoreIds":
        """The passages by id, a read-only mapping over the store's id index (nothing held in memory):
        `store.by_id[pid]` (KeyError if absent), `pid in store.by_id`, `store.by_id.get(pid)`."""
        return StoreIds(self)

    def row_of(self, pid: str) -> int | None:
        """The row of the passage whose id is `pid`, or None: a binary search of the sorted id hashes, the
        id checked on each row of that hash (two ids of one hash are told apart)."""
        hashes, rows = self._id_index()
        h = np.uint64(_id_hash(pid))
        j = int(hashes.searchsorted(h))
        while j < len(hashes) and hashes[j] == h:
            row = int(rows[j])
            if self._id_at(row) == pid:
                return row
            j += 1
        return None

    def _id_at(self, row: int) -> str:
        lo, hi = int(self._offsets[row]), int(self._offsets[row + 1])
        return json.loads(self._map[lo:hi])["id"]

    def _id_index(self) -> tuple[np.ndarray, np.ndarray]:
        if self._ids is None:
            hashes = np.memmap(self.folder / "idhash.u64", dtype="<u8", mode="r")
            rows = np.memmap(self.folder / "idrows.i64", dtype="<i8", mode="r")
            if len(hashes) != self._n or len(rows) != self._n:
                raise StoreFormatError(f"{self.folder}: the id index holds {len(hashes)} hashes and {len(rows)} rows, not {self._n}")
            self._ids = (hashes, rows)
        return self._ids

    def close(self) -> None:
        self._ids = None
        self._map.close()
        self._file.close()

    def __repr__(self) -> str:
        return f"PassageStore({str(self.folder)!r}, {self._n} passages)"


class StoreIds(Mapping):
    """A store's passages by id (`PassageStore.by_id`): lookups through its id index, iteration over the
    ids in corpus order (streamed)."""

    def __init__(self, store: PassageStore) -> None:
        self.store = store

    def __getitem__(self, pid: str) -> Passage:
        row = self.store.row_of(pid) if isinstance(pid, str) else None
        if row is None:
            raise KeyError(pid)
        return self.store[row]

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, str) and self.store.row_of(pid) is not None

    def __iter__(self) -> Iterator[str]:
        return (p.id for p in self.store)

    def __len__(self) -> int:
        return len(self.store)

    def __repr__(self) -> str:
        return f"StoreIds({self.store!r})"


def passages_by_id(corpus: Sequence[Passage]) -> Mapping[str, Passage]:
    """id -> passage of a corpus: a passage store's id index (nothing held in memory), else a dict of the list."""
    if isinstance(corpus, PassageStore):
        return corpus.by_id
    return {p.id: p for p in corpus}


class StoreFormatError(CorpusError):
    """A store written by another version of the toolkit (rebuilt by `open_store`)."""


def _sidecar(root: Path, path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:24]
    return root / "by-file" / f"{key}.json"


def open_store(path: str | Path, cache_dir: str | os.PathLike | None = "", skip_bad: bool = False) -> PassageStore:
    """The store of the corpus file `path` (ours or FlashRAG's format, as `read_corpus` reads),
    converted on first use. The file is found again by its path, size and mtime_ns without being
    read; a changed file is converted anew. `skip_bad`: a line that is not a passage is skipped and
    counted (meta.json's "skipped") instead of an error naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such corpus file")
    root = store_root(cache_dir)
    sidecar = _sidecar(root, path)
    if sidecar.exists():
        try:
            fp = json.loads(sidecar.read_text())["fingerprint"]
            folder = root / fp[:24]
            if (folder / "DONE").exists():
                return PassageStore(folder)
        except StoreFormatError as e:
            log.warning("%s; converting %s again", e, path)
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError, KeyError):
            pass  # a damaged sidecar: convert again
    folder = convert_corpus(path, root, skip_bad=skip_bad)
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    tmp = sidecar.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"path": str(path.resolve()), "fingerprint": PassageStore(folder).fingerprint}) + "\n")
    os.replace(tmp, sidecar)
    return PassageStore(folder)


def convert_corpus(path: str | Path, root: str | Path, skip_bad: bool = False) -> Path:
    """Stream the corpus file into a new store under `root`; returns its folder. A store of the
    same content that is already there is kept (this conversion is discarded)."""
    path, root = Path(path), Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert.", dir=root))
    try:
        try:
            meta = _convert_into(path, tmp, skip_bad)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise CorpusError(
                f"{root}: the disk filled while converting {path}: the store needs about "
                f"{path.stat().st_size * 1.08:,.0f} bytes (the file's size, plus about 32 bytes a passage: offsets and the id index); "
                f"{shutil.disk_usage(root).free:,} are free"
            ) from None
        folder = root / meta["fingerprint"][:24]
        if (folder / "DONE").exists():
            try:
                PassageStore(folder)
                return folder
            except StoreFormatError as e:
                log.warning("%s; rebuilding it", e)
                shutil.rmtree(folder)
        elif folder.exists():
            shutil.rmtree(folder)  # an unfinished leftover
        (tmp / "DONE").write_text("ok\n")
        tmp.chmod(0o755)
        os.replace(tmp, folder)
        log.info("converted %s into the passage store %s (%d passages)", path, folder, meta["num_passages"])
        return folder
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _id_hash(pid: str) -> int:
    return int.from_bytes(hashlib.blake2b(pid.encode("utf-8"), digest_size=8).digest(), "little")


def _convert_into(path: Path, folder: Path, skip_bad: bool) -> dict:
    h = hashlib.sha256()
    n = skipped = 0
    offsets: list[int] = [0]
    hashes: list[int] = []
    pos = 0
    bad: list[str] = []

    def on_error(lineno: int, reason: str) -> None:
        nonlocal skipped
        skipped += 1
        if len(bad) < 3:
            bad.append(f"{path}:{lineno}: {reason}")

    with open(folder / "passages.jsonl", "wb") as out, open(folder / "offsets.i64", "wb") as off, open(
        folder / "idhash.u64", "wb"
    ) as ids:
        for lineno, obj in iter_jsonl(path, on_error=on_error if skip_bad else None):
            try:
                p = _passage_from_row(obj, f"{path}:{lineno}")
            except CorpusError as e:
                if not skip_bad:
                    raise
                on_error(lineno, str(e).split(": ", 2)[-1])
                continue
            for part in (p.id, p.title, p.text):
                b = part.encode("utf-8")
                h.update(len(b).to_bytes(8, "little"))
                h.update(b)
            line = (json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n").encode("utf-8")
            out.write(line)
            pos += len(line)
            offsets.append(pos)
            hashes.append(_id_hash(p.id))
            n += 1
            if len(hashes) >= _WRITE_BUFFER:
                off.write(np.asarray(offsets, dtype="<i8").tobytes())
                ids.write(np.asarray(hashes, dtype="<u8").tobytes())
                offsets.clear()
                hashes.clear()
        off.write(np.asarray(offsets, dtype="<i8").tobytes())
        ids.write(np.asarray(hashes, dtype="<u8").tobytes())
    if n == 0:
        raise CorpusError(f"{path}: the corpus is empty (no passages)" + (f"; {skipped} bad line(s) skipped" if skipped else ""))
    if skipped:
        log.warning("%s: skipped %d line(s) that are not passages, e.g. %s", path, skipped, bad[0])
    _index_ids(path, folder, n)
    h.update(n.to_bytes(8, "little"))
    meta = {"format": STORE_FORMAT, "num_passages": n, "fingerprint": h.hexdigest(), "source": str(path), "skipped": skipped}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _index_ids(path: Path, folder: Path, n: int) -> None:
    """Sort the id hashes (in corpus order in idhash.u64) into the id index: idhash.u64 sorted, idrows.i64
    the row of each (a stable sort: rows of one hash ascending); 16 bytes a passage. Then a `CorpusError`
    naming both lines of the first repeated id (as `read_corpus`)."""
    raw = np.fromfile(folder / "idhash.u64", dtype="<u8")
    order = np.argsort(raw, kind="stable")
    with open(folder / "idhash.u64.sorted", "wb") as f:
        for start in range(0, n, _SORT_CHUNK):
            raw[order[start : start + _SORT_CHUNK]].tofile(f)
    del raw
    order.astype("<i8", copy=False).tofile(folder / "idrows.i64")
    del order
    os.replace(folder / "idhash.u64.sorted", folder / "idhash.u64")
    hashes = np.memmap(folder / "idhash.u64", dtype="<u8", mode="r")
    dup = {int(x) for x in hashes[1:][hashes[1:] == hashes[:-1]]}
    del hashes
    if not dup:
        return
    # an id hash seen twice: find the two lines (a second pass over the file, only then)
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path, on_error=lambda *_: None):
        pid = obj.get("id")
        if pid is None or _id_hash(str(pid)) not in dup:
            continue
        pid = str(pid)
        if pid in seen:
            raise CorpusError(f"{path}:{lineno}: field 'id': {pid!r} already used on line {seen[pid]}")
        seen[pid] = lineno
