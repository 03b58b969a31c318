"""A full disk (issue 64 item 3): every kind of write the toolkit makes (a JSONL append, an atomic file, an atomic
folder, a model save, a reuse-cache store, an index build) meets ENOSPC with one `DiskFullError` naming the folder
and what was being written, leaves nothing half-written where a rerun would read it, and the rerun, space freed,
gives what an uninterrupted write gives. ENOSPC is injected (at the write, the fsync or the library's save), as
the machine may not allow a small tmpfs; test_a_real_small_tmpfs tries one where it can be mounted."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from knowtrace_train import io as kio
from knowtrace_train.errors import report_user_error, user_errors
from knowtrace_train.io import DiskFullError, append_jsonl, atomic_dir, atomic_write_text, read_jsonl

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _leftovers(folder: Path) -> list[str]:
    """Hidden temporary files or folders the atomic writes would have left."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_jsonl_append_cut_back_to_whole_records(tmp_path, monkeypatch):
    f = tmp_path / "parts" / "rank0.jsonl"
    append_jsonl(f, {"i": 0})
    append_jsonl(f, {"i": 1})
    real = os.write

    def half_then_full(fd, data):  # half the record reaches the disk, then the disk is full
        real(fd, bytes(data[: len(data) // 2]))
        raise ENOSPC

    monkeypatch.setattr(kio.os, "write", half_then_full)
    with pytest.raises(DiskFullError) as e:
        append_jsonl(f, {"i": 2, "text": "x" * 100})
    assert str(f.parent) in str(e.value) and "a record of rank0.jsonl" in str(e.value)
    assert read_jsonl(f) == [{"i": 0}, {"i": 1}]  # no torn line: a rerun reads both whole records
    monkeypatch.setattr(kio.os, "write", real)
    append_jsonl(f, {"i": 2, "text": "x" * 100})  # space freed: the append goes on as if never cut
    assert [r["i"] for r in read_jsonl(f)] == [0, 1, 2]


def test_atomic_file_keeps_the_old_file(tmp_path, monkeypatch):
    f = tmp_path / "metrics.json"
    atomic_write_text(f, "old\n")
    monkeypatch.setattr(kio.os, "fsync", lambda fd: (_ for _ in ()).throw(ENOSPC))
    with pytest.raises(DiskFullError, match=rf"device of {tmp_path} while writing the metrics"):
        atomic_write_text(f, "new\n" * 1000, what="the metrics")
    assert f.read_text() == "old\n" and _leftovers(tmp_path) == []


def test_atomic_folder_keeps_the_old_folder(tmp_path):
    target = tmp_path / "index"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(DiskFullError, match="while writing index"):
        with atomic_dir(target) as tmp:
            (tmp / "a").write_text("new, half")
            raise ENOSPC
    assert (target / "a").read_text() == "old" and _leftovers(tmp_path) == []
    with pytest.raises(DiskFullError) as e:  # a file of the folder written by the helpers: named by the folder
        with atomic_dir(target, what="the index") as tmp:
            with pytest.MonkeyPatch.context() as m:
                m.setattr(kio.os, "fsync", lambda fd: (_ for _ in ()).throw(ENOSPC))
                atomic_write_text(tmp / "meta.json", "{}")
    assert str(e.value).startswith(f"no space left on the device of {tmp_path} while writing the index (")
    assert (target / "a").read_text() == "old" and _leftovers(tmp_path) == []


def test_an_errno_lost_by_a_library_is_told_by_the_free_space(tmp_path, monkeypatch):
    """numpy says "N requested and M written" without an errno; a file system with no space left says the rest."""
    monkeypatch.setattr(kio, "free_bytes", lambda folder: 0)
    with pytest.raises(DiskFullError):
        with atomic_dir(tmp_path / "x"):
            raise OSError("1048576 requested and 262128 written")
    monkeypatch.setattr(kio, "free_bytes", lambda folder: 10 << 30)
    with pytest.raises(OSError, match="requested"):  # space left: another error, passed on unchanged
        with atomic_dir(tmp_path / "x"):
            raise OSError("1048576 requested and 262128 written")
    with pytest.raises(DiskFullError):  # safetensors' wording
        with atomic_dir(tmp_path / "x"):
            raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    with pytest.raises(KeyError):  # a bug stays a bug
        with atomic_dir(tmp_path / "x"):
            raise KeyError("x")


def test_model_save_merge(tmp_path, tiny_model_dir, monkeypatch):
    """A merge whose safetensors save fills the disk: no model folder, and the rerun's equals an uninterrupted one."""
    import transformers.modeling_utils as mu
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from knowtrace_train.train.merge import merge_adapters_into_base

    import torch

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    peft.save_pretrained(tmp_path / "adapter")
    whole = merge_adapters_into_base(tiny_model_dir, tmp_path / "adapter", tmp_path / "whole")

    real = mu.safe_save_file

    def half_then_full(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(mu, "safe_save_file", half_then_full)
    out = tmp_path / "merged"
    with pytest.raises(DiskFullError, match=rf"device of {tmp_path} while writing the merged model"):
        merge_adapters_into_base(tiny_model_dir, tmp_path / "adapter", out)
    assert not out.exists() and _leftovers(tmp_path) == []
    monkeypatch.setattr(mu, "safe_save_file", real)
    merge_adapters_into_base(tiny_model_dir, tmp_path / "adapter", out)
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_cache_store(tmp_path, monkeypatch):
    from knowtrace_train.selftrain import reuse

    cache = reuse.ReuseCache(tmp_path / "cache")
    entry = cache.entry("eval", {"x": 1})
    src = tmp_path / "eval.jsonl"
    src.write_text('{"a": 1}\n')
    real = reuse.shutil.copy2
    monkeypatch.setattr(reuse.shutil, "copy2", lambda *a, **k: (_ for _ in ()).throw(ENOSPC))
    with pytest.raises(DiskFullError, match="while writing the reuse cache's eval entry"):
        cache.store(entry, {"eval.jsonl": src}, {"em": 1.0}, tmp_path)
    assert not entry.path.exists() and _leftovers(entry.path.parent) == []
    assert cache.lookup(entry, "eval") is None  # nothing a rerun would read
    monkeypatch.setattr(reuse.shutil, "copy2", real)
    assert cache.store(entry, {"eval.jsonl": src}, {"em": 1.0}, tmp_path)
    assert cache.lookup(entry, "eval") == {"em": 1.0}
    # another failure of a store stays a warning: the run does not depend on the cache
    other = cache.entry("eval", {"x": 2})
    monkeypatch.setattr(reuse.shutil, "copy2", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "no")))
    assert cache.store(other, {"eval.jsonl": src}, {}, tmp_path) is False


def test_index_build(tmp_path, monkeypatch):
    import numpy as np

    from knowtrace_train.data.schema import Passage, passage_id
    from knowtrace_train.retrieval.bm25 import BM25Retriever

    corpus = [Passage(passage_id(t, x), t, x) for t, x in
              [("a", "the river flows north"), ("b", "a castle by the river"), ("c", "mountains and snow")]]
    fresh = [[s.passage.id for s in hits] for hits in BM25Retriever(corpus, cache_dir=None).search(["river castle"], 2)]
    real = np.save
    calls = []

    def full(file, arr, *a, **k):  # numpy's own wording: no errno; the file system has no space left
        calls.append(file)
        raise OSError(f"{arr.nbytes} requested and 0 written")

    monkeypatch.setattr(np, "save", full)
    monkeypatch.setattr(kio, "free_bytes", lambda folder: 0)
    with pytest.raises(DiskFullError, match="while writing the BM25 index"):
        BM25Retriever(corpus, cache_dir=tmp_path / "idx")
    assert calls, "the injection did not hit the index's save"
    assert list((tmp_path / "idx" / "bm25").iterdir()) == []  # no half index a rerun would load
    monkeypatch.setattr(np, "save", real)
    monkeypatch.undo()
    again = BM25Retriever(corpus, cache_dir=tmp_path / "idx")
    assert [[s.passage.id for s in hits] for hits in again.search(["river castle"], 2)] == fresh


def test_one_line_and_exit_2(capsys):
    @user_errors
    def main(argv):
        raise kio.disk_full_error("/runs/x/iter_1", "the merged model", ENOSPC)

    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("disk full: no space left on the device of /runs/x/iter_1 "
                                                   "while writing the merged model")
    assert report_user_error(DiskFullError("x")) == 2


def test_a_real_small_tmpfs(tmp_path):
    """Where this process may mount a tmpfs (root in a container), a real full disk: an atomic folder and an append."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(DiskFullError, match="while writing big"):
            with atomic_dir(mnt / "big") as tmp:
                (tmp / "blob").write_bytes(b"\0" * (1 << 20))
        assert list(mnt.iterdir()) == []
        f = mnt / "rows.jsonl"
        append_jsonl(f, {"i": 0})
        with pytest.raises(DiskFullError):
            for i in range(1, 10_000):
                append_jsonl(f, {"i": i, "pad": "y" * 1000})
        rows = read_jsonl(f)
        assert [r["i"] for r in rows] == list(range(len(rows)))  # whole records only
        assert json.loads(f.read_text().splitlines()[-1])["i"] == len(rows) - 1
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
