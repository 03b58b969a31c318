"""The baselines' batched stepping: one generate call and one batched search per step across the live questions, each call recorded.

A baseline's `run` keeps one `Live` per question and, step by step, hands the runner the model calls
(`Step`) and the queries of every question still going. The runner makes ONE `generator.generate`
for the calls and ONE `retriever.search` for the queries, records every call as a `ModelCall` (role,
exact prompt, output = response prefix + generated text, token counts, the passages in the prompt and
their tokens), and attributes wall time to questions by the KnowTrace engine's rule: a batched call's
time split in proportion to each request's tokens, a batched search's equally among its queries, the
strategy's own work between batches equally among the step's questions. A batch the generator or the
retriever refuses is retried one request at a time; what still fails is recorded (the call's `error`,
an event in `meta["events"]`) and the run goes on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.generation.base import Generator
from knowtrace_train.methods.baselines.common import clean_answer, passage_line
from knowtrace_train.methods.baselines.config import BaselineConfig
from knowtrace_train.methods.calls import CallSpec, PassageTokens, generate_calls
from knowtrace_train.methods.hints import trajectory_id
from knowtrace_train.retrieval.base import RetrievalError, Retriever
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)


@dataclass
class Live:
    """One question in flight: its trajectory and the method's running state."""

    item: QAItem
    traj: Trajectory
    #: the model's own running text (a transcript the next call continues)
    transcript: str = ""
    #: passages gathered so far, in the order found, without repeats
    passages: list[Passage] = field(default_factory=list)
    #: passages shown in the transcript so far, repeats included (every later call reads them again)
    shown: list[Passage] = field(default_factory=list)
    #: anything else a method keeps per question (asked sub-questions, the last generation, ...)
    state: dict[str, Any] = field(default_factory=dict)
    done: bool = False

    def event(self, rnd: int, what: str, **details: Any) -> None:
        self.traj.meta["events"].append({"round": rnd, "event": what, **details})

    def add_passages(self, found: Sequence[Passage], cap: int | None = None) -> list[Passage]:
        """Add the passages not seen yet (up to `cap` in all); returns those added."""
        have = {p.id for p in self.passages}
        added = []
        for p in found:
            if cap is not None and len(self.passages) >= cap:
                break
            if p.id not in have:
                self.passages.append(p)
                have.add(p.id)
                added.append(p)
        return added


@dataclass
class Step:
    """One model call to make for one question. `passages` are the retrieved passages its prompt
    (or prefix) carries: their ids and tokens are recorded on the call (Table 5's retrieved tokens)."""

    live: Live
    kind: str
    round: int
    prompt: str
    prefix: str = ""
    stop: tuple[str, ...] = ()
    max_new_tokens: int = 64
    passages: Sequence[Passage] = ()


