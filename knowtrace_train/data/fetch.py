"""`python -m knowtrace_train.data fetch NAME...` and `list`: the registry's benchmarks and corpora into the cache home.

A file is downloaded to ``<file>.part`` (resumed with an HTTP Range request after a kill), its SHA-256 checked
against the registry, the hub's listing or the lock of an earlier fetch, and only then renamed into place; a
zip's members are extracted the same way. ``fetch.lock.json`` is written last, so a folder without it (or with
a file of another size than it records) is never read as data. Sources: the official address, a hub repo at
``$HF_ENDPOINT`` (default https://huggingface.co), or ``--mirror DIR`` (the same files in a local folder, by
their file name or their path in the repo, optionally under ``DIR/<name>/``). ``HF_HUB_OFFLINE=1`` forbids the
network: only a mirror or an earlier fetch is used.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

from knowtrace_train.io import atomic_write_text

from .download import CHUNK, _append, _kind_problem, _open, _sha256, download, endpoint, offline
from .registry import FETCH_COMMAND, LOCK_NAME, REGISTRY, Entry, FetchError, Source, data_home, entry

# -- what a source holds: (relative path, where to read it, expected size, expected SHA-256) --------------


def _mirror_file(mirror: Path, name: str, rel: str) -> Path | None:
    for base in (mirror / name, mirror):
        for cand in (base / rel, base / Path(rel).name):
            if cand.is_file():
                return cand
    return None


def _hub_json(path: str):
    """The hub API's answer at `path`; a listing split over pages (a Link header with rel="next", as the hub
    paginates a large folder's tree) is read page by page and joined."""
    url = f"{endpoint()}/api/datasets/{path}"
    pages = []
    while url:
        stream = _open(url, 0)
        try:
            pages.append(json.loads(b"".join(stream.chunks)))
        except ValueError:
            raise FetchError(f"{url}: not a hub API answer (is HF_ENDPOINT a hub?)") from None
        url = stream.next_page
        if url and not isinstance(pages[-1], list):
            raise FetchError(f"{url}: a paginated hub answer that is not a list (is HF_ENDPOINT a hub?)")
    return pages[0] if len(pages) == 1 else [x for page in pages for x in page]


def _plan(e: Entry, s: Source, lock: dict, mirror: Path | None) -> tuple[list[tuple[str, str, int | None, str | None, str | None]], str | None]:
    """The files to fetch as (relative path, URL or local path, size, SHA-256, MD5) and the hub commit (hub sources)."""
    pinned = lock.get("files", {})
    plan = []
    commit = lock.get("commit")
    if s.kind == "url":
        for f in s.files:
            local = _mirror_file(mirror, e.name, f.path) if mirror else None
            if mirror and local is None:
                raise FetchError(f"--mirror {mirror}: no {f.path} (nor {e.name}/{f.path})")
            sha = f.sha256 or pinned.get(f.path, {}).get("sha256")
            plan.append((f.path, str(local) if local else str(f.url), f.size, sha, f.md5))
        return plan, None
    for f in s.files:
        if mirror:
            found = sorted({p for base in (mirror / e.name, mirror) for p in base.glob(f.path)})
            if not found:
                raise FetchError(f"--mirror {mirror}: no file matches {f.path} (nor {e.name}/{f.path})")
            for p in found:
                rel = p.relative_to(mirror / e.name if (mirror / e.name) in p.parents else mirror).as_posix()
                plan.append((rel, str(p), None, pinned.get(rel, {}).get("sha256"), None))
            continue
        if commit is None:
            commit = _hub_json(f"{s.repo}/revision/{s.revision}").get("sha") or s.revision
        folder = os.path.dirname(f.path)
        listing = _hub_json(f"{s.repo}/tree/{commit}/{folder}".rstrip("/"))
        matched = [x for x in listing if x.get("type") == "file" and fnmatch.fnmatch(x["path"], f.path)]
        if not matched:
            raise FetchError(f"{s.repo}@{commit}: no file matches {f.path}")
        for x in matched:
            lfs = x.get("lfs") or {}
            sha = lfs.get("oid") or lfs.get("sha256") or pinned.get(x["path"], {}).get("sha256")
            url = f"{endpoint()}/datasets/{s.repo}/resolve/{commit}/{urllib.parse.quote(x['path'])}"
            plan.append((x["path"], url, x.get("size"), sha, None))
    return plan, commit


