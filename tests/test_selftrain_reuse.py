"""Reuse across runs (selftrain/reuse.py): M0, the raw base's evaluation and probe, M0's evaluation and the first
iteration's rollouts come from the cache home when another run made them from the same inputs, and a grid
builds them once. Every test points $KNOWTRACE_CACHE at its own folder."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.selftrain import SelfTrain
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.selftrain.reuse import KEY_FILE, ReuseCache

from selftrain_helpers import oracle_factory, tiny_overrides

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """This test's cache home; returns its runs/ folder (the reuse cache)."""
    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "runs"


@pytest.fixture
def calls(monkeypatch) -> dict[str, list[Path]]:
    """What the runs compute: the output of every rollout, every trained adapter, every merged model."""
    import knowtrace_train.selftrain.rollout_stage as rollout_stage
    import knowtrace_train.train.lora as lora
    import knowtrace_train.train.merge as merge

    seen: dict[str, list[Path]] = {"rollout": [], "train": [], "merge": []}

    def spy(kind, fn, at):
        def wrapped(*args, **kwargs):
            seen[kind].append(Path(args[at]))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(rollout_stage, "run_rollouts", spy("rollout", rollout_stage.run_rollouts, 1))
    monkeypatch.setattr(lora, "train_role", spy("train", lora.train_role, 2))
    monkeypatch.setattr(merge, "merge_adapters_into_base", spy("merge", merge.merge_adapters_into_base, 2))
    return seen


def _config(tmp_path, tiny_model_dir, name, **values) -> SelfTrainConfig:
    values = {"reuse": True, "iterations": 1, "output_dir": str(tmp_path / name), **values}
    return load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, **values))


def _run(tmp_path, tiny_model_dir, name, oracle=True, **values) -> SelfTrain:
    run = SelfTrain(_config(tmp_path, tiny_model_dir, name, **values), progress=False)
    if oracle:
        run.make_generator = oracle_factory(run)
    run.run()
    return run


def _done(folder: Path, stage: str) -> dict:
    return json.loads((folder / f"DONE.{stage}").read_text())


def _entries(cache: Path, stage: str) -> list[Path]:
    return sorted(p for p in (cache / stage).iterdir()) if (cache / stage).is_dir() else []


def _rel(paths, root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in paths)


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


# -- the cache's own rules ------------------------------------------------------------------------------


