"""Resumable stages of a run folder: DONE markers, the folder layout, and the processes that share it.

A stage is done when its marker `DONE.<stage>` exists in its folder; the marker is written (atomically)
after every file of the stage, so a kill at any moment leaves either a finished stage or one that is
redone from scratch (rollouts keep their finished chunks, see `rollout.py`); the temporary file or folder of a
write the kill cut short is removed as the run starts again (`remove_leftovers`). The marker records the
SHA-256 of every file the stage wrote or changed in its folder (`"sha256": {path: digest}`, taken once as
the marker is written); a finished stage whose file is gone or no longer has its digest (a crash's torn
write, a person's edit, a full disk) is refused with the file named, never used. Under `torchrun` or
`accelerate launch` every process walks the same stages; only the main process writes files, and all
of them meet at a barrier after each stage so that they agree on what is done.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from knowtrace_train.errors import LaunchError, RunError
from knowtrace_train.io import file_sha256, read_json, write_json

log = logging.getLogger(__name__)

DONE_PREFIX = "DONE."
#: a marker's record of the files its stage wrote: path in the folder -> SHA-256 of its bytes
FILES_KEY = "sha256"


# -- processes ------------------------------------------------------------------------------------


@dataclass
class Processes:
    """This process's place among the launched ones (one process when not launched)."""

    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def detect(cls) -> "Processes":
        """From the launcher's environment. With more than one process the default process group is
        started here (gloo on CPUs, nccl on GPUs), as accelerate and the Trainer expect."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch
        from accelerate import PartialState

        # accelerate treats a CPU-only launch as distributed only when told `cpu=True` (else every
        # torchrun process thinks it is the only one, rank 0 of 1, and they all write the same files)
        state = PartialState(cpu=not torch.cuda.is_available())
        procs = cls(rank=state.process_index, world=state.num_processes)
        if procs.world != world:
            raise LaunchError(
                f"launched as {world} processes (WORLD_SIZE) but accelerate sees {procs.world} "
                f"({state.distributed_type}); refusing to run them as independent writers of one run folder")
        log.info("process %d of %d (%s, backend %s)", procs.rank, procs.world, state.distributed_type, state.backend)
        return procs

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, in rank order (on every process)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """The main process's `obj` on every process."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


# -- stages ---------------------------------------------------------------------------------------


def marker(folder: Path, stage: str) -> Path:
    return folder / f"{DONE_PREFIX}{stage}"


def is_done(folder: Path, stage: str) -> bool:
    return marker(folder, stage).is_file()


def read_marker(folder: Path, stage: str) -> dict[str, Any]:
    """The stage's marker as written: its figures and the SHA-256 of its files (`FILES_KEY`)."""
    return read_json(marker(folder, stage))


def read_done(folder: Path, stage: str) -> dict[str, Any]:
    """What the stage recorded in its marker (its seconds and figures)."""
    done = read_marker(folder, stage)
    done.pop(FILES_KEY, None)
    return done


def mark_done(folder: Path, stage: str, info: dict[str, Any]) -> None:
    write_json(marker(folder, stage), info)


#: what a kill in the middle of an atomic write (io.atomic_write_text, io.atomic_dir) leaves: the temporary file or
#: folder beside the target, ".<name>.<the 8 characters tempfile picks>"
LEFTOVER = re.compile(r"^\..+\.[a-z0-9_]{8}$")


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files and folders that killed atomic writes left under `folder` (a half-saved model, an
    adapter, a JSON file), which nothing reads and a resumed run would otherwise keep for good; returns them. Only
    where no process writes there: a run's folder as the run starts, a cache entry's siblings under its lock."""
    removed = []
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            if LEFTOVER.match(name):
                p = Path(root) / name
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
                removed.append(p)
        dirs[:] = [d for d in dirs if not LEFTOVER.match(d)]
    if removed:
        log.info("removed %d temporary file(s) a killed run left in %s: %s", len(removed), folder,
                 ", ".join(str(p.relative_to(folder)) for p in removed))
    return removed


def folder_state(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under `folder` but markers and hidden (temporary) files: path -> (size, mtime, inode)."""
    out = {}
    if folder.is_dir():
        for p in folder.rglob("*"):
            rel = p.relative_to(folder)
            if p.is_file() and not p.name.startswith(DONE_PREFIX) and not any(x.startswith(".") for x in rel.parts):
                st = p.stat()
                out[str(rel)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def written_digests(folder: Path, before: dict[str, tuple[int, int, int]]) -> dict[str, str]:
    """SHA-256 of each file under `folder` that is new or changed since `before` (`folder_state`)."""
    after = folder_state(folder)
    return {rel: file_sha256(folder / rel) for rel in sorted(after) if before.get(rel) != after[rel]}


def changed_file(folder: Path, stage: str, done: dict[str, Any]) -> str | None:
    """Why a finished stage's files cannot be used (None: each one its marker lists is there, same bytes)."""
    for rel, want in (done.get(FILES_KEY) or {}).items():
        p = folder / rel
        if not p.is_file():
            why = "is gone"
        elif file_sha256(p) != want:
            why = "no longer has the SHA-256 its marker recorded (a corrupt or edited file)"
        else:
            continue
        return (f"{p} {why}: stage {folder.name}/{stage} finished with it, and the run will not go on from a changed "
                f"file; restore it, or remove {marker(folder, stage)} to redo the stage")
    return None


@dataclass
class StageRunner:
    """Runs a stage unless its marker exists, times it, has the main process write the marker with
    the figures the stage returned, and makes every process meet the others afterwards."""

    procs: Processes = field(default_factory=Processes)

    def run(self, folder: Path, name: str, body: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
        """The stage's figures: those its marker recorded when it is done already, else `body()`'s
        (plus its `seconds`)."""
        if is_done(folder, name):
            log.info("%s/%s: done already, skipped", folder.name, name)
            # the main process reads the files (once, not once per process) and tells the others
            problem = self.procs.broadcast(changed_file(folder, name, read_marker(folder, name))
                                           if self.procs.is_main else None)
            if problem is not None:
                raise RunError(problem)
            return read_done(folder, name)
        log.info("%s/%s: starting", folder.name, name)
        before = folder_state(folder) if self.procs.is_main else {}
        t0 = time.perf_counter()
        info = dict(body() or {})
        info.setdefault("seconds", round(time.perf_counter() - t0, 3))
        if self.procs.is_main:
            mark_done(folder, name, {**info, FILES_KEY: written_digests(folder, before)})
        self.procs.barrier()
        return info