# -- fetch -------------------------------------------------------------------------------------------------


def fetch(name: str, *, source: str | None = None, mirror: str | Path | None = None, cache: str | Path | None = None,
          verify: bool = False, log: Callable[[str], None] = print) -> tuple[Path, dict]:
    """Fetch `name` (see the module's doc); (its folder, its lock)."""
    e = entry(name)
    s = e.source(source)
    folder = data_home(cache) / name / s.revision
    lock_path = folder / LOCK_NAME
    lock = json.loads(lock_path.read_text(encoding="utf-8")) if lock_path.is_file() else {}
    if lock.get("complete") and not verify and all((folder / rel).is_file() and (folder / rel).stat().st_size == v["size"]
                                                   for rel, v in lock["files"].items()):
        log(f"{name}: already fetched in {folder}")
        return folder, lock
    if offline() and mirror is None:
        raise FetchError(f"HF_HUB_OFFLINE is set and {name} is not fetched in {folder}: fetch where there is a "
                         "network, or pass --mirror DIR")
    folder.mkdir(parents=True, exist_ok=True)
    plan, commit = _plan(e, s, lock, Path(mirror) if mirror else None)
    files: dict[str, dict] = {}
    for rel, url, size, sha, md5 in plan:
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        kept = _kept(folder, rel, lock, verify, sha, log)
        if kept is not None:
            files[rel] = kept
        else:
            log(f"{name}: {rel} <- {url}")
            started = time.monotonic()
            got = download(url, dest, sha256=sha, size=size, md5=md5, source=name)
            log(f"{name}: {rel} ({dest.stat().st_size} bytes, {time.monotonic() - started:.1f}s)")
            files[rel] = {"sha256": got, "size": dest.stat().st_size, "from": url if "://" in url else "mirror"}
        for member in next((f.members for f in s.files if f.path == rel), ()):
            pinned = lock.get("files", {}).get(member, {}).get("sha256")
            files[member] = _kept(folder, member, lock, verify, pinned, log) or _extract(dest, member, folder, pinned, name)
    lock = {"name": name, "source": s.kind, "revision": s.revision, "repo": s.repo, "commit": commit,
            "files": files, "complete": True}
    atomic_write_text(lock_path, json.dumps(lock, indent=1) + "\n")
    return folder, lock


def _kept(folder: Path, rel: str, lock: dict, verify: bool, sha256: str | None, log: Callable[[str], None] = print) -> dict | None:
    """The lock's record of a file already in `folder` (hashed again with `verify`), None where it must be fetched.
    A file the lock does not record (an earlier fetch stopped before the lock) is kept only where it passes the
    checks a download passes; one that does not (an HTML page saved by an older fetch, a cut archive) is removed
    and fetched again, never reused."""
    dest, pinned = folder / rel, lock.get("files", {}).get(rel)
    if not dest.is_file():
        return None
    if pinned and dest.stat().st_size == pinned["size"] and not verify:
        return pinned
    if not pinned:
        with dest.open("rb") as f:
            problem = _kind_problem(dest.name, f.read(64))
        if problem is None and dest.suffix == ".zip" and not zipfile.is_zipfile(dest):
            problem = "not a whole zip archive"
        if problem:
            log(f"{dest}: {problem}: removed, fetching it again")
            dest.unlink()
            return None
    got = _sha256(dest)
    want = sha256 or (pinned or {}).get("sha256")
    if want is not None and got != want:
        raise FetchError(f"{dest}: checksum mismatch (SHA-256 {got}, expected {want}); delete it and fetch again")
    return {**(pinned or {}), "sha256": got, "size": dest.stat().st_size}


