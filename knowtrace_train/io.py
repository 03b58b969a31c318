"""File helpers every stage shares: JSON Lines with located errors, and atomic writes.

A full disk (ENOSPC, or an exhausted quota) met by any write made here (a JSONL append, an atomic file, an atomic
folder: a model or adapter save, a reuse-cache store, a retrieval index) raises `DiskFullError`: one line naming
the folder and what was being written, exit 2. What was half-written is removed first (an atomic file's or
folder's temporary copy; an append's torn last line is cut off), so a rerun once space is freed reads nothing of
it and redoes only the unfinished stage.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from knowtrace_train.errors import UserError

log = logging.getLogger(__name__)


class DataFileError(UserError, ValueError):
    """A data file that cannot be read; the message names the file, line and field."""

    label = "data error"


class DiskFullError(UserError):
    """A write failed because the disk (or the user's quota) is full; the message names the folder and what
    was being written. Not an OSError: code that tolerates a failed optional write (`except OSError`) must
    not carry on past a full disk."""

    label = "disk full"


#: errno values of a full disk: no space left, quota exceeded
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: how libraries that lose the errno word it (safetensors: "No space left on device (os error 28)")
FULL_TEXTS = ("no space left on device", "os error 28", "disk quota exceeded")
#: below this many free bytes, a write error whose errno was lost (numpy: "N requested and M written", torch's
#: zip writer: "unexpected pos") is taken for a full disk
FULL_MARGIN = 1 << 20


def free_bytes(folder: str | Path) -> int | None:
    """Bytes an unprivileged writer may still use on `folder`'s file system (None where it cannot be told)."""
    p = Path(folder)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(e: BaseException, folder: str | Path | None = None) -> bool:
    """Whether `e`, raised by a write into `folder`, comes from a full disk: its errno, its text, or (for an
    OSError or RuntimeError that lost both) a file system with under `FULL_MARGIN` bytes left."""
    if isinstance(e, UserError):
        return False
    if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
        return True
    if any(t in str(e).lower() for t in FULL_TEXTS):
        return True
    if folder is not None and isinstance(e, (OSError, RuntimeError)):
        free = free_bytes(folder)
        return free is not None and free < FULL_MARGIN
    return False


def disk_full_error(folder: str | Path, what: str, e: BaseException) -> DiskFullError:
    return DiskFullError(f"no space left on the device of {folder} while writing {what} ({e}); free some space "
                         "and rerun the same command: finished stages are kept and nothing half-written is read")


@contextlib.contextmanager
def disk_space(folder: str | Path, what: str) -> Iterator[None]:
    """Turn a full disk met in the block into a `DiskFullError` naming `folder` and `what` (the block
    itself removes what it half-wrote); any other error passes unchanged."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e, folder):
            raise
        raise disk_full_error(folder, what, e) from e


def iter_jsonl(
    path: str | Path, on_error: Callable[[int, str], None] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; a bad line raises `DataFileError`,
    or, where `on_error` is given, is passed to it as (line number, reason) and skipped."""
    path = Path(path)
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                if on_error is None:
                    raise not_utf8(path, e, lineno) from e
                on_error(lineno, f"not UTF-8 text (byte 0x{e.object[e.start:e.start + 1].hex()} at offset {e.start})")
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                reason = f"not valid JSON ({e.msg} at column {e.pos + 1})"
                if on_error is None:
                    raise DataFileError(f"{path}:{lineno}: {reason}") from e
                on_error(lineno, reason)
                continue
            if not isinstance(obj, dict):
                reason = f"expected a JSON object, got {type(obj).__name__}"
                if on_error is None:
                    raise DataFileError(f"{path}:{lineno}: {reason}")
                on_error(lineno, reason)
                continue
            yield lineno, obj


#: characters read at a time by `iter_json_array` (an element longer than this reads in more)
ARRAY_READ = 1 << 20


def iter_json_array(path: str | Path) -> Iterator[tuple[int, int, Any]]:
    """Yield (index, line, element) of a JSON array file one element at a time, holding one read buffer
    and the element being decoded (not the whole file): `line` is where the element starts. Broken JSON,
    a missing "," or "]", or anything after the closing "]" raises `DataFileError` naming the line."""
    path = Path(path)
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as f:
        buf, pos, line, eof = "", 0, 1, False  # `line`: the line of buf[pos]

        def more() -> bool:
            """Drop what was consumed and read on; False at the end of the file."""
            nonlocal buf, pos, eof
            if eof:
                return False
            chunk = f.read(max(ARRAY_READ, len(buf) - pos))
            if not chunk:
                eof = True
                return False
            buf, pos = buf[pos:] + chunk, 0
            return True

        def skip_space() -> str:
            """The next non-space character ("" at the end of the file), not consumed."""
            nonlocal pos, line
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    line += buf[pos] == "\n"
                    pos += 1
                if pos < len(buf) or not more():
                    return buf[pos] if pos < len(buf) else ""

        def fail(at: int, what: str) -> DataFileError:
            where = line + buf.count("\n", pos, at)
            return DataFileError(f"{path}:{where}: not valid JSON ({what})")

        if skip_space() != "[":
            raise fail(pos, "expected a JSON array")
        pos += 1
        index = 0
        if skip_space() == "]":
            pos += 1
        else:
            while True:
                if not skip_space():
                    raise fail(pos, "the array is not closed")
                while True:
                    try:
                        value, end = decoder.raw_decode(buf, pos)
                    except json.JSONDecodeError as e:
                        if more():
                            continue
                        raise fail(e.pos, f"{e.msg} at column {e.pos - buf.rfind(chr(10), 0, e.pos)}") from None
                    if end == len(buf) and more():  # a number or literal may go on in the next read
                        continue
                    break
                yield index, line, value
                line += buf.count("\n", pos, end)
                pos, index = end, index + 1
                c = skip_space()
                pos += 1
                if c == "]":
                    break
                if c != ",":
                    raise fail(pos - 1, f"expected ',' or ']' after item {index - 1}, got {c[:1]!r}" if c else "the array is not closed")
        if skip_space():
            raise fail(pos, "extra data after the closing ']'")


def not_utf8(path: str | Path, e: UnicodeDecodeError, line: int | None = None) -> DataFileError:
    """The one-line error of a file whose bytes are not UTF-8: the file, the line where known, the byte offset."""
    where = f"{path}:{line}" if line is not None else str(path)
    return DataFileError(f"{where}: not UTF-8 text (byte 0x{e.object[e.start:e.start + 1].hex()} at offset {e.start}"
                         f"{' of the line' if line is not None else ''}): save it as UTF-8, or name the right file")


def read_text(path: str | Path) -> str:
    """A user's text file as UTF-8 (a leading BOM dropped); bytes that are not UTF-8 raise `DataFileError` naming the
    file and the byte offset, a folder or an unreadable path one naming the path (through the command's boundary)."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise not_utf8(path, e) from e


def read_json(path: str | Path) -> Any:
    """A JSON file (a run folder's bookkeeping, a summary): a damaged one raises `DataFileError` naming the file and
    where it breaks."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFileError(f"{path}: damaged JSON ({e.msg} at line {e.lineno}, column {e.colno}): restore it, or "
                            "remove it (with the stage that wrote it) so that a rerun writes it again") from e


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [obj for _, obj in iter_jsonl(path)]


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path: str | Path, text: str, what: str | None = None) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file. A full disk
    raises `DiskFullError` (naming `what`, else the file) with the temporary file removed."""
    path = Path(path)
    with disk_space(path.parent, what or path.name):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


@contextlib.contextmanager
def atomic_dir(path: str | Path, *, done: str | None = None, what: str | None = None) -> Iterator[Path]:
    """Yield a fresh temporary folder beside `path` to write into; when the block ends, rename it to
    `path`, so readers never see half a folder. An existing `path` is replaced. With `done` (the name
    of a marker file the block writes last), a `path` that holds that marker is a copy another
    process finished first: it is kept and this one discarded. When the block raises, the temporary
    folder is removed and `path` is left as it was; a full disk met in the block (a model's save, an index
    build, a cache store) is raised as `DiskFullError` naming `what` (else the folder's name)."""
    path = Path(path)
    with disk_space(path.parent, what or path.name):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        try:
            yield tmp
            tmp.chmod(0o755)  # mkdtemp makes 0700; give the folder the usual mode
            if done is not None and (path / done).exists():
                log.info("another process finished %s first; using its copy", path)
                return
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            try:
                os.replace(tmp, path)
            except OSError:
                if done is None or not (path / done).exists():
                    raise
                log.info("another process finished %s first; using its copy", path)
        except Exception as e:  # told before the temporary folder goes: its bytes are what filled the disk
            if isinstance(e, DiskFullError):  # a write inside (a file of the folder): named by the folder
                cause = e.__cause__ or e
                raise disk_full_error(path.parent, what or path.name, cause) from cause
            if not is_disk_full(e, path.parent):
                raise
            raise disk_full_error(path.parent, what or path.name, e) from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]], what: str | None = None) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), what)