def test_an_entry_is_used_only_with_its_key_json_and_every_file(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    c = ReuseCache(tmp_path / "runs")
    src = tmp_path / "src"
    (src / "model").mkdir(parents=True)
    (src / "model" / "weights.bin").write_bytes(b"w" * 100)
    (src / "eval.jsonl").write_text('{"a": 1}\n')
    entry = c.entry("m0", {"seed": 0})
    assert c.entry("m0", {"seed": 0}).key == entry.key and c.entry("m0", {"seed": 1}).key != entry.key
    assert c.entry("eval", {"seed": 0}).key != entry.key
    assert c.lookup(entry, "M0") is None and "not in the reuse cache" in caplog.text  # a plain miss
    assert c.store(entry, {"model": src / "model", "eval.jsonl": src / "eval.jsonl"}, {"loss": 0.5}, "runs/a", link=True)
    saved = json.loads((entry.path / KEY_FILE).read_text())
    assert saved["files"] == {"eval.jsonl": 9, "model/weights.bin": 100} and saved["inputs"]["seed"] == 0
    import hashlib

    assert saved["sha256"] == {"eval.jsonl": hashlib.sha256(b'{"a": 1}\n').hexdigest(),
                               "model/weights.bin": hashlib.sha256(b"w" * 100).hexdigest()}
    assert saved["made_by"] == "runs/a" and "package" in saved["inputs"]["code"]
    assert c.lookup(entry, "M0") == {"loss": 0.5}
    # same file system: the cache holds hard links, no second copy
    assert (entry.path / "model" / "weights.bin").stat().st_ino == (src / "model" / "weights.bin").stat().st_ino

    def broken(damage) -> str:
        c.store(entry, {"model": src / "model"}, {"loss": 0.5}, "runs/a", link=True)
        damage()
        caplog.clear()
        assert c.lookup(entry, "M0") is None
        assert not entry.path.exists()  # removed: the rebuilt output replaces it
        return caplog.text

    kf = entry.path / KEY_FILE
    assert "model/weights.bin is missing" in broken(lambda: (entry.path / "model" / "weights.bin").unlink())
    # (replaced, not written in place: the entry's files are hard links to the run's, which no stage edits)
    assert "has 3 bytes" in broken(lambda: _replace(entry.path / "model" / "weights.bin", b"abc"))
    # the same size, other bytes (a crash's torn write, a person's edit): caught by the SHA-256, rebuilt with a warning
    said = broken(lambda: _replace(entry.path / "model" / "weights.bin", b"x" * 100))
    assert "model/weights.bin no longer has the SHA-256 key.json recorded" in said and "rebuilding it" in said
    assert "lists no SHA-256" in broken(lambda: kf.write_text(kf.read_text().replace('"sha256"', '"sums"')))
    assert f"no {KEY_FILE}" in broken(lambda: kf.unlink())
    assert "cannot be read" in broken(lambda: kf.write_text("{"))
    assert "other inputs" in broken(lambda: kf.write_text(kf.read_text().replace('"seed": 0', '"seed": 7')))
    assert "names key" in broken(lambda: kf.write_text(kf.read_text().replace(entry.key, "0" * 64)))
    assert (src / "model" / "weights.bin").read_bytes() == b"w" * 100  # the run's own files are untouched


def test_a_store_removes_what_a_killed_store_of_its_entry_left(tmp_path):
    """A store killed halfway leaves its temporary folder beside the entry (`.<key>.<8 characters>`, io.atomic_dir);
    the next store of that entry, under its lock, removes it; another entry's is not its to remove."""
    c = ReuseCache(tmp_path / "runs")
    (tmp_path / "eval.jsonl").write_text('{"a": 1}\n')
    entry, other = c.entry("eval", {"seed": 0}), c.entry("eval", {"seed": 1})
    for e in (entry, other):
        (e.path.parent / f".{e.path.name}.k1ll3d_x" / "eval.jsonl").parent.mkdir(parents=True)
        (e.path.parent / f".{e.path.name}.k1ll3d_x" / "eval.jsonl").write_text('{"a"')
    c.claim(entry, "eval", "runs/a")
    try:
        assert c.store(entry, {"eval.jsonl": tmp_path / "eval.jsonl"}, {}, "runs/a")
    finally:
        c.release(entry)
    assert sorted(p.name for p in entry.path.parent.iterdir()) == sorted([entry.path.name, f".{other.path.name}.k1ll3d_x"])


# -- M0: hit, miss, corrupt -------------------------------------------------------------------------------


def test_a_run_in_another_mode_reuses_m0_base_eval_m0_eval_and_first_rollouts(tmp_path, tiny_model_dir, cache, calls,
                                                                               caplog):
    from knowtrace_train.selftrain.models import run_model

    caplog.set_level(logging.INFO)
    a = _run(tmp_path, tiny_model_dir, "a").run_dir
    assert [p.name for p in calls["merge"]] == ["model"] and len(calls["train"]) == 3  # bootstrap, explore, complete
    assert not any("reused_from" in _done(a / f, s) for f, s in
                   [("base", "eval"), ("iter_0", "merge"), ("iter_0", "eval"), ("iter_1", "rollout")])
    assert [len(_entries(cache, s)) for s in ("eval", "m0", "rollout")] == [2, 1, 1]
    for c in calls.values():
        c.clear()
    caplog.clear()

    b = _run(tmp_path, tiny_model_dir, "b", mode="star").run_dir
    # only what depends on the mode ran: iteration 1's training and evaluation
    assert calls["merge"] == [] and _rel(calls["train"], b) == ["iter_1/adapters/complete", "iter_1/adapters/explore"]
    assert _rel(calls["rollout"], b) == ["iter_1/eval.jsonl"]
    m0_entry = _entries(cache, "m0")[0]
    for label in ("base/eval", "M0 (iter_0/model)", "iter_0/eval", "iter_1/rollout"):
        assert f"reused {label} from {cache}" in caplog.text, label
    assert _done(b / "iter_0", "merge")["reused_from"] == str(m0_entry)
    assert _done(b / "iter_0", "train_bootstrap")["reused_from"] == str(m0_entry)
    assert _done(b / "iter_0", "train_bootstrap")["loss"] == _done(a / "iter_0", "train_bootstrap")["loss"]
    for folder, stage, kind in [("base", "eval", "eval"), ("iter_0", "eval", "eval"), ("iter_1", "rollout", "rollout")]:
        src = Path(_done(b / folder, stage)["reused_from"])
        assert src.parent == cache / kind and (src / KEY_FILE).is_file()
    assert "reused_from" not in _done(b / "iter_1", "eval") and "reused_from" not in _done(b / "iter_1", "train_explore")
    # the run folder holds the same files: copies of the trajectories, M0 as hard links to the cache's
    for f in ["base/eval.jsonl", "iter_0/eval.jsonl", "iter_1/rollouts.jsonl"]:
        assert (b / f).read_bytes() == (a / f).read_bytes(), f
        cached = Path(_done(b / f.split("/")[0], "eval" if "eval" in f else "rollout")["reused_from"]) / Path(f).name
        inodes = {(d / f).stat().st_ino for d in (a, b)} | {cached.stat().st_ino}
        assert len(inodes) == 3, f"{f}: JSONL files are copies (an editor may write them in place)"
    weights = sorted(p.name for p in (a / "iter_0" / "model").iterdir())
    assert weights == sorted(p.name for p in (b / "iter_0" / "model").iterdir())
    for name in weights:
        assert (b / "iter_0/model" / name).read_bytes() == (a / "iter_0/model" / name).read_bytes()
        assert (b / "iter_0/model" / name).stat().st_ino == (m0_entry / "model" / name).stat().st_ino
    assert (b / "iter_0/bootstrap_adapters/bootstrap/adapter_config.json").is_file()
    assert json.loads((b / "m0.json").read_text())["path"] == "iter_0/model"
    assert run_model(b, 1).state.model == str(b / "iter_0" / "model")
    mb = json.loads((b / "iter_1" / "metrics.json").read_text())
    assert mb["status"] == "trained" and mb["rationale"]["mode"] == "star"
    assert mb["rollout"]["correct"] == json.loads((a / "iter_1" / "metrics.json").read_text())["rollout"]["correct"]


def test_rollout_samples_and_temperature_key_the_first_rollouts_not_the_evaluations(tmp_path, tiny_model_dir, cache,
                                                                                     calls):
    """G samples at a rollout temperature are other first rollouts than one greedy sample: computed anew; the
    dev evaluations (greedy, one trajectory per question) and M0 are reused."""
    _run(tmp_path, tiny_model_dir, "a")
    for c in calls.values():
        c.clear()
    b = _run(tmp_path, tiny_model_dir, "b", mode="star", **{"rollout.samples": 2, "rollout.temperature": 1.0}).run_dir
    assert calls["merge"] == [] and _rel(calls["rollout"], b) == ["iter_1/eval.jsonl", "iter_1/rollouts.jsonl"]
    assert "reused_from" in _done(b / "iter_0", "eval") and "reused_from" not in _done(b / "iter_1", "rollout")


def test_where_links_cannot_be_made_m0_json_points_at_the_cache(tmp_path, tiny_model_dir, cache, calls, monkeypatch):
    from knowtrace_train.selftrain.models import run_model
    from knowtrace_train.train.export import export_run

    _run(tmp_path, tiny_model_dir, "a", iterations=0, eval_base=False)
    m0_entry = _entries(cache, "m0")[0]

    def no_links(src, dst, *args, **kwargs):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    c = _run(tmp_path, tiny_model_dir, "c", eval_base=False).run_dir
    assert len(calls["merge"]) == 1  # a's only
    assert json.loads((c / "m0.json").read_text())["path"] == str(m0_entry / "model")
    assert not (c / "iter_0" / "model").exists()
    assert _done(c / "iter_0", "merge")["m0_files"] == "m0.json points at the cache folder"
    # the iteration trained from the cache's M0; evaluate --run and export find it there
    info = json.loads((c / "iter_1/adapters/explore/knowtrace_training.json").read_text())
    assert Path(info["base_model"]) == (m0_entry / "model").resolve()
    assert run_model(c, 1).state.model == str(m0_entry / "model")
    monkeypatch.undo()
    out = export_run(c, 1, n_prompts=1, max_new_tokens=4)
    assert {Path(r.base_model) for r in out} == {m0_entry / "model"} and all(r.identical for r in out)


def test_a_changed_bootstrap_setting_retrains_m0_and_train_keys_do_not(tmp_path, tiny_model_dir, cache, calls, caplog):
    caplog.set_level(logging.INFO)
    base = {"iterations": 0, "eval_base": False}
    _run(tmp_path, tiny_model_dir, "a", oracle=False, **base)
    assert len(calls["merge"]) == 1
    b = _run(tmp_path, tiny_model_dir, "b", oracle=False, **base, **{"bootstrap.train.learning_rate": 0.01}).run_dir
    assert len(calls["merge"]) == 2 and "reused_from" not in _done(b / "iter_0", "merge")
    assert _rel([calls["rollout"][-1]], b) == ["iter_0/eval.jsonl"]  # another M0: evaluated anew
    assert len(_entries(cache, "m0")) == 2 and len(_entries(cache, "eval")) == 2
    # the iterations' training settings, the mode and the iteration count are no input of M0
    caplog.clear()
    c = _run(tmp_path, tiny_model_dir, "c", oracle=False, eval_base=False, iterations=2, mode="star",
             on_empty="stop", **{"train.learning_rate": 0.01, "train.epochs": 1.0}).run_dir
    assert len(calls["merge"]) == 2 and "reused_from" in _done(c / "iter_0", "merge")
    assert "reused iter_0/eval" in caplog.text


def test_a_generator_dtype_resolved_otherwise_reuses_m0_but_evaluates_anew(tmp_path, tiny_model_dir, cache, calls,
                                                                            monkeypatch):
    # generator.dtype 'auto' is bf16 on CPUs with native bf16 and fp32 on others: the key holds what it resolved to
    from knowtrace_train.generation import hf as hf_mod

    base = {"iterations": 0, "eval_base": False}
    monkeypatch.setattr(hf_mod, "cpu_has_native_bf16", lambda: False)
    _run(tmp_path, tiny_model_dir, "a", oracle=False, **base)
    monkeypatch.setattr(hf_mod, "cpu_has_native_bf16", lambda: True)
    b = _run(tmp_path, tiny_model_dir, "b", oracle=False, **base).run_dir
    assert len(calls["merge"]) == 1 and "reused_from" in _done(b / "iter_0", "merge")
    assert _rel([calls["rollout"][-1]], b) == ["iter_0/eval.jsonl"]  # decoded in bf16 now: evaluated anew
    assert len(_entries(cache, "eval")) == 2


def test_a_corrupt_cached_m0_is_rebuilt_never_used(tmp_path, tiny_model_dir, cache, calls, caplog):
    caplog.set_level(logging.INFO)
    base = {"iterations": 0, "eval_base": False}
    a = _run(tmp_path, tiny_model_dir, "a", oracle=False, **base).run_dir
    entry = _entries(cache, "m0")[0]
    (entry / "model" / "model.safetensors").unlink()  # a file gone
    caplog.clear()
    b = _run(tmp_path, tiny_model_dir, "b", oracle=False, **base).run_dir
    assert len(calls["merge"]) == 2 and "reused_from" not in _done(b / "iter_0", "merge")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(entry) in w and "model/model.safetensors is missing" in w and "rebuilding" in w for w in warnings)
    # rebuilt by b, a valid entry again (the same weights on a CPU: training is seeded)
    assert json.loads((entry / KEY_FILE).read_text())["made_by"] == str(b)
    assert (entry / "model/model.safetensors").stat().st_ino == (b / "iter_0/model/model.safetensors").stat().st_ino
    assert (a / "iter_0/model/model.safetensors").is_file()  # a's own M0 untouched

    kf = entry / KEY_FILE
    saved = json.loads(kf.read_text())
    saved["inputs"]["seed"] = 99  # key.json tampered with
    kf.write_text(json.dumps(saved))
    caplog.clear()
    c = _run(tmp_path, tiny_model_dir, "c", oracle=False, **base).run_dir
    assert len(calls["merge"]) == 3 and "reused_from" not in _done(c / "iter_0", "merge")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("other inputs than this key's (seed)" in w for w in warnings)
    assert json.loads(kf.read_text())["inputs"]["seed"] == 0
    caplog.clear()
    d = _run(tmp_path, tiny_model_dir, "d", oracle=False, **base).run_dir
    assert len(calls["merge"]) == 3 and _done(d / "iter_0", "merge")["reused_from"] == str(entry)