def _extract(archive: Path, member: str, folder: Path, sha256: str | None, source: str = "") -> dict:
    """`member` (by base name) out of the zip `archive` into `folder`, through a .part file. An archive that is
    not a whole zip (a cut download, a mirror's corrupt copy) is removed, so that it is never reused."""
    dest = folder / member
    try:
        z = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as e:
        archive.unlink(missing_ok=True)
        raise FetchError(f"{source + ': ' if source else ''}{archive.name} is not a whole zip archive ({e}); it was "
                         f"removed: run {FETCH_COMMAND} {source} again, or check the mirror's copy") from None
    with z:
        names = [n for n in z.namelist() if Path(n).name == member and not n.startswith("__MACOSX")]
        if not names:
            raise FetchError(f"{archive.name}: no member {member!r} (holds {', '.join(z.namelist()[:8])})")
        part = dest.with_name(dest.name + ".part")
        try:
            with z.open(names[0]) as src, part.open("wb") as out:
                while chunk := src.read(CHUNK):
                    _append(out, chunk)
        except (zipfile.BadZipFile, EOFError) as e:  # a damaged member (CRC, truncated data)
            part.unlink(missing_ok=True)
            archive.unlink(missing_ok=True)
            raise FetchError(f"{source + ': ' if source else ''}{archive.name} is damaged ({member}: {e}); it was removed: "
                             f"run {FETCH_COMMAND} {source} again, or check the mirror's copy") from None
        except OSError as e:
            if e.errno == errno.ENOSPC:
                need = z.getinfo(names[0]).file_size
                raise FetchError(f"no space left in {folder}: {need} bytes needed for {member}") from None
            raise
    got = _sha256(part)
    if sha256 is not None and got != sha256:
        part.unlink()
        raise FetchError(f"{member} (from {archive.name}): checksum mismatch (SHA-256 {got}, expected {sha256})")
    os.replace(part, dest)
    return {"sha256": got, "size": dest.stat().st_size, "from": archive.name}


def _check_items(name: str, skip_bad: bool, log: Callable[[str], None]) -> None:
    """Read every split once through its reader, streamed and counted, none kept (a bad row: file, row and
    field; or skipped and counted)."""
    from .loaders import LoadReport, iter_items

    e = REGISTRY[name]
    if e.kind != "qa":
        return
    from .registry import fetched_dir

    _, lock = fetched_dir(name)
    for split in e.source(lock.get("source")).splits:
        report = LoadReport(path=f"{name}:{split}", format="")
        count = sum(1 for _ in iter_items(f"{name}:{split}", skip_bad=skip_bad, report=report))
        note = f", {len(report.skipped)} bad rows skipped" if report.skipped else ""
        log(f"{name}:{split}: {count} items{note}")


def _fetch_command(args: argparse.Namespace) -> int:
    for name in args.names:
        entry(name).source(args.source)  # every name is checked before anything is downloaded
    for name in args.names:
        folder, _ = fetch(name, source=args.source, mirror=args.mirror, verify=args.verify)
        _check_items(name, args.skip_bad, print)
        print(f"{name}: ready in {folder}")
    return 0


def _list_command(args: argparse.Namespace) -> int:
    home = data_home()
    for e in REGISTRY.values():
        if not e.sources:
            print(f"{e.name:<20} {e.kind:<6} unavailable: {e.unavailable}")
            continue
        s = e.sources[0]
        state = "fetched" if any((home / e.name / x.revision / LOCK_NAME).is_file() for x in e.sources) else "not fetched"
        where = s.repo if s.kind == "hub" else "official address"
        splits = f" splits {', '.join(s.splits)}" if s.splits else ""
        print(f"{e.name:<20} {e.kind:<6} {state:<11} {where}@{s.revision}{splits} ({e.licence})")
    return 0


def add_fetch_commands(subparsers) -> None:
    p = subparsers.add_parser("fetch", help="download benchmarks and corpora by name into the cache home")
    p.add_argument("names", nargs="+", metavar="NAME", help=f"names: {', '.join(REGISTRY)}")
    p.add_argument("--mirror", metavar="DIR", help="a local folder holding the same files (no network)")
    p.add_argument("--source", choices=("hub", "url"), help="a name's other source (default: its first)")
    p.add_argument("--verify", action="store_true", help="hash every fetched file again against its lock")
    p.add_argument("--skip_bad", "--skip-bad", dest="skip_bad", action="store_true",
                   help="skip and count rows that do not fit the schema instead of stopping")
    p.set_defaults(func=_fetch_command)
    q = subparsers.add_parser("list", help="the names fetch knows, their sources and whether they are fetched")
    q.set_defaults(func=_list_command)

