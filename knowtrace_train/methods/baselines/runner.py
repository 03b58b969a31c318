"""The baselines' batched stepping: one generate call and one batched search per step across the live questions, each call recorded.

A baseline's `run` keeps one `Live` per question and, step by step, hands the runner the model calls
(`Job`s, methods/engine.py) and the queries of every question still going. The runner makes ONE `generator.generate`
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
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.generation.base import Generator
from knowtrace_train.methods.baselines.common import clean_answer, passage_line
from knowtrace_train.methods.baselines.config import BaselineConfig
from knowtrace_train.methods.engine import Engine, InFlight, Job, new_trajectory
from knowtrace_train.retrieval.base import RetrievalError, Retriever
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)


@dataclass
class Live(InFlight):
    """One question in flight: its trajectory and the method's running state."""

    #: the model's own running text (a transcript the next call continues)
    transcript: str = ""
    #: passages gathered so far, in the order found, without repeats
    passages: list[Passage] = field(default_factory=list)
    #: passages shown in the transcript so far, repeats included (every later call reads them again)
    shown: list[Passage] = field(default_factory=list)
    #: anything else a method keeps per question (asked sub-questions, the last generation, ...)
    state: dict[str, Any] = field(default_factory=dict)

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


class Runner(Engine):
    """Batched calls and searches for one `run` of a baseline over many questions (methods/engine.py), every call
    under the config's `role`."""

    def __init__(self, name: str, config: BaselineConfig, generator: Generator, retriever: Retriever,
                 on_done: Callable[[Trajectory], None] | None) -> None:
        self.name, self.config = name, config
        self.bind(generator, retriever, on_done, lambda p: passage_line(p, 1), adapter=config.role)

    def start(self, items: Sequence[QAItem]) -> list[Live]:
        cfg = self.config
        return [Live(item=it, traj=new_trajectory(it, self.name, {"passages": cfg.passages, "max_rounds": cfg.max_rounds,
                                                                  "events": [], "queries": []})) for it in items]

    # -- retrieval ------------------------------------------------------------------------------
    def search(self, lives: Sequence[Live], queries: Sequence[str], rnd: int) -> list[list[Passage]]:  # type: ignore[override]
        """N passages per query, one batched search; an empty query or a refused one finds nothing
        (recorded as an event), as does a query that matches nothing ("empty retrieval")."""
        hits = []
        for lv, q, found in zip(lives, queries, super().search(queries, lives)):
            if not (q and q.strip()):
                lv.event(rnd, "empty query: nothing retrieved")
            elif isinstance(found, RetrievalError):
                lv.event(rnd, f"retrieval error: {found}", query=q)
                found = []
            hits.append(found)
        for lv, q, h in zip(lives, queries, hits):
            lv.traj.meta["queries"].append({"round": rnd, "query": q, "passage_ids": [p.id for p in h]})
            if q and q.strip() and not h:
                lv.event(rnd, "empty retrieval", query=q)
        return hits

    # -- generation -----------------------------------------------------------------------------
    def continue_transcripts(self, lives: Sequence[Live], kind: str, rnd: int, prompt: str, stop: tuple[str, ...],
                             max_new_tokens: int, suffix: str = "") -> list[Job]:
        """Steps that continue each question's transcript (the response prefix, then `suffix`) under
        the same `prompt`; the passages shown in the transcript are the call's retrieved passages."""
        return [Job(lv, kind, rnd, prompt, prefix=lv.transcript + suffix, stop=stop, max_new_tokens=max_new_tokens,
                     passages=tuple(lv.shown)) for lv in lives]

    def forced_answers(self, steps: Sequence[Job], reasons: Sequence[str], key: str = "answer",
                       thought: Callable[[Live], str | None] = lambda lv: None) -> None:
        """One batch of forced final answers (each step's prefix ends where the answer begins): the
        first line of each output is the prediction; an empty one is recorded as the call's error."""
        for step, reason, call in zip(steps, reasons, self.generate(steps)):
            answer = clean_answer(self.new_text(call, step))
            call.parsed = {key: answer}
            if answer is None and call.error is None:
                call.error = "empty forced answer"
            self.finish(step.state, answer, reason, thought=thought(step.state))

    @staticmethod
    def new_text(call: ModelCall, step: Job) -> str:
        """What the model wrote in `call` (its output without the response prefix)."""
        return call.output[len(step.prefix):] if call.error is None else ""


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