# -- the raw base, reuse off ------------------------------------------------------------------------------


def _counting_factory(made: list):
    def make(gen_cfg):
        from knowtrace_train.generation import build_generator

        made.append(gen_cfg.model)
        return build_generator(gen_cfg)
    return make


def test_base_eval_and_probe_are_reused_and_reuse_false_recomputes(tmp_path, tiny_model_dir, cache, calls, caplog):
    caplog.set_level(logging.INFO)
    # bootstrap auto with min_em 0: the probe runs, and decides against a bootstrap
    values = {"iterations": 0, "bootstrap.mode": "auto", "bootstrap.min_em": 0.0, "bootstrap.probe_questions": 2}
    made: list[str] = []

    def run(name, **more):
        r = SelfTrain(_config(tmp_path, tiny_model_dir, name, **values, **more), progress=False)
        r.make_generator = _counting_factory(made)
        r.run()
        return r.run_dir

    a = run("a")
    assert len(made) == 2 and _rel(calls["rollout"], a) == ["base/eval.jsonl", "base/probe.jsonl"]
    assert len(_entries(cache, "eval")) == 1 and len(_entries(cache, "probe")) == 1

    b = run("b", mode="star", **{"train.learning_rate": 0.01, "bootstrap.questions": 4})
    assert len(made) == 2 and len(calls["rollout"]) == 2  # nothing computed, no generator built
    assert _done(b / "base", "eval")["reused_from"] == str(_entries(cache, "eval")[0])
    assert _done(b / "base", "probe")["reused_from"] == str(_entries(cache, "probe")[0])
    assert _done(b / "base", "eval")["em"] == _done(a / "base", "eval")["em"]
    for f in ("eval.jsonl", "probe.jsonl"):
        assert (b / "base" / f).read_bytes() == (a / "base" / f).read_bytes()
    assert json.loads((b / "m0.json").read_text())["path"] == str(tiny_model_dir)  # no bootstrap: M0 is the base
    SelfTrain(_config(tmp_path, tiny_model_dir, "b", reuse=False, **values, mode="star",  # reuse may change on resume
                      **{"train.learning_rate": 0.01, "bootstrap.questions": 4}), progress=False).run()

    caplog.clear()
    c = run("c", **{"strategy.max_rounds": 2})  # the strategy shapes the trajectories: another key
    assert len(made) == 4 and _rel(calls["rollout"][2:], c) == ["base/eval.jsonl", "base/probe.jsonl"]
    assert "base/eval: not in the reuse cache" in caplog.text and len(_entries(cache, "eval")) == 2

    snapshot = {p: p.stat().st_mtime_ns for p in cache.rglob("*")}
    d = run("d", reuse=False)
    assert len(made) == 6 and _rel(calls["rollout"][4:], d) == ["base/eval.jsonl", "base/probe.jsonl"]
    assert "reused_from" not in _done(d / "base", "eval") and "reused_from" not in _done(d / "base", "probe")
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*")} == snapshot  # the cache not even read into
    assert _untimed(d / "base" / "eval.jsonl") == _untimed(a / "base" / "eval.jsonl")  # what the cache would have given


