"""The YAML + command-line config loader: nesting, types, overrides, located errors."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import pytest
import yaml

from knowtrace_train.config import ConfigError, dump_config, load_config, parse_overrides


@dataclass
class Inner:
    k: int = 5
    name: str = "bm25"
    ratio: float = 0.5
    tags: list[str] = field(default_factory=list)


@dataclass
class Outer:
    path: str
    inner: Inner = field(default_factory=Inner)
    limit: Optional[int] = None
    out: Path | None = None
    fast: bool = False
    mode: Literal["a", "b"] = "a"
    roles: dict[str, int] = field(default_factory=dict)
    pair: tuple[int, int] = (1, 2)

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValueError("limit must be >= 0")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_yaml_to_nested_dataclasses(tmp_path):
    p = write(tmp_path, "path: data.jsonl\ninner:\n  k: 3\n  tags: [x, y]\nlimit: 16\nout: runs/a.jsonl\nroles: {explore: 1}\npair: [3, 4]\n")
    c = load_config(Outer, p)
    assert c == Outer(path="data.jsonl", inner=Inner(k=3, tags=["x", "y"]), limit=16, out=Path("runs/a.jsonl"),
                      roles={"explore": 1}, pair=(3, 4))


def test_overrides(tmp_path):
    p = write(tmp_path, "path: data.jsonl\ninner: {k: 3}\n")
    c = load_config(Outer, p, ["--inner.k", "7", "--limit=2", "--fast", "--inner.name", "123", "--mode", "b",
                               "--inner.ratio", "1", "--inner.tags", "[a, b]"])
    assert (c.inner.k, c.limit, c.fast, c.inner.name, c.mode, c.inner.ratio, c.inner.tags) == (7, 2, True, "123", "b", 1.0, ["a", "b"])
    assert load_config(Outer, p, ["--limit", "null"]).limit is None
    assert load_config(Outer, None, ["--path", "x"]).path == "x"


def test_exponent_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 reads 1e-3 as a string; a float field takes it as the number, a string field keeps it
    p = write(tmp_path, "path: data.jsonl\ninner: {ratio: 1e-3, name: 2e5}\n")
    c = load_config(Outer, p, [])
    assert c.inner.ratio == 0.001 and c.inner.name == "2e5"
    assert load_config(Outer, p, ["--inner.ratio", "-5E+2"]).inner.ratio == -500.0
    with pytest.raises(ConfigError, match="inner.ratio"):
        load_config(Outer, p, ["--inner.ratio", "1e-3x"])


def test_aliases():
    assert parse_overrides(["--limit", "4"], {"limit": "inner.k"}) == {"inner.k": "4"}
    assert load_config(Outer, None, ["--path", "x", "--limit", "4"], aliases={"limit": "inner.k"}).inner.k == 4


def test_round_trip_through_yaml(tmp_path):
    c = Outer(path="p", inner=Inner(k=2, tags=["t"]), limit=3, out=Path("o"), fast=True, mode="b", roles={"a": 1}, pair=(5, 6))
    assert load_config(Outer, write(tmp_path, dump_config(c))) == c


@pytest.mark.parametrize(
    "text, args, match",
    [
        ("path: p\ninner: {kk: 3}\n", [], r"c\.yaml: unknown key 'inner\.kk' for Inner \(did you mean 'inner\.k'\?\)"),
        ("path: p\nbogus: 1\n", [], r"c\.yaml: unknown key 'bogus'"),
        ("path: p\n", ["--inner.nope", "1"], r"command line \(--inner\.nope\): unknown key 'inner\.nope'"),
        ("path: p\ninner: {k: three}\n", [], r"c\.yaml: inner\.k: expected an integer, got 'three'"),
        ("path: p\n", ["--inner.k", "three"], r"command line \(--inner\.k\): inner\.k: expected an integer"),
        ("path: p\nfast: 1\n", [], r"c\.yaml: fast: expected true or false"),
        ("path: p\nmode: c\n", [], r"c\.yaml: mode: expected one of \['a', 'b'\]"),
        ("path: p\ninner: 3\n", [], r"c\.yaml: inner: expected a mapping of Inner"),
        ("path: p\nlimit: x\n", [], r"c\.yaml: limit: expected"),
        ("path: p\ninner: {tags: x}\n", [], r"inner\.tags: expected a list"),
        ("path: p\npair: [1]\n", [], r"pair: expected 2 items"),
        ("inner: {k: 3}\n", [], r"c\.yaml: missing required key 'path'"),
        ("path: p\nlimit: -1\n", [], r"c\.yaml: .*limit must be >= 0"),
        ("- a\n- b\n", [], r"c\.yaml: expected a mapping at the top level"),
        ("path: [unclosed\n", [], r"c\.yaml:2:1: not valid YAML"),
    ],
)
def test_errors_name_key_and_source(tmp_path, text, args, match):
    with pytest.raises(ConfigError, match=match):
        load_config(Outer, write(tmp_path, text), args)


def test_bad_command_line():
    with pytest.raises(ConfigError, match="expected --key value"):
        parse_overrides(["limit", "3"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(Outer, "/nonexistent/c.yaml")


@dataclass
class Parent:
    """A parent whose nested defaults differ from the nested classes' own defaults."""

    inner: Inner = field(default_factory=lambda: Inner(k=9, name="dense", tags=["t"]))
    maybe: Optional[Inner] = None
    outer: Outer = field(default_factory=lambda: Outer(path="p", inner=Inner(k=1, ratio=0.25), limit=4))


