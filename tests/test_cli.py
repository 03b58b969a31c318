"""The `knowtrace-train` console script (knowtrace_train/cli.py): every subcommand's --help, the top-level usage, an
unknown command, the recipes and scripts as wrappers of the same mains, and `data stats` for real. The whole
self-training run through it is tests/test_console_run.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from knowtrace_train import cli

REPO = Path(__file__).resolve().parents[1]

#: each command and options its --help must name
HELP = {
    "selftrain": ["--config", "--quiet", "--iterations", "--mode", "--report_to", "--run_name", "--seeds"],
    "evaluate": ["--config", "--quiet", "--run", "--iteration", "--dataset.path", "--output"],
    "report": ["RUN_OR_ROLLOUTS", "--out", "--data", "--corpus", "--title"],
    "export": ["run", "--iteration", "--prompts", "--max-new-tokens", "--tie-tolerance"],
    "compare": ["runs", "--out", "--kind", "--upto", "--arm"],
    "data": ["stats", "build-corpus"],
    "doctor": ["--size", "--out", "--keep", "--skip"],
}


@pytest.mark.parametrize("command", list(HELP))
def test_every_subcommand_has_its_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: knowtrace-train {command} ")
    missing = [o for o in HELP[command] if o not in out]
    assert not missing, missing


def test_the_usage_lists_every_command_and_an_unknown_one_is_one_line(capsys):
    assert set(HELP) == set(cli.COMMANDS)
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: knowtrace-train <command>") and all(f"\n  {c} " in out for c in HELP)
    assert cli.main([]) == 2 and capsys.readouterr().err.startswith("usage: knowtrace-train")
    assert cli.main(["selftrian"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no command 'selftrian'" in err[0] and "selftrain" in err[0]
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.startswith("knowtrace-train ")


def test_the_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"] == {"knowtrace-train": "knowtrace_train.cli:main"}


def _load(path: str):
    spec = importlib.util.spec_from_file_location(f"wrapper_{Path(path).stem}", REPO / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("path,command", [
    ("recipes/selftrain.py", "selftrain"), ("recipes/evaluate.py", "evaluate"), ("scripts/report.py", "report"),
    ("scripts/export.py", "export"), ("scripts/compare_runs.py", "compare"), ("scripts/doctor.py", "doctor")])
def test_the_recipes_and_scripts_run_the_commands_mains(path, command):
    module = importlib.import_module(cli.COMMANDS[command][0])
    assert _load(path).main is module.main
    assert module.__doc__.split("\n")[0] == _load(path).__doc__.split("\n")[0]  # the description --help shows


def test_data_stats_runs_for_real_as_python_m_knowtrace_train_data_does(capsys):
    from knowtrace_train.data.__main__ import main as data_main

    dev = str(REPO / "data" / "world" / "dev.jsonl")
    assert cli.main(["data", "stats", dev]) == 0
    ours = capsys.readouterr().out
    assert data_main(["stats", dev]) == 0
    assert capsys.readouterr().out == ours
    counts = json.loads(ours.strip().splitlines()[-1])
    assert counts["items"] > 0 and counts["skipped"] == 0