def _untimed(path: Path) -> list[dict]:
    """Trajectories without their wall time."""
    return [{k: v for k, v in json.loads(line).items() if k != "wall_time"} for line in path.read_text().splitlines()]


# -- the grid -------------------------------------------------------------------------------------------


def oracle_recipe(monkeypatch):
    """recipes/selftrain.py as a module, its runs answering through the oracle."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("selftrain_recipe", REPO / "recipes" / "selftrain.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)

    class OracleRun(SelfTrain):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.make_generator = oracle_factory(self)

    # the recipe's functions live in the package (knowtrace_train.commands.selftrain), the script re-exports them
    monkeypatch.setattr(sys.modules[recipe.run_all.__module__], "SelfTrain", OracleRun)
    return recipe


def test_grid_stages_shared(tmp_path, tiny_model_dir, cache, calls, monkeypatch):
    """A 2-point grid over train.learning_rate builds the base evaluation, M0, its evaluation and iteration 1's
    rollouts once; each point's folder shows where its stages came from."""
    from knowtrace_train.config import RecipeArgs

    recipe = oracle_recipe(monkeypatch)
    root = tmp_path / "grid"
    overrides = tiny_overrides(tmp_path, tiny_model_dir, reuse=True, iterations=1, output_dir=str(root),
                               grid='{"train.learning_rate": [0.001, 0.0005]}')
    line = recipe.run_all(recipe.load(None, overrides), RecipeArgs(config=None, quiet=True, overrides=overrides))
    p1, p2 = root / "learning_rate0.001", root / "learning_rate0.0005"
    assert [x["point"] for x in line["points"]] == [{"train.learning_rate": 0.001}, {"train.learning_rate": 0.0005}]
    assert _rel(calls["rollout"], root) == sorted([
        "learning_rate0.001/base/eval.jsonl", "learning_rate0.001/iter_0/eval.jsonl",
        "learning_rate0.001/iter_1/rollouts.jsonl", "learning_rate0.001/iter_1/eval.jsonl",
        "learning_rate0.0005/iter_1/eval.jsonl"])
    assert _rel(calls["merge"], root) == ["learning_rate0.001/iter_0/model"]
    assert _rel(calls["train"], root) == sorted(
        [f"{p}/iter_1/adapters/{a}" for p in ("learning_rate0.001", "learning_rate0.0005") for a in ("complete", "explore")]
        + ["learning_rate0.001/iter_0/bootstrap_adapters/bootstrap"])
    shared = [("base", "eval"), ("iter_0", "train_bootstrap"), ("iter_0", "merge"), ("iter_0", "eval"),
              ("iter_1", "rollout")]
    for folder, stage in shared:
        assert "reused_from" not in _done(p1 / folder, stage)
        assert Path(_done(p2 / folder, stage)["reused_from"]).parent.parent == cache, (folder, stage)
    for stage in ("train_explore", "train_complete", "eval"):
        assert "reused_from" not in _done(p2 / "iter_1", stage)
    assert (p1 / "iter_1/rollouts.jsonl").read_bytes() == (p2 / "iter_1/rollouts.jsonl").read_bytes()
    info = [json.loads((p / "iter_1/adapters/explore/knowtrace_training.json").read_text()) for p in (p1, p2)]
    assert [i["config"]["learning_rate"] for i in info] == [0.001, 0.0005]  # each point trained its own way
    assert [i["base_model"] for i in info] == [str((p / "iter_0/model").resolve()) for p in (p1, p2)]
    weights = [(p / "iter_1/adapters/explore/adapter_model.safetensors").read_bytes() for p in (p1, p2)]
    assert weights[0] != weights[1]


