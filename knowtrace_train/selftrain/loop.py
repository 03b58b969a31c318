"""Algorithm 2 (backtracing-guided self-training) as resumable stages in a run folder, for any registered method.

M0 is the base model, or the bootstrapped one (iteration 0: LoRA on the method's gold trajectories,
merged into the weights). Iteration z rolls out the train questions with M(z-1) (M0 at z=1; afterwards
M0 with iteration z-1's adapter for each generator role: KnowTrace's exploration adapter for
exploration and answering calls, its completion adapter for completion calls), scores them, turns the
correct trajectories into SFT records with the rationalizer `mode` names (KnowTrace's "backtrace"
filters them; "star" keeps them whole), trains one adapter per role from M0 on that iteration's
records only, calibrates M(z)'s decisions, and evaluates M(z) on the dev questions. Each stage is an object built
with the run's context (context.py) and composed here: Bootstrap, Rollouts, Rationalize, Train, Calibrate,
Evaluations.

Run folder (runs/<name>):

    config.yaml                   the config as run; a rerun must bring the same one
    questions.json                ids of the rollout, bootstrap, dev and calibration questions
    base/eval.jsonl               the raw base (few-shot) on the dev questions; base/probe.jsonl for
                                  bootstrap "auto" (the raw base on the first train questions)
    iter_0/                       the bootstrap: sft_<kind>.jsonl (gold), gold.json, bootstrap_adapters/<a>/
                                  (merged already), model/ (M0), calibration.json (its decision thresholds,
                                  calibration.py), eval.jsonl, metrics.json
    m0.json                       M0: "path" of its model folder (relative to the run folder when inside it), the
                                  raw base, whether bootstrapped, the prompt settings it runs with
    iter_<z>/                     rollouts.jsonl, rationale.json, sft_<kind>.jsonl, adapters/<role>/,
                                  calibration.json, eval.jsonl, metrics.json (with `vs_m0` and `vs_previous`: paired tests
                                  of M(z) against M0 and M(z-1) on the dev questions, read from the
                                  eval.jsonl files)
    <folder>/DONE.<stage>         the stage's marker with its seconds and figures ("reused_from": the cache
                                  folder of a stage another run computed, see reuse.py)
    summary.json                  dev EM/F1 and FA ratios per iteration, wall time per phase
    tracking/                     where `report_to` names trackers: each trainer's run and the loop's figures
                                  per iteration (knowtrace_train/tracking.py)

Every file is written to a temporary name and renamed; a stage whose marker exists is never redone,
so a killed run started again with the same config continues at the first unfinished stage. With
`reuse`, the stages that depend neither on the mode, the iterations nor `train.*` (the base's evaluation
and probe, M0, M0's evaluation, iteration 1's rollouts) come from the cache home when a run on this
machine computed them from the same inputs (reuse.py). With `eval_beside` (on by default for one CPU process)
each model's dev evaluation runs on a worker thread beside the next stages, each stage on a thread count the
schedule fixes (beside.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from knowtrace_train import tracking
from knowtrace_train.data.schema import QAItem
from knowtrace_train.errors import RunError
from knowtrace_train.io import read_json, write_json
from knowtrace_train.progress import library_bars_off
from knowtrace_train.selftrain.beside import Evaluations
from knowtrace_train.selftrain.bootstrap import Bootstrap
from knowtrace_train.selftrain.calibration import Calibrate
from knowtrace_train.selftrain.config import SelfTrainConfig, evaluates
from knowtrace_train.selftrain.context import RunContext
from knowtrace_train.selftrain.folder import check_same_config, run_config_text
from knowtrace_train.selftrain.preflight import check_inputs, preflight
from knowtrace_train.selftrain.training import Train
from knowtrace_train.selftrain.rationalize import Rationalize
from knowtrace_train.selftrain.models import (
    ModelState, next_model, run_relative)
from knowtrace_train.selftrain.rollout_stage import Rollouts
from knowtrace_train.stages import Processes, remove_leftovers

log = logging.getLogger(__name__)

# -- question selection -----------------------------------------------------------------------------


@dataclass
class Questions:
    rollout: list[QAItem]
    bootstrap: list[QAItem]
    dev: list[QAItem]
    #: every train and dev item (the corpus of "contexts" and the items backtracing looks up)
    all_items: list[QAItem]
    #: held-out train questions whose gold decision prompts calibrate the trained models' thresholds
    calibration: list[QAItem] = dataclasses.field(default_factory=list)

    def ids(self) -> dict[str, list[str]]:
        return {k: [it.id for it in getattr(self, k)] for k in ("rollout", "bootstrap", "dev", "calibration")}


def select_questions(config: SelfTrainConfig, bootstrap: bool) -> Questions:
    """Seeded shuffles of the train and dev splits: D is the first `train_questions` train questions,
    the bootstrap's gold questions the next `bootstrap.questions`, the calibration's the next
    `calibration.questions` (as many as are left), dev the first `dev_questions`."""
    from knowtrace_train.data.loaders import load_items

    d = config.data
    train = load_items(d.train, d.format)
    dev = load_items(d.dev, d.format)
    order = list(train)
    random.Random(d.seed).shuffle(order)
    n_boot = config.bootstrap.questions if bootstrap else 0
    n_cal = config.calibration.questions
    n_roll = d.train_questions if d.train_questions is not None else max(0, len(order) - n_boot - n_cal)
    if n_roll > len(order):
        raise RunError(f"data.train_questions is {n_roll} but {d.train} holds {len(order)} questions")
    rollout = order[:n_roll]
    boot = order[n_roll : n_roll + n_boot]
    if bootstrap and not boot:
        raise RunError(f"{d.train}: no train question left for the bootstrap after {n_roll} rollout questions")
    calibration = order[n_roll + n_boot : n_roll + n_boot + n_cal]
    if len(calibration) < n_cal:
        log.warning("calibration: %d of the %d questions asked are left in %s after the rollouts' and the "
                    "bootstrap's", len(calibration), n_cal, d.train)
    dev_order = list(dev)
    random.Random(d.seed + 1).shuffle(dev_order)
    if d.dev_questions is not None and d.dev_questions > len(dev_order):
        raise RunError(f"data.dev_questions is {d.dev_questions} but {d.dev} holds {len(dev_order)} questions: ask "
                       "for at most that many (or null: all)")
    dev_sel = dev_order if d.dev_questions is None else dev_order[: d.dev_questions]
    if not dev_sel:
        raise RunError(f"{d.dev}: no dev question to evaluate on (data.dev_questions is {d.dev_questions})")
    return Questions(rollout=rollout, bootstrap=boot, dev=dev_sel, all_items=train + dev, calibration=calibration)


# -- the run ----------------------------------------------------------------------------------------


class SelfTrain(RunContext):
    """One self-training run in its folder. `run()` walks every stage, skipping the finished ones."""

    def __init__(
        self,
        config: SelfTrainConfig,
        *,
        procs: Processes | None = None,
        progress: bool = True,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
        make_generator: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(config, procs=procs, progress=progress, make_generator=make_generator)
        #: called with each finished model's metrics (the base, M0, every iteration), in order
        self.on_metrics = on_metrics
        # the stages, each built with this run's context (context.py)
        self.rollouts = Rollouts(self)
        self.rationalize = Rationalize(self)
        self.train = Train(self)
        self.calibrate = Calibrate(self)
        self.evaluations = Evaluations(self, self.rollouts, self._record)
        self.bootstrap = Bootstrap(self, self.rollouts, self.train, self.calibrate, self.evaluations)

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Every stage in order; returns the summary (also written to summary.json)."""
        cfg = self.config
        t0 = time.perf_counter()
        threads = self._set_threads()
        self._prepare_folder()
        evaluations = self.evaluations
        evaluations.start(threads)
        metrics: list[dict[str, Any]] = []
        self.tracking = tracking.for_run(cfg.report_to, self.run_dir, cfg.run_name, self.procs.is_main)
        with tracking.tracked(self.tracking), library_bars_off():  # one bar per stage: none of the libraries'
            try:
                if cfg.eval_base:  # beside the bootstrap, in turn, or (the fixed schedule) later: Evaluations.base
                    evaluations.base(metrics)
                m0 = self.bootstrap(metrics)  # iteration 0
                state = m0
                for z in range(1, cfg.iterations + 1):
                    state, stop = self._iteration(z, state, m0, metrics)
                    if stop:
                        break
                evaluations.finish_all(metrics)
            except BaseException as e:
                if not isinstance(e, KeyboardInterrupt):
                    evaluations.abandon()  # nothing of this run writes after it has failed
                raise
        summary = self._write_summary(metrics)
        log.info("run finished in %.1fs (this invocation)", time.perf_counter() - t0)
        return summary

    def _set_threads(self) -> int:
        """torch threads per process (returned): `threads`, or the cores this process may use divided among the
        processes on this machine. `accelerate launch` without a config sets OMP_NUM_THREADS=1 on
        CPUs, which left one of two cores idle in the default run."""
        import torch

        from knowtrace_train.train.precision import training_device

        n = self.config.threads
        if n is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.procs.world) or 1)
            n = max(1, cores // max(1, local))
        if torch.get_num_threads() != n:
            log.info("torch threads: %d (was %d; config threads: %s)", n, torch.get_num_threads(), self.config.threads)
            torch.set_num_threads(n)
        if n > 1 and os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE" and training_device() == "cpu":
            log.warning("OMP_WAIT_POLICY=PASSIVE with %d torch threads: every parallel region wakes sleeping threads, "
                        "which slows a run alone on its cores (measured in docs/training.md, \"Threads\"). Unset it here; where other jobs share the cores, keep it and run one "
                        "thread per process (--threads 1, or torchrun)", n)
        return n

    def _emit(self, m: dict[str, Any]) -> None:
        if self.tracking is not None:
            self.tracking.log_model(m)  # the main process's trackers (tracking.py)
        if self.on_metrics is not None and self.procs.is_main:
            self.on_metrics(m)

    # -- folder and questions ---------------------------------------------------------------------
    def _prepare_folder(self) -> None:
        cfg = self.config
        saved = self.run_dir / "config.yaml"
        resumed = saved.is_file()
        if resumed:
            check_same_config(cfg, saved, self.procs.world)
        # the preflight (preflight.py), before config.yaml is written: a failed start leaves none behind
        self.questions = select_questions(cfg, bootstrap=cfg.bootstrap.mode != "never")
        preflight(self)
        if resumed:
            if self.procs.is_main:  # a killed run's half-written temporary files (none of this run's yet)
                remove_leftovers(self.run_dir)
        elif self.procs.is_main:
            from knowtrace_train.io import atomic_write_text

            atomic_write_text(saved, run_config_text(cfg, self.procs.world))
        check_inputs(self.run_dir, cfg, self.procs.is_main)
        self.procs.barrier()
        qfile = self.run_dir / "questions.json"
        ids = self.questions.ids()
        if qfile.is_file():
            if read_json(qfile) != ids:
                raise RunError(f"{qfile}: the data files now give other questions than this run used; "
                                 "restore them or start a new run folder")
        elif self.procs.is_main:
            write_json(qfile, ids)
        self.procs.barrier()
        self.items_by_id = {it.id: it for it in self.questions.all_items}

    # -- models -----------------------------------------------------------------------------------
    def m0_folder(self, m0: ModelState) -> Path:
        """Where M0's dev evaluation is: iter_0 (bootstrapped) or base (M0 is the raw base)."""
        return self.run_dir / ("iter_0" if m0.name == "M0" else "base")

    # -- one iteration ----------------------------------------------------------------------------
    def _iteration(self, z: int, prev: ModelState, m0: ModelState,
                   metrics: list[dict[str, Any]]) -> tuple[ModelState, bool]:
        """Iteration z's stages; its metrics go to `metrics` once M(z) is evaluated (see `Evaluations.evaluate`).
        Returns M(z) and whether the run stops here."""
        cfg = self.config
        folder = self.run_dir / f"iter_{z}"
        seed = cfg.strategy.seed + z
        roll = self.rollouts.iteration(folder, z, prev, seed)  # Algorithm 2 line 5: M(z-1) rolls out D's questions
        bt, records = self.rationalize(folder, z)  # lines 6-11: the correct ones rationalized into D_z
        if self.evaluations.fixed:  # the evaluation beside the rollouts is joined here: the training gets every thread
            self.evaluations.join(metrics)
        groups = self.train.groups(records)
        base = Path(m0.model) if m0.name == "M0" else self.base_path
        train_info, adapters = self.train(folder, z, groups, base, prev)  # line 12: one adapter per role, from M0
        state = next_model(z, prev, m0, adapters)  # M(z): M0 with them
        if adapters:
            state = self.calibrate(folder, state, seed)  # M(z)'s decision thresholds
        else:
            log.warning("iteration %d: %d of %d rollouts correct, %d records: nothing to train on (%s)",
                        z, roll["correct"], roll["questions"], sum((bt.get("records") or {}).values()),
                        "the run stops here" if cfg.on_empty == "stop" else "M%d = M%d" % (z, z - 1))
        status = "trained" if adapters else "empty"
        stop = not adapters and cfg.on_empty == "stop"
        m = {
            "iteration": z,
            "model": state.name,
            "status": status,
            "rollout": roll,
            "rationale": bt,
            "sft_records": {a: len(r) for a, r in groups.items()},
            "train": train_info,
            "adapters": {a: run_relative(self.run_dir, p) for a, p in adapters.items()},
        }

        def finish(ev: dict[str, Any] | None) -> dict[str, Any]:
            vs_m0 = vs_prev = None
            if ev is not None:
                vs_m0 = self.evaluations.compare(m0.name, self.m0_folder(m0), folder)
                vs_prev = (vs_m0 if z == 1 else
                           self.evaluations.compare(prev.name, self.run_dir / f"iter_{z - 1}", folder))
            m.update({"eval": ev, "vs_m0": vs_m0, "vs_previous": vs_prev, "seconds": {
                "rollout": roll["seconds"],
                "rationalize": bt["seconds"],
                "train": sum(t["seconds"] for t in train_info.values()),
                "eval": ev["seconds"] if ev else 0.0,
            }})
            if self.procs.is_main:
                write_json(folder / "metrics.json", m)
            self.procs.barrier()
            return m

        if not stop and evaluates(z, cfg.iterations, cfg.eval_every):
            self.evaluations.evaluate(folder, state, seed, z, finish, metrics, last=z == cfg.iterations)
        else:
            self.evaluations.join(metrics)
            self._record(finish(None), metrics)
        return state, stop

    # -- the run's rows and summary ----------------------------------------------------------------------------------
    def _record(self, m: dict[str, Any], metrics: list[dict[str, Any]]) -> None:
        """A finished model's row: appended to `metrics`, shown, and the summary written again."""
        metrics.append(m)
        self._emit(m)
        self._write_summary(metrics)

    def _write_summary(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        from knowtrace_train.report import summarize_run

        summary = summarize_run(self.config, self.run_dir, metrics)
        if self.procs.is_main:
            write_json(self.run_dir / "summary.json", summary)
        return summary
