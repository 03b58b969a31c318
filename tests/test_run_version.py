"""A run folder made by another version of the code (issue 64 item 4): config.yaml's launch record names the package
version and the checkout's commit; a resume under another package version is refused in one line naming both,
unless --resume_anyway; another commit of the same version, or a folder that names no version, is only warned about."""

from __future__ import annotations

import logging
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import knowtrace_train
from knowtrace_train.config import load_config
from knowtrace_train.errors import RunError
from knowtrace_train.selftrain import check_same_config
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.selftrain.folder import code_version, run_config_text

REPO = Path(__file__).resolve().parents[1]


def _folder(tmp_path: Path, version: dict | None) -> tuple[SelfTrainConfig, Path]:
    cfg = SelfTrainConfig(output_dir=str(tmp_path))
    saved = tmp_path / "config.yaml"
    data = yaml.safe_load(run_config_text(cfg, 1))
    if version is None:
        data["launch"].pop("version")
    else:
        data["launch"]["version"] = version
    saved.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg, saved


def test_the_launch_record_names_the_version():
    v = yaml.safe_load(run_config_text(SelfTrainConfig(), 1))["launch"]["version"]
    assert v["package"] == knowtrace_train.__version__
    if (REPO / ".git").exists():  # a checkout (a clone's folder or a worktree's file): its HEAD
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert v["commit"] == head.strip() and re.fullmatch(r"[0-9a-f]{40}", v["commit"])


def test_another_package_version_is_refused_unless_resume_anyway(tmp_path, caplog):
    cfg, saved = _folder(tmp_path, {"package": "0.0.1", "commit": "abcdef1234567890"})
    with pytest.raises(RunError, match=rf"made by knowtrace-train 0\.0\.1 \(commit abcdef123456\) and this is "
                                       rf"knowtrace-train {re.escape(knowtrace_train.__version__)}.*--resume_anyway"):
        check_same_config(cfg, saved, 1)
    anyway = load_config(SelfTrainConfig, None, ["--output_dir", str(tmp_path), "--resume_anyway"])
    assert anyway.resume_anyway is True
    with caplog.at_level(logging.WARNING):
        check_same_config(anyway, saved, 1)  # the flag is not a config change either
    assert "(--resume_anyway)" in caplog.text


def test_another_commit_or_no_record_is_only_warned_about(tmp_path, caplog):
    cfg, saved = _folder(tmp_path, {"package": knowtrace_train.__version__, "commit": "0" * 40})
    with caplog.at_level(logging.WARNING):
        check_same_config(cfg, saved, 1)
    if code_version()["commit"]:
        assert "the same package version, another commit" in caplog.text
    caplog.clear()
    cfg, saved = _folder(tmp_path, None)
    with caplog.at_level(logging.WARNING):
        check_same_config(cfg, saved, 1)
    assert "names no version" in caplog.text


def test_the_recipe_refuses_in_one_line(tmp_path, tiny_model_dir):
    """As a user meets it: the recipe on a folder another version made, one line and exit 2; --resume_anyway goes on."""
    from test_user_errors import _assert_one_line, _run, _selftrain_args

    cmd = [str(REPO / "recipes" / "selftrain.py"),
           *_selftrain_args(tmp_path, tiny_model_dir, "old", **{"bootstrap.mode": "never", "eval_base": False})]
    saved = tmp_path / "old" / "config.yaml"
    saved.parent.mkdir()
    cfg = load_config(SelfTrainConfig, None, cmd[1:])
    saved.write_text(run_config_text(cfg, 1).replace(f"package: {knowtrace_train.__version__}", "package: 0.0.1"))
    _assert_one_line(_run(cmd, tmp_path), "run error", "made by knowtrace-train 0.0.1", "another version")
    r = _run([*cmd, "--resume_anyway"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(--resume_anyway)" in r.stderr