def write_json(path: str | Path, obj: Any, what: str | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n", what)


def append_jsonl(path: str | Path, row: dict[str, Any]) -> None:
    """Append one record and flush it to disk (used where each finished record must survive a kill). A full
    disk cuts the file back to the records it held before (no torn last line) and raises `DiskFullError`."""
    path = Path(path)
    with disk_space(path.parent, f"a record of {path.name}"):
        path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)  # the part of the record that made it to disk
                raise
        finally:
            os.close(fd)


#: The one variable that moves everything the toolkit caches (converted models, retrieval indexes, M0s).
CACHE_ENV = "KNOWTRACE_CACHE"


def cache_home(explicit: str | os.PathLike | None = None) -> Path:
    """The toolkit's cache folder: `explicit`, else $KNOWTRACE_CACHE, else ~/.cache/knowtrace-train.
    Converted models live in its models/ (and hub/), retrieval indexes in retrieval/."""
    if explicit is not None:
        return Path(explicit).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "knowtrace-train"


# -- what names a model in a cache key ----------------------------------------------------------------------

#: the cache home's folder of model identities: per model folder, each file's SHA-256 under its size and mtime
IDENTITY_FOLDER = "identity"
#: a file modified less than this before it was hashed may be rewritten at the same size within the file system's
#: clock tick (the same mtime): its hash is not trusted later and is computed again, as git treats "racily clean" files
RACY_NS = 2_000_000_000
_HASHES: dict[tuple[str, int, int], tuple[str, int]] = {}  # (file, size, mtime_ns) -> (SHA-256, when hashed): trusted ones


