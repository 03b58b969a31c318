"""Experiment tracking of a self-training run: TRL's `report_to` for every trainer, and the loop's own figures.

`report_to` in the config ("none", one of `BACKENDS`, or a list of them) goes to every TRL trainer the loop
builds (SFT, KTO, GRPO: `train.config.common_args` reads `trainer_arguments()`), each trainer's run named
`<run_name>/iter_<z>/<role>` (iter_0: the bootstrap). The loop logs each model's figures (`model_figures`: dev
EM and F1 with their 95% intervals, the EM difference from M0 and its p-value, the FA ratio overall and per
record kind, the correct rollouts, the records and the loss per adapter, each stage's seconds) to the run
`<run_name>/loop` of the same trackers, the iteration as the step (M0 is step 0; the raw base's figures are
`base/...` at step 0). `run_name`: the config's, else the run folder's name.

Everything is written inside the run folder, under tracking/:

    tensorboard/iter_<z>/<role>/  a trainer's events         tensorboard --logdir runs/<name>/tracking/tensorboard
    tensorboard/loop/             the loop's figures
    trackio/                      trackio's local store (TRACKIO_DIR; the project is run_name)
                                                             TRACKIO_DIR=runs/<name>/tracking/trackio trackio show
    wandb/                        wandb's runs (WANDB_DIR), offline unless WANDB_MODE or WANDB_API_KEY is set
    mlruns/                       mlflow's file store, unless MLFLOW_TRACKING_URI names another
    logged.json                   the models whose figures the loop has logged (a resumed run logs each once)

Nothing reaches the network unless the user asks: TensorBoard and trackio write locally (trackio goes to a
Space only where TRACKIO_SPACE_ID names one), wandb runs offline unless WANDB_MODE or WANDB_API_KEY says
otherwise (`wandb sync` uploads later), mlflow writes files unless MLFLOW_TRACKING_URI names a server. A
variable the user has set is kept; the ones set here are restored after the run. trackio reads TRACKIO_DIR
when it is first imported: a process that imported it before the run keeps its directory (a warning says so).

The packages come with the `tracking` extra (tensorboard, trackio), `wandb` and `mlflow` with their own; a
backend chosen without its package is one line naming the pip install (`check_installed`, from `validate`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib.util
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from knowtrace_train.errors import MissingExtraError, import_extra
from knowtrace_train.io import read_json

log = logging.getLogger(__name__)

BACKENDS = ("tensorboard", "trackio", "wandb", "mlflow")
#: backend -> (the module it needs, the extra that installs it)
PACKAGES = {"tensorboard": ("tensorboard", "tracking"), "trackio": ("trackio", "tracking"),
            "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
TRACKING_DIR = "tracking"
LOGGED_FILE = "logged.json"
LOOP_RUN = "loop"

#: the Trainer arguments of the training in progress (set by `trainer_run`; None: nothing reported)
_TRAINER: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("knowtrace_trainer_tracking",
                                                                                 default=None)


def backends(report_to: str | Sequence[str] | None) -> list[str]:
    """The backends `report_to` names: "none", None or [] -> []; a name, "a,b", "[a, b]" (a list as the command
    line gives it) or a list -> each once, in order. An unknown name is a ValueError naming the known ones ("all"
    too: it could reach the network)."""
    if report_to is None:
        return []
    names = report_to.strip().strip("[]").split(",") if isinstance(report_to, str) else list(report_to)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"report_to must be 'none', a backend or a list of backends {list(BACKENDS)}, "
                         f"got {report_to!r}")
    out = [n.strip() for n in names if n.strip() and n.strip() != "none"]
    unknown = [n for n in out if n not in BACKENDS]
    if unknown:
        raise ValueError(f"report_to: unknown backend(s) {unknown}; known: {list(BACKENDS)} (or 'none')")
    return list(dict.fromkeys(out))


def canonical(report_to: str | Sequence[str] | None) -> str | list[str]:
    """`report_to` as the config keeps it: "none", one backend's name, or a list of several."""
    names = backends(report_to)
    return "none" if not names else names[0] if len(names) == 1 else names


def check_installed(names: Sequence[str]) -> None:
    """A `MissingExtraError` (import_extra's line) for the first backend whose package is absent. Nothing is
    imported: trackio fixes its directory when it is first imported."""
    for name in names:
        module, extra = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(f"report_to: {name} needs {module} (not installed: {module}): "
                                    f"pip install 'knowtrace-train[{extra}]'")


