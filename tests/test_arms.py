"""Runs as arms over seeds: grouping and its refusals, incomplete seeds, the across-seed table and pooled tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from knowtrace_train.arms import compare_arms, group_arms
from knowtrace_train.config import ConfigError
from knowtrace_train.report import load_run

REPO = Path(__file__).resolve().parents[1]
IDS = [f"q{i:02d}" for i in range(24)]


def run_folder(root: Path, name: str, mode: str, seed: int, evals: dict[int, list[float]], planned: int = 2,
               **config) -> Path:
    """A run folder as compare_runs reads it: config.yaml, summary.json, each model's eval.jsonl (M0 in iter_0);
    evals[z][i] is the EM of question IDS[i], written in reverse order (pairing is by id)."""
    d = root / name
    for z, ems in evals.items():
        (d / f"iter_{z}").mkdir(parents=True)
        rows = [{"question_id": q, "answers": ["x"], "prediction": "x" if e else "y", "em": e, "f1": e}
                for q, e in zip(IDS, ems)]
        (d / f"iter_{z}" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    dev = root / "dev.jsonl"  # every fourth question a comparison
    dev.write_text("".join(json.dumps({"id": q, "question": f"Question {q}?", "answers": ["x"],
                                       "type": "comparison" if i % 4 == 3 else "bridge"}) + "\n"
                           for i, q in enumerate(IDS)))
    cfg = {"name": name, "output_dir": str(d), "iterations": planned, "mode": mode, "seed": seed, "threads": 1,
           "data": {"dev": str(dev), "train_questions": 200, "dev_questions": 24, "seed": 0}, "train": {"epochs": 1.0}}
    for key, value in config.items():
        section, _, leaf = key.partition(".")
        cfg.setdefault(section, {})[leaf] = value
    cfg["launch"] = {"processes": 1}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    mean = {z: sum(e) / len(e) for z, e in evals.items()}
    summary = {"run_dir": str(d), "name": name, "mode": mode, "iterations_planned": planned,
               "bootstrap": {"em": mean[0]},
               "iterations": [{"iteration": z, "em": mean[z]} for z in sorted(evals) if z > 0]}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def ems(right: range | list[int]) -> list[float]:
    return [1.0 if i in right else 0.0 for i in range(len(IDS))]


@pytest.fixture
def two_arms(tmp_path):
    """Backtracing and STaR over seeds 0 and 1: M0 right on q00-q05 in both seeds; backtracing gains q06-q09
    at iteration 2 in both seeds, STaR gains q06 in seed 0 only."""
    runs = []
    for seed in (0, 1):
        runs.append(run_folder(tmp_path, f"bt_{seed}", "backtrace", seed,
                               {0: ems(range(6)), 1: ems(range(7)), 2: ems(range(10))}))
        runs.append(run_folder(tmp_path, f"star_{seed}", "star", seed,
                               {0: ems(range(6)), 1: ems(range(6)), 2: ems(range(7 if seed == 0 else 6))}))
    return [load_run(r) for r in runs]


def test_the_across_seed_table_and_pooled_tests_on_hand_computed_tables(two_arms):
    result = compare_arms(group_arms(two_arms))
    bt, star = result["arms"]
    assert (bt["mode"], bt["seeds"], star["seeds"]) == ("backtrace", [0, 1], [0, 1])
    m2 = bt["models"][2]
    assert m2["em_mean"] == pytest.approx(10 / 24) and m2["em_by_seed"] == {"0": 10 / 24, "1": 10 / 24}
    # against M0: 4 questions gained in both seeds, none lost: sign flips over 4 questions, p = 2 / 2^4
    assert m2["vs_m0"]["diff"] == pytest.approx(4 / 24) and m2["vs_m0"]["p_value"] == pytest.approx(2 / 16)
    assert m2["vs_m0"]["n"] == 24 and m2["vs_m0"]["seeds"] == 2
    # star - backtrace at iteration 2: per question mean over seeds: q06 (1 - 1)/2... star has q06 in seed 0 only:
    # q06: (1 + 0)/2 - 1 = -0.5; q07-q09: -1 each; the lattice of halves: |sum| 3.5, p = P(|±1 ±1 ±1 ±0.5| >= 3.5) = 2/16
    between = {r["iteration"]: r for r in result["between"]}
    assert between[2]["diff"] == pytest.approx(-3.5 / 24) and between[2]["p_value"] == pytest.approx(2 / 16)
    assert between[0]["diff"] == 0 and between[0]["p_value"] == 1.0


def test_bridge_questions_apart(two_arms):
    """q03, q07, q11, ... are comparisons: of backtracing's four gains at iteration 2 (q06-q09) q07 is one, so
    on the 18 bridge questions it gains q06, q08, q09 in both seeds: p = 2 / 2^3."""
    result = compare_arms(group_arms(two_arms), kind="bridge")
    m2 = result["arms"][0]["models"][2]
    assert result["kind"] == "bridge" and m2["n"] == 18
    assert m2["vs_m0"]["diff"] == pytest.approx(3 / 18) and m2["vs_m0"]["p_value"] == pytest.approx(2 / 8)


def test_an_arm_of_other_configs_is_refused_with_the_keys_named(tmp_path):
    a = run_folder(tmp_path, "a", "backtrace", 0, {0: ems(range(3)), 1: ems(range(3)), 2: ems(range(3))})
    b = run_folder(tmp_path, "b", "backtrace", 1, {0: ems(range(3)), 1: ems(range(3)), 2: ems(range(3))},
                   **{"train.epochs": 2.0, "data.train_questions": 400})
    with pytest.raises(ConfigError, match=r"one arm \(mode backtrace\).*data\.train_questions \(200 vs 400\), train\.epochs \(1\.0 vs 2\.0\)"):
        group_arms([load_run(a), load_run(b)])
    c = run_folder(tmp_path, "c", "backtrace", 0, {0: ems(range(3)), 1: ems(range(3)), 2: ems(range(3))})
    with pytest.raises(ConfigError, match="two runs of one seed"):
        group_arms([load_run(a), load_run(c)])


def test_an_incomplete_seed_is_listed_and_left_out(tmp_path, two_arms):
    killed = run_folder(tmp_path, "bt_2", "backtrace", 2, {0: ems(range(20)), 1: ems(range(24))})  # no iteration 2
    arms = group_arms([*two_arms, load_run(killed)])
    assert arms[0].seeds == [0, 1]
    assert arms[0].incomplete == [{"run_dir": str(killed), "seed": 2, "why": "no dev evaluation of model(s) [2] (planned iterations 1..2)"}]
    result = compare_arms(arms)
    assert result["arms"][0]["models"][0]["em_by_seed"] == {"0": 6 / 24, "1": 6 / 24}  # seed 2's 20/24 not averaged in


def test_a_seed_still_building_m0_is_listed_as_incomplete(tmp_path, two_arms):
    """A run folder with its config.yaml but no summary.json yet (the run is in its bootstrap) is one more
    incomplete seed of its arm; alone, compare_runs refuses it in one line."""
    from knowtrace_train.arms import started_run

    young = run_folder(tmp_path, "bt_3", "backtrace", 3, {0: ems(range(24))})
    (young / "summary.json").unlink()
    arms = group_arms([*two_arms, started_run(young)])
    assert arms[0].seeds == [0, 1] and arms[0].incomplete == [
        {"run_dir": str(young), "seed": 3, "why": "no dev evaluation of model(s) [0, 1, 2] (planned iterations 1..2)"}]
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(young), "--out", str(tmp_path / "x.png")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2 and "no summary.json yet" in r.stderr and "Traceback" not in r.stderr


def test_compare_runs_prints_the_arms_and_refuses_mixed_configs_in_one_line(tmp_path, two_arms):
    pytest.importorskip("matplotlib")
    out = tmp_path / "seeds.png"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), *(s["run_dir"] for s in two_arms),
                        "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "arm backtrace: seeds [0, 1]" in r.stdout and "star - backtrace at M2 over seeds [0, 1] x 24 questions" in r.stdout
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["figure"] == str(out) and out.stat().st_size > 1000 and len(last["arms"]) == 2
    odd = run_folder(tmp_path, "odd", "star", 5, {0: ems(range(6)), 1: ems(range(6)), 2: ems(range(6))},
                     **{"strategy.max_rounds": 5})
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), *(s["run_dir"] for s in two_arms),
                        str(odd), "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("config error: ") and "strategy.max_rounds (3 vs 5)" in r.stderr  # read with its defaults


def test_single_runs_of_one_mode_and_other_settings_are_compared_run_by_run(tmp_path):
    """No two runs are seeds of one setting (one sample against two, say): no arms, no refusal; the runs are
    compared run by run as before there were arms. One seed more of either makes them arms, and refused."""
    from knowtrace_train.arms import replicated

    g1 = run_folder(tmp_path, "g1", "backtrace", 0, {0: ems(range(6)), 1: ems(range(6)), 2: ems(range(7))})
    g2 = run_folder(tmp_path, "g2", "backtrace", 0, {0: ems(range(6)), 1: ems(range(8)), 2: ems(range(9))},
                    **{"rollout.samples": 2})
    assert not replicated([load_run(g1), load_run(g2)])
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(g1), str(g2), "--out",
                        str(tmp_path / "x.png")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    between = json.loads(r.stdout.strip().splitlines()[-1])["between"]
    assert [(b["iteration"], b["only_a"], b["only_b"]) for b in between] == [(0, 0, 0), (1, 0, 2), (2, 0, 2)]
    g1_seed1 = run_folder(tmp_path, "g1s1", "backtrace", 1, {0: ems(range(6)), 1: ems(range(6)), 2: ems(range(7))})
    assert replicated([load_run(g1), load_run(g2), load_run(g1_seed1)])
    with pytest.raises(ConfigError, match=r"rollout.samples"):
        group_arms([load_run(g1), load_run(g2), load_run(g1_seed1)])


def test_kind_on_single_runs_prints_each_runs_bridge_questions_with_intervals_and_tests(tmp_path):
    """`--kind bridge` on runs that are no seeds of one setting: each run alone, its models on the bridge
    questions with a 95% interval and the paired test against its own M0 (a one-seed arm). g2 gains q06-q09 at
    iteration 1; q07 is a comparison, so on the 18 bridge questions it gains 3: p = 2 / 2^3. Both runs plan two
    iterations and have evaluated one so far: the models they have are compared."""
    g1 = run_folder(tmp_path, "g1", "backtrace", 0, {0: ems(range(6)), 1: ems(range(6))})
    g2 = run_folder(tmp_path, "g2", "backtrace", 0, {0: ems(range(6)), 1: ems(range(10))}, **{"rollout.samples": 2})
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(g1), str(g2), "--kind", "bridge",
                        "--out", str(tmp_path / "x.png")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bridge questions only" in r.stdout and f"arm backtrace, run={g2}: seeds [0]" in r.stdout
    by_kind = json.loads(r.stdout.strip().splitlines()[-1])["by_kind"]
    m1 = by_kind["arms"][1]["models"][1]
    assert by_kind["kind"] == "bridge" and m1["n"] == 18 and m1["em_interval"] is None  # under 20 questions: no bounds
    assert m1["vs_m0"]["diff"] == pytest.approx(3 / 18) and m1["vs_m0"]["p_value"] == pytest.approx(2 / 8)
    g2_m1 = next(b for b in by_kind["between"] if b["iteration"] == 1)  # g2 - g1 on the bridge questions, paired
    assert g2_m1["diff"] == pytest.approx(3 / 18) and g2_m1["p_value"] == pytest.approx(2 / 8)
    # a run of another seed is compared with its own M0, and with the first run not at all, saying why
    g3 = run_folder(tmp_path, "g3", "star", 1, {0: ems(range(6)), 1: ems(range(7))})
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), str(g1), str(g3), "--kind", "bridge",
                        "--out", str(tmp_path / "y.png")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not compared (no seed among both arms' compared runs: questions pair only within a seed)" in r.stdout


def test_runs_of_older_code_are_read_with_the_defaults_and_batching_keys_are_free(tmp_path, two_arms):
    """A config.yaml written before a section existed (rollout, grpo) reads as its defaults, and runs that differ
    only in how a step's records are computed (per_device_batch_size, share_prefixes) are seeds of one arm."""

    from knowtrace_train.arms import ARM_FREE_KEYS, config_differences, flat_config

    a = two_arms[0]["run_dir"]
    data = yaml.safe_load((Path(a) / "config.yaml").read_text())
    data.pop("rollout", None)
    data.setdefault("train", {})["per_device_batch_size"] = 1
    data["train"]["share_prefixes"] = False
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.yaml").write_text(yaml.safe_dump(data))
    assert flat_config(old)["rollout.samples"] == 1
    assert config_differences(flat_config(a), flat_config(old), ARM_FREE_KEYS) == []
    assert config_differences(flat_config(a), flat_config(old), frozenset({"seed"})) != []


