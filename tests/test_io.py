"""The shared file helpers: atomic folder writes, and the content identity every cache names a model by."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import knowtrace_train.io as kio
from knowtrace_train.io import atomic_dir, model_identity


def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir())


def test_atomic_dir_renames_into_place(tmp_path):
    target = tmp_path / "a" / "out"  # the parent is made
    with atomic_dir(target) as tmp:
        assert tmp.parent == target.parent and tmp != target and not target.exists()
        (tmp / "f.txt").write_text("x")
        (tmp / "sub").mkdir()
    assert (target / "f.txt").read_text() == "x" and (target / "sub").is_dir()
    assert _siblings(target) == ["out"]  # no temporary folder left
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


def test_atomic_dir_replaces_an_existing_target(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(target)) == ["new.txt"]
    target_file = tmp_path / "file"
    target_file.write_text("a file where the folder goes")
    with atomic_dir(target_file) as tmp:
        (tmp / "f").write_text("y")
    assert (target_file / "f").read_text() == "y"
    assert _siblings(target) == ["file", "out"]


def test_atomic_dir_on_error_removes_the_temporary_folder_and_keeps_the_target(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(target) as tmp:
            (tmp / "half.txt").write_text("half")
            raise RuntimeError("boom")
    assert sorted(os.listdir(target)) == ["old.txt"] and _siblings(target) == ["out"]
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "new") as tmp:
            raise KeyboardInterrupt
    assert _siblings(target) == ["out"]


def test_atomic_dir_with_a_done_marker_keeps_a_finished_copy(tmp_path):
    target = tmp_path / "index"
    # an unfinished leftover (no marker) is replaced
    target.mkdir()
    (target / "partial").write_text("")
    with atomic_dir(target, done="DONE") as tmp:
        (tmp / "DONE").write_text("mine\n")
    assert sorted(os.listdir(target)) == ["DONE"]
    # a copy another process finished while this one was writing is kept, this one discarded
    with atomic_dir(target, done="DONE") as tmp:
        (tmp / "DONE").write_text("second\n")
    assert (target / "DONE").read_text() == "mine\n" and _siblings(target) == ["index"]


def test_atomic_dir_losing_the_rename_race(tmp_path, monkeypatch):
    import knowtrace_train.io as io_mod

    real_replace = os.replace
    target = tmp_path / "index"

    def other_process_wins(src, dst):  # another process renames its finished copy in first
        os.mkdir(dst)
        (Path(dst) / "DONE").write_text("theirs\n")
        real_replace(src, dst)  # fails: the target is a non-empty folder now

    monkeypatch.setattr(io_mod.os, "replace", other_process_wins)
    with atomic_dir(target, done="DONE") as tmp:
        (tmp / "DONE").write_text("mine\n")
    assert (target / "DONE").read_text() == "theirs\n" and _siblings(target) == ["index"]
    # without a marker to tell a finished copy, the failed rename is an error (and nothing is left behind)
    other = tmp_path / "other"
    with pytest.raises(OSError):
        with atomic_dir(other) as tmp:
            (tmp / "f").write_text("")
    assert _siblings(other) == ["index", "other"] and os.listdir(other) == ["DONE"]


# -- model identity ---------------------------------------------------------------------------------------


def _model(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"hidden_size": 4}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def _age(path: Path, seconds: int = 60) -> None:
    """Set a file's times `seconds` back (as a model written a while ago has)."""
    t = path.stat().st_mtime_ns - seconds * 10**9
    os.utime(path, ns=(t, t))


def test_model_identity_is_the_content_whatever_the_path_or_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    kio._HASHES.clear()
    a = _model(tmp_path / "a", b"\x00" * 64)
    first = model_identity(a)
    assert set(first) == {"sha256"} and model_identity(str(a)) == first
    assert model_identity(_model(tmp_path / "copy", b"\x00" * 64)) == first  # the same files elsewhere: the same model
    assert model_identity("owner/hub-model") == {"hub_id": "owner/hub-model"}
    # retrained in place: other weights of the same size, written at once (even at the same mtime): another model
    old = (a / "model.safetensors").stat().st_mtime_ns
    (a / "model.safetensors").write_bytes(b"\x01" * 64)
    os.utime(a / "model.safetensors", ns=(old, old))
    second = model_identity(a)
    assert second != first
    (a / "tokenizer.json").write_text("{}")  # any file of the folder counts; hidden ones do not
    third = model_identity(a)
    (a / ".gitattributes").write_text("*")
    assert third != second and model_identity(a) == third
    (a / "sub").mkdir()
    assert model_identity(a) == third  # an empty folder is no file
    (a / "sub" / "config.json").write_text("{}")  # sentence-transformers keeps modules in subfolders
    assert model_identity(a) != third


def test_model_identity_hashes_each_file_once_and_keeps_the_hashes_beside(tmp_path, monkeypatch):
    """A file's hash is kept in the cache home under its size and mtime: later calls (other processes too) only stat
    it; a rewrite, which changes the mtime, is hashed again. A hash taken right after a write is not kept."""
    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    kio._HASHES.clear()
    m = _model(tmp_path / "m", b"\x00" * 64)
    for f in m.iterdir():
        _age(f)
    ident = model_identity(m)
    (kept,) = (tmp_path / "cache" / kio.IDENTITY_FOLDER).glob("*.json")
    assert json.loads(kept.read_text())["path"] == str(m.resolve())
    hashed = []
    real = kio.hashlib.sha256

    def counting(*args):
        hashed.append(args)
        return real(*args)

    monkeypatch.setattr(kio.hashlib, "sha256", counting)
    kio._HASHES.clear()  # another process: the kept hashes
    assert model_identity(m) == ident and len(hashed) == 2  # the path's name and the combined digest, no file
    # the same sizes and mtime with other bytes cannot be told apart without hashing: the kept hash is trusted
    st = (m / "model.safetensors").stat()
    (m / "model.safetensors").write_bytes(b"\x02" * 64)
    os.utime(m / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model_identity(m) == ident
    (m / "model.safetensors").write_bytes(b"\x02" * 64)  # a real rewrite has a new mtime
    hashed.clear()
    assert model_identity(m) != ident and len(hashed) == 3  # that file alone hashed again
    kept.write_text("{not json")  # a damaged record: everything hashed again, no error
    kio._HASHES.clear()
    assert model_identity(m) != ident