# -- two processes ---------------------------------------------------------------------------------------


def test_two_processes_store_and_reuse_through_the_main_process(tmp_path, tiny_model_dir, cache, monkeypatch):
    """torchrun --nproc_per_node 2 after a one-process run: iteration 1's rollouts are reused (the main
    process decides, the other follows), the base evaluation is computed by both and stored by the main one."""
    from knowtrace_train.config import dump_config

    # both on the CPU on every machine (the device is part of the key)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    values = {"bootstrap.mode": "never", "data.train_questions": 5, "strategy.fewshot.explore": False,
              "strategy.fewshot.complete": False}
    one = _run(tmp_path, tiny_model_dir, "one", eval_base=False, mode="star", **values).run_dir
    assert len(_entries(cache, "rollout")) == 1 and not _entries(cache, "eval")

    cfg = _config(tmp_path, tiny_model_dir, "ddp", eval_base=True, **values)
    path = tmp_path / "ddp.yaml"
    path.write_text(dump_config(cfg))
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "tests" / "selftrain_helpers.py"), str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "KNOWTRACE_CACHE": str(cache.parent)},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    d = tmp_path / "ddp"
    assert "process 1 of 2 (DistributedType.MULTI_CPU" in r.stderr
    assert r.stderr.count("reused iter_1/rollout from") == 1  # logged by the main process only
    assert _done(d / "iter_1", "rollout")["reused_from"] == str(_entries(cache, "rollout")[0])
    assert (d / "iter_1/rollouts.jsonl").read_bytes() == (one / "iter_1/rollouts.jsonl").read_bytes()
    [base_eval] = _entries(cache, "eval")
    assert json.loads((base_eval / KEY_FILE).read_text())["made_by"] == str(d)
    assert (base_eval / "eval.jsonl").read_bytes() == (d / "base/eval.jsonl").read_bytes()
    assert json.loads((d / "iter_1/metrics.json").read_text())["status"] == "trained"
    assert not list(d.rglob(".*.tmp*")) and not list(d.rglob("*.parts")) and not list(cache.rglob(".*"))


