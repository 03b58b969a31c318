"""Processes.detect: what accelerate is told on CPUs, and a launch it does not see whole."""

from __future__ import annotations

import sys
import types

import pytest

from knowtrace_train.stages import Processes


class FakeState:
    """Stands in for accelerate.PartialState: records `cpu` and reports a fixed process count."""

    seen: list[bool] = []

    def __init__(self, cpu: bool = False, rank: int = 1, world: int = 2) -> None:
        FakeState.seen.append(cpu)
        self.process_index, self.num_processes = (rank, world) if cpu else (0, 1)
        self.distributed_type = "MULTI_CPU" if cpu else "NO"
        self.backend = "gloo" if cpu else None


@pytest.fixture
def fake_accelerate(monkeypatch):
    FakeState.seen = []
    monkeypatch.setitem(sys.modules, "accelerate", types.SimpleNamespace(PartialState=FakeState))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    return FakeState


def test_one_process_without_a_launcher(monkeypatch, fake_accelerate):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert Processes.detect() == Processes(rank=0, world=1)
    assert fake_accelerate.seen == []  # no process group for a plain run


def test_cpu_launch_tells_accelerate_cpu(monkeypatch, fake_accelerate):
    """accelerate 1.15 counts a CPU launch as distributed only with cpu=True (else rank 0 of 1 everywhere)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    p = Processes.detect()
    assert fake_accelerate.seen == [True]
    assert (p.rank, p.world, p.is_main) == (1, 2, False)


def test_a_launch_accelerate_does_not_see_whole_is_an_error(monkeypatch, fake_accelerate):
    monkeypatch.setenv("WORLD_SIZE", "4")  # FakeState reports 2
    with pytest.raises(RuntimeError, match="launched as 4 processes .* accelerate sees 2"):
        Processes.detect()


def test_a_run_folder_loses_what_killed_atomic_writes_left_and_nothing_else(tmp_path):
    """A kill in the middle of io.atomic_dir / atomic_write_text leaves `.<name>.<8 characters>` beside the target
    (a half-saved model, an adapter): removed, with everything else, hidden files included, kept."""
    from knowtrace_train.stages import remove_leftovers

    (tmp_path / "iter_0" / ".model.afk9q90k").mkdir(parents=True)
    (tmp_path / "iter_0" / ".model.afk9q90k" / "model.safetensors").write_bytes(b"half")
    (tmp_path / "iter_1" / "adapters" / ".complete.vg_gyx1q").mkdir(parents=True)
    (tmp_path / "iter_1" / ".metrics.json.k2j4l5m6").write_text("{")
    kept = [tmp_path / "iter_0" / "model" / "config.json", tmp_path / ".gitignore", tmp_path / "iter_1" / ".notes.md",
            tmp_path / "iter_1" / "rollouts.jsonl.parts" / "rank0.jsonl", tmp_path / ".ipynb_checkpoints" / "a.txt"]
    for p in kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    removed = remove_leftovers(tmp_path)
    assert sorted(p.name for p in removed) == [".complete.vg_gyx1q", ".metrics.json.k2j4l5m6", ".model.afk9q90k"]
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)