def test_runs_that_evaluate_every_kth_iteration_are_finished_and_compared_on_those_models(tmp_path):
    """eval_every 2 over 3 iterations evaluates M0, M2 and M3: such runs are finished, and the arms compare those
    models only (a run that skipped M2 is incomplete)."""
    from knowtrace_train.arms import evaluated_models, finished

    runs = []
    for seed in (0, 1):
        d = run_folder(tmp_path, f"g_{seed}", "backtrace", seed, {0: ems(range(6)), 2: ems(range(8)), 3: ems(range(9))},
                       planned=3)
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["eval_every"] = 2
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        runs.append(json.loads((d / "summary.json").read_text()))
    assert evaluated_models(runs[0]) == [0, 2, 3] and finished(runs[0]) is None
    result = compare_arms(group_arms(runs))
    models = result["arms"][0]["models"]
    assert [m["iteration"] for m in models] == [0, 2, 3] and models[1]["em_mean"] == pytest.approx(8 / len(IDS))
    short = dict(runs[0], iterations=[r for r in runs[0]["iterations"] if r["iteration"] != 2])
    assert "no dev evaluation of model(s) [2]" in finished(short)


def test_an_ablation_groups_its_arms_by_a_config_key(tmp_path):
    """Runs of one mode that differ in a config key are refused as one arm; `keys` makes each value its own arm.
    M0-only runs (`--iterations 0`) compare their M0s: seed 0 of epochs 2 answers q06 and q07 more, seed 1 the
    same; per question the mean over seeds differs by 0.5 on q06 and q07, so diff 1/24 and p = 2 / 2^2."""
    runs = []
    for seed in (0, 1):
        runs.append(run_folder(tmp_path, f"e1_{seed}", "backtrace", seed, {0: ems(range(6))}, planned=0))
        runs.append(run_folder(tmp_path, f"e2_{seed}", "backtrace", seed, {0: ems(range(8 if seed == 0 else 6))},
                               planned=0, **{"train.epochs": 2.0}))
    runs = [load_run(r) for r in runs]
    with pytest.raises(ConfigError, match=r"train\.epochs \(1\.0 vs 2\.0\).*compare_runs\.py --arm KEY"):
        group_arms(runs)
    arms = group_arms(runs, ["train.epochs"])
    assert [(a.name, a.seeds) for a in arms] == [("backtrace, train.epochs=1.0", [0, 1]), ("backtrace, train.epochs=2.0", [0, 1])]
    result = compare_arms(arms)
    assert [r["models"][0]["em_by_seed"] for r in result["arms"]] == [{"0": 6 / 24, "1": 6 / 24}, {"0": 8 / 24, "1": 6 / 24}]
    (m0,) = result["between"]
    assert (m0["a"], m0["b"], m0["iteration"], m0["seeds"]) == ("backtrace, train.epochs=1.0", "backtrace, train.epochs=2.0", 0, [0, 1])
    assert m0["diff"] == pytest.approx(1 / 24) and m0["p_value"] == pytest.approx(2 / 4)
    with pytest.raises(ConfigError, match=r"--arm train\.epoch: no such config key .*did you mean 'train\.epochs'"):
        group_arms(runs, ["train.epoch"])
    other = run_folder(tmp_path, "e2_2", "backtrace", 2, {0: ems(range(6))}, planned=0,
                       **{"train.epochs": 2.0, "data.train_questions": 400})
    with pytest.raises(ConfigError, match=r"one arm \(mode backtrace, train\.epochs=2\.0\).*data\.train_questions \(200 vs 400\)"):
        group_arms([*runs, load_run(other)], ["train.epochs"])