# -- seeds ----------------------------------------------------------------------------------------------


def test_seeds_run_a_folder_each_then_the_arm_table(tmp_path, tiny_model_dir, cache, calls, monkeypatch, capsys):
    """--seeds 0,1: one run per seed in <run folder>/seed_<s>, each with its report and the small-dev-set note;
    the seeds share what no seed draws (the raw base's evaluation) and each trains its own M0; the last
    line holds the across-seed table of the arm."""
    from knowtrace_train.config import RecipeArgs

    recipe = oracle_recipe(monkeypatch)
    root = tmp_path / "seeds"
    overrides = tiny_overrides(tmp_path, tiny_model_dir, reuse=True, iterations=1, output_dir=str(root), seeds="0,1")
    line = recipe.run_all(recipe.load(None, overrides), RecipeArgs(config=None, quiet=True, overrides=overrides))
    out = capsys.readouterr().out
    s0, s1 = root / "seed_0", root / "seed_1"
    assert [x["seed"] for x in line["seeds"]] == [0, 1] and line["arms"][0]["seeds"] == [0, 1]
    for d in (s0, s1):
        assert (d / "summary.json").is_file() and (d / "report.html").is_file()
        assert f"report: {d / 'report.html'}" in out
    assert out.count("note: 4 dev questions cannot show the differences above: they are too few for an interval") == 2
    assert "arm backtrace: seeds [0, 1]" in out
    assert "reused_from" in _done(s1 / "base", "eval")  # the raw base is the same model in every seed
    assert "reused_from" not in _done(s1 / "iter_0", "train_bootstrap")  # each seed trains its own M0
    assert sorted(p.parent.name for p in calls["merge"]) == ["iter_0", "iter_0"]
    with pytest.raises(ConfigError, match="seeds and grid together"):
        recipe.run_all(recipe.load(None, [*overrides, "--grid", '{"train.epochs": [1, 2]}']),
                       RecipeArgs(config=None, quiet=True, overrides=overrides))
