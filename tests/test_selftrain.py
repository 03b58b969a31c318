"""The self-training loop (Algorithm 2 with a bootstrap) on the tiny model: stages, files, resume, reports."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import knowtrace_train

from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.metrics import paired_test
from knowtrace_train.report import NO_INTERVAL, headline, load_run, table_header, table_row
from knowtrace_train.selftrain import SelfTrain, check_same_config
from knowtrace_train.selftrain.config import SelfTrainConfig

from selftrain_helpers import differing, oracle_factory, run_outputs, tiny_overrides

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "recipes" / "configs"


def _load_recipe():
    import importlib.util

    spec = importlib.util.spec_from_file_location("selftrain_recipe", REPO / "recipes" / "selftrain.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- configs ------------------------------------------------------------------------------------------


def test_default_config_file_is_the_embedded_default():
    assert load_config(SelfTrainConfig, CONFIGS / "selftrain_default.yaml") == SelfTrainConfig()
    cfg = SelfTrainConfig()
    cfg.validate()
    assert cfg.iterations >= 2 and cfg.bootstrap.mode == "always" and cfg.retriever.backend == "bm25"
    assert cfg.generator.model == "smollm2-135m" and cfg.mode == "backtrace"


def test_train_sections_and_lora_train_config_share_one_set_of_defaults():
    import dataclasses

    from knowtrace_train.train.config import LoraTrainConfig

    cfg = SelfTrainConfig()
    # iteration adapters: one epoch; both sections: 4 records per optimizer step whatever the process count, and
    # decisions weighted (docs/decisions.md)
    assert cfg.train == dataclasses.replace(LoraTrainConfig(), epochs=1.0, effective_batch_size=4, decision_weight=4.0)
    assert cfg.bootstrap.train == dataclasses.replace(LoraTrainConfig(), epochs=1.0, learning_rate=1e-3, effective_batch_size=4,
                                                      decision_weight=4.0)
    # the CPU default run's values (its figures were measured with them): the sections' 4 records in one pass
    lora = LoraTrainConfig()
    assert (lora.per_device_batch_size, lora.gradient_accumulation_steps, lora.learning_rate, lora.epochs,
            lora.max_length, lora.logging_steps, lora.share_prefixes) == (None, 4, 3e-4, 2.0, 1024, 5, True)
    from knowtrace_train.train.config import as_trained

    assert [(t.per_device_batch_size, t.gradient_accumulation_steps) for t in
            (as_trained(cfg.train, 1), as_trained(cfg.bootstrap.train, 1), as_trained(cfg.train, 2))] == [(4, 1), (4, 1), (2, 1)]


def test_overriding_one_nested_key_keeps_the_other_defaults():
    cfg = load_config(SelfTrainConfig, None, ["--strategy.max_rounds", "4", "--train.epochs", "3",
                                              "--strategy.max_new_tokens.explore", "10", "--bootstrap.train.rank", "8"])
    default = SelfTrainConfig()
    assert cfg.strategy.max_rounds == 4 and cfg.strategy.passages == default.strategy.passages
    assert cfg.strategy.max_new_tokens.explore == 10
    assert cfg.strategy.max_new_tokens.complete == default.strategy.max_new_tokens.complete
    assert cfg.train.epochs == 3.0 and cfg.train.learning_rate == default.train.learning_rate
    assert cfg.bootstrap.train.rank == 8 and cfg.bootstrap.train.epochs == default.bootstrap.train.epochs
    assert cfg.bootstrap.train.per_device_batch_size == default.bootstrap.train.per_device_batch_size


def test_star_and_paper_configs_load():
    star = load_config(SelfTrainConfig, CONFIGS / "selftrain_star.yaml")
    star.validate()
    assert star.mode == "star" and star.name == "selftrain_star"
    assert {k: v for k, v in vars(star).items() if k not in ("mode", "name")} == {
        k: v for k, v in vars(SelfTrainConfig()).items() if k not in ("mode", "name")}
    kto = load_config(SelfTrainConfig, CONFIGS / "selftrain_kto.yaml")
    kto.validate()
    assert kto.mode == "kto" and kto.kto.undesirable == ["incorrect"] and kto.kto.undesirable_per_desirable == 1.0
    assert {k: v for k, v in vars(kto).items() if k not in ("mode", "name", "kto")} == {
        k: v for k, v in vars(SelfTrainConfig()).items() if k not in ("mode", "name", "kto")}
    paper = load_config(SelfTrainConfig, CONFIGS / "selftrain_paper_gpu.yaml")
    assert paper.generator.backend == "vllm" and "Llama-3" in paper.generator.model
    assert paper.data.train_questions == 5000 and paper.strategy.passages == 5 and paper.retriever.backend == "bm25"
    assert paper.bootstrap.mode == "auto" and paper.fewshot_trained
    assert paper.data.test == paper.data.dev and paper.data.test_questions == 500  # held out from the run's dev ones
    assert sorted(paper.grid) == ["train.effective_batch_size", "train.epochs", "train.learning_rate"]
    assert paper.grid["train.learning_rate"] == [1e-5, 5e-5, 1e-4, 3e-4]
    assert paper.grid["train.effective_batch_size"] == [32, 64, 128]
    assert paper.train.effective_batch_size == paper.bootstrap.train.effective_batch_size == 32


def test_paper_grid_keeps_its_effective_batch_on_any_gpu_count_that_divides_it():
    paper = load_config(SelfTrainConfig, CONFIGS / "selftrain_paper_gpu.yaml")
    for processes in (1, 2, 4, 8, 16):
        paper._check_batches(processes)  # every grid point divides
    with pytest.raises(ValueError, match=r"train \(grid point \{'effective_batch_size': 32\}\): effective_batch_size 32 "
                                         r"is not a multiple of per_device_batch_size 2 x 3 processes = 6"):
        paper._check_batches(3)
    paper.train.per_device_batch_size = paper.bootstrap.train.per_device_batch_size = 8
    with pytest.raises(ValueError, match=r"per_device_batch_size 8 x 8 processes = 64"):
        paper._check_batches(8)


def test_config_typo_and_wrong_type_name_the_key_and_the_file(tmp_path, capsys):
    recipe = _load_recipe()
    bad = tmp_path / "bad.yaml"
    bad.write_text("iterations: 2\nstrategy:\n  max_round: 3\n")
    assert recipe.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "strategy.max_round" in err and "did you mean 'strategy.max_rounds'" in err
    bad.write_text("iterations: two\n")
    assert recipe.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "iterations" in err and "integer" in err
    bad.write_text("data:\n  train: nowhere/train.jsonl\n")
    assert recipe.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "data.train" in err and "nowhere/train.jsonl" in err
    assert recipe.main(["--mode", "stra"]) == 2
    assert "mode must be one of" in capsys.readouterr().err


def test_grid_points_expand_into_runs():
    recipe = _load_recipe()
    cfg = load_config(SelfTrainConfig, CONFIGS / "selftrain_paper_gpu.yaml")
    points = recipe.grid_points(cfg.grid)
    assert len(points) == 3 * 3 * 4
    assert points[0] == {"train.epochs": 1, "train.effective_batch_size": 32, "train.learning_rate": 1e-5}
    assert recipe.point_name(points[0]) == "epochs1_effective_batch_size32_learning_rate1e-05"


def test_the_grid_chooses_the_best_final_dev_em_and_writes_grid_json(tmp_path, monkeypatch):
    from knowtrace_train.selftrain.grid import GRID_FILE, choose_point, final_dev_em, finish_grid

    results = [
        {"point": {"train.epochs": 1}, "run_dir": "a", "base_em": 0.0, "m0_em": 0.25, "em": [0.25, 0.5]},
        # stopped at iteration 2 (no dev EM): its final model is iteration 1's
        {"point": {"train.epochs": 2}, "run_dir": "b", "base_em": 0.0, "m0_em": 0.25, "em": [0.75, None]},
        {"point": {"train.epochs": 3}, "run_dir": "c", "base_em": 0.0, "m0_em": 0.25, "em": [0.5, 0.75]},  # a tie
        {"point": {"train.epochs": 4}, "run_dir": "d", "base_em": None, "m0_em": None, "em": []},  # nothing evaluated
    ]
    assert [final_dev_em(r) for r in results] == [0.5, 0.75, 0.75, None]
    assert choose_point(results) == 1  # ties: the earlier point
    assert choose_point(results[:1] + [{"point": {}, "run_dir": "e", "m0_em": 0.6, "em": []}]) == 1  # M0's
    with pytest.raises(ValueError, match="no grid point has a dev EM"):
        choose_point(results[3:])

    out = finish_grid(SelfTrainConfig(), tmp_path, results)
    assert out == {"chosen": {"train.epochs": 2}, "chosen_run_dir": "b", "dev_em": 0.75, "test": None,
                   "note": "dev only: data.test is not set"}
    grid = json.loads((tmp_path / GRID_FILE).read_text())
    assert {k: grid[k] for k in out} == out and grid["run_dir"] == str(tmp_path) and "ties" in grid["selection"]
    assert [(p["run_dir"], p["dev_em"]) for p in grid["points"]] == [("a", 0.5), ("b", 0.75), ("c", 0.75), ("d", None)]
    # the other processes choose alike and write nothing
    monkeypatch.setenv("RANK", "1")
    (tmp_path / GRID_FILE).unlink()
    assert finish_grid(SelfTrainConfig(), tmp_path, results)["chosen"] == {"train.epochs": 2}
    assert not (tmp_path / GRID_FILE).exists()
    with pytest.raises(ValueError, match="data.test: no such file 'nowhere.jsonl'"):
        load_config(SelfTrainConfig, None, ["--data.test", "nowhere.jsonl"]).validate()


# -- the loop -----------------------------------------------------------------------------------------


def _run(tmp_path, tiny_model_dir, *extra, oracle=True, **values):
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, **values) + list(extra))
    rows = []
    run = SelfTrain(cfg, progress=False, on_metrics=lambda m: rows.append(table_row(m)))
    if oracle:
        run.make_generator = oracle_factory(run)
    return run, run.run(), rows


def test_loop_two_iterations_on_the_tiny_model(tmp_path, tiny_model_dir):
    run, summary, rows = _run(tmp_path, tiny_model_dir)
    d = run.run_dir
    # the raw base, the bootstrap (M0), two iterations: one table row each, the models' in order (the raw base's
    # comes first, or last where it runs beside the last evaluation: the fixed schedule on two threads)
    labels = [r.split()[0] for r in rows]
    assert labels in (["base", "0", "1", "2"], ["0", "1", "2", "base"]) and len(table_header().split("  ")) >= 9
    for f in ["config.yaml", "questions.json", "m0.json", "summary.json", "base/eval.jsonl", "iter_0/model/config.json",
              "iter_0/sft_explore.jsonl", "iter_0/sft_complete.jsonl", "iter_0/eval.jsonl", "iter_0/metrics.json"]:
        assert (d / f).is_file(), f
    m0 = json.loads((d / "m0.json").read_text())
    assert m0["bootstrapped"] and m0["path"] == "iter_0/model"
    assert (d / "iter_0/bootstrap_adapters/bootstrap/adapter_config.json").is_file() and not (d / "iter_0/adapters").exists()
    for z in (1, 2):
        it = d / f"iter_{z}"
        for f in ["rollouts.jsonl", "rationale.json", "sft_explore.jsonl", "sft_complete.jsonl", "sft_answer.jsonl",
                  "eval.jsonl", "metrics.json", "adapters/explore/adapter_config.json",
                  "adapters/complete/adapter_config.json"]:
            assert (it / f).is_file(), f"iter_{z}/{f}"
        for stage in ["rollout", "rationalize", "train_explore", "train_complete", "eval"]:
            assert (it / f"DONE.{stage}").is_file()
        assert not (it / "rollouts.jsonl.parts").exists()
        m = json.loads((it / "metrics.json").read_text())
        assert m["status"] == "trained" and m["rollout"]["questions"] == 6
        # the oracle answers the short questions, and asks one unavailing pair that backtracing filters
        assert m["rollout"]["correct"] >= 1 and 0 < m["rationale"]["fa_ratio"] < 1
        assert m["sft_records"]["explore"] > 0 and m["sft_records"]["complete"] > 0
        assert m["train"]["explore"]["records"] == m["sft_records"]["explore"]
        assert m["adapters"] == {"explore": f"iter_{z}/adapters/explore", "complete": f"iter_{z}/adapters/complete"}
        rollouts = [json.loads(line) for line in (it / "rollouts.jsonl").read_text().splitlines()]
        assert [t["question_id"] for t in rollouts] == json.loads((d / "questions.json").read_text())["rollout"]
        assert all(t["iteration"] == z for t in rollouts)
        # iteration 2 rolls out with iteration 1's adapters: M0 for exploration and completion alike
        if z == 2:
            info = json.loads((d / "iter_1/adapters/explore/knowtrace_training.json").read_text())
            assert Path(info["base_model"]) == (d / "iter_0/model").resolve()
    explore_records = [json.loads(line) for line in (d / "iter_1/sft_explore.jsonl").read_text().splitlines()]
    assert all("Retrieval Guidance" in r["completion"] or "Answer:" in r["completion"] for r in explore_records)
    assert not any("anything else worth knowing" in r["completion"] for r in explore_records)  # filtered out
    assert [x["iteration"] for x in summary["iterations"]] == [1, 2]
    assert summary["base"] is not None and summary["bootstrap"]["em"] is not None
    assert set(summary["seconds"]) >= {"rollout", "train", "eval", "bootstrap", "total"}
    line = headline(summary)
    assert len(line["em"]) == 2 and len(line["fa_ratio"]) == 2 and line["run_dir"] == str(d)
    assert load_run(d) == json.loads((d / "summary.json").read_text())

    # intervals and paired tests: 4 dev questions give means but no interval, and every row says so
    assert all(r.endswith(NO_INTERVAL) for r in rows)
    dev_ids = json.loads((d / "questions.json").read_text())["dev"]

    def file_scores(folder: str) -> tuple[list[float], list[float]]:
        trajs = [json.loads(x) for x in (d / folder / "eval.jsonl").read_text().splitlines()]
        assert [t["question_id"] for t in trajs] == dev_ids
        return [t["em"] for t in trajs], [t["f1"] for t in trajs]

    def paired(a: str, b: str) -> dict:
        (em_a, f1_a), (em_b, f1_b) = file_scores(a), file_scores(b)
        seed = run.config.seed
        return {"n": 4, "em": dataclasses.asdict(paired_test(em_a, em_b, seed=seed)),
                "f1": dataclasses.asdict(paired_test(f1_a, f1_b, seed=seed)),
                "only_a": sum(x > y for x, y in zip(em_a, em_b)), "only_b": sum(y > x for x, y in zip(em_a, em_b))}

    from knowtrace_train.data.loaders import load_items

    dev_kinds = {it.id: it.type for it in load_items(run.config.data.dev)}
    m0_metrics = json.loads((d / "iter_0" / "metrics.json").read_text())
    assert m0_metrics["vs_base"] == {"model": "base", **paired("base", "iter_0")}
    for z in (1, 2):
        m = json.loads((d / f"iter_{z}" / "metrics.json").read_text())
        ev = m["eval"]
        assert ev["em_interval"]["low"] is None and ev["em_interval"]["n"] == 4 and ev["em_interval"]["mean"] == ev["em"]
        assert {k: v["n"] for k, v in ev["by_kind"].items()} == {
            k: sum(dev_kinds[i] == k for i in dev_ids) for k in ("bridge", "comparison") if any(dev_kinds[i] == k for i in dev_ids)}
        assert isinstance(ev["evidence_supported"], int) and 0 <= ev["evidence_supported"] <= round(ev["em"] * 4)
        assert m["vs_m0"] == {"model": "M0", **paired("iter_0", f"iter_{z}")}
        assert m["vs_previous"] == {"model": f"M{z - 1}", **paired(f"iter_{z - 1}", f"iter_{z}")}
        assert f"{m['vs_m0']['em']['diff']:+.3f} p={m['vs_m0']['em']['p_value']:.2f}" in rows[labels.index(str(z))]
        assert summary["iterations"][z - 1]["vs_m0"] == m["vs_m0"]
        assert summary["iterations"][z - 1]["by_kind"] == ev["by_kind"]
    assert line["em_interval"] == [None, None] and line["m0_em_interval"] is None
    assert line["p_vs_m0"] == [round(x["vs_m0"]["em"]["p_value"], 4) for x in summary["iterations"]]

    # a rerun of a finished run loads no model and changes nothing
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    cfg = run.config
    again = SelfTrain(cfg, progress=False)
    again.make_generator = lambda c: pytest.fail("a finished run must not build a generator")
    assert again.run() == summary
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before

    # the figure and the comparison table of scripts/compare_runs.py
    out = tmp_path / "fig.png"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(d), "--out", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.stat().st_size > 1000 and "iter" in r.stdout
    assert json.loads(r.stdout.strip().splitlines()[-1])["figure"] == str(out)

    # the stage-time benchmark reads the run's phases (summary.json) and the bootstrap's training markers
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "bench_selftrain.py"), "--read", str(d), str(d)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    bench = json.loads(r.stdout.strip().splitlines()[-1])
    times = bench["runs"][0]
    assert times["phases"] == {k: summary["seconds"][k] for k in times["phases"]}
    assert times["base_eval_seconds"] == round(json.loads((d / "base" / "DONE.eval").read_text())["seconds"], 1) > 0
    assert times["bootstrap_train"]["bootstrap"]["steps"] == 1 and times["bootstrap_train"]["bootstrap"]["plateau_stop_step"] is None
    assert all(v == 1.0 for v in bench["ratios"].values() if v is not None) and "| bootstrap |" in r.stdout


def test_eval_files_of_other_questions_are_not_paired(tmp_path, caplog):
    """The loop's paired tests read two eval.jsonl files, matching questions by id; files of other questions
    are refused (and said so in the metrics), a model without an evaluation is not compared."""
    from knowtrace_train.io import write_jsonl
    from knowtrace_train.selftrain.models import ModelState

    run = SelfTrain(SelfTrainConfig(output_dir=str(tmp_path)), progress=False)
    row = {"answers": ["x"], "prediction": "x", "em": 1.0, "f1": 1.0}
    write_jsonl(tmp_path / "iter_0" / "eval.jsonl", [{**row, "question_id": f"q{i}"} for i in range(3)])
    write_jsonl(tmp_path / "iter_1" / "eval.jsonl", [{**row, "question_id": f"q{i}"} for i in (0, 2, 1)])
    assert run.evaluations.compare("M0", tmp_path / "iter_0", tmp_path / "iter_1")["n"] == 3  # another order: paired by id
    write_jsonl(tmp_path / "iter_1" / "eval.jsonl", [{**row, "question_id": f"q{i}"} for i in (0, 2, 5)])
    out = run.evaluations.compare("M0", tmp_path / "iter_0", tmp_path / "iter_1")
    assert out["model"] == "M0" and "other questions" in out["refused"] and "em" not in out
    assert "no paired test of iter_1 against M0" in caplog.text
    assert table_row({"iteration": 1, "eval": {"em": 1.0}, "vs_m0": out}).split()[-1] == "-"
    assert run.evaluations.compare("M0", tmp_path / "iter_0", tmp_path / "iter_2") is None
    # M0's evaluation: the bootstrap's, or the raw base's when M0 is the raw base
    assert run.m0_folder(ModelState(name="M0", model="m")) == run.run_dir / "iter_0"
    assert run.m0_folder(run.raw_base()) == run.run_dir / "base"


def test_changed_config_is_refused_in_an_existing_run_folder(tmp_path):
    cfg = SelfTrainConfig(output_dir=str(tmp_path))
    from knowtrace_train.config import dump_config

    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    check_same_config(load_config(SelfTrainConfig, None, ["--output_dir", str(tmp_path), "--iterations", "5"]),
                      tmp_path / "config.yaml")  # more iterations: fine
    with pytest.raises(ConfigError, match=r"strategy\.max_rounds \(3 -> 2\)"):
        check_same_config(load_config(SelfTrainConfig, None, ["--output_dir", str(tmp_path), "--strategy.max_rounds", "2"]),
                          tmp_path / "config.yaml")


def test_resume_refuses_another_process_count(tmp_path, tiny_model_dir):
    """The run folder records its launch (process count, effective batch); a resume under another one is
    refused before any work, and the recorded launch does not disturb reading the config back."""
    from knowtrace_train.selftrain.config import read_run_config
    from knowtrace_train.stages import Processes

    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir))
    SelfTrain(cfg, procs=Processes(0, 1), progress=False)._prepare_folder()
    saved = tmp_path / "run" / "config.yaml"
    launch = yaml.safe_load(saved.read_text())["launch"]
    # both sections name effective_batch_size 4: 2 records per pass, 2 passes per step
    assert launch.pop("version")["package"] == knowtrace_train.__version__  # the code's (tests/test_run_version.py)
    assert launch == {"processes": 1, "effective_batch": {"train": 4, "bootstrap": 4}}
    assert read_run_config(saved) == cfg
    check_same_config(cfg, saved, 1)
    with pytest.raises(ConfigError, match=r"launched as 1 process\(es\).*resumed with 2; relaunch it with 1"):
        SelfTrain(cfg, procs=Processes(0, 2), progress=False)._prepare_folder()


def test_an_iteration_with_nothing_to_train_on_stops_the_run(tmp_path, tiny_model_dir, caplog):
    """The tiny random model alone answers nothing: iteration 1 is reported empty and the run stops."""
    import logging

    caplog.set_level(logging.INFO)
    # bootstrap "auto" probes the raw base on the first train questions; with min_em 0 it never bootstraps
    run, summary, rows = _run(tmp_path, tiny_model_dir, oracle=False, **{
        "bootstrap.mode": "auto", "bootstrap.min_em": 0.0, "bootstrap.probe_questions": 2, "eval_base": False,
        "on_empty": "stop", "iterations": 3, "data.train_questions": 4})
    probe = json.loads((run.run_dir / "base" / "DONE.probe").read_text())
    assert probe["questions"] == 2 and probe["em"] == 0.0 and (run.run_dir / "base" / "probe.jsonl").is_file()
    assert "no bootstrap" in caplog.text and not (run.run_dir / "iter_0").exists()
    assert [x["iteration"] for x in summary["iterations"]] == [1]
    assert summary["iterations"][0]["status"] == "empty" and summary["iterations"][0]["em"] is None
    assert "0 records: nothing to train on" in caplog.text and "the run stops here" in caplog.text
    assert rows[-1].split()[0] == "1" and "empty" in rows[-1]
    assert not (run.run_dir / "iter_2").exists() and not (run.run_dir / "iter_1" / "adapters").exists()
    m0 = json.loads((run.run_dir / "m0.json").read_text())
    assert not m0["bootstrapped"] and m0["path"] == str(tiny_model_dir)

    # the final model (M1, the raw base here) on held-out test questions: the dev file's, less the run's dev ones
    import dataclasses

    from knowtrace_train.selftrain.grid import evaluate_on_test

    cfg = dataclasses.replace(run.config, data=dataclasses.replace(run.config.data, test="data/world/dev.jsonl",
                                                                   test_questions=2))
    test = evaluate_on_test(cfg, run.run_dir, tmp_path / "test", progress=False)
    dev_ids = set(json.loads((run.run_dir / "questions.json").read_text())["dev"])
    tested = [json.loads(line)["id"] for line in (tmp_path / "test" / "questions.jsonl").read_text().splitlines()]
    assert test["questions"] == 2 and test["model"] == "M1" and test["used_by_run"] == len(dev_ids) == 4
    assert len(tested) == 2 and not dev_ids & set(tested)
    assert [json.loads(line)["question_id"] for line in Path(test["trajectories"]).read_text().splitlines()] == tested


# -- kill and resume; two processes -------------------------------------------------------------------


def _config_file(tmp_path: Path, name: str, tiny_model_dir: Path, **values) -> Path:
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, **values))
    from knowtrace_train.config import dump_config

    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_config(cfg))
    return path


def test_killed_run_resumes_to_the_same_results(tmp_path, tiny_model_dir):
    import os
    import signal

    script = [sys.executable, str(REPO / "tests" / "selftrain_helpers.py")]
    # both runs on the CPU on every machine: the adapters are compared bit for bit, and CUDA's attention
    # backward is not deterministic (what is tested is the resumption, not the device)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    values = {"iterations": 1, "eval_base": False}
    whole = _config_file(tmp_path, "whole", tiny_model_dir, output_dir=str(tmp_path / "whole"), **values)
    r = subprocess.run([*script, str(whole)], capture_output=True, text=True, cwd=REPO, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]

    cut = _config_file(tmp_path, "cut", tiny_model_dir, output_dir=str(tmp_path / "cut"), **values)
    # the run kills itself (SIGKILL to its process group) once it has written its first finished rollout: the kill
    # lands mid-rollout under any load
    from selftrain_helpers import KILL_ENV

    proc = subprocess.run([*script, str(cut)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, timeout=900, env={**env, KILL_ENV: "iter_1/rollout:record"})
    assert proc.returncode == -signal.SIGKILL, "the run was not killed: " + proc.stderr[-2000:]
    assert (tmp_path / "cut" / "iter_1" / "rollouts.jsonl.parts" / "rank0.jsonl").is_file()
    assert not (tmp_path / "cut" / "iter_1" / "DONE.eval").exists()
    assert (tmp_path / "cut" / "iter_0" / "DONE.merge").exists()  # the bootstrap is kept

    r = subprocess.run([*script, str(cut)], capture_output=True, text=True, cwd=REPO, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    # M0's evaluation ran beside iteration 1's rollouts (eval_beside, on with 2 threads): the kill may have cut it too
    assert "iter_0/train_bootstrap: done already" in r.stderr
    assert ("iter_0/eval: done already" in r.stderr) != ("iter_0/eval: starting" in r.stderr)
    assert differing(run_outputs(tmp_path / "whole"), run_outputs(tmp_path / "cut")) == []


def test_two_processes_with_torchrun(tmp_path, tiny_model_dir):
    """torchrun --nproc_per_node 2: rollouts split and gathered, gloo data-parallel training, one writer."""
    import os

    cfg = _config_file(tmp_path, "ddp", tiny_model_dir, output_dir=str(tmp_path / "ddp"), iterations=1,
                       eval_base=False, mode="star", **{"bootstrap.mode": "never", "data.train_questions": 5,
                       # the raw base runs the zero-shot prompts the oracle knows
                       "strategy.fewshot.explore": False, "strategy.fewshot.complete": False})
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",  # a free port
         str(REPO / "tests" / "selftrain_helpers.py"), str(cfg)],
        capture_output=True, text=True, cwd=REPO, timeout=900,
        # CPU processes on every machine: two processes on one GPU would be NCCL on a shared device (refused)
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(last["em"]) == 1 and last["mode"] == "star"
    d = tmp_path / "ddp"
    rollouts = [json.loads(line) for line in (d / "iter_1" / "rollouts.jsonl").read_text().splitlines()]
    assert [t["question_id"] for t in rollouts] == json.loads((d / "questions.json").read_text())["rollout"]
    m = json.loads((d / "iter_1" / "metrics.json").read_text())
    assert m["rollout"]["correct"] >= 1 and m["status"] == "trained"
    assert "process 1 of 2 (DistributedType.MULTI_CPU" in r.stderr  # accelerate saw both processes
    assert "2 processes" in r.stderr  # the trainer ran data-parallel
    assert not list(d.rglob(".*.tmp*")) and not list(d.rglob("*.parts"))


def test_threads_default_to_the_cores_shared_among_local_processes(monkeypatch, tmp_path, tiny_model_dir):
    """accelerate launch sets OMP_NUM_THREADS=1 on CPUs; the run sets its own thread count."""
    import os

    import torch

    before = torch.get_num_threads()
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir))
    cores = len(os.sched_getaffinity(0))
    try:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        SelfTrain(cfg, progress=False)._set_threads()
        assert torch.get_num_threads() == cores
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 2))
        SelfTrain(cfg, progress=False)._set_threads()
        assert torch.get_num_threads() == 1
        cfg.threads = 1
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        SelfTrain(cfg, progress=False)._set_threads()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="threads"):
        load_config(SelfTrainConfig, None, ["--threads", "0"])


def test_a_passive_wait_policy_with_several_threads_is_warned_of(monkeypatch, tmp_path, tiny_model_dir, caplog):
    import torch

    before = torch.get_num_threads()
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    warned = []
    try:
        for threads, policy in ((2, "passive"), (1, "PASSIVE"), (2, None), (2, "ACTIVE")):
            cfg.threads = threads
            if policy is None:
                monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
            else:
                monkeypatch.setenv("OMP_WAIT_POLICY", policy)
            caplog.clear()
            with caplog.at_level("WARNING", logger="knowtrace_train.selftrain.loop"):
                SelfTrain(cfg, progress=False)._set_threads()
            warned.append(any("OMP_WAIT_POLICY=PASSIVE with 2 torch threads" in r.getMessage() for r in caplog.records))
    finally:
        torch.set_num_threads(before)
    assert warned == [True, False, False, False]


def test_rollout_samples_settings_are_checked_before_any_work(tmp_path):
    """G > 1 samples need a temperature above 0; the numbers must be numbers; a greedy-only method has no
    rollout temperature. Each is a config error naming the key."""
    with pytest.raises(ConfigError, match=r"rollout.samples must be an integer >= 1"):
        load_config(SelfTrainConfig, None, ["--rollout.samples", "0"])
    with pytest.raises(ConfigError, match=r"rollout.temperature must be a number >= 0"):
        load_config(SelfTrainConfig, None, ["--rollout.temperature", "-1"])
    greedy = load_config(SelfTrainConfig, None, ["--rollout.samples", "4"])
    with pytest.raises(ValueError, match=r"rollout.samples is 4 but the rollouts decode greedily .*set rollout.temperature"):
        greedy.validate()
    load_config(SelfTrainConfig, None, ["--rollout.samples", "4", "--rollout.temperature", "0.7"])._check_rollout()
    load_config(SelfTrainConfig, None, ["--rollout.samples", "4", "--strategy.temperature", "0.7"])._check_rollout()
    trace = load_config(SelfTrainConfig, None, ["--strategy.name", "trace", "--mode", "star", "--rollout.temperature", "0.7"])
    with pytest.raises(ValueError, match=r"method 'trace' decodes greedily"):
        trace._check_rollout()


def test_g_rollout_samples_through_the_loop(tmp_path, tiny_model_dir):
    """The oracle answers every sample alike, so G = 2 doubles the correct trajectories and the records of
    G = 1; the iteration reports the trajectories, the questions solved and pass@G, the table row counts
    trajectories, and every record names its sample's trajectory."""
    one, _, _ = _run(tmp_path / "g1", tiny_model_dir, iterations=1)
    two, _, rows = _run(tmp_path / "g2", tiny_model_dir, iterations=1,
                        **{"rollout.samples": 2, "rollout.temperature": 1.0})
    r1 = json.loads((one.run_dir / "iter_1/metrics.json").read_text())["rollout"]
    r2 = json.loads((two.run_dir / "iter_1/metrics.json").read_text())["rollout"]
    assert (r1["samples"], r1["trajectories"], r1["questions"]) == (1, 6, 6)
    assert (r2["samples"], r2["trajectories"], r2["questions"]) == (2, 12, 6)
    assert r2["correct"] == 2 * r1["correct"] > 0 and r2["solved"] == r1["solved"] == r1["correct"]
    assert r2["pass_at_samples"] == r1["pass_at_samples"] == r1["correct"] / 6
    assert next(r for r in rows if r.split()[0] == "1").split()[1] == f"{r2['correct']}/12"
    for kind in ("explore", "complete"):
        recs1 = [json.loads(x) for x in (one.run_dir / f"iter_1/sft_{kind}.jsonl").read_text().splitlines()]
        recs2 = [json.loads(x) for x in (two.run_dir / f"iter_1/sft_{kind}.jsonl").read_text().splitlines()]
        assert len(recs2) == 2 * len(recs1) > 0
        assert {r["trajectory_id"].rpartition("#")[2] for r in recs2} == {"s0", "s1"}
    summary = json.loads((two.run_dir / "summary.json").read_text())
    assert summary["iterations"][0]["rollout_trajectories"] == 12 and summary["iterations"][0]["rollout_samples"] == 2


def test_g_sampled_rollouts_of_the_tiny_model_differ_and_repeat(tmp_path, tiny_model_dir):
    """Real sampling (the tiny random model at temperature 1): a question's two samples write different
    outputs, and the same run in another folder writes the same ones."""
    def outputs(name):
        run, _, _ = _run(tmp_path / name, tiny_model_dir, oracle=False, iterations=1, eval_base=False,
                         **{"rollout.samples": 2, "rollout.temperature": 1.0, "data.train_questions": 3})
        trajs = [json.loads(x) for x in (run.run_dir / "iter_1/rollouts.jsonl").read_text().splitlines()]
        return [(t["id"], [c["output"] for c in t["calls"]]) for t in trajs]

    a = outputs("a")
    assert [i for i, _ in a] == [f"{q}#s{k}" for q in dict.fromkeys(i.split("#")[0] for i, _ in a) for k in (0, 1)]
    assert all(a[i][1] != a[i + 1][1] for i in range(0, len(a), 2))
    assert outputs("b") == a
