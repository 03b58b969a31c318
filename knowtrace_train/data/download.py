"""Downloading one file as the sources really serve it: resumed with HTTP Range after a drop or a kill (bounded
retries), an HTML or error page where a file belongs refused in one line (nothing kept), Google Drive's
confirmation form followed, a token never sent to another host on a redirect, the published size, MD5 and SHA-256
checked before the file is renamed into place. `fetch.py` plans what to download and keeps the lock."""

from __future__ import annotations

import errno
import hashlib
import html.parser
import http.client
import os
import re
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

from .registry import FETCH_COMMAND, FetchError

CHUNK = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


# -- opening a file: a URL (with Range) or a mirror's copy ------------------------------------------------


class _AuthStaysHome(urllib.request.HTTPRedirectHandler):
    """A redirect to another host drops the Authorization header (a hub token must not reach its CDN), as
    huggingface_hub does; a redirect on the same host keeps it. urllib copies every header otherwise."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.headers = {k: v for k, v in new.headers.items() if k.lower() != "authorization"}
            new.unredirected_hdrs = {k: v for k, v in new.unredirected_hdrs.items() if k.lower() != "authorization"}
        return new


_OPENER = urllib.request.build_opener(_AuthStaysHome())


class _Stream:
    """An open download: its chunks from `offset` on, the file's total size where known, whether it starts at
    `offset` (a 206), its Content-Type and the address it came from after redirects."""

    def __init__(self, chunks: Iterator[bytes], total: int | None, resumed: bool, content_type: str = "", url: str = "",
                 next_page: str | None = None) -> None:
        self.chunks, self.total, self.resumed, self.content_type, self.url = chunks, total, resumed, content_type, url
        self.next_page = next_page  # a paginated API answer's next page (its Link header's rel="next")

    def __iter__(self):  # (chunks, total, resumed), as callers unpacked it before
        return iter((self.chunks, self.total, self.resumed))


def _open(url: str, offset: int) -> _Stream:
    """`url` (or a local path) from byte `offset` on (see `_Stream`)."""
    if url.startswith("file://") or "://" not in url:
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path) if "://" in url else url)
        size = path.stat().st_size

        def local() -> Iterator[bytes]:
            with path.open("rb") as f:
                f.seek(offset)
                while chunk := f.read(CHUNK):
                    yield chunk

        return _Stream(local(), size, True, "", url)
    if offline():
        raise FetchError(f"HF_HUB_OFFLINE is set: not downloading {url} (fetch where there is a network, or pass --mirror DIR)")
    headers = {"User-Agent": "knowtrace-train"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    token = os.environ.get("HF_TOKEN")
    if token and url.startswith(endpoint()):
        headers["Authorization"] = f"Bearer {token}"
    try:
        resp = _OPENER.open(urllib.request.Request(url, headers=headers), timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # the part is longer than the file: start again
            return _Stream(_open(url, 0).chunks, None, False)
        raise FetchError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"{url}: cannot connect ({getattr(e, 'reason', e)}); set HF_ENDPOINT, or pass --mirror DIR") from None
    resumed = resp.status == 206
    length = resp.headers.get("Content-Length")
    total = None
    if resumed and "/" in resp.headers.get("Content-Range", ""):
        tail = resp.headers["Content-Range"].rsplit("/", 1)[1]
        total = int(tail) if tail.isdigit() else None
    elif length is not None:
        total = int(length)

    def remote() -> Iterator[bytes]:
        with resp:
            while chunk := resp.read(CHUNK):
                yield chunk

    link = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', resp.headers.get("Link", ""))
    return _Stream(remote(), total, resumed, resp.headers.get("Content-Type", ""), resp.geturl(),
                   urllib.parse.urljoin(url, link.group(1)) if link else None)


# -- what came back: the file, or a page where it belongs ---------------------------------------------------

#: the first bytes each kind of file starts with (JSON: its first non-space character)
_MAGIC = {".zip": (b"PK\x03\x04", b"PK\x05\x06"), ".bz2": (b"BZh",), ".gz": (b"\x1f\x8b",), ".parquet": (b"PAR1",)}
_DRIVE_HOSTS = ("drive.google.com", "drive.usercontent.google.com", "docs.google.com")


def _kind_problem(name: str, first: bytes, content_type: str = "") -> str | None:
    """What is wrong with a file called `name` that starts with `first` (None: it looks like one)."""
    suffix = Path(name).suffix.lower()
    head = first.lstrip()[:1]
    page = "text/html" in content_type.lower() or first.lstrip()[:15].lower().startswith((b"<!doctype", b"<html"))
    if suffix in _MAGIC and not first.startswith(_MAGIC[suffix]) or suffix in (".json", ".jsonl") and head not in (b"[", b"{") or page:
        what = "an HTML page" if page else "not a " + (suffix.lstrip(".") or "data") + " file"
        return f"{what} (Content-Type {content_type or 'none'}, starts {first[:48]!r})"
    return None


class _DrivePage(html.parser.HTMLParser):
    """Google Drive's virus-scan page: the form ``download-form`` (its action and hidden inputs: id, export,
    confirm, uuid), or its error caption (a quota or permission page)."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.error = ""
        self._in_form = self._in_error = False

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("id") == "download-form":
            self.action, self._in_form = a.get("action", ""), True
        elif tag == "input" and self._in_form and a.get("type", "").lower() == "hidden" and a.get("name"):
            self.fields[a["name"]] = a.get("value", "")
        elif "uc-error-subcaption" in a.get("class", "").split():
            self._in_error = True

    def handle_endtag(self, tag):
        if tag == "form":
            self._in_form = False
        elif tag == "p":
            self._in_error = False

    def handle_data(self, data):
        if self._in_error:
            self.error += data


