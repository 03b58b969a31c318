"""The fair table (scripts/lab/fair.py, scripts/compare_methods.py with a `runs:` config): two real tiny
self-training runs read side by side, and the errors that come before any table."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from knowtrace_train.config import ConfigError, load_config
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "lab"))

from fair import FairConfig, FairTableError, fair_figures, fair_table, format_fair_table  # noqa: E402
STAGES = ["base", "m0", "iter_1"]
DEV_QUESTIONS = 20  # the fewest with a bootstrap interval (metrics.MIN_QUESTIONS_FOR_INTERVAL)
#: self_ask's settings in place of the tiny overrides' KnowTrace ones
SELF_ASK = ["--strategy.passages", "2", "--strategy.max_rounds", "2", "--strategy.max_new_tokens", "8",
            "--strategy.answer_tokens", "4"]


def _run(folder: Path, tiny_model_dir: Path, method: str) -> Path:
    """One tiny self-training run of one iteration: KnowTrace backtracing on the oracle, or `method` with STaR on
    the tiny model alone (its M0 bootstrapped from gold trajectories; an empty iteration continues as M1 = M0)."""
    from selftrain_helpers import oracle_factory, tiny_overrides

    from knowtrace_train.selftrain import SelfTrain
    from knowtrace_train.selftrain.config import SelfTrainConfig

    args = tiny_overrides(folder, tiny_model_dir, iterations=1, eval_base=True,
                          mode="backtrace" if method == "knowtrace" else "star",
                          **{"strategy.name": method, "data.train_questions": 2, "data.dev_questions": DEV_QUESTIONS})
    if method != "knowtrace":  # the tiny overrides' strategy keys are KnowTrace's
        keep = []
        for k, v in zip(args[::2], args[1::2]):
            if not k.startswith("--strategy.") or k == "--strategy.name":
                keep += [k, v]
        args = keep + SELF_ASK
    run = SelfTrain(load_config(SelfTrainConfig, None, args), progress=False)
    if method == "knowtrace":
        run.make_generator = oracle_factory(run)
    run.run()
    return run.run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fair")
    return {m: _run(root / m, tiny_model_dir, m) for m in ("knowtrace", "self_ask")}


def _config(runs: dict[str, Path], **extra) -> FairConfig:
    return FairConfig(runs={k: str(v) for k, v in runs.items()}, stages=extra.pop("stages", STAGES),
                      data="data/world/dev.jsonl", **extra)


def test_the_fair_table_of_two_runs(runs):
    config = _config(runs)
    rows = fair_table(config)
    assert [(r.label, r.stage) for r in rows] == [(m, s) for m in ("knowtrace", "self_ask") for s in STAGES]
    for r in rows:
        assert r.em.n == r.f1.n == DEV_QUESTIONS and 0.0 <= r.em.mean <= 1.0 and 0.0 <= r.f1.mean <= 1.0
        assert r.em.low is not None and r.em.low <= r.em.mean <= r.em.high
        assert r.f1.low is not None and r.f1.low <= r.f1.mean <= r.f1.high
        assert sum(iv.n for iv in r.by_kind.values()) == DEV_QUESTIONS and "bridge" in r.by_kind
        assert r.seconds["eval"] > 0 and r.path.name == "eval.jsonl"
        assert r.method == r.label and isinstance(r.mechanism, dict)
        # how each question ended: every question once, the right ones the EM's numerator, read from the file
        trajs = [json.loads(x) for x in r.path.read_text().splitlines() if x.strip()]
        want = {}
        for d in trajs:
            want.setdefault(d["stop_reason"], [0, 0])
            want[d["stop_reason"]][0] += 1
            want[d["stop_reason"]][1] += int(float(d["em"]) == 1.0)
        assert r.stops == want and list(r.stops.values()) == sorted(r.stops.values(), key=lambda c: -c[0])
        assert sum(n for n, _ in r.stops.values()) == DEV_QUESTIONS
        assert sum(right for _, right in r.stops.values()) == round(r.em.mean * DEV_QUESTIONS)
        if r.stage == "base":
            assert r.build_seconds == 0.0 and r.path.parent.name == "base"
        else:  # both runs bootstrap M0
            assert r.seconds["bootstrap"] > 0 and not r.m0_is_base
        assert (r.seconds["iterations"] > 0) == (r.stage == "iter_1")
    best = {r.label: r for r in rows if r.best}
    assert set(best) == {"knowtrace", "self_ask"}
    assert best["knowtrace"].vs_reference is None
    v = best["self_ask"].vs_reference
    assert v["n"] == DEV_QUESTIONS and v["em"]["test"] == "mcnemar" and 0.0 <= v["em"]["p_value"] <= 1.0
    assert v["em"]["diff"] == pytest.approx(best["self_ask"].em.mean - best["knowtrace"].em.mean)
    text = format_fair_table(rows, "knowtrace")
    assert text.count("\n| knowtrace |") == 3 and text.count("\n| self_ask |") == 3
    assert "bridge EM" in text and "comparison EM" in text and "- self_ask " in text
    assert "p=" in text or "p<0.01" in text
    figs = json.loads(json.dumps(fair_figures(rows, config)))
    assert len(figs["rows"]) == 6 and [p["label"] for p in figs["paired"]] == ["self_ask"]
    # each stage against the label's stage before it: base -> m0 -> iter_1, never across labels
    assert [(r.label, r.stage) for r in rows if r.vs_previous is None] == [("knowtrace", "base"), ("self_ask", "base")]
    for before, r in zip(rows, rows[1:]):
        if r.vs_previous is not None:
            assert r.vs_previous["n"] == DEV_QUESTIONS
            assert r.vs_previous["em"]["diff"] == pytest.approx(r.em.mean - before.em.mean)
            only_b = sum(a == 0 and b == 1 for a, b in zip(before.scores.em, r.scores.em))
            assert r.vs_previous["only_b"] == only_b
    assert text.count("- knowtrace m0 vs base: ") == 1 and text.count("- self_ask iter_1 vs m0: ") == 1
    ended = rows[0].stops
    assert "How the questions ended" in text and ("- knowtrace base: " + ", ".join(
        f"{k} {n} ({right} right)" for k, (n, right) in ended.items())) in text
    assert figs["rows"][0]["stops"] == {k: {"questions": n, "right": right} for k, (n, right) in ended.items()}
    assert [(s["label"], s["previous"], s["stage"]) for s in figs["steps"]] == [
        (m, a, b) for m in ("knowtrace", "self_ask") for a, b in zip(STAGES, STAGES[1:])]


def _script():
    spec = importlib.util.spec_from_file_location("compare_methods_script", REPO / "scripts" / "compare_methods.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_methods_prints_the_fair_table_for_a_runs_config(runs, tmp_path, capsys):
    path = tmp_path / "fair.yaml"
    path.write_text(yaml.safe_dump({"runs": {k: str(v) for k, v in runs.items()}, "stages": STAGES}))
    assert _script().main(["--config", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    figs = json.loads(out[-1])
    assert figs["reference"] == "knowtrace" and len(figs["rows"]) == 6 and figs["paired"][0]["label"] == "self_ask"
    assert any(line.startswith(("| self_ask | iter_1", "| self_ask | m0")) for line in out)
    # an error before any table: one line on stderr, exit 2
    path.write_text(yaml.safe_dump({"runs": {k: str(v) for k, v in runs.items()}, "stages": ["iter_3"]}))
    assert _script().main(["--config", str(path), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "stage iter_3" in captured.err


def test_a_missing_eval_file_names_its_stage_and_path(runs):
    missing = r"runs\.knowtrace: stage iter_2: no eval file .*knowtrace/run/iter_2/eval\.jsonl"
    with pytest.raises(FairTableError, match=missing):
        fair_table(_config(runs, stages=["base", "iter_2"]))
    with pytest.raises(FairTableError, match=r"runs\.trace: no run folder .*nowhere"):
        fair_table(_config({**runs, "trace": runs["knowtrace"].parent / "nowhere"}))


def _copy_head(src: Path, dst: Path) -> Path:
    """A run folder with the files that come before the evaluations: config.yaml, questions.json, m0.json."""
    dst.mkdir(parents=True)
    for name in ("config.yaml", "questions.json", "m0.json"):
        shutil.copy(src / name, dst / name)
    return dst


def test_runs_on_other_dev_questions_are_refused_naming_both(runs, tmp_path):
    other = _copy_head(runs["self_ask"], tmp_path / "other")
    q = json.loads((other / "questions.json").read_text())
    q["dev"] = q["dev"][:-1] + ["world-dev-not-this-one"]
    (other / "questions.json").write_text(json.dumps(q))
    with pytest.raises(FairTableError, match=rf"runs\.knowtrace \({runs['knowtrace']}\) and runs\.self_ask \({other}\) "
                                             r"evaluate other dev questions \(2 ids"):
        fair_table(_config({"knowtrace": runs["knowtrace"], "self_ask": other}))


def test_a_run_of_an_unregistered_method_is_refused_naming_its_config(runs, tmp_path):
    other = _copy_head(runs["self_ask"], tmp_path / "other")
    text = (other / "config.yaml").read_text()
    (other / "config.yaml").write_text(text.replace("name: self_ask", "name: no_such_method", 1))
    with pytest.raises(FairTableError, match=r"runs\.mystery: .*other/config\.yaml: strategy\.name 'no_such_method' is "
                                             r"not a registered method"):
        fair_table(_config({"knowtrace": runs["knowtrace"], "mystery": other}))


def test_the_config_checks_its_own_fields():
    with pytest.raises(ConfigError, match="reference 'knowtrace' is not a label of runs"):
        load_config(FairConfig, None, ["--runs.trace", "runs/fair/trace"])
    with pytest.raises(ConfigError, match="'iter_x' is not base, m0 or iter_<z>"):
        load_config(FairConfig, None, ["--runs.knowtrace", "r", "--stages", "base,iter_x"])
    cfg = load_config(FairConfig, None, ["--runs.knowtrace", "r"])
    assert cfg.stages == ["base", "m0", "iter_2"] and cfg.data == "data/world/dev.jsonl"
    with pytest.raises(FairTableError, match="runs: no run folder named"):
        fair_table(FairConfig())


def _second_seed(run: Path, dst: Path, flip: int) -> Path:
    """A copy of a run folder as if it were another seed: every eval file's first `flip` questions' EM flipped
    (and F1 set to the new EM), so the pooled figures differ from either run's."""
    shutil.copytree(run, dst)
    for path in dst.glob("*/eval.jsonl"):
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        for d in lines[:flip]:
            d["em"] = 1.0 - float(d["em"])
            d["f1"] = d["em"]
        path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return dst


