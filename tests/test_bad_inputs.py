"""The careless user's sweep as a table (issue 79): every bad input below, given to a command as a user types it, ends
with ONE line on stderr, exit status 2, no traceback, and nothing half-written left behind (no run folder's
config.yaml, no report, no output file). Each command runs in-process (its `main(argv)`), and every case stops
before any model loads: the module runs in seconds.

Beside it, Hypothesis feeds arbitrary bytes to the readers a user's files go through (the YAML config loader, the
data, corpus and trajectory readers): each gives a clean `UserError` or a valid result, never another exception.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "data" / "world"
LOG_PREFIXES = ("INFO ", "WARNING ", "DEBUG ")


# -- the bad files ------------------------------------------------------------------------------------------------


def _safetensors(path: Path, header: dict, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _model(folder: Path, config: bytes = b'{"model_type": "llama"}', weights: Callable[[Path], None] | None = None) -> Path:
    """A model folder as is_model_folder sees one: config.json, a safetensors file, a tokenizer."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(config)
    (folder / "tokenizer.json").write_text("{}")
    (weights or (lambda p: _safetensors(p, {"__metadata__": {}})))(folder / "model.safetensors")
    return folder


class Bad:
    """The workspace of bad inputs (tmp_path)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.binary = self._write("binary.bin", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
        self.latin1_yaml = self._write("latin1.yaml", "name: caf\u00e9\n".encode("latin-1"))
        self.dup_yaml = self._write("dup.yaml", b"iterations: 1\ndata:\n  seed: 1\n  seed: 2\n")
        self.bad_yaml = self._write("bad.yaml", b"iterations: [1\n")
        self.list_yaml = self._write("list.yaml", b"- a\n- b\n")
        self.empty = self._write("empty.jsonl", b"")
        rows = (WORLD / "dev.jsonl").read_bytes().splitlines(keepends=True)
        first = json.loads(rows[0])
        self.hops = self._write("hops.jsonl", (json.dumps({**first, "hops": "two"}) + "\n").encode() + b"".join(rows[1:]))
        self.answers = self._write("answers.jsonl", (json.dumps({**first, "answers": "Paris"}) + "\n").encode())
        self.latin1_jsonl = self._write("latin1.jsonl", rows[0].replace(b"University", b"Universit\xe9") + b"".join(rows[1:]))
        self.cut_jsonl = self._write("cut.jsonl", rows[0][:40] + b"\n" + b"".join(rows[1:]))
        self.a_file = self._write("a_file.txt", b"not a folder\n")
        self.folder = tmp / "a_folder"
        self.folder.mkdir()
        self.nowhere = tmp / "no_such_thing"
        # damaged models
        self.model_ok = _model(tmp / "model_ok")
        self.model_bad_config = _model(tmp / "model_bad_config", config=b"{\"architectures\": [")
        self.model_cut = _model(tmp / "model_cut", weights=lambda p: _safetensors(
            p, {"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}, b"\0" * 100))
        self.model_random = _model(tmp / "model_random", weights=lambda p: p.write_bytes(bytes(range(200, 256)) * 50))
        self.gguf = self._write("model.gguf", b"this is a text file, not a model\n")

    def _write(self, name: str, data: bytes) -> Path:
        path = self.tmp / name
        path.write_bytes(data)
        return path

    def run_folder(self, name: str, iterations: int = 1, **extra: str) -> Path:
        """A run folder whose config.yaml a rerun of `selftrain_args(name, ...)` accepts."""
        from knowtrace_train.commands.selftrain import load
        from knowtrace_train.selftrain.folder import run_config_text

        folder = self.tmp / name
        folder.mkdir()
        config = load(None, self.selftrain_args(name, iterations=iterations))
        (folder / "config.yaml").write_text(run_config_text(config, 1))
        for file, text in extra.items():
            (folder / file).write_text(text)
        return folder

    def selftrain_args(self, name: str, **values) -> list[str]:
        values = {"output_dir": str(self.tmp / name), "generator.model": str(self.model_ok), "reuse": False,
                  "data.train_questions": 6, "data.dev_questions": 4, "bootstrap.questions": 4, **values}
        return [a for k, v in values.items() for a in (f"--{k}", str(v))]


# -- the table ----------------------------------------------------------------------------------------------------

#: name -> (command, argv builder, what the one line must say, paths (builders) that must not exist afterwards)
Case = tuple[str, Callable[[Bad], list[str]], str, Callable[[Bad], list[Path]]]


def _none(b: Bad) -> list[Path]:
    return []


def _st(name: str, says: str, **values) -> tuple[str, Case]:
    """A selftrain case with the small sizes, writing into tmp/<name>; its config.yaml must not be left."""
    key = name.replace(" ", "_").replace("/", "_")
    return name, ("selftrain", lambda b: b.selftrain_args(key, **{k: v(b) if callable(v) else v for k, v in values.items()}),
                  says, lambda b: [b.tmp / key / "config.yaml"])


def _eval(*argv: Callable[[Bad], str] | str) -> Callable[[Bad], list[str]]:
    return lambda b: ["--config", str(REPO / "recipes/configs/eval_world.yaml"), "--generator.model", str(b.model_ok),
                      *[a(b) if callable(a) else a for a in argv]]


def _args(*argv: Callable[[Bad], str] | str) -> Callable[[Bad], list[str]]:
    return lambda b: [a(b) if callable(a) else a for a in argv]


def _p(attr: str, *tail: str) -> Callable[[Bad], str]:
    return lambda b: str(Path(getattr(b, attr), *tail))


def _trajectory_line() -> str:
    from knowtrace_train.trajectory import Trajectory

    return json.dumps(Trajectory(id="q1/0", question_id="q1", question="Who?", answers=["x"], dataset="world", strategy="knowtrace").to_dict())


CASES: dict[str, Case] = dict([
    # selftrain: its config file
    ("selftrain: a binary --config", ("selftrain", _args("--config", _p("binary")), "not UTF-8 text", _none)),
    ("selftrain: a Latin-1 --config", ("selftrain", _args("--config", _p("latin1_yaml")), "latin1.yaml: not UTF-8 text (byte 0xe9", _none)),
    ("selftrain: a key given twice", ("selftrain", _args("--config", _p("dup_yaml")), "dup.yaml:4: key 'seed' given twice (first on line 3)", _none)),
    ("selftrain: YAML that does not parse", ("selftrain", _args("--config", _p("bad_yaml")), "bad.yaml:2:1: not valid YAML", _none)),
    ("selftrain: a YAML list", ("selftrain", _args("--config", _p("list_yaml")), "expected a mapping at the top level", _none)),
    ("selftrain: a folder as --config", ("selftrain", _args("--config", _p("folder")), "a folder, not a YAML file", _none)),
    ("selftrain: no such --config", ("selftrain", _args("--config", _p("nowhere")), "cannot read", _none)),
    # selftrain: values
    ("selftrain: --iterations with no value", ("selftrain", _args("--iterations"), "--iterations needs a value", _none)),
    ("selftrain: --iterations abc", ("selftrain", _args("--iterations", "abc"), "command line (--iterations): iterations: expected an integer", _none)),
    ("selftrain: --iterations -1", ("selftrain", _args("--iterations", "-1"), "iterations must be >= 0", _none)),
    ("selftrain: an unknown key", ("selftrain", _args("--iteratons", "2"), "iteratons", _none)),
    ("selftrain: --data.dev_questions -1", ("selftrain", _args("--data.dev_questions", "-1"), "data.dev_questions must be >= 1", _none)),
    ("selftrain: a command-line value is not blamed on the defaults",
     ("selftrain", _args("--mode", "nosuch"), "command line", _none)),
    # selftrain: data
    _st("selftrain: a binary data.dev", "binary.bin:1: not UTF-8 text", **{"data.dev": _p("binary")}),
    _st("selftrain: a Latin-1 data.dev", "latin1.jsonl:1: not UTF-8 text (byte 0xe9", **{"data.dev": _p("latin1_jsonl")}),
    _st("selftrain: hops two", "hops.jsonl:1: record: field 'hops' must be a whole number or null, got 'two'", **{"data.dev": _p("hops")}),
    _st("selftrain: answers a string", "answers.jsonl:1", **{"data.dev": _p("answers")}),
    _st("selftrain: a cut JSON line", "cut.jsonl:1: not valid JSON", **{"data.train": _p("cut_jsonl")}),
    _st("selftrain: an empty train file", "empty file", **{"data.train": _p("empty")}),
    _st("selftrain: a folder as data.dev", "command line (--data.dev): data.dev: no such file", **{"data.dev": _p("folder")}),
    _st("selftrain: no such data.dev", "command line (--data.dev): data.dev: no such file", **{"data.dev": _p("nowhere")}),
    _st("selftrain: more train questions than the split", "data.train_questions is 100000 but", **{"data.train_questions": 100000}),
    _st("selftrain: more dev questions than the split (not capped)", "data.dev_questions is 1000 but", **{"data.dev_questions": 1000}),
    _st("selftrain: train and dev overlap", "are also train questions of this run",
        **{"data.dev": str(WORLD / "train.jsonl"), "data.dev_questions": 200, "data.train_questions": 200}),
    _st("selftrain: no such corpus", "no such file", **{"data.corpus.path": _p("nowhere")}),
    _st("selftrain: a binary corpus", "not UTF-8", **{"data.corpus.path": _p("binary")}),
    # selftrain: paths, device, model
    ("selftrain: output_dir is a file", ("selftrain", lambda b: b.selftrain_args("x", output_dir=b.a_file),
                                         "a_file.txt is a file, not a folder", _none)),
    ("selftrain: output_dir under a file", ("selftrain", lambda b: b.selftrain_args("x", output_dir=b.a_file / "run"),
                                            "a_file.txt is a file, not a folder", lambda b: [b.a_file / "run"])),
    _st("selftrain: an invalid config.json", "config.json: not valid JSON", **{"generator.model": _p("model_bad_config")}),
    _st("selftrain: a safetensors file cut short", "model.safetensors: not a whole safetensors file", **{"generator.model": _p("model_cut")}),
    _st("selftrain: a safetensors file of random bytes", "model.safetensors: not a whole safetensors file", **{"generator.model": _p("model_random")}),
    _st("selftrain: a text file named .gguf", "not a GGUF file", **{"generator.model": _p("gguf")}),
    _st("selftrain: no such model", "model", **{"generator.model": _p("nowhere")}),
    # selftrain: a run folder's own files
    ("selftrain: a binary run config.yaml", ("selftrain", lambda b: (b.tmp / "r1").mkdir() or (b.tmp / "r1" / "config.yaml").write_bytes(b"\xff\xfe") and b.selftrain_args("r1"),
                                             "config.yaml: not UTF-8 text", _none)),
    ("selftrain: a truncated questions.json", ("selftrain", lambda b: b.run_folder("r2", **{"questions.json": '{"rollout": ["a'}) and b.selftrain_args("r2"),
                                               "questions.json: damaged JSON", _none)),
    ("selftrain: the data changed since the run started",
     ("selftrain", lambda b: b.run_folder("r3", **{"inputs.json": json.dumps({"data.dev": {"path": "x", "size": 1, "mtime_ns": 1, "sha256": "0" * 64}})})
      and b.selftrain_args("r3"), "the content of data.dev", _none)),
    ("selftrain: a truncated inputs.json", ("selftrain", lambda b: b.run_folder("r4", **{"inputs.json": '{"data.dev": {'}) and b.selftrain_args("r4"),
                                            "inputs.json: damaged JSON", _none)),
    ("selftrain: a run folder started with another config", ("selftrain", lambda b: b.run_folder("r5") and b.selftrain_args("r5", seed=7),
                                                             "started with another config", _none)),
    # evaluate
    ("evaluate: a binary --config", ("evaluate", _args("--config", _p("binary")), "not UTF-8 text", _none)),
    ("evaluate: a key given twice", ("evaluate", _args("--config", _p("dup_yaml")), "given twice", _none)),
    ("evaluate: --output is a folder", ("evaluate", _eval("--output", _p("folder")), "is a folder: name the trajectory file", _none)),
    ("evaluate: a binary dataset", ("evaluate", _eval("--dataset.path", _p("binary"), "--output", _p("tmp", "e1.jsonl")),
                                    "not UTF-8 text", lambda b: [b.tmp / "e1.jsonl", b.tmp / "e1.cell.json"])),
    ("evaluate: hops two", ("evaluate", _eval("--dataset.path", _p("hops"), "--output", _p("tmp", "e2.jsonl")),
                            "field 'hops'", lambda b: [b.tmp / "e2.jsonl", b.tmp / "e2.cell.json"])),
    ("evaluate: a negative limit", ("evaluate", _eval("--limit", "-1", "--output", _p("tmp", "e3.jsonl")), "limit must be >= 0 or null, got -1",
                                    lambda b: [b.tmp / "e3.jsonl"])),
    ("evaluate: not a run folder", ("evaluate", _eval("--run", _p("nowhere")), "not a self-training run folder", _none)),
    ("evaluate: an iteration the run does not have", ("evaluate", lambda b: b.run_folder("r6") and _eval("--run", str(b.tmp / "r6"), "--iteration", "5")(b),
                                                      "the run has 1 iteration(s) (config.yaml), so iteration 5 does not exist", _none)),
    ("evaluate: a binary run config.yaml", ("evaluate", lambda b: (b.tmp / "r7").mkdir() or (b.tmp / "r7" / "config.yaml").write_bytes(b"\xff") and _eval("--run", str(b.tmp / "r7"))(b),
                                            "config.yaml: not UTF-8 text", _none)),
    ("evaluate: --output made with another config",
     ("evaluate", lambda b: (b.tmp / "e4.jsonl").write_text(_trajectory_line() + "\n") and (b.tmp / "e4.cell.json").write_text('{"strategy": {}}')
      and _eval("--output", str(b.tmp / "e4.jsonl"))(b), "was run with other", _none)),
    ("evaluate: a damaged settings file", ("evaluate", lambda b: (b.tmp / "e5.cell.json").write_text('{"str') and _eval("--output", str(b.tmp / "e5.jsonl"))(b),
                                           "e5.cell.json: damaged JSON", lambda b: [b.tmp / "e5.jsonl"])),
    # data
    ("data stats: a binary file", ("data", _args("stats", _p("binary")), "binary.bin:1: not UTF-8 text", _none)),
    ("data stats: a Latin-1 file", ("data", _args("stats", _p("latin1_jsonl")), "not UTF-8 text (byte 0xe9", _none)),
    ("data stats: hops two", ("data", _args("stats", _p("hops")), "field 'hops'", _none)),
    ("data stats: a cut line", ("data", _args("stats", _p("cut_jsonl")), "cut.jsonl:1: not valid JSON", _none)),
    ("data stats: a folder", ("data", _args("stats", _p("folder")), "a folder, not a data file", _none)),
    ("data stats: no such file", ("data", _args("stats", _p("nowhere")), "no such data file", _none)),
    ("data stats: a negative limit", ("data", _args("stats", str(WORLD / "dev.jsonl"), "--limit", "-1"), "the limit must be >= 0", _none)),
    ("data build-corpus: no such file", ("data", _args("build-corpus", _p("nowhere"), "--out", _p("tmp", "c.jsonl")), "no such",
                                         lambda b: [b.tmp / "c.jsonl"])),
    ("data build-corpus: --out is a folder", ("data", _args("build-corpus", str(REPO / "tests/fixtures/musique_dev_mini.jsonl"), "--out", _p("folder")),
                                              "a_folder: it is a folder: name a file", _none)),
    ("data fetch: an unknown name", ("data", _args("fetch", "nosuchbenchmark"), "nosuchbenchmark", _none)),
    # report
    ("report: an empty folder", ("report", _args(_p("folder"), "--out", _p("tmp", "r.html")), "a folder with no run", lambda b: [b.tmp / "r.html"])),
    ("report: a YAML file", ("report", _args(_p("dup_yaml"), "--out", _p("tmp", "r.html")), "not a trajectory file", lambda b: [b.tmp / "r.html"])),
    ("report: a binary file", ("report", _args(_p("binary"), "--out", _p("tmp", "r.html")), "not a trajectory file", lambda b: [b.tmp / "r.html"])),
    ("report: a data file, not trajectories", ("report", _args(_p("hops"), "--out", _p("tmp", "r.html")), "its first line is not a trajectory",
                                               lambda b: [b.tmp / "r.html"])),
    ("report: --out is a folder", ("report", lambda b: (b.tmp / "t.jsonl").write_text(_trajectory_line() + "\n") and [str(b.tmp / "t.jsonl"), "--out", str(b.folder)],
                                   "is a folder: name the HTML file", _none)),
    ("report: no such run", ("report", _args(_p("nowhere"), "--out", _p("tmp", "r.html")), "no such run folder", lambda b: [b.tmp / "r.html"])),
    # export
    ("export: not a run folder", ("export", _args(_p("nowhere")), "no iter_<z>/adapters", _none)),
    ("export: a damaged m0.json", ("export", lambda b: b.run_folder("r8", **{"m0.json": '{"path": '}) and [str(b.tmp / "r8")], "", _none)),
    # compare
    ("compare: not a run folder", ("compare", _args(_p("nowhere"), _p("nowhere")), "no summary.json", _none)),
    ("compare: a truncated summary.json", ("compare", lambda b: b.run_folder("r9", **{"summary.json": '{"iterations": ['}) and [str(b.tmp / "r9"), str(b.tmp / "r9")],
                                           "summary.json: damaged JSON", _none)),
    # the console script
    ("console: selftrain with a binary --config", ("console", _args("selftrain", "--config", _p("binary")), "not UTF-8 text", _none)),
    ("console: data stats of a binary file", ("console", _args("data", "stats", _p("binary")), "not UTF-8 text", _none)),
    ("console: no such command", ("console", _args("selftrian"), "no command 'selftrian'", _none)),
    ("console: report of an empty folder", ("console", _args("report", _p("folder"), "--out", _p("tmp", "r2.html")), "a folder with no run",
                                             lambda b: [b.tmp / "r2.html"])),
    ("console: evaluate --output a folder", ("console", lambda b: ["evaluate", *_eval("--output", str(b.folder))(b)], "is a folder", _none)),
    # the environment
    ("env: KNOWTRACE_PROGRESS_SECONDS=abc", ("selftrain", lambda b: b.selftrain_args("env1"), "KNOWTRACE_PROGRESS_SECONDS='abc'",
                                              lambda b: [b.tmp / "env1"])),
    ("env: KNOWTRACE_REUSE_WAIT_LOG_S=-5", ("data", _args("stats", str(WORLD / "dev.jsonl")), "KNOWTRACE_REUSE_WAIT_LOG_S='-5'", _none)),
    ("env: KNOWTRACE_CACHE is a file", ("selftrain", lambda b: b.selftrain_args("env3", reuse=True), "the cache home", lambda b: [b.tmp / "env3" / "config.yaml"])),
    ("doctor: --out is a file", ("doctor", _args("--out", _p("a_file"), "--skip", "torch,gpus,extras,model,cuda_tests,train,selftrain,qlora"),
                                 "a_file.txt", _none)),
])

#: the environment a case runs under (beside KNOWTRACE_CACHE in tmp)
ENV = {"env: KNOWTRACE_PROGRESS_SECONDS=abc": {"KNOWTRACE_PROGRESS_SECONDS": "abc"},
       "env: KNOWTRACE_REUSE_WAIT_LOG_S=-5": {"KNOWTRACE_REUSE_WAIT_LOG_S": "-5"}}


def _main(command: str) -> Callable[[list[str]], int]:
    import importlib

    if command == "console":
        from knowtrace_train.cli import main
        return main
    if command == "data":
        from knowtrace_train.data.__main__ import main
        return main
    return importlib.import_module(f"knowtrace_train.commands.{command}").main


def test_the_table_covers_every_command():
    assert len(CASES) >= 60
    assert {c[0] for c in CASES.values()} >= {"selftrain", "evaluate", "data", "report", "export", "compare", "console"}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_line_and_exit_2(name, tmp_path, monkeypatch, capsys):
    command, argv, says, absent = CASES[name]
    monkeypatch.chdir(REPO)  # the default data paths are relative to the checkout
    monkeypatch.delenv("KNOWTRACE_DEBUG", raising=False)
    for k in ("KNOWTRACE_PROGRESS_SECONDS", "KNOWTRACE_REUSE_WAIT_LOG_S"):
        monkeypatch.delenv(k, raising=False)
    cache = tmp_path / "cache"
    if name == "env: KNOWTRACE_CACHE is a file":
        cache.write_text("a file")
    monkeypatch.setenv("KNOWTRACE_CACHE", str(cache))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    bad = Bad(tmp_path)
    args = argv(bad)
    for k, v in ENV.get(name, {}).items():
        monkeypatch.setenv(k, v)
    logging.disable(logging.CRITICAL)  # the log's lines are not the error's line
    try:
        try:
            rc = _main(command)(args)
        except SystemExit as e:  # argparse's own errors
            rc = e.code
    finally:
        logging.disable(logging.NOTSET)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(LOG_PREFIXES)]
    assert rc == 2, f"{name}: exit {rc}\n{err[-3000:]}"
    assert "Traceback" not in err
    assert len(lines) == 1, f"{name}: {lines}"
    assert says in lines[0], f"{name}: {lines[0]}"
    for path in absent(bad):
        assert not path.exists(), f"{name}: {path} was left behind"


def test_generator_device_cuda_without_cuda_fails_at_start(tmp_path, monkeypatch, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    from knowtrace_train.commands.selftrain import main

    bad = Bad(tmp_path)
    assert main(bad.selftrain_args("cuda", **{"generator.device": "cuda"})) == 2
    assert "generator.device is 'cuda' but this machine has 0 CUDA device(s)" in capsys.readouterr().err
    assert not (tmp_path / "cuda" / "config.yaml").exists()


def test_ctrl_c_is_one_line_saying_how_to_continue(monkeypatch, capsys, tmp_path):
    from knowtrace_train.commands import selftrain

    def interrupted(config, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(selftrain, "run", interrupted)
    monkeypatch.delenv("KNOWTRACE_DEBUG", raising=False)
    assert selftrain.main(["--output_dir", str(tmp_path / "x")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[-1]] and "rerun the same command to continue" in err[-1]
    with pytest.raises(KeyboardInterrupt):  # --debug keeps the traceback
        selftrain.main(["--output_dir", str(tmp_path / "x"), "--debug"])


def test_debug_keeps_the_traceback_of_a_user_error(tmp_path, monkeypatch):
    from knowtrace_train.commands.report import main

    with pytest.raises(UnicodeDecodeError):
        (tmp_path / "t.jsonl").write_bytes(b"\xff\n")
        from knowtrace_train.errors import guarded
        guarded(lambda: b"\xff".decode("utf-8"), debug=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="a folder with no run"):
        main([str(tmp_path / "empty"), "--debug"])


def test_a_failed_start_leaves_no_config_to_refuse_the_corrected_command(tmp_path, monkeypatch, capsys):
    """The issue's worst case: after one bad start, the corrected command was refused as "another config"."""
    from knowtrace_train.commands.selftrain import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    bad = Bad(tmp_path)
    assert main(bad.selftrain_args("fix", **{"data.dev": str(bad.hops)})) == 2
    assert not (tmp_path / "fix" / "config.yaml").exists()
    assert main(bad.selftrain_args("fix", **{"generator.model": str(bad.model_cut)})) == 2
    assert not (tmp_path / "fix" / "config.yaml").exists()