def _drive_confirm(page_url: str, page: bytes) -> str | None:
    """The address Drive's confirmation form submits to (GET, its hidden inputs as the query), None where the
    page has no such form; a quota or error page is one line saying what Drive said."""
    parsed = _DrivePage()
    parsed.feed(page.decode("utf-8", "replace"))
    if parsed.action is not None:
        action = urllib.parse.urljoin(page_url, parsed.action)
        return action + ("&" if "?" in action else "?") + urllib.parse.urlencode(parsed.fields)
    said = " ".join(parsed.error.split()) or " ".join(re.sub(r"<[^>]+>", " ", page.decode("utf-8", "replace")).split())[:160]
    if said:
        quota = "quota" in said.lower() or "too many users" in said.lower()
        hint = ("Drive's download quota for this file is used up: try again in 24 hours, or download it in a browser and "
                "pass --mirror DIR") if quota else "download it in a browser and pass --mirror DIR"
        raise FetchError(f"{page_url}: Google Drive answered a page, not the file ({said}); {hint}")
    return None


# -- downloading -----------------------------------------------------------------------------------------

#: a dropped connection is resumed with a Range request this many times before fetch gives up
RETRIES = 5
#: seconds before the n-th retry: RETRY_WAIT * n
RETRY_WAIT = 2.0
_DROPPED = (http.client.IncompleteRead, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError)


def _append(out, chunk: bytes) -> None:
    """One write of a download (its own function: tests inject a full disk here)."""
    out.write(chunk)


