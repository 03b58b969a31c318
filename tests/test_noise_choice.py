"""scripts/lab/noise_choice.py: each noise arm's M0 against the baseline's over common seeds, and its rollouts' noise."""

from __future__ import annotations

import json
import subprocess
import sys

from test_arms import REPO, ems, run_folder


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "lab" / "noise_choice.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_an_arm_below_the_baseline_on_every_seed_is_pooled_paired_and_its_noise_read(tmp_path):
    # baseline M0 right on q00-q09 in seeds 0 and 1; the arm right on q00-q05 only (4 fewer of 24 in each seed)
    base = [run_folder(tmp_path, f"old_{s}", "backtrace", s, {0: ems(range(10))}, planned=0) for s in (0, 1)]
    arm = [run_folder(tmp_path, f"new_{s}", "backtrace", s, {0: ems(range(6))}, planned=1) for s in (0, 1)]
    (arm[0] / "iter_1").mkdir()
    (arm[0] / "iter_1" / "rationale.json").write_text(json.dumps({
        "fa_ratio": 0.30, "fa_ratio_backtraced": 0.25, "correct": 40, "backtraced": 38,
        "backtrace_records": {"whole": 80, "changed": 60},
        "fa_decomposed": {"untraceable": 0.05, "unneeded_pairs": 0.05, "extraneous_triplets": 0.20,
                          "dropped_by_both": 0.0}}))
    r = _run("--baseline", *map(str, base), "--arm", f"1.0={arm[0]},{arm[1]}")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["baseline"]["all"]["em"] == round(10 / 24, 3) and out["baseline"]["all"]["n"] == 24
    row = out["arms"][0]
    assert row["arm"] == "1.0" and row["all"]["em_by_seed"] == [0.25, 0.25]
    vs = row["all"]["vs_baseline"]
    assert vs["paired_seeds"] == [0, 1] and vs["n"] == 24 and abs(vs["diff"] + 4 / 24) < 1e-9 and vs["p_value"] < 0.2
    # q06-q09 are three bridges and one comparison (every fourth question of the fixture is a comparison)
    assert row["comparison"]["n"] == 6 and abs(row["comparison"]["vs_baseline"]["diff"] + 1 / 6) < 1e-9
    assert abs(row["bridge"]["vs_baseline"]["diff"] + 3 / 18) < 1e-9
    noise = row["iteration_1_noise"]
    assert noise["0"]["noise_in_traced"] == 0.25 and noise["0"]["records"] == {"whole": 80, "changed": 60}
    assert noise["1"] is None  # seed 1 has no rollouts yet


def test_an_arm_with_no_seed_of_the_baseline_is_refused_in_its_row(tmp_path):
    base = [run_folder(tmp_path, "old_0", "backtrace", 0, {0: ems(range(10))}, planned=0)]
    arm = run_folder(tmp_path, "new_3", "backtrace", 3, {0: ems(range(6))}, planned=1)
    r = _run("--baseline", str(base[0]), "--arm", f"0.5={arm}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["arms"][0]["all"]["vs_baseline"] == {"refused": "no common seed"}
