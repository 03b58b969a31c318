"""Progress of a long stage: a tqdm bar on a terminal, plain periodic log lines in a log file.

A bar redraws itself with carriage returns (and, stacked under another, cursor-up escapes); in a log
that is not a terminal (`nohup`, `> run.log 2>&1`, CI) every redraw stays as bytes. So `stage_bar` gives a
tqdm bar only where stderr is a terminal, and elsewhere a `LineProgress`: one INFO line every
`LINE_SECONDS` (`KNOWTRACE_PROGRESS_SECONDS`) and one when the stage ends, with the count, the bar's
postfix (a rollout's running EM) and the seconds.

Each stage of a run has one bar: `library_bars_off()` turns off the bars the libraries draw inside a stage
(transformers' "Loading weights" and "Writing model shards", datasets' maps) for a run, and off a terminal
the Hugging Face Hub's download bars too; `trainer_bar_off()` is the Trainer's `disable_tqdm`.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

from knowtrace_train.errors import env_number

log = logging.getLogger(__name__)

#: seconds between two lines of a `LineProgress` (the environment's KNOWTRACE_PROGRESS_SECONDS where set)
LINE_SECONDS = 60.0
SECONDS_ENV = "KNOWTRACE_PROGRESS_SECONDS"


def stderr_is_terminal() -> bool:
    """Whether stderr (where bars draw) is a terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def trainer_bar_off() -> bool:
    """The Trainer's `disable_tqdm`: its bar off where stderr is not a terminal (it logs its losses either way)."""
    return not stderr_is_terminal()


class LineProgress:
    """tqdm's `update`, `set_postfix` and `close`, as a log line every `seconds` and one at the end."""

    def __init__(self, total: int, desc: str, unit: str = "it", seconds: float | None = None) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n = 0
        self.postfix = ""
        self.seconds = seconds if seconds is not None else env_number(SECONDS_ENV, LINE_SECONDS)
        self._start = self._last = time.perf_counter()
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self._last >= self.seconds and self.n < self.total:
            self._last = now
            self._line()

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._line()

    def _line(self) -> None:
        extra = f" ({self.postfix})" if self.postfix else ""
        log.info("%s: %d/%d %s%s, %.0fs", self.desc, self.n, self.total, self.unit, extra,
                 time.perf_counter() - self._start)

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stage_bar(total: int, desc: str, unit: str = "it", mininterval: float = 1.0):
    """A stage's progress: a tqdm bar where stderr is a terminal, else a `LineProgress`."""
    if not stderr_is_terminal():
        return LineProgress(total, desc, unit)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, mininterval=mininterval)


def question_bar(total: int, desc: str, enabled: bool, mininterval: float = 1.0):
    """The bar of a run over `total` questions (`stage_bar`), or None where progress is off or nothing is to run."""
    return stage_bar(total, desc, unit="q", mininterval=mininterval) if enabled and total else None


@contextmanager
def library_bars_off() -> Iterator[None]:
    """The libraries' own bars off inside the block (transformers', datasets'; off a terminal the Hub's
    downloads' too), as they were after it."""
    from transformers.utils import logging as tf_logging

    import datasets
    from huggingface_hub import utils as hub_utils

    hub_was_off = hub_utils.are_progress_bars_disabled()
    tf_was_on, ds_was_on = tf_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled()
    tf_logging.disable_progress_bar()  # it turns the Hub's off too: back on below on a terminal
    if stderr_is_terminal() and not hub_was_off:
        hub_utils.enable_progress_bars()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if tf_was_on:
            tf_logging.enable_progress_bar()
        (hub_utils.disable_progress_bars if hub_was_off else hub_utils.enable_progress_bars)()
        if ds_was_on:
            datasets.enable_progress_bars()