def test_nested_section_starts_from_the_parents_default(tmp_path):
    # an override of one nested key keeps the parent's other defaults (not the nested class's)
    c = load_config(Parent, None, ["--inner.k", "4"])
    assert c.inner == Inner(k=4, name="dense", tags=["t"])
    # the same from a YAML section, two levels deep, and YAML plus an override together
    c = load_config(Parent, write(tmp_path, "outer:\n  inner: {name: x}\n"), ["--outer.fast"])
    assert c.outer == Outer(path="p", inner=Inner(k=1, name="x", ratio=0.25), limit=4, fast=True)
    assert c.inner == Inner(k=9, name="dense", tags=["t"])
    # a whole section as one command-line value
    assert load_config(Parent, None, ["--inner", "{ratio: 2}"]).inner == Inner(k=9, name="dense", ratio=2.0, tags=["t"])
    # a section whose default is None is built from the class's defaults
    assert load_config(Parent, None, ["--maybe.k", "2"]).maybe == Inner(k=2)
    # nothing given: exactly the defaults, and each load gets its own objects
    a, b = load_config(Parent), load_config(Parent)
    assert a == Parent() and a.inner.tags is not b.inner.tags


def test_nested_section_from_default_still_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"command line \(--outer\.limit\): .*limit must be >= 0"):
        load_config(Parent, None, ["--outer.limit", "-1"])
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown key 'inner\.kk' for Inner"):
        load_config(Parent, write(tmp_path, "inner: {kk: 1}\n"))


def test_parse_recipe_args():
    from knowtrace_train.config import RecipeArgs, parse_recipe_args

    args = parse_recipe_args(["--config", "c.yaml", "--inner.k", "3", "--quiet", "--fast"], "Doc line.\nMore.", "YAML")
    assert args == RecipeArgs(config="c.yaml", quiet=True, overrides=["--inner.k", "3", "--fast"])
    assert parse_recipe_args([], None, "YAML") == RecipeArgs(config=None, quiet=False, overrides=[])
    # the overrides are what load_config takes
    assert load_config(Outer, None, ["--path", "p", *args.overrides]).inner.k == 3


