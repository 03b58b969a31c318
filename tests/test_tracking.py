"""Experiment tracking (knowtrace_train/tracking.py) and the progress of a stage off a terminal (progress.py), in
parts: what `report_to` accepts, the arguments every TRL trainer gets, the figures the loop logs, the environment
that keeps everything local, the wandb and mlflow writers (on stand-ins), a missing tracker's one line. A whole
tiny run that logs to TensorBoard and trackio is tests/test_console_run.py."""

from __future__ import annotations

import logging
import os
import sys
import types
from pathlib import Path

import pytest

from knowtrace_train import tracking
from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.errors import MissingExtraError, import_extra
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.tracking import Tracking, backends, model_figures, trainer_arguments, trainer_run

REPO = Path(__file__).resolve().parents[1]


def test_report_to_names_the_backends_and_refuses_others():
    assert backends("none") == backends(None) == backends([]) == []
    assert backends("tensorboard") == ["tensorboard"]
    assert backends("[tensorboard, trackio]") == backends("tensorboard,trackio") == ["tensorboard", "trackio"]
    assert backends(["trackio", "trackio", "none"]) == ["trackio"]
    for bad in ("all", "comet", ["tensorboard", "neptune"]):
        with pytest.raises(ValueError, match=r"report_to: unknown backend.*known: \['tensorboard', 'trackio', 'wandb', 'mlflow'\]"):
            backends(bad)
    # the config keeps one canonical value, and refuses an unknown backend naming the key
    assert load_config(SelfTrainConfig, None, ["--report_to", "[tensorboard,trackio]"]).report_to == ["tensorboard", "trackio"]
    assert load_config(SelfTrainConfig, None, ["--report_to", "trackio"]).report_to == "trackio"
    assert SelfTrainConfig().report_to == "none" and SelfTrainConfig().run_name is None
    with pytest.raises(ConfigError, match=r"--report_to.*report_to: unknown backend\(s\) \['comet'\]"):
        load_config(SelfTrainConfig, None, ["--report_to", "comet"])


