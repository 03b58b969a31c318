"""On-disk cache of retrieval indexes, keyed by the corpus content and the settings that shaped them."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from knowtrace_train.data.schema import Passage
from knowtrace_train.io import atomic_dir, cache_home

log = logging.getLogger(__name__)


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path | None:
    """The cache folder to use: `None` turns caching off; "" means the default, the retrieval/ folder
    of the toolkit's cache home ($KNOWTRACE_CACHE, else ~/.cache/knowtrace-train)."""
    if cache_dir is None:
        return None
    if str(cache_dir) == "":
        return cache_home() / "retrieval"
    return Path(cache_dir).expanduser()


def corpus_fingerprint(passages: Sequence[Passage]) -> str:
    """SHA-256 of the passages' ids, titles and texts, in order: the same corpus gives the
    same fingerprint in any process, and any change to any passage gives another. A passage store
    (`data.store.PassageStore`) gives the fingerprint it computed once while converting (a hash of
    the same parts, ending with the count), so its 21M passages are not read again to key an index."""
    kept = getattr(passages, "fingerprint", None)
    if isinstance(kept, str) and kept:
        return kept
    h = hashlib.sha256()
    h.update(len(passages).to_bytes(8, "little"))
    for p in passages:
        for part in (p.id, p.title, p.text):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def cache_key(corpus_fp: str, settings: dict[str, Any]) -> str:
    """Key of one index: the corpus fingerprint plus the settings that change the index."""
    blob = json.dumps({"corpus": corpus_fp, "settings": settings}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


def build_once(target: Path, build: Callable[[Path], None], what: str = "a retrieval index") -> Path:
    """Return `target` if it holds a finished index; otherwise call `build(tmp)` on a fresh
    folder beside it and rename that folder into place. A killed build leaves only a
    temporary folder behind, never a half-written `target`; two processes building the same
    index at once both succeed and one copy wins; a full disk is a `DiskFullError` naming `what`, and leaves only
    what it found."""
    if (target / "DONE").exists():
        return target
    # an unfinished leftover (no DONE marker) is replaced; a copy another process finished is kept
    with atomic_dir(target, done="DONE", what=what) as tmp:
        build(tmp)
        (tmp / "DONE").write_text("ok\n")
    return target


def drop_other_format(folder: Path, meta_name: str, version: int, what: str) -> None:
    """Remove the finished index in `folder` where its `meta_name` JSON names another format than `version` (or
    cannot be read), with a warning, so that it is rebuilt."""
    if not (folder / "DONE").exists():
        return
    try:
        fmt = json.loads((folder / meta_name).read_text()).get("format")
    except (OSError, ValueError):
        fmt = None
    if fmt != version:
        log.warning("the %s in %s is format %s, not %s: rebuilding it", what, folder, fmt, version)
        shutil.rmtree(folder)