def test_run_recipe_reports_config_errors(tmp_path, capsys):
    from knowtrace_train.config import run_recipe

    seen = []

    def run(config, args):
        seen.append((config, args.quiet))
        return 0

    load = lambda path, overrides: load_config(Outer, path, overrides)  # noqa: E731
    assert run_recipe(["--path", "p", "--limit", "3", "--quiet"], "Doc.", "YAML", load, run) == 0
    assert seen == [(Outer(path="p", limit=3), True)]
    bad = write(tmp_path, "path: p\ninner: {kk: 1}\n")
    assert run_recipe(["--config", str(bad)], "Doc.", "YAML", load, run) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: ") and str(bad) in err and "inner.kk" in err

    def refuses(config, args):
        raise ConfigError("runs/x: started with another config")

    assert run_recipe(["--path", "p"], "Doc.", "YAML", load, refuses) == 2
    assert "config error: runs/x: started with another config" in capsys.readouterr().err


# -- help metadata on the shipped config classes -------------------------------------------------------------


def _reachable_config_classes() -> list[type]:
    """Every dataclass a field of SelfTrainConfig or EvalConfig leads to (nested sections, and for a
    tagged section such as `strategy` its declared class and every registered method's config class)."""
    import dataclasses
    import typing

    from knowtrace_train.config import TaggedConfig
    from knowtrace_train.compare import CompareConfig
    from knowtrace_train.evaluate import EvalConfig
    from knowtrace_train.methods import METHODS
    from knowtrace_train.selftrain.config import SelfTrainConfig

    seen: list[type] = []
    todo: list[type] = [SelfTrainConfig, EvalConfig, CompareConfig]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for tp in typing.get_type_hints(cls).values():
            for arm in (tp, *typing.get_args(tp)):
                if dataclasses.is_dataclass(arm) and isinstance(arm, type):
                    todo.append(arm)
                    if issubclass(arm, TaggedConfig):
                        todo.extend(m.config_class for m in METHODS.values())
    return seen


def test_reachable_config_classes_are_the_shipped_ones():
    names = {c.__name__ for c in _reachable_config_classes()}
    assert names >= {
        "SelfTrainConfig", "DataConfig", "BootstrapConfig", "CorpusConfig", "DatasetConfig", "EvalConfig",
        "RetrieverConfig", "GeneratorConfig", "LoraTrainConfig", "StrategyConfig", "KnowTraceConfig",
        "FewShotConfig", "MaxNewTokensConfig", "RoleConfig",
    }


@pytest.mark.parametrize("cls", _reachable_config_classes(), ids=lambda c: c.__name__)
def test_every_config_field_has_a_default_and_a_one_line_help(cls):
    import dataclasses

    missing = []
    for f in dataclasses.fields(cls):
        text = f.metadata.get("help")
        if not isinstance(text, str) or not text.strip() or "\n" in text:
            missing.append(f.name)
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, f.name
    assert not missing, f"{cls.__name__}: no one-line metadata['help'] on {missing}"


# -- config_help and the recipes' --help ----------------------------------------------------------------------


def test_config_help_walks_nested_sections_from_the_parents_defaults():
    from knowtrace_train.config import config_help

    rows = {key: (default, text) for key, default, text in config_help(Parent)}
    # the nested sections show the parent's default instances, not the nested classes' own defaults
    assert rows["inner.k"] == ("9", "") and rows["inner.name"] == ("dense", "") and rows["inner.tags"] == ("[t]", "")
    assert rows["outer.inner.k"][0] == "1" and rows["outer.inner.ratio"][0] == "0.25" and rows["outer.limit"][0] == "4"
    assert rows["outer.path"][0] == "p" and rows["outer.out"][0] == "null" and rows["outer.pair"][0] == "[1, 2]"
    assert "inner" not in rows and "outer" not in rows and "outer.inner" not in rows  # sections are not keys
    assert [k for k, _, _ in config_help(Inner, prefix="x")] == ["x.k", "x.name", "x.ratio", "x.tags"]


