"""Every failure a user causes is one line on stderr and exit status 2 (issue 64 item 5), swept over the recipes and
scripts: each situation below runs the command as a user would (a subprocess, the tiny model, small sizes) and its
stderr must end in `<label>: <message>` with no traceback. The program's own errors keep theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from selftrain_helpers import tiny_overrides

REPO = Path(__file__).resolve().parents[1]


def _selftrain_args(tmp: Path, model: Path, name: str, other_method: bool = False, **values) -> list[str]:
    args = tiny_overrides(tmp, model, output_dir=str(tmp / name), iterations=0, **values)
    if other_method:  # another method's strategy has none of KnowTrace's strategy.* keys
        pairs = [args[i:i + 2] for i in range(0, len(args), 2)]
        args = [a for p in pairs if not p[0].startswith("--strategy.") or p[0] == "--strategy.name" for a in p]
    return args


def _unrelated_corpus(tmp: Path) -> Path:
    """A corpus that holds none of the questions' evidence."""
    path = tmp / "unrelated_corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"x{i}", "title": f"Nothing {i}",
                                        "text": f"Filler passage {i} about nothing at all."}) + "\n" for i in range(30)))
    return path


def _empty(path: Path) -> Path:
    path.write_text("")
    return path


def _situations(tmp: Path, model: Path) -> dict[str, tuple[list[str], str, str]]:
    """name -> (command after `python`, the line's label, what the line says)."""
    selftrain = str(REPO / "recipes" / "selftrain.py")
    evaluate = [str(REPO / "recipes" / "evaluate.py"), "--config", str(REPO / "recipes/configs/eval_world.yaml"),
                "--generator.model", str(model)]
    nowhere = str(tmp / "no_such_run")
    return {
        # the issue's own: TRACE's gold chains cannot follow the world's unsupported hops
        "no gold trajectory": ([selftrain, *_selftrain_args(tmp, model, "trace", other_method=True, mode="star",
                                                              **{"strategy.name": "trace", "bootstrap.questions": 4,
                                                                 "data.train_questions": 32})],
                               "run error", "bootstrap: no gold trajectory could be built from 4 train questions"),
        "a corpus without the questions' evidence": (
            [selftrain, *_selftrain_args(tmp, model, "corpus", **{"data.corpus.path": str(_unrelated_corpus(tmp))})],
            "run error", "no gold trajectory could be built"),
        "more train questions than the split holds": (
            [selftrain, *_selftrain_args(tmp, model, "many", **{"data.train_questions": 100000})],
            "run error", "data.train_questions is 100000 but"),
        "a method without the mode asked for": (
            [selftrain, *_selftrain_args(tmp, model, "mode", other_method=True, mode="backtrace", **{"strategy.name": "ircot"})],
            "config error", "mode must be one of"),
        "a corpus file missing": (
            [selftrain, *_selftrain_args(tmp, model, "nocorpus", **{"data.corpus.path": str(tmp / "gone.jsonl")})],
            "config error", "data.corpus.path: no such file"),
        "selftrain: an empty dev file": (
            [selftrain, *_selftrain_args(tmp, model, "nodev", **{"data.dev": str(_empty(tmp / "dev.jsonl"))})],
            "data error", "empty file"),
        "an empty dev split": ([*evaluate, "--limit", "0", "--output", str(tmp / "e.jsonl")],
                               "run error", "no question to evaluate (dataset.limit is 0)"),
        "evaluate: not a run folder": ([*evaluate, "--run", nowhere], "config error", "not a self-training run folder"),
        "export: no adapters": ([str(REPO / "scripts" / "export.py"), nowhere], "export error",
                                "no iter_<z>/adapters/<role>/ folder with adapters"),
        "report: no such run": ([str(REPO / "scripts" / "report.py"), nowhere, "--out", str(tmp / "r.html")],
                                "error", "no such run folder or trajectory file"),
        "compare: not a run": ([str(REPO / "scripts" / "compare_runs.py"), nowhere, nowhere + "2"],
                               "error", "no summary.json"),
    }


