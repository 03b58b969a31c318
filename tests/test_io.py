"""The shared file helpers: atomic folder writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from knowtrace_train.io import atomic_dir


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