def test_config_help_of_the_selftrain_config():
    from knowtrace_train.config import config_help
    from knowtrace_train.selftrain.config import SelfTrainConfig

    rows = {key: (default, text) for key, default, text in config_help(SelfTrainConfig)}
    assert rows["bootstrap.train.learning_rate"][0] == "0.001" and rows["train.learning_rate"][0] == "0.0003"
    assert rows["strategy.max_rounds"][0] == "3"  # SelfTrainConfig's strategy, not KnowTraceConfig's 5
    assert rows["strategy.name"][0] == "knowtrace" and rows["strategy.path_rule"][0] == "backward"  # the tagged class's keys
    assert rows["strategy.max_new_tokens.explore"][0] == "96" and rows["strategy.fewshot.explore"][0] == "true"
    assert rows["data.train_questions"][0] == "32" and rows["data.train_questions"][1].startswith("D, rollout questions")
    assert rows["output_dir"][0] == "null" and rows["grid"][0] == "{}" and rows["retriever.cache_dir"][0] == "''"
    assert all(text for _, text in rows.values())


def _recipe(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_recipe", Path(__file__).resolve().parents[1] / "recipes" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("recipe", ["selftrain", "evaluate"])
def test_recipe_help_lists_every_key_with_its_default_and_help(recipe, capsys):
    from knowtrace_train.config import config_help
    from knowtrace_train.evaluate import EvalConfig
    from knowtrace_train.selftrain.config import SelfTrainConfig

    with pytest.raises(SystemExit) as exit_info:
        _recipe(recipe).main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out and "--quiet" in out
    lines = out.splitlines()
    rows = config_help(SelfTrainConfig if recipe == "selftrain" else EvalConfig)
    assert len(rows) > 60
    for key, default, text in rows:
        line = next((ln.strip() for ln in lines if ln.strip().startswith(f"--{key}  ")), None)
        assert line == f"--{key}  (default: {default})  {text}", (key, line)
    if recipe == "selftrain":
        assert any(ln.strip().startswith("--bootstrap.train.learning_rate  (default: 0.001)") for ln in lines)
        assert any(ln.strip().startswith("--train.learning_rate  (default: 0.0003)") for ln in lines)


# -- the shipped YAML files name only what differs from the dataclasses ---------------------------------------

CONFIGS = Path(__file__).resolve().parents[1] / "recipes" / "configs"


def _keys_at_their_default(data, loaded, default, prefix=""):
    """The dotted keys of the YAML mapping `data` whose loaded value equals the default it replaces, and
    its empty sections. A section starts from the parent's default for it (or, where a tagged section
    names another class, from that class's defaults), as loading does."""
    import dataclasses

    found = []
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        value, base = getattr(loaded, k), getattr(default, k)
        if isinstance(v, dict) and dataclasses.is_dataclass(value):
            if not v:
                found.append(key)
            same = type(base) is type(value)
            sub = _keys_at_their_default(v, value, base if same else type(value)(), key)
            # a tagged section's `name` that picks another class than the default's is never redundant
            found += sub if same else [s for s in sub if s != f"{key}.name"]
        elif value == base:
            found.append(key)
    return found


def _config_class(path: Path) -> type:
    from knowtrace_train.compare import CompareConfig
    from knowtrace_train.evaluate import EvalConfig
    from knowtrace_train.selftrain.config import SelfTrainConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "lab"))
    from fair import FairConfig  # scripts/lab/fair.py

    if path.name.startswith("compare_") and "runs" in (yaml.safe_load(path.read_text()) or {}):
        return FairConfig  # the fair table's configs name run folders (scripts/compare_methods.py reads them)
    classes = {"selftrain_": SelfTrainConfig, "eval_": EvalConfig, "compare_": CompareConfig}
    return next(cls for prefix, cls in classes.items() if path.name.startswith(prefix))


