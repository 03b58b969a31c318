"""scripts/lab/sim_schedule.py: decode steps of a stage under lockstep rounds and under per-question pipelining,
on trajectories whose counts are worked out by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from knowtrace_train.trajectory import ModelCall, Trajectory

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lab" / "sim_schedule.py"


def load():
    spec = importlib.util.spec_from_file_location("sim_schedule_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def traj(qid: str, calls: list[tuple[str, int, int]]) -> Trajectory:
    """calls: (role, round, output tokens)."""
    t = Trajectory(id=qid, question_id=qid, question="q?", answers=["a"], dataset="world", strategy="knowtrace")
    t.calls = [ModelCall(index=i, role=r, round=n, prompt="p", output="o", prompt_tokens=5, output_tokens=k)
               for i, (r, n, k) in enumerate(calls)]
    return t


# question 1: explore (3 decode steps), two completions side by side (1 and 5), a forced answer (2);
# question 2: explore (8), a forced answer (1)
Q1 = traj("q1", [("explore", 1, 4), ("complete", 1, 2), ("complete", 1, 6), ("answer", 1, 3)])
Q2 = traj("q2", [("explore", 1, 9), ("answer", 1, 2)])


def test_phases_group_a_rounds_completions_and_count_decode_steps():
    sim = load()
    assert sim.call_phases(Q1) == [((1, 1), [3]), ((1, 2), [1, 5]), ((1, 3), [2])]
    assert sim.refilled_steps([3, 8, 0], 32) == 8 and sim.refilled_steps([3, 8], 1) == 11
    assert sim.refilled_steps([2, 2, 2], 2) == 4  # the third request takes the first freed row


def test_lockstep_waits_for_each_rounds_slowest_call_and_pipelining_does_not():
    sim = load()
    # lockstep: explore max(3, 8) + completions max(1, 5) + answers max(2, 1) = 15
    assert sim.lockstep_steps([Q1, Q2], 32) == 15
    # pipelined: q1's completions start at step 4 and end at 4 and 8, with q2's exploration; both answers then
    # start at step 9, q2's ending there and q1's at 10
    assert sim.pipelined_steps([Q1, Q2], 32) == 10
    # one row: both schedules decode every token one after another
    assert sim.lockstep_steps([Q1, Q2], 1) == sim.pipelined_steps([Q1, Q2], 1) == 20


def test_the_script_reads_trajectory_files_and_ends_with_json(tmp_path, capsys):
    sim = load()
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in (Q1, Q2)))
    assert sim.main([str(path), "--rows", "32"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "1.50x fewer steps" in out[0]
    assert json.loads(out[-1])[str(path)] == {"questions": 2, "decoded": 20, "lockstep_steps": 15, "pipelined_steps": 10,
                                              "ratio": 1.5}
    assert sim.main([str(tmp_path / "missing.jsonl")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "a trajectory"}\n' + json.dumps(Q1.to_dict()) + "\n")
    assert sim.main([str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