def test_a_missing_tracker_is_the_missing_extra_line(monkeypatch, capsys):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    with pytest.raises(MissingExtraError) as info:
        tracking.check_installed(["tensorboard", "trackio"])
    assert str(info.value) == "report_to: trackio needs trackio (not installed: trackio): pip install 'knowtrace-train[tracking]'"
    with pytest.raises(MissingExtraError) as same:  # import_extra's own line
        import_extra("surely_absent_tracker_xyz", "tracking", "report_to: trackio")
    assert str(same.value).split(" needs ")[0] == str(info.value).split(" needs ")[0]
    # the recipe stops on it before any work: one line, exit 2
    from knowtrace_train.commands.selftrain import main

    assert main(["--report_to", "trackio"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("missing extra: report_to: trackio needs trackio") and "[tracking]" in err[0]


def test_each_backend_comes_with_the_extra_it_names():
    from test_dependencies import declared, distributions_of

    _, extras = declared()
    for name, (module, extra) in tracking.PACKAGES.items():
        assert extra in extras and (distributions_of(module) & extras[extra]), name
    assert {"tensorboard", "trackio"} <= extras["tracking"] and {"tensorboard", "trackio"} <= extras["dev"]


def test_every_trl_trainer_reports_to_the_runs_trackers_under_its_iteration_and_role(tmp_path):
    """SFT, KTO and GRPO build their arguments with common_args: outside a tracked training "none", inside it the
    backends, the run name <run_name>/iter_<z>/<role> and trackio's project; TensorBoard's folder is the role's."""
    from knowtrace_train.train.config import LoraTrainConfig
    from knowtrace_train.train.grpo import GRPOSettings
    from knowtrace_train.train.kto import KTOSettings
    from knowtrace_train.train.grpo import grpo_args
    from knowtrace_train.train.kto import kto_args
    from knowtrace_train.train.lora import sft_args

    def build(out: str):
        cfg = LoraTrainConfig(per_device_batch_size=2, gradient_accumulation_steps=1)
        return [sft_args(cfg, "fp32", "cpu", out), kto_args(cfg, KTOSettings(), (1.0, 1.0), "fp32", "cpu", out),
                grpo_args(cfg, GRPOSettings(batch_size=2), 1, 1.0, "fp32", "cpu", out)]

    assert trainer_arguments() == {"report_to": "none"}
    assert all(a.report_to == [] for a in build(str(tmp_path / "o")))
    t = Tracking(["tensorboard", "trackio"], tmp_path / "run", "exp")
    os.environ.pop("TENSORBOARD_LOGGING_DIR", None)
    with trainer_run(t, "iter_2", "explore"):
        assert trainer_arguments() == {"report_to": ["tensorboard", "trackio"], "run_name": "exp/iter_2/explore",
                                       "project": "exp", "trackio_static_space_id": False}
        assert os.environ["TENSORBOARD_LOGGING_DIR"] == str((tmp_path / "run/tracking/tensorboard/iter_2/explore").resolve())
        for a in build(str(tmp_path / "o")):
            assert (a.report_to, a.run_name, a.project) == (["tensorboard", "trackio"], "exp/iter_2/explore", "exp")
            assert a.disable_tqdm is (not sys.stderr.isatty())  # no bar redraws in a log file
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ and trainer_arguments() == {"report_to": "none"}
    with trainer_run(None, "iter_1", "explore"):
        assert trainer_arguments() == {"report_to": "none"}


def _iteration_metrics() -> dict:
    interval = {"low": 0.25, "high": 0.5, "mean": 0.375, "n": 40}
    return {
        "iteration": 2, "model": "M2", "status": "trained",
        "rollout": {"correct": 5, "trajectories": 12, "questions": 6},
        "rationale": {"fa_ratio": 0.6, "fa_by_role": {"explore": 0.5, "complete": 0.75, "answer": None}},
        "sft_records": {"explore": 7, "complete": 3},
        "train": {"explore": {"loss": 1.5, "records": 7}, "complete": {"records": 0}},
        "eval": {"em": 0.375, "f1": 0.5, "em_interval": interval, "f1_interval": {"low": None, "high": None}},
        "vs_m0": {"model": "M0", "em": {"diff": 0.125, "p_value": 0.25}},
        "seconds": {"rollout": 10.0, "rationalize": 0.5, "train": 20.0, "eval": 8.0},
    }


def test_the_figures_of_a_model():
    step, f = model_figures(_iteration_metrics())
    assert step == 2 and f == {
        "dev/em": 0.375, "dev/em_low": 0.25, "dev/em_high": 0.5, "dev/f1": 0.5, "dev/em_vs_m0": 0.125,
        "dev/p_vs_m0": 0.25, "fa/ratio": 0.6, "fa/explore": 0.5, "fa/complete": 0.75, "rollout/correct": 5.0,
        "rollout/trajectories": 12.0, "records/explore": 7.0, "records/complete": 3.0, "loss/explore": 1.5,
        "seconds/rollout": 10.0, "seconds/rationalize": 0.5, "seconds/train": 20.0, "seconds/eval": 8.0}
    # M0 counts its records per adapter; the raw base is base/... at step 0; an iteration not evaluated has no dev/
    m0 = {"iteration": 0, "sft_records": {"explore": 9, "complete": 4, "answer": 2},
          "sft_records_per_adapter": {"explore": 11, "complete": 4}, "eval": {"em": 0.25, "f1": 0.3},
          "seconds": {"gold": 1.0}}
    assert model_figures(m0) == (0, {"dev/em": 0.25, "dev/f1": 0.3, "records/explore": 11.0, "records/complete": 4.0,
                                     "seconds/gold": 1.0})
    assert model_figures({"iteration": "base", "eval": {"em": 0.125, "f1": 0.2}, "seconds": {"eval": 3.0}}) == (
        0, {"base/dev/em": 0.125, "base/dev/f1": 0.2, "base/seconds/eval": 3.0})
    assert not any(k.startswith("dev/") for k in model_figures({**_iteration_metrics(), "eval": None, "vs_m0": None})[1])


def test_everything_stays_local_unless_the_user_says_otherwise(monkeypatch, tmp_path):
    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI",
              "MLFLOW_EXPERIMENT_NAME", "TRACKIO_DIR"):
        monkeypatch.delenv(k, raising=False)
    t = Tracking(["trackio", "wandb", "mlflow"], tmp_path / "run", "exp")
    folder = (tmp_path / "run" / "tracking").resolve()
    assert t.environment() == {"TRACKIO_DIR": str(folder / "trackio"), "WANDB_DIR": str(folder), "WANDB_PROJECT": "exp",
                               "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": (folder / "mlruns").as_uri(),
                               "MLFLOW_EXPERIMENT_NAME": "exp"}
    with t.active():
        assert os.environ["WANDB_MODE"] == "offline" and os.environ["TRACKIO_DIR"] == str(folder / "trackio")
    assert "WANDB_MODE" not in os.environ and "TRACKIO_DIR" not in os.environ  # restored
    monkeypatch.setenv("WANDB_API_KEY", "k")  # logged in: wandb's own mode
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    env = t.environment()
    assert "WANDB_MODE" not in env and "MLFLOW_TRACKING_URI" not in env
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "online")
    assert "WANDB_MODE" not in t.environment()


