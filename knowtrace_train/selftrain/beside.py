"""A model's dev evaluation on a worker thread beside the loop's next stages (`eval_beside`).

The evaluation of M(z) needs nothing of iteration z+1, whose rollouts and training need nothing of it;
the raw base's evaluation needs nothing of the bootstrap. On a CPU decoding uses a second thread poorly and
training well (docs/training.md, "Threads", has the measurements). So the loop runs an evaluation on a worker
thread with half the process's threads, the next stages on the main thread with the other half, and finishes the
model's row when it joins the evaluation, so rows come in order.

The schedule is fixed (`eval_beside_fixed`, the default): M(z)'s evaluation runs beside iteration z+1's
rollouts and is joined before iteration z+1's training; the main thread keeps its half until then, however early
the evaluation ends (`threads.ThreadShare`, held), and the training and the bootstrap run in turn on every thread.
The last evaluation runs on the main thread on an evaluation's half, the raw base's beside it on the other (or,
where M0 is the raw base, as M0's). So every stage runs on a thread count the schedule fixes: where products round
differently on one thread and on two (docs/training.md, "bf16 on a CPU depends on the thread count"), a thread count
that changed with timing made two runs of the same code differ; and every model's row is decoded on the same
thread count, so the paired tests between rows compare models, not roundings. `eval_beside_fixed: false` is the schedule before
it: the raw base's evaluation beside the bootstrap, M(z)'s beside iteration z+1's rollouts and training until the
next evaluation is due, the main thread taking the threads back as soon as the evaluation ends. Where the thread
count changes nothing both give the outputs of evaluations in turn.

Off under several processes (the stages meet at barriers), with the vLLM backend (one engine per GPU)
and on GPUs (not measured); `eval_beside: true` asks for it on a GPU with the transformers backend.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from knowtrace_train.config import ConfigError
from knowtrace_train.io import write_json
from knowtrace_train.pairing import compare_evals
from knowtrace_train.stages import is_done
from knowtrace_train.threads import SHARE

log = logging.getLogger(__name__)


def beside_threads(setting: bool | None, threads: int, processes: int, backend: str, device: str) -> int:
    """Threads lent to an evaluation beside the next stages (0: evaluations run in turn). `setting` is the
    config's `eval_beside` (None: on for one process decoding with the transformers backend on a CPU with
    two or more threads), `threads` the process's torch threads, `device` where the generator runs."""
    if setting is False or processes > 1 or backend == "vllm":  # eval_beside: true is refused there (config)
        return 0
    if setting is True:
        return max(1, threads // 2)
    return threads // 2 if device == "cpu" and threads >= 2 else 0


def check_beside(setting: bool | None, processes: int, backend: str) -> None:
    """`eval_beside: true` where it cannot be: a ConfigError naming why."""
    if setting is not True:
        return
    if processes > 1:
        raise ConfigError(f"eval_beside: true needs one process (launched as {processes}): the stages of "
                          "several processes meet at barriers")
    if backend == "vllm":
        raise ConfigError("eval_beside: true needs generator.backend: transformers (vLLM runs one engine per GPU)")


class BesideJob:
    """`body()` on a daemon worker thread with `threads` torch threads lent by the main thread."""

    def __init__(self, body: Callable[[], Any], total: int, threads: int, name: str, hold: bool = False,
                 keep: int | None = None) -> None:
        self.name = name
        self._result: Any = None
        self._error: BaseException | None = None
        self.threads = SHARE.lend(total, threads, hold, keep)
        log.info("%s: beside the next stages on %d of %d threads (the main thread takes them back %s)", name,
                 self.threads, total, "when it joins the job" if hold else "as soon as the job ends")
        self._thread = threading.Thread(target=self._run, args=(body,), name=name, daemon=True)
        self._thread.start()

    def _run(self, body: Callable[[], Any]) -> None:
        import torch

        try:
            torch.set_num_threads(self.threads)
            self._result = body()
        except BaseException as e:  # raised again on the main thread by result()
            self._error = e
        finally:
            SHARE.give_back()

    def wait_quietly(self) -> None:
        """Let the job end, without its result (where the main thread is failing already: no stage writes after
        the run). The main thread takes its threads back."""
        self._thread.join()
        SHARE.end()

    def result(self) -> Any:
        """Wait for the job; its result, or its exception raised here."""
        self.wait_quietly()
        if self._error is not None:
            raise self._error
        return self._result


class Evaluations:
    """The run's dev evaluations: a model in, its metrics row recorded (`record(row, metrics)`) once evaluated; in
    turn, or each on a worker thread beside the next stages. Built with the run's context (context.py) and its
    rollout stage (rollout_stage.py)."""

    def __init__(self, run, rollouts, record: Callable[[dict[str, Any], list[dict[str, Any]]], None]) -> None:
        self.run = run
        self.rollouts = rollouts
        #: records a finished model's row in the run's metrics (SelfTrain: appended, shown, summarized)
        self.record = record
        #: threads lent to an evaluation beside the next stages (0: in turn), whether the schedule is the fixed one
        #: (`eval_beside_fixed`), the process's threads (set by `start`), and the evaluation running beside with the
        #: function that finishes its model's metrics
        self.threads_beside = 0
        self.fixed = False
        self._threads = 1
        self._pending: tuple[BesideJob, Callable[[dict[str, Any] | None], dict[str, Any]]] | None = None
        #: whether the raw base's evaluation waits for its place in the fixed schedule (`base`)
        self._base_waits = False

    def start(self, threads: int) -> None:
        """The schedule of a run whose process has `threads` torch threads."""
        cfg = self.run.config
        self.threads_beside = beside_threads(cfg.eval_beside, threads, self.run.procs.world, cfg.generator.backend,
                                             self._generator_device())
        self._threads, self._pending, self._base_waits = threads, None, False
        self.fixed = self.threads_beside > 0 and cfg.eval_beside_fixed

    @property
    def beside(self) -> bool:
        """Whether this run evaluates beside the next stages (known once the run has started)."""
        return self.threads_beside > 0

    def _generator_device(self) -> str:
        from knowtrace_train.generation.hf import pick_device

        return str(pick_device(self.run.config.generator.device).type)

    def evaluate(self, folder: Path, state, seed: int, iteration: int | None,
                 finish: Callable[[dict[str, Any] | None], dict[str, Any]], metrics: list[dict[str, Any]],
                 last: bool = False) -> None:
        """Evaluate `state` on the dev questions; `finish(eval figures)` makes the model's metrics (written),
        then recorded in `metrics`, shown and summarized. With `eval_beside` it runs on a worker thread beside
        the next stages and is finished when the main thread joins it: before the next training in the fixed
        schedule, else when the next model's evaluation is due (the previous one first: rows in order). The
        `last` evaluation, which no stage follows, runs on the main thread: in the fixed schedule on as many
        threads as an evaluation beside (every model's row decoded on the same thread count), beside the raw
        base's where that waits for it (`base`); else on every thread."""
        self.join(metrics)
        if last and self.fixed:
            with self._on_beside_threads():
                if self._base_waits:
                    self._base_waits = False
                    self._beside_job(*self._base_args(), self._base_finish(metrics), metrics,
                                     keep=self.threads_beside)
                self.record(finish(self.rollouts.evaluate(folder, state, seed, iteration)), metrics)
                self.join(metrics)
        elif not self.threads_beside or last:
            self.record(finish(self.rollouts.evaluate(folder, state, seed, iteration)), metrics)
        else:
            self._beside_job(folder, state, seed, iteration, finish, metrics)

    def _beside_job(self, folder: Path, state, seed: int, iteration: int | None,
                    finish: Callable[[dict[str, Any] | None], dict[str, Any]], metrics: list[dict[str, Any]],
                    keep: int | None = None) -> None:
        """The evaluation on a worker thread (`_pending`), the main thread keeping `keep` threads (None: the rest),
        or at once where it is done or the cache serves it."""
        run, rollouts = self.run, self.rollouts
        if is_done(folder, "eval") or run.reuse.served(
                "eval", rollouts.inputs(state, run.questions.dev, seed, iteration)):
            self.record(finish(rollouts.evaluate(folder, state, seed, iteration)), metrics)
            return
        # what the worker would otherwise build lazily, beside the main thread's use of it; and its generator:
        # loading models is not thread-safe (transformers patches torch.nn while it loads), and here the load
        # draws from torch's global generator at the point of the run where evaluations in turn draw
        _ = run.retriever, run.base_path, run.reuse.cache is not None and run.reuse.corpus_fingerprint()
        generator = run.build_generator(state)

        def beside() -> dict[str, Any]:
            try:
                return rollouts.evaluate(folder, state, seed, iteration, generator=generator)
            finally:
                generator.close()  # where the stage came from the reuse cache, or every question was done

        self._pending = (BesideJob(beside, self._threads, self.threads_beside, f"{folder.name} dev eval", self.fixed,
                                   keep), finish)

    def base(self, metrics: list[dict[str, Any]], m0: bool | None = None) -> None:
        """The raw base's dev evaluation: called by the run first (`m0` None) and by the bootstrap once it knows
        whether the raw base is M0 itself. In the fixed schedule it waits for its place: where M0 is the raw base,
        M0's (beside iteration 1's rollouts); else beside the last evaluation, each on as many threads as an
        evaluation beside the rollouts, so that every row of the run is decoded on the same thread count (on CPUs
        whose products round otherwise on one thread than on two, a row decoded on two threads is a different
        measurement) and the second thread is not idle at the end. Otherwise it runs at once: beside the
        bootstrap, or in turn."""
        cfg = self.run.config
        if m0 is None:
            if self.fixed:
                self._base_waits = True
            else:
                self.evaluate(*self._base_args(), self._base_metrics, metrics,
                              last=cfg.iterations == 0 and cfg.bootstrap.mode == "never")
        elif m0 and self._base_waits:
            self._base_waits = False
            self.evaluate(*self._base_args(), self._base_metrics, metrics, last=cfg.iterations == 0)

    def _base_args(self) -> tuple[Path, Any, int, None]:
        """The raw base's evaluation as `evaluate` takes it: its folder, model, seed and (no) iteration."""
        return self.run.run_dir / "base", self.run.raw_base(), self.run.config.strategy.seed, None

    def _base_metrics(self, ev: dict[str, Any] | None) -> dict[str, Any]:
        m = {"iteration": "base", "model": "base", "eval": ev, "seconds": {"eval": ev["seconds"]}}
        if self.run.procs.is_main:
            write_json(self.run.run_dir / "base" / "metrics.json", m)
        return m

    def finish_all(self, metrics: list[dict[str, Any]]) -> None:
        """At the end of the run: join the evaluation beside, and run the raw base's if it still waits (the run
        stopped before its last evaluation), as the last evaluation, on the threads it would have had."""
        self.join(metrics)
        if self._base_waits:
            self._base_waits = False
            self.evaluate(*self._base_args(), self._base_finish(metrics), metrics, last=True)

    def _base_finish(self, metrics: list[dict[str, Any]]) -> Callable[[dict[str, Any] | None], dict[str, Any]]:
        """The raw base's metrics, and M0's paired test against it where M0's row came first."""
        run_dir = self.run.run_dir

        def finish(ev: dict[str, Any] | None) -> dict[str, Any]:
            m = self._base_metrics(ev)
            for row in metrics:
                if row.get("iteration") == 0 and row.get("vs_base") is None:
                    row["vs_base"] = self.compare("base", run_dir / "base", run_dir / "iter_0")
                    if self.run.procs.is_main:
                        write_json(run_dir / "iter_0" / "metrics.json", row)
            return m

        return finish

    def compare(self, against: str, a_folder: Path, b_folder: Path) -> dict[str, Any] | None:
        """The model evaluated in `b_folder` against the one in `a_folder` (named `against`) on the
        dev questions: {"model": against, "n", "em", "f1"} (paired tests, `pairing.compare_evals`,
        read from the two eval.jsonl files). None where either was not evaluated; {"model",
        "refused"} where the files hold other questions (they never should in one run folder)."""
        a, b = a_folder / "eval.jsonl", b_folder / "eval.jsonl"
        if not (a.is_file() and b.is_file()):
            return None
        try:
            return {"model": against, **compare_evals(a, b, seed=self.run.config.seed)}
        except ValueError as e:
            log.warning("no paired test of %s against %s: %s", b_folder.name, against, e)
            return {"model": against, "refused": str(e)}

    @contextmanager
    def _on_beside_threads(self) -> Iterator[None]:
        """The main thread on as many torch threads as an evaluation beside gets (those it keeps while a job beside
        is held), every thread again after."""
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.threads_beside)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def join(self, metrics: list[dict[str, Any]]) -> None:
        """Wait for the evaluation beside, if one runs, and record its model's row."""
        if self._pending is not None:
            job, finish = self._pending
            self._pending = None
            self.record(finish(job.result()), metrics)

    def abandon(self) -> None:
        """Where the run fails: let the evaluation beside end without its row (nothing of the run writes after)."""
        if self._pending is not None:
            self._pending[0].wait_quietly()