def test_a_stopped_lock_holder_is_named_and_the_wait_is_bounded(tmp_path, caplog):
    """A reuse-cache lock held by a stopped process (Ctrl-Z): the wait says so, and gives up after its bound."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from knowtrace_train.errors import RunError
    from knowtrace_train.selftrain.entry_lock import EntryLock
    from knowtrace_train.selftrain.preflight import pid_stopped

    lock = tmp_path / "e.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, json, os, socket, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'run': 'r', 'pid': os.getpid(), 'host': socket.gethostname(), 'since': 'now'}).encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not pid_stopped(holder.pid)
        os.kill(holder.pid, signal.SIGSTOP)
        for _ in range(100):  # the signal lands within milliseconds
            if pid_stopped(holder.pid):
                break
            time.sleep(0.02)
        assert pid_stopped(holder.pid)
        with caplog.at_level(logging.INFO), pytest.raises(RunError, match="is STOPPED"):
            EntryLock(lock).acquire("m0", "me", poll=0.05, limit=0.5)
        assert any("STOPPED" in r.getMessage() for r in caplog.records)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()


# -- fuzzing the readers ------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

#: bytes a user's file might hold: anything, and text near the formats (JSON lines, YAML) cut anywhere
_row = json.dumps({"id": "q1", "question": "Who founded X?", "answers": ["Y"], "hops": 2, "type": "bridge"})
_near = st.sampled_from([_row.encode(), b"iterations: 2\ndata:\n  seed: 1\n", _trajectory_line().encode(),
                         b'{"id": "p1", "title": "T", "text": "x"}'])
BYTES = st.one_of(st.binary(max_size=400),
                  st.tuples(_near, st.integers(0, 200), st.binary(max_size=8)).map(lambda t: t[0][:t[1]] + t[2]),
                  st.lists(_near, max_size=4).map(b"\n".join),
                  st.text(max_size=200).map(lambda s: s.encode("utf-8")))


def _clean(call: Callable[[], object]) -> object:
    from knowtrace_train.errors import UserError

    try:
        return call()
    except UserError as e:
        assert "\n" not in str(e).strip(), f"not one line: {e}"
        return e


@FUZZ
@given(data=BYTES)
def test_fuzz_the_config_loader(tmp_path, data):
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain.config import SelfTrainConfig

    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    _clean(lambda: load_config(SelfTrainConfig, path))


@FUZZ
@given(data=BYTES)
def test_fuzz_the_data_reader(tmp_path, data):
    from knowtrace_train.data.loaders import load_items

    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    got = _clean(lambda: load_items(path))
    if isinstance(got, list):
        assert all(it.question.strip() and it.answers for it in got)


@FUZZ
@given(data=BYTES)
def test_fuzz_the_corpus_reader(tmp_path, data):
    from knowtrace_train.data.corpus import read_corpus

    path = tmp_path / "corpus.jsonl"
    path.write_bytes(data)
    _clean(lambda: read_corpus(path))


@FUZZ
@given(data=BYTES)
def test_fuzz_the_trajectory_reader(tmp_path, data):
    from knowtrace_train.trajectory import read_trajectories

    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    _clean(lambda: read_trajectories(path))


def test_overlap_by_id_is_refused_a_repeated_text_under_another_id_only_warned(caplog):
    import logging
    from types import SimpleNamespace

    from knowtrace_train.data.schema import QAItem
    from knowtrace_train.selftrain.preflight import PreflightError, check_overlap

    train = [QAItem(id="t1", question="Who wrote X?", answers=("A",)), QAItem(id="t2", question="Where is Y?",
                                                                              answers=("B",))]
    dev_text = [QAItem(id="d1", question="who  wrote x?", answers=("A",))]
    q = SimpleNamespace(rollout=train, bootstrap=[], calibration=[], dev=dev_text)
    with caplog.at_level(logging.WARNING):
        check_overlap(q, allow=False)
    assert "1 of the 1 dev questions repeat the text of a train question" in caplog.text
    q.dev = [train[1]]
    with pytest.raises(PreflightError, match="1 of the 1 dev questions are also train questions .*'t2'"):
        check_overlap(q, allow=False)
    check_overlap(q, allow=True)


def test_a_run_whose_every_prompt_is_too_long_fails_in_one_line_some_alone_are_scored_wrong():
    from knowtrace_train.errors import RunError
    from knowtrace_train.evaluate import check_prompts_fit
    from knowtrace_train.generation.base import TOO_LONG
    from knowtrace_train.trajectory import ModelCall, Trajectory

    def traj(i: int, long: bool) -> Trajectory:
        err = f"generation error: request 0 (role 'explore'): prompt of 9000 tokens plus max_new_tokens 80 {TOO_LONG} of 8192 tokens" if long else None
        return Trajectory(id=f"q{i}", question_id=f"q{i}", question="Q?", answers=["a"], dataset="world", strategy="knowtrace",
                          calls=[ModelCall(index=0, role="explore", round=1, prompt="p", output="", prompt_tokens=1,
                                          output_tokens=0, error=err)])

    check_prompts_fit([traj(0, True), traj(1, False)], "dev")  # one question alone: scored wrong, no error
    check_prompts_fit([], "dev")
    with pytest.raises(RunError, match=r"dev: every one of the 2 questions met a prompt longer than the model's context"):
        check_prompts_fit([traj(0, True), traj(1, True)], "dev")
