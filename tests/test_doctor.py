"""scripts/doctor.py (knowtrace_train/commands/doctor.py, which the script wraps): every check ends ok, skipped with
its reason, or failed; the last line is JSON; a failed check is exit 1, a missing optional part never is. (CI's
fourth step runs the whole doctor on the CPU.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import doctor as doctor_script

from knowtrace_train.commands import doctor


def test_the_script_runs_the_packages_doctor():
    assert doctor_script.main is doctor.main


def test_each_check_ends_ok_skipped_or_failed_with_its_minutes(capsys):
    def broken():
        raise RuntimeError("the engine fell over")

    def absent():
        raise doctor.Skip("bitsandbytes is not installed")

    ok = doctor.run_check("a", lambda: {"detail": "fine", "tok_s": 3.0})
    skipped = doctor.run_check("b", absent)
    failed = doctor.run_check("c", broken)
    assert (ok["status"], ok["tok_s"], skipped["status"], failed["status"]) == ("ok", 3.0, "skipped", "failed")
    assert skipped["detail"] == "bitsandbytes is not installed" and "RuntimeError: the engine fell over" in failed["detail"]
    assert "Traceback" in failed["traceback"] and all(r["minutes"] >= 0 for r in (ok, skipped, failed))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["a", "ok"], ["b", "skipped"], ["c", "failed"]]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU's reasons")
def test_the_gpu_checks_say_why_they_skip_on_a_cpu():
    state: dict = {"device": "cpu", "bitsandbytes": True, "model": Path("m")}
    for check, why in [(doctor.check_gpus, "no CUDA device"), (doctor.check_cuda_tests, "no GPU"),
                       (doctor.check_qlora, "needs a CUDA GPU")]:
        with pytest.raises(doctor.Skip, match=why):
            check(state)
    with pytest.raises(doctor.Skip, match="no model"):
        doctor.check_train({"device": "cpu"})


def test_the_cuda_tests_check_names_each_skipped_test_and_why(monkeypatch):
    """On the H200 the check said '72 passed, 3 skipped' and not which: the -ra summary's skips go into it."""
    import subprocess

    out = ("..s.\n=== short test summary info ===\n"
           "SKIPPED [2] tests/test_generation_vllm.py:31: vLLM is not installed\n"
           "SKIPPED [1] tests/test_train.py:90: the CPU's error\n4 passed, 3 skipped in 1.00s\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    row = doctor.check_cuda_tests({"device": "cuda"})
    assert row["skipped_tests"] == ["[2] tests/test_generation_vllm.py:31: vLLM is not installed",
                                    "[1] tests/test_train.py:90: the CPU's error"]
    assert row["detail"].endswith("4 passed, 3 skipped in 1.00s; skipped: [2] tests/test_generation_vllm.py:31: "
                                  "vLLM is not installed; [1] tests/test_train.py:90: the CPU's error")


def test_the_doctor_prints_a_table_and_ends_in_json_and_fails_only_on_a_failed_check(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(doctor, "check_model", lambda state: {"detail": "m"})
    monkeypatch.setattr(doctor, "check_train", lambda state: {"detail": "77 tokens/s", "tok_s": 77.0})
    monkeypatch.setattr(doctor, "check_selftrain", lambda state, size, out: {"detail": f"{size} run", "em": 0.0})
    assert doctor.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    last = json.loads(out[-1])
    names = [c["name"] for c in last["checks"]]
    assert names == ["torch", "gpus", "extras", "model", "cuda_tests", "train", "selftrain", "qlora"]
    assert last["failed"] == 0 and last["ok"] + last["skipped"] == 8
    assert all(c["detail"] for c in last["checks"] if c["status"] == "skipped")
    assert out[0].split()[:2] == ["check", "status"] and len(out) == 10

    def broken(state, size, out):
        raise RuntimeError("selftrain exit 1")

    monkeypatch.setattr(doctor, "check_selftrain", broken)
    assert doctor.main(["--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["failed"] == 1 and "selftrain failed" in captured.err


def test_skip_leaves_named_checks_out_and_refuses_an_unknown_name(monkeypatch, tmp_path, capsys):
    ran = []
    monkeypatch.setattr(doctor, "check_model", lambda state: ran.append("model") or {"detail": "m"})
    monkeypatch.setattr(doctor, "check_train", lambda state: ran.append("train") or {"detail": "77 tokens/s"})
    monkeypatch.setattr(doctor, "check_selftrain", lambda state, size, out: ran.append("selftrain") or {"detail": "r"})
    assert doctor.main(["--out", str(tmp_path), "--skip", "train, selftrain"]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out.splitlines()[-1])["checks"]}
    assert ran == ["model"] and len(checks) == 8
    assert checks["train"]["status"] == checks["selftrain"]["status"] == "skipped"
    assert checks["train"]["detail"] == "left out by --skip" and checks["model"]["status"] == "ok"
    with pytest.raises(SystemExit):
        doctor.main(["--out", str(tmp_path), "--skip", "trian"])
    assert "no check named trian" in capsys.readouterr().err