def test_a_label_of_several_seeds_is_pooled(runs, tmp_path):
    from knowtrace_train.pairing import compare_scores, read_question_scores

    seeds = {k: [str(v), str(_second_seed(v, tmp_path / f"{k}_s1", flip=3 if k == "self_ask" else 0))]
             for k, v in runs.items()}
    path = tmp_path / "fair.yaml"  # a YAML list of folders per label
    path.write_text(yaml.safe_dump({"runs": seeds, "stages": STAGES}))
    cfg = load_config(FairConfig, path, [])
    assert cfg.folders("self_ask") == seeds["self_ask"]
    assert load_config(FairConfig, path, ["--first", "1"]).folders("self_ask") == seeds["self_ask"][:1]
    with pytest.raises(ConfigError, match="first must be at least 1"):
        load_config(FairConfig, path, ["--first", "0"])
    rows = {(r.label, r.stage): r for r in fair_table(cfg)}
    one = {(r.label, r.stage): r for r in fair_table(_config(runs))}
    for key, r in rows.items():
        a, b = (by_seed for by_seed in (read_question_scores(p) for p in r.paths))
        assert r.seeds == 2 and r.em.n == DEV_QUESTIONS
        assert r.em.mean == pytest.approx((sum(a.em) + sum(b.em)) / (2 * DEV_QUESTIONS))
        # identical copies (KnowTrace's) pool to the one run's figures; the mechanism's counts double
        if key[0] == "knowtrace":
            assert r.em.mean == pytest.approx(one[key].em.mean)
            for name, stat in r.mechanism.items():
                assert (stat.numerator, stat.denominator) == (2 * one[key].mechanism[name].numerator,
                                                              2 * one[key].mechanism[name].denominator)
            assert r.stops == {k: [2 * n, 2 * right] for k, (n, right) in one[key].stops.items()}
        # the stop reasons of the pooled runs are summed: every (seed, question) once, the right ones counted per seed
        assert sum(n for n, _ in r.stops.values()) == 2 * DEV_QUESTIONS
        assert sum(right for _, right in r.stops.values()) == sum(a.em) + sum(b.em)
    step = rows["self_ask", "iter_1"].vs_previous
    assert step["seeds"] == 2 and step["em"]["test"] == "sign_flip_over_questions"
    # the discordant pairs are summed over the seeds
    before, after = rows["self_ask", "m0"], rows["self_ask", "iter_1"]
    assert step["only_b"] == sum(compare_scores(x, y)["only_b"] for x, y in zip(before.seed_scores, after.seed_scores))
    text = format_fair_table(list(rows.values()), "knowtrace")
    assert "| n x seeds |" in text and "| 20 x 2 |" in text and "each the mean of 2 runs" in text
    figs = fair_figures(list(rows.values()), cfg)
    assert figs["rows"][0]["seeds"] == 2 and isinstance(figs["rows"][0]["eval"], list)
    # a label of another count of seeds cannot be paired: refused before any table
    with pytest.raises(FairTableError, match=r"every label must name as many run folders .*knowtrace: 2, self_ask: 1"):
        fair_table(FairConfig(runs={"knowtrace": seeds["knowtrace"], "self_ask": str(runs["self_ask"])}, stages=STAGES))
    with pytest.raises(FairTableError, match=r"runs\.self_ask\[1\]: no run folder"):
        fair_table(FairConfig(runs={"knowtrace": seeds["knowtrace"],
                                    "self_ask": [seeds["self_ask"][0], str(tmp_path / "nowhere")]}, stages=STAGES))
