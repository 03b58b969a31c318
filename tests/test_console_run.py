"""One tiny self-training run through the console script (`python -m knowtrace_train.cli selftrain`, what
`knowtrace-train selftrain` runs) with `--report_to [tensorboard,trackio]`, its stdout and stderr to files, as a
job in a log runs: the end of the run reads like a result (the whole table alone, the small-dev-set note, the
report's path, the JSON line last), the log holds no bar redraws, and TensorBoard's event files and trackio's
local store hold the figures of the run's metrics.json files (the tiny model, 2 rollout and 2 dev questions,
the bootstrap and one iteration: about 30 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from knowtrace_train.report import table_header, table_row

from selftrain_helpers import tiny_overrides

REPO = Path(__file__).resolve().parents[1]
MODELS = ("base", "iter_0", "iter_1")


@pytest.fixture(scope="module")
def console_run(tmp_path_factory, tiny_model_dir):
    pytest.importorskip("tensorboard", reason="the tracking extra is not installed (pip install -e '.[dev]')")
    pytest.importorskip("trackio", reason="the tracking extra is not installed (pip install -e '.[dev]')")
    tmp = tmp_path_factory.mktemp("console_run")
    cmd = [sys.executable, "-m", "knowtrace_train.cli", "selftrain",
           *tiny_overrides(tmp, tiny_model_dir, iterations=1, **{"data.train_questions": 2, "data.dev_questions": 2,
                                                                 "bootstrap.questions": 2}),
           "--threads", "1", "--report_to", "[tensorboard,trackio]", "--run_name", "tiny"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACKIO_", "TENSORBOARD_"))}
    env["OMP_WAIT_POLICY"] = "PASSIVE"

    def run(name: str) -> SimpleNamespace:
        out, err = tmp / f"{name}.out", tmp / f"{name}.err"
        with out.open("w") as o, err.open("w") as e:
            r = subprocess.run(cmd, stdout=o, stderr=e, cwd=REPO, env=env, timeout=900)
        assert r.returncode == 0, err.read_text()[-3000:]
        return SimpleNamespace(stdout=out.read_text(), stderr=err.read_text())

    first = run("first")
    d = tmp / "run"
    metrics = {f: json.loads((d / f / "metrics.json").read_text()) for f in MODELS}
    return SimpleNamespace(run_dir=d, first=first, metrics=metrics, again=lambda: run("again"))


def test_the_run_ends_with_the_whole_table_the_note_the_report_and_the_json_line(console_run):
    lines = console_run.first.stdout.splitlines()
    line = json.loads(lines[-1])
    assert line["run_dir"] == str(console_run.run_dir) and len(line["em"]) == 1
    assert lines[-2] == f"report: {console_run.run_dir / 'report.html'} (the run view and every dev question's traced graph)"
    assert lines[-3].startswith("note: 2 dev questions cannot show the differences above")
    start = len(lines) - 1 - lines[::-1].index("")  # the table stands alone after one empty line
    table = lines[start + 1:-3]
    assert table == [table_header(), *(table_row(console_run.metrics[f]) for f in MODELS)]
    assert lines[start - 1].startswith("wall time ")
    # the same rows came one by one as the models finished
    assert all(lines.index(row) < start for row in table[1:])


def test_a_log_that_is_not_a_terminal_holds_no_bar_redraws(console_run):
    err = console_run.first.stderr
    assert "\r" not in err and "\x1b[A" not in err and "\r" not in console_run.first.stdout
    # instead, each stage with a bar ends in one plain line
    for stage in ("base dev eval: 2/2 q", "iter_0 dev eval: 2/2 q", "iter 1 rollout: 2/2 q", "iter_1 dev eval: 2/2 q"):
        assert sum(stage in x for x in err.splitlines()) == 1, stage


def _close(a: float, b: float) -> bool:
    return a == pytest.approx(b, rel=1e-6, abs=1e-6)  # TensorBoard keeps float32


def _expected(metrics: dict) -> dict[int, dict[str, float]]:
    """metrics.json's figures the loop logs, by step (read here from the files, not through model_figures)."""
    base, m0, it = metrics["base"], metrics["iter_0"], metrics["iter_1"]
    exp = {0: {"base/dev/em": base["eval"]["em"], "base/dev/f1": base["eval"]["f1"],
               "base/seconds/eval": base["seconds"]["eval"],
               "dev/em": m0["eval"]["em"], "dev/f1": m0["eval"]["f1"],
               **{f"records/{a}": n for a, n in m0["sft_records_per_adapter"].items()},
               **{f"seconds/{k}": v for k, v in m0["seconds"].items()},
               "loss/bootstrap": m0["train"]["bootstrap"]["loss"]},
           1: {"dev/em": it["eval"]["em"], "dev/f1": it["eval"]["f1"], "fa/ratio": it["rationale"]["fa_ratio"],
               **{f"fa/{k}": v for k, v in it["rationale"]["fa_by_role"].items()},
               "rollout/correct": it["rollout"]["correct"], "rollout/trajectories": it["rollout"]["trajectories"],
               **{f"records/{a}": n for a, n in it["sft_records"].items()},
               **{f"seconds/{k}": v for k, v in it["seconds"].items()},
               "dev/em_vs_m0": it["vs_m0"]["em"]["diff"], "dev/p_vs_m0": it["vs_m0"]["em"]["p_value"]}}
    assert set(exp[1]) >= {"fa/explore", "fa/complete", "records/explore", "records/complete", "seconds/rollout"}
    return exp