def test_compare_runs_arm_prints_the_ablation(tmp_path):
    runs = [run_folder(tmp_path, f"e{e}_{seed}", "backtrace", seed, {0: ems(range(6 + e * seed))}, planned=0,
                       **{"train.epochs": float(e)}) for e in (1, 2) for seed in (0, 1)]
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_runs.py"), *map(str, runs), "--arm", "train.epochs",
                        "--out", str(tmp_path / "abl.png")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "arm backtrace, train.epochs=2.0: seeds [0, 1]" in r.stdout
    assert "backtrace, train.epochs=2.0 - backtrace, train.epochs=1.0 at M0 over seeds [0, 1] x 24 questions" in r.stdout
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert [a["settings"] for a in last["arms"]] == [{"train.epochs": 1.0}, {"train.epochs": 2.0}]


def test_upto_compares_runs_stopped_after_an_iteration_as_seeds(tmp_path, two_arms):
    """Runs that planned 3 iterations and stopped after 2 (a time limit) are incomplete; with upto=2 they are the
    arm's seeds for M0..M2 (the table of `two_arms`, whose runs planned 2), and a run without M2 stays incomplete."""
    from knowtrace_train.arms import arms_table

    stopped = []
    for seed in (0, 1):  # two_arms' EMs, 3 iterations planned
        stopped.append(run_folder(tmp_path / "stopped", f"bt_{seed}", "backtrace", seed,
                                  {0: ems(range(6)), 1: ems(range(7)), 2: ems(range(10))}, planned=3))
        stopped.append(run_folder(tmp_path / "stopped", f"star_{seed}", "star", seed,
                                  {0: ems(range(6)), 1: ems(range(6)), 2: ems(range(7 if seed == 0 else 6))}, planned=3))
    stopped = [load_run(r) for r in stopped]
    assert all(a.runs == [] for a in group_arms(stopped))
    full, upto = compare_arms(group_arms(two_arms)), compare_arms(group_arms(stopped, upto=2))
    assert upto["arms"][0]["models"] == full["arms"][0]["models"] and upto["between"] == full["between"]
    assert "models up to M2" in arms_table(upto) and upto["upto"] == 2
    assert [m["iteration"] for m in compare_arms(group_arms(stopped, upto=1))["arms"][0]["models"]] == [0, 1]
    short = load_run(run_folder(tmp_path / "stopped", "bt_short", "backtrace", 5, {0: ems(range(6)), 1: ems(range(7))}, planned=3))
    arm, _ = group_arms([*stopped, short], upto=2)
    assert arm.seeds == [0, 1] and arm.incomplete == [
        {"run_dir": short["run_dir"], "seed": 5,
         "why": "no dev evaluation of model(s) [2] (planned iterations 1..3, compared up to M2)"}]
    with pytest.raises(ConfigError, match="upto"):
        group_arms(stopped, upto=-1)


def test_the_figure_2_over_seeds_carries_fa_and_its_noise_part(tmp_path, two_arms):
    """Each iteration's FA of each seed rides along (with its parts where the run records them), and the figure
    draws (b) FA and its noise part per arm."""
    from knowtrace_train.arms import plot_arms

    for s in two_arms:
        for row in s["iterations"]:
            row["fa_ratio"] = 0.3 if s["mode"] == "star" else 0.2
            row["fa_decomposed"] = {"untraceable": 0.1, "unneeded_pairs": 0.05, "extraneous_triplets": 0.05,
                                    "dropped_by_both": 0.0}
    result = compare_arms(group_arms(two_arms))
    m1 = result["arms"][1]["models"][1]
    assert m1["fa_by_seed"]["0"] == {"fa_ratio": 0.3, "untraceable": 0.1, "unneeded_pairs": 0.05,
                                     "extraneous_triplets": 0.05, "dropped_by_both": 0.0}
    assert "fa_by_seed" not in result["arms"][0]["models"][0]  # M0 has no rollouts to trace
    out = plot_arms(result, tmp_path / "fig2.png", "Figure 2")
    assert out.is_file() and out.stat().st_size > 10_000