def model_identity(model: str | os.PathLike) -> dict[str, Any]:
    """What names a model (a base, a merged M0, an adapter, an encoder) in every cache key that depends on it: for a
    local folder or file, the SHA-256 of its files' names and contents, whatever the path (a model retrained or
    rewritten in place, same sizes or not, is another model; a copy elsewhere is the same); anything else (a hub id,
    an alias) by its name. Each file is hashed once: its hash is kept in the cache home
    (identity/<the folder's path hashed>.json) under its size and mtime_ns, so a later call only stats the files and
    a retrain, which rewrites them, hashes them again. Hidden files (.gitattributes, download metadata) are left out."""
    path = Path(model).expanduser()
    if not path.exists():
        return {"hub_id": str(model)}
    path = path.resolve()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(path).parts))
    sidecar = cache_home() / IDENTITY_FOLDER / f"{hashlib.sha256(str(path).encode('utf-8')).hexdigest()[:24]}.json"
    stats = [(f, f.stat()) for f in files]
    kept: Any = {}
    if not all((str(f), st.st_size, st.st_mtime_ns) in _HASHES for f, st in stats):  # else: known in this process
        try:
            kept = json.loads(sidecar.read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError, AttributeError):
            kept = {}
    kept = kept if isinstance(kept, dict) else {}
    entries, changed = {}, False
    for f, st in stats:
        rel = f.name if f == path else f.relative_to(path).as_posix()
        mark = (str(f), st.st_size, st.st_mtime_ns)
        old = kept.get(rel)
        if mark in _HASHES:
            entry = [st.st_size, st.st_mtime_ns, *_HASHES[mark]]
        elif (isinstance(old, list) and len(old) == 4 and old[:2] == [st.st_size, st.st_mtime_ns]
              and isinstance(old[3], int) and old[3] - st.st_mtime_ns >= RACY_NS):
            entry = old
        else:
            started = time.time_ns()  # a rewrite after this has a later mtime than the one read above
            h = hashlib.sha256()
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 24), b""):
                    h.update(block)
            entry, changed = [st.st_size, st.st_mtime_ns, h.hexdigest(), started], True
        if entry[3] - st.st_mtime_ns >= RACY_NS:
            _HASHES[mark] = (entry[2], entry[3])
        entries[rel] = entry
    if changed:
        try:
            atomic_write_text(sidecar, json.dumps({"path": str(path), "files": entries}, indent=1) + "\n")
        except OSError as e:  # a read-only cache home: hashed again next time
            log.info("cannot keep the hashes of %s in %s: %s", path, sidecar, e)
    combined = hashlib.sha256(json.dumps(sorted((rel, e[2]) for rel, e in entries.items())).encode("utf-8"))
    return {"sha256": combined.hexdigest()}