def test_the_wandb_and_mlflow_writers_log_each_model_once(monkeypatch, tmp_path):
    """On stand-ins of both packages: each model's figures once per run folder (a resumed run skips the models it
    logged), wandb in its offline mode with the iteration as the x-axis, mlflow going on in its run."""
    calls: list[tuple] = []

    class WandbRun:
        def define_metric(self, name, step_metric=None):
            calls.append(("wandb.define_metric", name, step_metric))

        def log(self, row):
            calls.append(("wandb.log", row))

        def finish(self):
            calls.append(("wandb.finish",))

    def wandb_init(**kw):
        calls.append(("wandb.init", kw["project"], kw["name"], kw["id"], kw["resume"], os.environ.get("WANDB_MODE")))
        return WandbRun()

    runs = iter(["r1", "r2"])

    def start_run(run_id=None, run_name=None):
        rid = run_id or next(runs)
        calls.append(("mlflow.start_run", run_id, run_name, os.environ.get("MLFLOW_TRACKING_URI", "")[:7]))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=rid))

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=wandb_init))
    monkeypatch.setitem(sys.modules, "mlflow", types.SimpleNamespace(
        start_run=start_run, log_metrics=lambda m, step: calls.append(("mlflow.log_metrics", step, m)),
        end_run=lambda: calls.append(("mlflow.end_run",))))
    for k in ("WANDB_MODE", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)
    m = _iteration_metrics()
    step, figures = model_figures(m)
    with Tracking(["wandb", "mlflow"], tmp_path / "run", "exp").active() as t:
        t.log_model(m)
        t.log_model(m)  # the same model again: nothing
    wandb_id = calls[0][3]
    assert calls == [
        ("wandb.init", "exp", "exp/loop", wandb_id, "allow", "offline"),
        ("wandb.define_metric", "iteration", None), ("wandb.define_metric", "*", "iteration"),
        ("wandb.log", {"iteration": 2, **figures}), ("wandb.finish",),
        ("mlflow.start_run", None, "exp/loop", "file://"), ("mlflow.log_metrics", 2, figures), ("mlflow.end_run",)]
    calls.clear()
    with Tracking(["wandb", "mlflow"], tmp_path / "run", "exp").active() as t:  # the run resumed
        t.log_model(m)
        t.log_model({**m, "iteration": 3})
    assert [c[0] for c in calls] == ["wandb.init", "wandb.define_metric", "wandb.define_metric", "wandb.log",
                                     "wandb.finish", "mlflow.start_run", "mlflow.log_metrics", "mlflow.end_run"]
    assert calls[0][3] == wandb_id and calls[5][1] == "r1" and calls[6][1] == 3  # the same runs go on
    # another process than the main one logs nothing
    Tracking(["wandb"], tmp_path / "other", "exp", is_main=False).log_model(m)
    assert not (tmp_path / "other").exists()


def test_a_stage_off_a_terminal_logs_plain_lines(monkeypatch, caplog):
    from knowtrace_train import progress

    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: False)
    monkeypatch.setenv(progress.SECONDS_ENV, "0")
    with caplog.at_level(logging.INFO, logger="knowtrace_train.progress"):
        bar = progress.stage_bar(3, "iter 1 rollout", unit="q")
        assert isinstance(bar, progress.LineProgress)
        for _ in range(3):
            bar.set_postfix(em="0.333")
            bar.update(1)
        bar.close()
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.rsplit(",", 1)[0] for line in lines] == [
        "iter 1 rollout: 1/3 q (em=0.333)", "iter 1 rollout: 2/3 q (em=0.333)", "iter 1 rollout: 3/3 q (em=0.333)"]
    assert not any("\r" in line for line in lines)
    # the libraries' bars are off inside a run and as they were after it
    from transformers.utils import logging as tf_logging

    import datasets

    before = (tf_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled())
    with progress.library_bars_off():
        assert not tf_logging.is_progress_bar_enabled() and not datasets.is_progress_bar_enabled()
    assert (tf_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled()) == before