def _run(cmd: list[str], tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "KNOWTRACE_CACHE": str(tmp / "cache")}
    env.pop("KNOWTRACE_DEBUG", None)
    return subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=REPO, timeout=600, env=env)


def _assert_one_line(r: subprocess.CompletedProcess, label: str, says: str, name: str) -> None:
    assert r.returncode == 2, f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, f"{name}:\n{r.stderr[-3000:]}"
    # the log's lines (INFO/WARNING ...) may come before; the failure is the last line, and the only other one
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith(("INFO ", "WARNING ", "DEBUG "))]
    lines = [ln for ln in lines if "it/s]" not in ln and "s/it]" not in ln]  # progress bars of model loading
    assert len(lines) == 1, f"{name}: {lines}"
    assert lines[0].startswith(f"{label}: ") and says in lines[0], f"{name}: {lines[0]}"


@pytest.mark.slow
def test_every_user_caused_failure_is_one_line_and_exit_2(tmp_path, tiny_model_dir):
    results = {}
    for name, (cmd, label, says) in _situations(tmp_path, tiny_model_dir).items():
        r = _run(cmd, tmp_path)
        _assert_one_line(r, label, says, name)
        results[name] = r.stderr.strip().splitlines()[-1][:160]
    print(json.dumps(results, indent=1))


@pytest.mark.slow
def test_data_files_changed_under_a_run_is_one_line(tmp_path, tiny_model_dir):
    """A run folder resumed after its data file changed: refused at run time, one line, exit 2."""
    train = tmp_path / "train.jsonl"
    rows = (REPO / "data/world/train.jsonl").read_text().splitlines(keepends=True)
    train.write_text("".join(rows))
    cmd = [str(REPO / "recipes" / "selftrain.py"),
           *_selftrain_args(tmp_path, tiny_model_dir, "changed", **{"data.train": str(train), "bootstrap.mode": "never",
                                                                    "eval_base": False})]
    assert _run(cmd, tmp_path).returncode == 0
    train.write_text("".join(rows[1:] + rows[:1]))  # other questions picked by the same seeded shuffle
    _assert_one_line(_run(cmd, tmp_path), "run error", "the content of data.train", "changed data")  # inputs.json (issue 79)


def test_the_programs_own_errors_keep_their_traceback(monkeypatch, tmp_path):
    from knowtrace_train.commands import selftrain
    from knowtrace_train.errors import RunError, UserError

    assert issubclass(RunError, UserError) and issubclass(RunError, ValueError)

    def bug(config, args):
        raise KeyError("a bug")

    monkeypatch.setattr(selftrain, "run", bug)
    with pytest.raises(KeyError):
        selftrain.main(["--output_dir", str(tmp_path / "x")])


@pytest.mark.slow
def test_a_finished_stage_whose_file_was_corrupted_is_refused_in_one_line(tmp_path, tiny_model_dir):
    """A run folder resumed after a finished stage's file changed (the same size: a size check would pass it):
    refused, the file named, exit 2; removing the stage's marker, as the line says, redoes it."""
    cmd = [str(REPO / "recipes" / "selftrain.py"),
           *_selftrain_args(tmp_path, tiny_model_dir, "corrupt", **{"bootstrap.mode": "never"})]
    assert _run(cmd, tmp_path).returncode == 0
    trajs = tmp_path / "corrupt" / "base" / "eval.jsonl"
    data = trajs.read_bytes()
    i = data.index(b'"question": "') + len(b'"question": "')  # one letter of the first question's text
    trajs.write_bytes(data[:i] + (b"Y" if data[i:i + 1] != b"Y" else b"Z") + data[i + 1:])
    r = _run(cmd, tmp_path)
    _assert_one_line(r, "run error", f"{trajs} no longer has the SHA-256 its marker recorded", "corrupt file")
    (tmp_path / "corrupt" / "base" / "DONE.eval").unlink()  # the user's call, as the line says
    assert _run(cmd, tmp_path).returncode == 0 and (tmp_path / "corrupt" / "base" / "DONE.eval").is_file()
