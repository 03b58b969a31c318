"""What the batched engines share (KnowTrace's, DoG's, MINTQA's, the baselines' Runner): a question in flight, a
model call to make for it, one batched generate and one batched search per step timed onto the questions'
trajectories, and a question's end.

Wall time per question (the rule every engine follows): a batched call's time is split among its requests in
proportion to their tokens (methods/calls.py), a batched search's equally among its queries, and the engine's own
work between batches (`begin_step` .. `end_step`) equally among the step's questions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.decisions import decide_jobs
from knowtrace_train.generation.base import Generator
from knowtrace_train.kg import GuidancePair
from knowtrace_train.methods.calls import CallSpec, PassageTokens, generate_calls
from knowtrace_train.methods.hints import trajectory_id
from knowtrace_train.retrieval.base import RetrievalError, Retriever, passage_text, search_each
from knowtrace_train.trajectory import ModelCall, Trajectory


def new_trajectory(item: QAItem, strategy: str, meta: dict[str, Any]) -> Trajectory:
    """The empty trajectory of `item` under `strategy` (`<id>#hint` for a hinted rationalization rerun), holding
    `meta` itself (a dict of its own: its lists are the trajectory's)."""
    return Trajectory(id=trajectory_id(item), question_id=item.id, question=item.question, answers=list(item.answers),
                      dataset=item.dataset, strategy=strategy, meta=meta)


@dataclass(kw_only=True)
class InFlight:
    """One question in flight: its item and trajectory (an engine's own state extends it)."""

    item: QAItem
    traj: Trajectory
    done: bool = False


@dataclass
class Job:
    """One model call to make for one question in flight (methods/calls.py's CallSpec, its passages not yet counted).
    `prefix` opens the response and `decided` follows it (a decision taken from the model's scores, recorded as the
    model's output); `log_odds` is that decision's log P(Yes) - log P(No) (decisions.decide_jobs fills both)."""

    state: Any
    kind: str
    round: int
    prompt: str
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    prefix: str = ""
    decided: str = ""
    passages: Sequence[Passage] = ()
    pair: GuidancePair | None = None
    adapter: str = ""
    log_odds: float | None = None


class Engine:
    """The plumbing of one run of a batched engine over many questions: its `generator`, `retriever` and `on_done`
    (`bind` at the start of a run), the config's `temperature`, `seed` and `passages` (per query)."""

    name = ""
    config: Any

    def bind(self, generator: Generator, retriever: Retriever | None, on_done: Callable[[Trajectory], None] | None,
             render_passage: Callable[[Passage], str] = passage_text, adapter: str | None = None) -> None:
        """Start a run. `render_passage`: a passage as the engine's prompts show it (its tokens are a call's
        `retrieved_tokens`; an engine that shows none leaves it); `adapter`: the adapter of every call (None: each
        job's, else its kind)."""
        self.generator, self.retriever, self.on_done, self.adapter = generator, retriever, on_done, adapter
        self.passage_tokens = PassageTokens(render_passage, lambda text: self.count_tokens(text))
        self._batch_time = 0.0

    # -- one step's bookkeeping ------------------------------------------------------------------
    def begin_step(self) -> float:
        self._batch_time = 0.0
        return time.perf_counter()

    def end_step(self, states: Sequence[InFlight], started: float) -> None:
        """Share the step's own work (everything but the batched calls, scorings and searches) among `states`."""
        if not states:
            return
        overhead = max(0.0, time.perf_counter() - started - self._batch_time)
        for s in states:
            s.traj.wall_time += overhead / len(states)

    def finish(self, state: InFlight, prediction: str | None, reason: str, thought: str | None = None) -> None:
        """The question's end: its prediction (empty: none), thought and stop reason; `on_done` gets its trajectory."""
        state.traj.prediction = prediction or None
        state.traj.thought = thought
        state.traj.stop_reason = reason
        state.done = True
        if self.on_done is not None:
            self.on_done(state.traj)

    # -- model calls -----------------------------------------------------------------------------
    def generate(self, jobs: Sequence[Job]) -> list[ModelCall]:
        """One batched generate for `jobs`; each becomes a ModelCall on its question's trajectory (methods/calls.py).
        A call the generator refuses gets an empty output and `error` set."""
        cfg = self.config
        specs = [CallSpec(j.state.traj, j.kind, j.round, j.prompt, j.max_new_tokens, j.stop, prefix=j.prefix,
                          decided=j.decided, passage_ids=tuple(p.id for p in j.passages),
                          retrieved_tokens=self.passage_tokens(j.passages), pair=j.pair, adapter=j.adapter)
                 for j in jobs]
        calls, seconds = generate_calls(self.generator, specs, temperature=cfg.temperature, seed=cfg.seed,
                                        adapter=self.adapter)
        self._batch_time += seconds
        return calls

    def decide(self, jobs: Sequence[Job], *, prefix: str, role: str, threshold: float, stream: str) -> None:
        """Each job's Yes/No decided from the model's scores (`decisions.decide_jobs`, at the config's temperature,
        on each call's own seeded stream `stream`); the scoring's seconds go to the jobs' questions."""
        if jobs:
            cfg = self.config
            self._batch_time += decide_jobs(self.generator, jobs, prefix=prefix, role=role, threshold=threshold,
                                            temperature=cfg.temperature, seed=cfg.seed, stream=stream)

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` as the generator counts them (a gold engine, with no model, counts its own way)."""
        return self.generator.count_tokens(text)

    # -- retrieval -------------------------------------------------------------------------------
    def search(self, queries: Sequence[str], owners: Sequence[InFlight]) -> list[list[Passage] | RetrievalError]:
        """One batched search (`config.passages` passages a query; a refused batch retried query by query), its
        seconds shared equally among the queries' questions `owners`. A blank query is not sent and finds nothing;
        a query the retriever refuses comes back as its RetrievalError, for the engine to record."""
        if not queries:
            return []
        t0 = time.perf_counter()
        out: list[list[Passage] | RetrievalError] = [[] for _ in queries]
        todo = [i for i, q in enumerate(queries) if q and q.strip()]
        for i, found in zip(todo, search_each(self.retriever, [queries[i] for i in todo], self.config.passages)):
            out[i] = found if isinstance(found, RetrievalError) else [h.passage for h in found]
        dt = time.perf_counter() - t0
        self._batch_time += dt
        for s in owners:
            s.traj.wall_time += dt / len(queries)
        return out