def _summary_writer():
    import_extra("tensorboard", "tracking", "report_to: tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter


def _trackio():
    return import_extra("trackio", "tracking", "report_to: trackio")


def _wandb():
    return import_extra("wandb", "wandb", "report_to: wandb")


def _mlflow():
    return import_extra("mlflow", "mlflow", "report_to: mlflow")


# -- the figures of one model ---------------------------------------------------------------------------------


def model_figures(m: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, {name: value}) of one model's metrics (a metrics.json: the raw base, M0 or an iteration); a figure
    the metrics lack (no evaluation this iteration, no interval under 20 questions) is left out."""
    it = m.get("iteration")
    out: dict[str, float] = {}

    def put(name: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)

    ev = m.get("eval") or {}
    for key in ("em", "f1"):
        put(f"dev/{key}", ev.get(key))
        interval = ev.get(f"{key}_interval") or {}
        put(f"dev/{key}_low", interval.get("low"))
        put(f"dev/{key}_high", interval.get("high"))
    vs_m0 = (m.get("vs_m0") or {}).get("em") or {}
    put("dev/em_vs_m0", vs_m0.get("diff"))
    put("dev/p_vs_m0", vs_m0.get("p_value"))
    bt = m.get("rationale") or {}
    put("fa/ratio", bt.get("fa_ratio"))
    for kind, v in (bt.get("fa_by_role") or {}).items():
        put(f"fa/{kind}", v)
    roll = m.get("rollout") or {}
    put("rollout/correct", roll.get("correct"))
    put("rollout/trajectories", roll.get("trajectories"))
    records = m.get("sft_records_per_adapter") if it == 0 else m.get("sft_records")
    for adapter, n in (records or {}).items():
        put(f"records/{adapter}", n)
    for adapter, t in (m.get("train") or {}).items():
        put(f"loss/{adapter}", (t or {}).get("loss"))
    for stage, s in (m.get("seconds") or {}).items():
        put(f"seconds/{stage}", s)
    if it == "base":
        return 0, {f"base/{k}": v for k, v in out.items()}
    return int(it), out


# -- the writers ------------------------------------------------------------------------------------------------


class TensorBoardWriter:
    """The loop's figures as TensorBoard scalars in `folder`."""

    def __init__(self, folder: Path, **_: Any) -> None:
        self.writer = _summary_writer()(log_dir=str(folder))

    def log(self, step: int, figures: Mapping[str, float]) -> None:
        for name, value in figures.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _accepted(fn, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    import inspect

    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


class TrackioWriter:
    """The loop's figures in trackio's store: each model's in one `init(resume="allow")`, `log`, `finish`, so the
    trainers' own runs (TRL's callback inits and finishes its own) come between. trackio's notices go to stderr."""

    def __init__(self, *, project: str, name: str, **_: Any) -> None:
        self.trackio = _trackio()
        self.project, self.name = project, name

    def log(self, step: int, figures: Mapping[str, float]) -> None:
        t = self.trackio
        with contextlib.redirect_stdout(sys.stderr):
            t.init(**_accepted(t.init, dict(project=self.project, name=self.name, resume="allow", embed=False,
                                            auto_log_cpu=False, auto_log_gpu=False)))
            try:
                t.log(dict(figures), step=step)
            finally:
                t.finish()

    def close(self) -> None:
        pass


class WandbWriter:
    """The loop's figures in a wandb run of its own (a stable id, resumed), with "iteration" as their x-axis (the
    raw base's row may come after the iterations')."""

    def __init__(self, *, project: str, name: str, folder: Path, run_key: str, **_: Any) -> None:
        self.wandb = _wandb()
        self.project, self.name, self.folder = project, name, folder
        self.id = hashlib.sha1(run_key.encode("utf-8")).hexdigest()[:16]

    def log(self, step: int, figures: Mapping[str, float]) -> None:
        run = self.wandb.init(project=self.project, name=self.name, id=self.id, resume="allow", dir=str(self.folder))
        try:
            run.define_metric("iteration")
            run.define_metric("*", step_metric="iteration")
            run.log({"iteration": step, **figures})
        finally:
            run.finish()

    def close(self) -> None:
        pass


class MLflowWriter:
    """The loop's figures in an mlflow run of its own (its id kept in logged.json, so a resumed run goes on in it)."""

    def __init__(self, *, name: str, state: dict[str, Any], **_: Any) -> None:
        self.mlflow = _mlflow()
        self.name, self.state = name, state

    def log(self, step: int, figures: Mapping[str, float]) -> None:
        run_id = self.state.get("mlflow_run_id")
        run = self.mlflow.start_run(run_id=run_id) if run_id else self.mlflow.start_run(run_name=self.name)
        try:
            self.state["mlflow_run_id"] = run.info.run_id
            self.mlflow.log_metrics(dict(figures), step=step)
        finally:
            self.mlflow.end_run()

    def close(self) -> None:
        pass


WRITERS = {"tensorboard": TensorBoardWriter, "trackio": TrackioWriter, "wandb": WandbWriter, "mlflow": MLflowWriter}


# -- a run's tracking ---------------------------------------------------------------------------------------------


class Tracking:
    """A run's trackers: the environment the trainers' callbacks read, the names of their runs, and the loop's
    writers (on the main process only)."""

    def __init__(self, names: Sequence[str], run_dir: Path, run_name: str, is_main: bool = True) -> None:
        self.names = list(names)
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / TRACKING_DIR
        self.run_name = run_name
        self.is_main = is_main
        self._writers: list[Any] | None = None
        self._state: dict[str, Any] = {}

    # -- the environment ----------------------------------------------------------------------------------------
    def environment(self) -> dict[str, str]:
        """The variables the backends' own code reads, each where the user has not set it."""
        f = self.folder.resolve()
        env: dict[str, str] = {}
        if "trackio" in self.names:
            env["TRACKIO_DIR"] = str(f / "trackio")
        if "wandb" in self.names:
            env["WANDB_DIR"] = str(f)
            env["WANDB_PROJECT"] = self.run_name
            if not os.environ.get("WANDB_API_KEY"):
                env["WANDB_MODE"] = "offline"
        if "mlflow" in self.names:
            env["MLFLOW_TRACKING_URI"] = (f / "mlruns").as_uri()
            env["MLFLOW_EXPERIMENT_NAME"] = self.run_name
        return {k: v for k, v in env.items() if not os.environ.get(k)}

    @contextlib.contextmanager
    def active(self) -> Iterator["Tracking"]:
        """The run's environment set (restored after), the loop's writers closed at the end."""
        env = self.environment()
        with _environ(env):
            if "trackio" in self.names and "trackio" in sys.modules:
                here = Path(os.environ.get("TRACKIO_DIR", "")).resolve()
                there = Path(sys.modules["trackio"].utils.TRACKIO_DIR).resolve()
                if here != there:
                    log.warning("trackio was imported before this run set TRACKIO_DIR: it writes to %s, not %s",
                                there, here)
            try:
                yield self
            finally:
                self.close()

    # -- the trainers -------------------------------------------------------------------------------------------
    def trainer_arguments(self, iteration: str, role: str) -> dict[str, Any]:
        """TrainingArguments of the trainer of `role` in `iteration` (a folder name: iter_<z>)."""
        return {"report_to": list(self.names), "run_name": f"{self.run_name}/{iteration}/{role}",
                "project": self.run_name, "trackio_static_space_id": False}

    def trainer_environment(self, iteration: str, role: str) -> dict[str, str]:
        return {"TENSORBOARD_LOGGING_DIR": str((self.folder / "tensorboard" / iteration / role).resolve())}

    # -- the loop's figures ---------------------------------------------------------------------------------------
    def _open(self) -> list[Any]:
        if self._writers is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            state_file = self.folder / LOGGED_FILE
            if state_file.is_file():
                self._state = read_json(state_file)
            self._state.setdefault("models", [])
            common = dict(folder=self.folder, project=self.run_name, name=f"{self.run_name}/{LOOP_RUN}",
                          run_key=str(self.run_dir.resolve()), state=self._state)
            self._writers = []
            for n in self.names:
                if n == "tensorboard":
                    self._writers.append(TensorBoardWriter(self.folder / "tensorboard" / LOOP_RUN))
                else:
                    self._writers.append(WRITERS[n](**common))
        return self._writers

    def log_model(self, m: Mapping[str, Any]) -> None:
        """One model's figures to every tracker, once per run folder (a resumed run's earlier rows are skipped)."""
        if not self.is_main:
            return
        writers = self._open()
        key = str(m.get("iteration"))
        if key in self._state["models"]:
            return
        step, figures = model_figures(m)
        for w in writers:
            w.log(step, figures)
        self._state["models"].append(key)
        from knowtrace_train.io import write_json

        write_json(self.folder / LOGGED_FILE, self._state)

    def close(self) -> None:
        for w in self._writers or []:
            w.close()
        self._writers = None


def for_run(report_to: str | Sequence[str] | None, run_dir: Path, run_name: str | None,
            is_main: bool = True) -> Tracking | None:
    """The run's Tracking, None where `report_to` names no backend (`run_name` None: the run folder's name)."""
    names = backends(report_to)
    if not names:
        return None
    return Tracking(names, Path(run_dir), run_name or Path(run_dir).name, is_main)


@contextlib.contextmanager
def tracked(tracking: Tracking | None) -> Iterator[Tracking | None]:
    """`tracking.active()`, or nothing for None."""
    if tracking is None:
        yield None
        return
    with tracking.active() as t:
        yield t


@contextlib.contextmanager
def trainer_run(tracking: Tracking | None, iteration: str, role: str) -> Iterator[None]:
    """The trainers built inside report to `tracking` as the run of `role` in `iteration` (nothing with None)."""
    if tracking is None:
        yield
        return
    token = _TRAINER.set(tracking.trainer_arguments(iteration, role))
    try:
        with _environ(tracking.trainer_environment(iteration, role)):
            yield
    finally:
        _TRAINER.reset(token)


def trainer_arguments() -> dict[str, Any]:
    """What `common_args` passes to a Trainer about reporting: report_to "none" outside `trainer_run`; inside it
    the backends, the run's name and trackio's project (the arguments this transformers has)."""
    args = _TRAINER.get()
    if args is None:
        return {"report_to": "none"}
    import dataclasses

    from transformers import TrainingArguments

    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {k: v for k, v in args.items() if k in known}


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ inside the block, the previous values (or their absence) after it."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


__all__ = ["BACKENDS", "Tracking", "backends", "check_installed", "for_run", "model_figures", "trainer_arguments",
           "trainer_run", "tracked"]
