"""Decode steps of a KnowTrace stage under two schedules, counted from its trajectory file's recorded calls.

    python scripts/lab/sim_schedule.py TRAJECTORIES.jsonl [...] [--rows 32]

- lockstep (the engine's step, methods/knowtrace/engine.py, for the questions in flight together): every round
  makes one generate call per role (exploration, then completion, then the forced answers), each call decoding
  its requests through `--rows` rows
  (the generator's batch_size) and refilling a row as soon as its request ends; a round starts when the last
  request of the one before has ended.
- pipelined (per call, not built; the engine pipelines per step only, admitting a waiting question when one
  finishes): a question's next call joins the running batch as soon as its own previous call ended, so no row
  waits for other questions' slowest request.

A call holds a row for output_tokens - 1 decode steps (its first token comes from its prefill). Prefill,
retrieval and parsing are not counted, and a decoding step is taken to cost the same at every row count
(on CPUs it nearly does: the weights are read once per step). So the ratio bounds what pipelining saves
of the decoding time, not of the stage. The last line is JSON, one entry per file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowtrace_train.errors import UserError, user_errors  # noqa: E402
from knowtrace_train.trajectory import Trajectory, read_trajectories  # noqa: E402

#: a round's generate calls, in the engine's order (KG-to-Text refreshes come first)
ROLE_ORDER = {"kg_to_text": 0, "explore": 1, "complete": 2, "answer": 3}


def call_phases(traj: Trajectory) -> list[tuple[tuple[int, int], list[int]]]:
    """The trajectory's calls as phases, in order: ((round, role rank), decode steps of each call). The
    completion calls of one round run together; every other call is a phase of its own."""
    phases: list[tuple[tuple[int, int], list[int]]] = []
    for call in traj.calls:
        key = (call.round, ROLE_ORDER.get(call.role, 0))
        steps = max(0, call.output_tokens - 1)
        if call.role == "complete" and phases and phases[-1][0] == key:
            phases[-1][1].append(steps)
        else:
            phases.append((key, [steps]))
    return phases


def refilled_steps(lengths: list[int], rows: int) -> int:
    """Steps to decode requests of these lengths (in order) through `rows` rows, a row refilled as it ends."""
    active: list[int] = []
    queue = [n for n in lengths if n > 0]
    queue.reverse()
    steps = 0
    while queue or active:
        while queue and len(active) < rows:
            active.append(queue.pop())
        steps += 1
        active = [n - 1 for n in active if n > 1]
    return steps


def lockstep_steps(trajs: list[Trajectory], rows: int) -> int:
    batches: dict[tuple[int, int], list[int]] = defaultdict(list)
    for traj in trajs:
        for key, lengths in call_phases(traj):
            batches[key].extend(lengths)
    return sum(refilled_steps(batches[key], rows) for key in sorted(batches))


def pipelined_steps(trajs: list[Trajectory], rows: int) -> int:
    phases = [call_phases(t) for t in trajs]
    ready: list[tuple[int, int]] = []  # (question, decode steps) waiting for a row, first come first served
    left: dict[int, int] = {}  # question -> calls of its current phase not yet ended

    def start_next(q: int) -> None:
        if phases[q]:
            _, lengths = phases[q].pop(0)
            left[q] = len(lengths)
            ready.extend((q, n) for n in lengths)

    def ended(q: int) -> None:
        left[q] -= 1
        if left[q] == 0:
            start_next(q)

    for q in range(len(phases)):
        start_next(q)
    running: list[list[int]] = []  # [steps left, question]
    steps = 0
    while ready or running:
        while ready and len(running) < rows:
            q, n = ready.pop(0)
            if n == 0:
                ended(q)  # a one-token call needs no decoding step
            else:
                running.append([n, q])
        if not running:
            continue
        steps += 1
        still = []
        for row in running:
            row[0] -= 1
            if row[0] == 0:
                ended(row[1])
            else:
                still.append(row)
        running = still
    return steps


@user_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, metavar="TRAJECTORIES.jsonl")
    parser.add_argument("--rows", type=int, default=32, help="rows decoded together (the generator's batch_size)")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    summary = {}
    for path in args.files:
        if not path.is_file():
            raise UserError(f"{path}: no such trajectory file")
        trajs = read_trajectories(path)
        decoded = sum(sum(steps) for t in trajs for _, steps in call_phases(t))
        lock, pipe = lockstep_steps(trajs, args.rows), pipelined_steps(trajs, args.rows)
        ratio = lock / pipe if pipe else 1.0
        print(f"{path}: {len(trajs)} questions, {decoded} decoded tokens; lockstep {lock} steps "
              f"({decoded / max(lock, 1):.1f} rows a step), pipelined {pipe} ({decoded / max(pipe, 1):.1f}): {ratio:.2f}x fewer steps")
        summary[str(path)] = {"questions": len(trajs), "decoded": decoded, "lockstep_steps": lock, "pipelined_steps": pipe,
                              "ratio": round(ratio, 3)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