class Runner:
    """Batched calls and searches for one `run` of a baseline over many questions."""

    def __init__(self, name: str, config: BaselineConfig, generator: Generator, retriever: Retriever,
                 on_done: Callable[[Trajectory], None] | None) -> None:
        self.name, self.config = name, config
        self.generator, self.retriever, self.on_done = generator, retriever, on_done
        self._passage_tokens = PassageTokens(lambda p: passage_line(p, 1), lambda text: self.count_tokens(text))
        self._batch_time = 0.0

    def start(self, items: Sequence[QAItem]) -> list[Live]:
        cfg = self.config
        return [Live(item=it, traj=Trajectory(
            id=trajectory_id(it), question_id=it.id, question=it.question, answers=list(it.answers),
            dataset=it.dataset, strategy=self.name,
            meta={"passages": cfg.passages, "max_rounds": cfg.max_rounds, "events": [], "queries": []}))
            for it in items]

    # -- one step's bookkeeping ------------------------------------------------------------------
    def begin_step(self) -> float:
        self._batch_time = 0.0
        return time.perf_counter()

    def end_step(self, lives: Sequence[Live], started: float) -> None:
        """Share the step's own work (everything but the batched calls and searches) among `lives`."""
        if not lives:
            return
        overhead = max(0.0, time.perf_counter() - started - self._batch_time)
        for lv in lives:
            lv.traj.wall_time += overhead / len(lives)

    def finish(self, live: Live, prediction: str | None, reason: str, thought: str | None = None) -> None:
        live.traj.prediction = prediction or None
        live.traj.thought = thought
        live.traj.stop_reason = reason
        live.done = True
        if self.on_done is not None:
            self.on_done(live.traj)

    # -- retrieval ------------------------------------------------------------------------------
    def search(self, lives: Sequence[Live], queries: Sequence[str], rnd: int) -> list[list[Passage]]:
        """N passages per query, one batched search; an empty query or a refused one finds nothing
        (recorded as an event), as does a query that matches nothing ("empty retrieval")."""
        if not queries:
            return []
        k = self.config.passages
        t0 = time.perf_counter()
        hits: list[list[Passage]] = [[] for _ in queries]
        todo = [i for i, q in enumerate(queries) if q and q.strip()]
        for i, q in enumerate(queries):
            if i not in todo:
                lives[i].event(rnd, "empty query: nothing retrieved")
        if todo:
            try:
                found = self.retriever.search([queries[i] for i in todo], k)
            except RetrievalError as e:
                log.warning("retrieval batch of %d refused (%s); retrying query by query", len(todo), e)
                found = []
                for i in todo:
                    try:
                        found.append(self.retriever.search([queries[i]], k)[0])
                    except RetrievalError as e1:
                        lives[i].event(rnd, f"retrieval error: {e1}", query=queries[i])
                        found.append([])
            if len(found) != len(todo):
                raise RuntimeError(f"retriever returned {len(found)} result lists for {len(todo)} queries")
            for i, f in zip(todo, found):
                hits[i] = [h.passage for h in list(f)[:k]]
        dt = time.perf_counter() - t0
        self._batch_time += dt
        for lv, q, h in zip(lives, queries, hits):
            lv.traj.wall_time += dt / len(queries)
            lv.traj.meta["queries"].append({"round": rnd, "query": q, "passage_ids": [p.id for p in h]})
            if q and q.strip() and not h:
                lv.event(rnd, "empty retrieval", query=q)
        return hits

    # -- generation -----------------------------------------------------------------------------
    def generate(self, steps: Sequence[Step]) -> list[ModelCall]:
        """One batched generate for `steps`; each becomes a ModelCall on its question's trajectory
        (methods/calls.py). A call the generator refuses gets an empty output and `error` set."""
        cfg = self.config
        specs = [CallSpec(s.live.traj, s.kind, s.round, s.prompt, s.max_new_tokens, s.stop, prefix=s.prefix,
                          passage_ids=tuple(p.id for p in s.passages),
                          retrieved_tokens=self._passage_tokens(s.passages)) for s in steps]
        calls, seconds = generate_calls(self.generator, specs, temperature=cfg.temperature, seed=cfg.seed, adapter=cfg.role)
        self._batch_time += seconds
        return calls

    def continue_transcripts(self, lives: Sequence[Live], kind: str, rnd: int, prompt: str, stop: tuple[str, ...],
                             max_new_tokens: int, suffix: str = "") -> list[Step]:
        """Steps that continue each question's transcript (the response prefix, then `suffix`) under
        the same `prompt`; the passages shown in the transcript are the call's retrieved passages."""
        return [Step(lv, kind, rnd, prompt, prefix=lv.transcript + suffix, stop=stop, max_new_tokens=max_new_tokens,
                     passages=tuple(lv.shown)) for lv in lives]

    def forced_answers(self, steps: Sequence[Step], reasons: Sequence[str], key: str = "answer",
                       thought: Callable[[Live], str | None] = lambda lv: None) -> None:
        """One batch of forced final answers (each step's prefix ends where the answer begins): the
        first line of each output is the prediction; an empty one is recorded as the call's error."""
        for step, reason, call in zip(steps, reasons, self.generate(steps)):
            answer = clean_answer(self.new_text(call, step))
            call.parsed = {key: answer}
            if answer is None and call.error is None:
                call.error = "empty forced answer"
            self.finish(step.live, answer, reason, thought=thought(step.live))

    @staticmethod
    def new_text(call: ModelCall, step: Step) -> str:
        """What the model wrote in `call` (its output without the response prefix)."""
        return call.output[len(step.prefix):] if call.error is None else ""

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` as the generator counts them (a gold runner, with no model, counts its own way)."""
        return self.generator.count_tokens(text)


class BaselineStrategy:
    """What every baseline's strategy shares: its config, and a `run` that starts one `Live` per
    question and hands them to the method's `loop`."""

    name = ""
    config_class: type[BaselineConfig] = BaselineConfig

    def __init__(self, config: BaselineConfig | None = None) -> None:
        self.config = config or self.config_class()

    def run(self, items: Sequence[QAItem], generator: Generator, retriever: Retriever,
            on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        runner = Runner(self.name, self.config, generator, retriever, on_done)
        lives = runner.start(items)
        self.loop(runner, lives)
        return [lv.traj for lv in lives]

    def loop(self, r: Runner, lives: list[Live]) -> None:
        raise NotImplementedError
