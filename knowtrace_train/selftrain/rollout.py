"""Rollouts: a method over a list of questions in fixed chunks, resumable, split across processes.

The questions are cut into chunks of `chunk_size` in their given order. Each chunk is one batch of
the engine (so a resumed run feeds the model exactly the batches an uninterrupted one did, and
greedy decoding gives the same trajectories); under several processes each takes every world-th
question of the chunk, and the main process gathers the chunk. A finished chunk is written at once,
atomically, to `<out>.parts/<chunk>.jsonl`; a kill loses at most the chunk in flight. When every
chunk is there, the main process writes `<out>` (scored trajectories, one per line, in question
order) and removes the parts. Scoring and the summary are evaluate's (`summarize`).

With `samples` G > 1 each question is tried G times: sample k runs the chunk with the strategy seeded
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
from knowtrace_train.generation.base import Generator, request_seed
from knowtrace_train.io import write_jsonl
from knowtrace_train.methods import StrategyConfig, get_method
from knowtrace_train.metrics import score
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
    chunk_size: int = 16,
    procs: Processes | None = None,
    iteration: int | None = None,
    desc: str = "rollout",
    progress: bool = True,
    samples: int = 1,
) -> list[Trajectory]:
    """Scored trajectories of `items` (`samples` per question), in their order, written to `out`. The
    generator is built (`make_generator()`) only when a chunk remains to run."""
    out = Path(out)
    procs = procs or Processes()
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        raise ValueError("rollout questions must have distinct ids")

    def keys(chunk: Sequence[QAItem]) -> list[tuple[str, int | None]]:
        return [(it.id, k if samples > 1 else None) for it in chunk for k in range(samples)]

    if out.is_file():
        done = read_trajectories(out)
        if [(t.question_id, sample_of(t.meta)) for t in done] == keys(items):
            return done
        raise ValueError(f"{out} holds other questions (or another number of samples) than this stage's; "
                         "remove it to rerun the stage")

    parts = parts_dir(out)
    method = get_method(strategy.name)
    engines = [method.strategy(method.with_seed(strategy, sample_seed(strategy.seed, k))) for k in range(samples)]
    generator: Generator | None = None
    chunks = [list(items[i : i + chunk_size]) for i in range(0, len(items), chunk_size)]
    bar = _bar(len(items), desc, progress and procs.is_main)
    result: list[Trajectory] = []
    try:
        for c, chunk in enumerate(chunks):
            part = parts / f"{c:05d}.jsonl"
            if part.is_file():
                trajs = read_trajectories(part)
                if [(t.question_id, sample_of(t.meta)) for t in trajs] != keys(chunk):
                    raise ValueError(f"{part} holds other questions than chunk {c}; remove {parts} to rerun the stage")
            else:
                if generator is None:
                    generator = make_generator()
                mine = chunk[procs.rank :: procs.world]
                local: list[Trajectory] = []
                for k, engine in enumerate(engines):
                    for t in engine.run(mine, generator, retriever) if mine else []:
                        s = score(t.prediction, t.answers)
                        t.em, t.f1, t.iteration = s["em"], s["f1"], iteration
                        if samples > 1:
                            t.id += sample_suffix(k)
                            t.meta = {**t.meta, "sample": k}
                        local.append(t)
                gathered = procs.gather([t.to_dict() for t in local])
                by_key = {(d["question_id"], sample_of(d.get("meta"))): d for rank_rows in gathered for d in rank_rows}
                rows = [by_key[key] for key in keys(chunk)]
                if procs.is_main:
                    write_jsonl(part, rows)
                trajs = [Trajectory.from_dict(d) for d in rows]
                procs.barrier()
            result.extend(trajs)
            if bar is not None:
                bar.update(len(chunk))
                bar.set_postfix(em=f"{sum(t.em or 0 for t in result) / len(result):.3f}")  # over trajectories
    finally:
        if generator is not None:
            generator.close()  # the next stage (training, another model) gets its memory back
    if bar is not None:
        bar.close()
    if procs.is_main:
        write_jsonl(out, [t.to_dict() for t in result])
        shutil.rmtree(parts, ignore_errors=True)
    procs.barrier()
    return result


def _bar(total: int, desc: str, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="q", mininterval=1.0)
