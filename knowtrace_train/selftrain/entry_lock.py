"""One reuse-cache entry's lock (selftrain/reuse.py): an exclusive OS file lock that a run holds while it computes
the entry or copies it out, so runs side by side with one cache home compute each shared stage once."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from knowtrace_train.errors import RunError, env_number
from knowtrace_train.selftrain.preflight import pid_stopped

log = logging.getLogger(__name__)

#: how often (seconds) a run waiting for an entry that another run computes says so
WAIT_LOG_ENV = "KNOWTRACE_REUSE_WAIT_LOG_S"


class EntryLock:
    """An exclusive OS file lock (flock) on one cache entry, held by one process at a time; the kernel releases
    it when its holder exits or dies. The holder writes who it is into the lock file (a JSON object: run, pid,
    host, since) for the runs that wait; the file itself is never removed (removing it would let two runs
    lock two different files of one name)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def holder(self) -> str:
        """Who holds the lock, as its file says (or "a run that has not said who it is yet")."""
        try:
            who = json.loads(self.path.read_text(encoding="utf-8"))
            return f"run {who['run']} (pid {who['pid']} on {who['host']}, since {who['since']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "a run that has not said who it is yet"

    def holder_stopped(self) -> bool:
        """Whether the holder the lock file names is a process on this machine that is stopped (Ctrl-Z)."""
        try:
            who = json.loads(self.path.read_text(encoding="utf-8"))
            return who["host"] == socket.gethostname() and pid_stopped(int(who["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def acquire(self, label: str, made_by: str | Path, poll: float = 0.2, limit: float | None = None) -> float:
        """Take the lock, waiting while another process holds it (at most `limit` seconds, then a `RunError`
        naming the holder); the seconds waited."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        every = env_number(WAIT_LOG_ENV, 60.0)
        t0 = last = time.monotonic()
        said = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    now = time.monotonic()
                    if limit is not None and now - t0 >= limit:
                        stopped = " and is STOPPED (Ctrl-Z: resume it with fg, or end it)" if self.holder_stopped() else ""
                        raise RunError(f"{label}: gave up after {now - t0:.0f} s waiting for {self.holder()}, which "
                                       f"holds {self.path}{stopped}; rerun once it is done (reuse_wait_minutes bounds "
                                       "the wait; --reuse false computes it here)")
                    if not said or now - last >= every:
                        stopped = self.holder_stopped()
                        (log.warning if stopped else log.info)(
                            "%s: %s is computing it; waiting for it (%.0f s so far, lock %s)%s", label, self.holder(),
                            now - t0, self.path,
                            "; that process is STOPPED (Ctrl-Z): resume it with fg, or end it" if stopped else "")
                        said, last = True, now
                    time.sleep(poll)
            me = {"run": str(made_by), "pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "stage": label}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(me) + "\n").encode("utf-8"), 0)
        except BaseException:
            os.close(fd)  # closing drops a lock taken just before
            raise
        self.fd = fd
        waited = time.monotonic() - t0
        if said:
            log.info("%s: the other run is done with it after %.0f s of waiting", label, waited)
        return waited

    def release(self) -> None:
        if self.fd is None:
            return
        import fcntl

        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)  # nobody's
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
