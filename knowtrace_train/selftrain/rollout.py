"""Rollouts: a method over a list of questions, resumable question by question, split across processes.

At most `chunk_size` questions are in flight at once (`methods.run_strategy`): KnowTrace admits the next
question as soon as one finishes, so its batches stay full; other methods run consecutive groups of
`chunk_size`. Each finished trajectory is scored and appended at once to `<out>.parts/rank<r>.jsonl` (one
file per process; a kill loses only the questions in flight, and a torn last line is dropped on reading).
A resumed run reads every part file and runs only the questions missing there; every sampled call draws
from its own seeded stream, and greedy decoding gives the same tokens in any batch up to fp32 rounding, so
it gives the trajectories an uninterrupted run would, up to that rounding. Under several processes each
takes every world-th question still to run. When every question is done, the main process writes `<out>`
(scored trajectories, one per line, in question order) and removes the parts. Running, scoring and appending
are `methods.run_scored`'s, evaluation's own loop; the summary is evaluate's (`summarize`).

With `samples` G > 1 each question is tried G times: sample k runs the questions with the strategy seeded
`sample_seed(seed, k)` (sample 0 keeps the strategy's own seed), so every call of every sample draws from its
own reproducible stream, and its trajectory id gets the suffix `#s<k>`. The file then holds G trajectories per
question, question by question, sample by sample.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.errors import RunError
from knowtrace_train.generation.base import Generator, request_seed
from knowtrace_train.io import write_jsonl
from knowtrace_train.methods import StrategyConfig, get_method, run_scored, written
from knowtrace_train.progress import question_bar
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.stages import Processes
from knowtrace_train.trajectory import Trajectory, read_trajectories

log = logging.getLogger(__name__)


def parts_dir(out: Path) -> Path:
    return out.parent / f"{out.name}.parts"


def sample_seed(seed: int, sample: int) -> int:
    """The strategy seed of sample `sample` of a rollout whose strategy seed is `seed` (sample 0: `seed`)."""
    return seed if sample == 0 else request_seed(seed, "sample", sample)


def sample_suffix(sample: int) -> str:
    return f"#s{sample}"


def sample_of(meta: Mapping[str, Any] | None) -> int | None:
    """The sample index a trajectory's `meta` holds in a G-sample rollout, None for a one-sample rollout's."""
    k = (meta or {}).get("sample")
    return k if isinstance(k, int) else None


def pass_at_samples(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Per question: solved by at least one of its samples. {"questions", "solved", "pass_at_samples"}."""
    solved: dict[str, bool] = {}
    for t in trajectories:
        solved[t.question_id] = solved.get(t.question_id, False) or (t.em or 0.0) >= 1.0
    n = len(solved)
    return {"questions": n, "solved": sum(solved.values()), "pass_at_samples": sum(solved.values()) / n if n else None}


def run_rollouts(
    items: Sequence[QAItem],
    out: str | Path,
    strategy: StrategyConfig,
    make_generator: Callable[[], Generator],
    retriever: Retriever,
    *,
    chunk_size: int = 32,
    procs: Processes | None = None,
    iteration: int | None = None,
    desc: str = "rollout",
    progress: bool = True,
    samples: int = 1,
) -> list[Trajectory]:
    """Scored trajectories of `items` (`samples` per question), in their order, written to `out`. At most
    `chunk_size` questions are in flight at once; the generator is built (`make_generator()`) only when a
    question remains to run."""
    out = Path(out)
    procs = procs or Processes()
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        raise ValueError("rollout questions must have distinct ids")

    def key(question_id: str, k: int) -> tuple[str, int | None]:
        return question_id, k if samples > 1 else None

    def key_of(t: Trajectory) -> tuple[str, int | None]:
        return t.question_id, sample_of(t.meta)

    order = [key(it.id, k) for it in items for k in range(samples)]
    if out.is_file():
        whole = read_trajectories(out)
        if [key_of(t) for t in whole] == order:
            return whole
        raise RunError(f"{out} holds other questions (or another number of samples) than this stage's; "
                         "remove it to rerun the stage")

    parts = parts_dir(out)
    wanted = set(order)

    def check(part: Path, t: Trajectory) -> None:
        if key_of(t) not in wanted:
            raise RunError(f"{part} holds other questions (or another number of samples) than this stage's "
                             f"({t.question_id}); remove {parts} to rerun the stage")

    done = written(sorted(parts.glob("*.jsonl")) if parts.is_dir() else [], key_of, check)
    method = get_method(strategy.name)
    mine_file = parts / f"rank{procs.rank}.jsonl"
    generator: Generator | None = None
    bar = question_bar(len(wanted), desc, progress and procs.is_main)
    if bar is not None and done:
        bar.update(len(done))
    local: list[Trajectory] = []
    correct = 0.0

    def stamp(k: int) -> Callable[[Trajectory], None]:
        def mark(t: Trajectory) -> None:
            t.iteration = iteration
            if samples > 1:
                t.id += sample_suffix(k)
                t.meta = {**t.meta, "sample": k}
        return mark

    def finished(t: Trajectory) -> None:
        nonlocal correct
        local.append(t)
        correct += t.em or 0.0
        if bar is not None:
            bar.set_postfix(em=f"{correct / len(local):.3f}")  # over this run's

    try:
        for k in range(samples):
            todo = [it for it in items if key(it.id, k) not in done][procs.rank :: procs.world]
            if not todo:
                continue
            if generator is None:
                generator = make_generator()
            engine = method.strategy(method.with_seed(strategy, sample_seed(strategy.seed, k)))
            run_scored(engine, todo, generator, retriever, mine_file, width=chunk_size, stamp=stamp(k), bar=bar,
                       on_done=finished)
    finally:
        if generator is not None:
            generator.close()  # the next stage (training, another model) gets its memory back
    gathered = procs.gather([t.to_dict() for t in local])
    for rank_rows in gathered:
        for d in rank_rows:
            t = Trajectory.from_dict(d)
            done.setdefault(key_of(t), t)
    result = [done[k] for k in order]
    if bar is not None:
        bar.close()
    if procs.is_main:
        write_jsonl(out, [t.to_dict() for t in result])
        shutil.rmtree(parts, ignore_errors=True)
    procs.barrier()
    return result
