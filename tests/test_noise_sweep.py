"""scripts/lab/noise_sweep.py: backtracing - STaR per gold noise rate, pooled over seeds, against M0's noise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_arms import REPO, ems, run_folder


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "lab" / "noise_sweep.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def _with_noise(run, unneeded: float, extraneous: float):
    """Iteration 1's FA parts in the run's summary, as the loop writes them."""
    s = json.loads((run / "summary.json").read_text())
    s["iterations"][0].update(fa_ratio=0.3, fa_decomposed={"untraceable": 0.1, "unneeded_pairs": unneeded,
                                                           "extraneous_triplets": extraneous, "dropped_by_both": 0.0})
    (run / "summary.json").write_text(json.dumps(s))
    return run


def test_two_rates_pooled_per_model_and_the_noise_of_each(tmp_path):
    # rate 0: both modes equal at M2. Rate 1.0 over seeds 0 and 1: backtracing gains q06-q09 at M2, STaR nothing.
    pts = {}
    for rate, seeds in (("0", (0,)), ("1.0", (0, 1))):
        bt, st = [], []
        for s in seeds:
            gain = range(10) if rate == "1.0" else range(6)
            bt.append(_with_noise(run_folder(tmp_path, f"bt{rate}_{s}", "backtrace", s,
                                             {0: ems(range(6)), 1: ems(range(6)), 2: ems(gain)}),
                                  0.02 if rate == "0" else 0.05 + 0.02 * s, 0.01 if rate == "0" else 0.15))
            st.append(run_folder(tmp_path, f"st{rate}_{s}", "star", s, {0: ems(range(6)), 1: ems(range(6)), 2: ems(range(6))}))
        pts[rate] = f"{rate}={','.join(map(str, bt))}:{','.join(map(str, st))}"
    fig = tmp_path / "sweep.png"
    r = _run("--point", pts["0"], "--point", pts["1.0"], "--out", str(fig))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    zero, one = out["points"]
    assert zero["noise_in_traced"] == pytest.approx(0.03) and one["noise_in_traced"] == pytest.approx(0.21)
    assert one["noise_seeds"] == 2
    d0 = {d["iteration"]: d for d in zero["backtrace_minus_star"]}
    d1 = {d["iteration"]: d for d in one["backtrace_minus_star"]}
    assert d0[2]["diff"] == 0 and d0[2]["seeds"] == [0]
    # 4 questions gained in both seeds, none lost: sign flips over 4 questions, p = 2 / 2^4
    assert d1[2]["diff"] == pytest.approx(4 / 24) and d1[2]["p_value"] == pytest.approx(2 / 16)
    assert d1[2]["seeds"] == [0, 1] and d1[1]["diff"] == 0
    assert fig.is_file() and fig.stat().st_size > 1000


def test_a_point_without_both_modes_is_one_line(tmp_path):
    bt = run_folder(tmp_path, "bt", "backtrace", 0, {0: ems(range(6)), 1: ems(range(6))}, planned=1)
    bt2 = run_folder(tmp_path, "bt2", "backtrace", 1, {0: ems(range(6)), 1: ems(range(6))}, planned=1)
    r = _run("--point", f"0={bt}:{bt2}")
    assert r.returncode != 0 and "not one backtrace and one star arm" in r.stderr
    r = _run("--point", f"0={bt}")
    assert r.returncode != 0 and "RATE=BT_RUN" in r.stderr