def test_tensorboard_holds_the_figures_of_metrics_json(console_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = console_run.run_dir / "tracking" / "tensorboard"
    loop = EventAccumulator(str(d / "loop"))
    loop.Reload()
    logged: dict[int, dict[str, float]] = defaultdict(dict)
    for tag in loop.Tags()["scalars"]:
        for e in loop.Scalars(tag):
            logged[e.step][tag] = e.value
    expected = _expected(console_run.metrics)
    assert set(logged) == {0, 1} and all(set(logged[s]) == set(expected[s]) for s in expected)
    assert all(_close(logged[s][k], v) for s in expected for k, v in expected[s].items())
    # the bootstrap's trainer, under its iteration and role, logged its losses (metrics.json keeps them)
    trainer = EventAccumulator(str(d / "iter_0" / "bootstrap"))
    trainer.Reload()
    losses = [e.value for e in trainer.Scalars("train/loss")]
    m0_train = console_run.metrics["iter_0"]["train"]["bootstrap"]
    assert len(losses) == len(m0_train["losses"]) and all(map(_close, losses, m0_train["losses"]))
    assert not (d / "iter_1").exists()  # iteration 1 had no record: no trainer


READ_TRACKIO = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps({run: SQLiteStorage.get_logs(sys.argv[1], run) for run in SQLiteStorage.get_runs(sys.argv[1])}, default=str))
"""


def _trackio_logs(run_dir: Path) -> dict[str, list[dict]]:
    """trackio's local store of the run, read by trackio in a process of its own (it fixes TRACKIO_DIR on import)."""
    env = {**os.environ, "TRACKIO_DIR": str(run_dir / "tracking" / "trackio")}
    r = subprocess.run([sys.executable, "-c", READ_TRACKIO, "tiny"], capture_output=True, text=True, env=env,
                       timeout=300, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_trackio_holds_the_figures_of_metrics_json(console_run):
    runs = _trackio_logs(console_run.run_dir)
    assert sorted(runs) == ["tiny/iter_0/bootstrap", "tiny/loop"]
    logged: dict[int, dict[str, float]] = defaultdict(dict)
    for row in runs["tiny/loop"]:
        logged[row["step"]].update({k: v for k, v in row.items() if k not in ("step", "timestamp")})
    expected = _expected(console_run.metrics)
    assert {s: set(v) for s, v in logged.items()} == {s: set(v) for s, v in expected.items()}
    assert all(_close(logged[s][k], v) for s in expected for k, v in expected[s].items())
    losses = [row["train/loss"] for row in runs["tiny/iter_0/bootstrap"] if "train/loss" in row]
    assert losses == pytest.approx(console_run.metrics["iter_0"]["train"]["bootstrap"]["losses"])


def test_a_rerun_of_the_finished_run_logs_nothing_twice_and_prints_the_table_again(console_run):
    before = _trackio_logs(console_run.run_dir)
    again = console_run.again()
    lines = again.stdout.splitlines()
    assert table_row(console_run.metrics["iter_1"]) in lines[-5:] and json.loads(lines[-1])["em"]
    assert _trackio_logs(console_run.run_dir) == before
    assert json.loads((console_run.run_dir / "tracking" / "logged.json").read_text())["models"] == ["base", "0", "1"]