def download(url: str, dest: Path, *, sha256: str | None, size: int | None, md5: str | None = None, source: str = "",
             progress: Callable[[int], None] | None = None) -> str:
    """`url` into `dest` through ``dest.part`` (resumed where one is left, and again with a Range request where
    the connection drops, `RETRIES` times), checked (its kind by its first bytes, size, SHA-256, MD5), renamed;
    its SHA-256. A page where the file belongs (Drive's confirmation form is followed) or a file that fails a
    check is removed: one line naming `source`, the address and what came back."""
    part = dest.with_name(dest.name + ".part")
    label = f"{source}: " if source else ""
    drops = forms = 0
    while True:
        offset = part.stat().st_size if part.exists() else 0
        if size is not None and offset > size:
            offset = 0
        stream = _open(url, offset)
        chunks = iter(stream.chunks)
        offset = offset if stream.resumed else 0
        total = stream.total if stream.total is not None else size
        try:
            first = next(chunks, b"") if offset == 0 else b""
        except _DROPPED:
            first = b""
        if offset == 0:
            problem = _kind_problem(dest.name, first, stream.content_type)
            if problem and "html" in problem.lower() and urllib.parse.urlsplit(stream.url or url).netloc in _DRIVE_HOSTS and forms < 2:
                page = first + b"".join(chunks)
                follow = _drive_confirm(stream.url or url, page)
                if follow is not None:
                    url, forms = follow, forms + 1
                    continue
            if problem:
                part.unlink(missing_ok=True)
                raise FetchError(f"{label}{stream.url or url} returned {problem} where {dest.name} belongs; nothing was "
                                 f"kept: try again later, or get the file by hand and pass --mirror DIR")
        need = (total - offset) if total is not None else None
        free = shutil.disk_usage(dest.parent).free
        if need is not None and need > free:
            raise FetchError(f"no space left in {dest.parent}: {need} bytes needed, {free} free ({dest.name})")
        done = offset
        dropped: Exception | None = None
        try:
            with part.open("ab" if offset else "wb") as out:
                for chunk in ((first,) if first else ()):
                    _append(out, chunk)
                    done += len(chunk)
                try:
                    for chunk in chunks:
                        _append(out, chunk)
                        done += len(chunk)
                        if progress:
                            progress(done)
                except _DROPPED as e:
                    dropped = e
        except OSError as e:
            if e.errno == errno.ENOSPC:
                left = f"{total - done} more bytes needed" if total is not None else "more bytes needed (size unknown)"
                raise FetchError(f"no space left in {dest.parent}: {left} for {dest.name} ({done} written to "
                                 f"{part.name}; free space and run fetch again to resume)") from None
            raise
        if dropped is None and (total is None or done >= total):
            break
        drops += 1
        if drops > RETRIES:
            of = f" of {total}" if total is not None else ""
            raise FetchError(f"{label}{url}: the connection dropped {drops} times ({done}{of} bytes of {dest.name} in "
                             f"{part.name}); run fetch again to resume")
        time.sleep(RETRY_WAIT * drops)
    got = _sha256(part)
    if total is not None and part.stat().st_size != total:
        raise FetchError(f"{dest.name}: got {part.stat().st_size} of {total} bytes; run fetch again to resume")
    with part.open("rb") as f:
        problem = _kind_problem(dest.name, f.read(64))
    if problem:
        part.unlink()
        raise FetchError(f"{label}{url}: {dest.name} is {problem}; it was removed: run {FETCH_COMMAND} again, or check "
                         "the mirror's copy")
    if size is not None and part.stat().st_size != size:
        part.unlink()
        raise FetchError(f"{label}{dest.name}: {part.stat().st_size} bytes, the publisher gives {size}; the download was "
                         f"removed: run {FETCH_COMMAND} again, or check the mirror's copy")
    if sha256 is not None and got != sha256:
        part.unlink()
        raise FetchError(f"{dest.name}: checksum mismatch (SHA-256 {got}, expected {sha256}); the download "
                         f"was removed: run {FETCH_COMMAND} again, or check the mirror's copy")
    if md5 is not None and _md5(part) != md5:
        got_md5 = _md5(part)
        part.unlink()
        raise FetchError(f"{label}{dest.name}: checksum mismatch (MD5 {got_md5}, the publisher gives {md5}); the download "
                         f"was removed: run {FETCH_COMMAND} again, or check the mirror's copy")
    os.replace(part, dest)
    return got


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