def test_the_redundancy_check_finds_defaults(tmp_path):
    from knowtrace_train.selftrain.config import SelfTrainConfig

    data = {"iterations": 2, "train": {"learning_rate": 3.0e-4, "rank": 8}, "strategy": {"max_rounds": 3, "passages": 5},
            "bootstrap": {"train": {"learning_rate": 1.0e-3}}, "retriever": {}}
    path = tmp_path / "selftrain_x.yaml"
    path.write_text(yaml.safe_dump(data))
    loaded = load_config(SelfTrainConfig, path)
    assert _keys_at_their_default(data, loaded, SelfTrainConfig()) == [
        "iterations", "train.learning_rate", "strategy.max_rounds", "bootstrap.train.learning_rate", "retriever"]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_name_only_what_differs_from_the_defaults(path):
    cls = _config_class(path)
    data = yaml.safe_load(path.read_text()) or {}
    assert _keys_at_their_default(data, load_config(cls, path), cls()) == [], f"{path.name}: keys at their {cls.__name__} default"


def test_a_user_error_is_one_line_and_debug_brings_the_traceback_back(tmp_path, capsys, monkeypatch):
    """A data file, a corpus, a run folder, a model: every `UserError` prints its line and exits 2;
    `--debug` (or KNOWTRACE_DEBUG=1) re-raises it; the program's own errors are never swallowed."""
    from knowtrace_train.config import run_recipe
    from knowtrace_train.io import DataFileError

    def bad_data(config, args):
        raise DataFileError("/tmp/bad/mal.jsonl:2: not valid JSON (Expecting value at column 1)")

    load = lambda path, overrides: load_config(Outer, path, overrides)  # noqa: E731
    assert run_recipe(["--path", "p"], "Doc.", "YAML", load, bad_data) == 2
    err = capsys.readouterr().err
    assert err.startswith("data error: /tmp/bad/mal.jsonl:2: not valid JSON") and err.count("\n") == 1
    assert "--debug" in err
    with pytest.raises(DataFileError):
        run_recipe(["--path", "p", "--debug"], "Doc.", "YAML", load, bad_data)
    monkeypatch.setenv("KNOWTRACE_DEBUG", "1")
    with pytest.raises(DataFileError):
        run_recipe(["--path", "p"], "Doc.", "YAML", load, bad_data)
    monkeypatch.delenv("KNOWTRACE_DEBUG")

    def bug(config, args):
        raise KeyError("a bug of the program's own")

    with pytest.raises(KeyError):
        run_recipe(["--path", "p"], "Doc.", "YAML", load, bug)


def test_user_errors_wraps_a_scripts_main(capsys):
    from knowtrace_train.errors import MissingExtraError, user_errors

    @user_errors
    def main(argv=None):
        assert "--debug" not in argv  # taken off before the script's own parser sees it
        raise MissingExtraError("a figure needs matplotlib: pip install 'knowtrace-train[plot]'")

    assert main(["x"]) == 2
    assert capsys.readouterr().err.startswith("missing extra: a figure needs matplotlib: pip install 'knowtrace-train[plot]'")
    with pytest.raises(MissingExtraError):
        main(["x", "--debug"])


@pytest.mark.parametrize("command", [
    ["recipes/selftrain.py", "--data.dev", "{bad}", "--output_dir", "{tmp}/run"],
    ["recipes/evaluate.py", "--config", "recipes/configs/eval_world.yaml", "--dataset.path", "{bad}", "--output", "{tmp}/e.jsonl"],
    ["scripts/eval_retrieval.py", "--data", "{bad}"],
])
def test_a_malformed_data_file_ends_in_one_line_without_a_traceback(tmp_path, command):
    """The issue's example, as a user meets it: a malformed JSONL line in a data file given on the command line."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    bad = tmp_path / "mal.jsonl"
    bad.write_text('{"id": "q1", "question": "Who?", "answers": ["x"]}\n{oops\n', encoding="utf-8")
    argv = [a.format(bad=bad, tmp=tmp_path) for a in command]
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=repo, timeout=300,
                       env={**os.environ, "KNOWTRACE_DEBUG": ""})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("data error: ") and f"{bad}:2: not valid JSON" in last
