"""Torch CPU threads shared between a run's main thread and one job on a worker thread beside it.

torch's thread count belongs to each OS thread (OpenMP's and MKL's per-thread settings): a worker's
`torch.set_num_threads` leaves the main thread's alone, and the main thread's only changes when the main
thread itself sets it. So while a job runs beside (`selftrain/beside.py`: a model's dev evaluation beside
the next stages), the job runs on the threads it was lent and the main thread on the rest. When the main
thread takes them back is the schedule's choice:
- held (`hold=True`, the loop's fixed schedule): when it joins the job (`end()`), at a point of the run that the
  run itself fixes, so every stage runs on a thread count known in advance. Where a model's outputs and a LoRA
  step's weights differ on one thread and on two (docs/training.md, "bf16 on a CPU depends on the thread count"),
  only a held share gives the same results whenever the job ends;
- followed: as soon as the job has ended, at the next `follow()`, which the main thread's training steps and
  generation calls make. The threads idle no longer than the job runs, but a stage's thread count depends on
  timing: only where the outputs are bitwise the same on one thread and on two are the results independent of
  when the job ends (docs/training.md, "Threads").
"""

from __future__ import annotations

import threading


class ThreadShare:
    """The main thread's torch thread count while a job beside it holds some of the process's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: threading.Thread | None = None
        self._total = 0
        self._target: int | None = None
        self._hold = False

    def lend(self, total: int, lent: int, hold: bool = False, keep: int | None = None) -> int:
        """The calling (main) thread lends `lent` of its `total` threads to a job beside it and runs on the
        rest (`keep` of them, where given) from now on: until it joins the job (`end()`) where `hold`, else until
        the job ends. Returns the threads the job gets."""
        lent = max(1, min(lent, total - 1)) if total > 1 else 1
        with self._lock:
            self._owner = threading.current_thread()
            self._total = total
            self._target = max(1, min(keep, total - lent) if keep is not None else total - lent)
            self._hold = hold
        self.follow()
        return lent

    def give_back(self) -> None:
        """The job has ended (called from its thread): unless the share is held, the main thread's next
        `follow()` takes every thread."""
        with self._lock:
            if not self._hold:
                self._target = self._total

    def end(self) -> None:
        """On the main thread, the job joined: it takes every thread now (the share is over)."""
        with self._lock:
            if self._owner is threading.current_thread():
                self._target = self._total
        self.follow()

    def follow(self) -> None:
        """On the main thread: set its torch threads to what it may use now (every thread again once the job
        has ended, after which the share is over). Elsewhere: nothing."""
        if self._owner is not threading.current_thread():
            return
        import torch

        with self._lock:
            target = self._target
            if target == self._total:  # the job has ended
                self._owner = self._target = None
        if target is not None and torch.get_num_threads() != target:
            torch.set_num_threads(target)


#: the process's one share (a run has at most one job beside its main thread)
SHARE = ThreadShare()


def follow() -> None:
    """The main thread's training steps and generation calls call this: see `ThreadShare.follow`."""
    SHARE.follow()
