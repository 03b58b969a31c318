"""The four MINTQA strategies as one batched engine: parametric, direct RAG, decomposition-then-retrieval, dynamic retrieval.

All unfinished questions advance together: each step makes one batch of calls of one kind
across the questions (and one batched retrieval), so a step costs one `generator.generate`
call per kind whatever the number of questions.

- `mintqa_parametric`: one answer call per question, no retrieval.
- `mintqa_rag`: one retrieval with the whole question (top `passages`), one answer call over them.
- `mintqa_decompose`: per step, a decomposition call gives the next sub-question or "finish"; a
  sub-question retrieves `passages` passages and an answer call answers it over them. At most
  `max_steps` sub-questions; a sub-question asked before ends the loop too. Then one final call
  answers the main question from the sub-question/answer history.
- `mintqa_dynamic`: as decompose, but each sub-question is first answered from the model's own
  knowledge with a confidence; only an uncertain or unreadable one retrieves and is answered again
  over its passages.

Each trajectory records, besides its calls, `meta["subquestions"]` (one entry per sub-question:
step, question, answer, whether it retrieved, the confidence), `meta["retrievals"]` (queries sent
to the retriever) and `meta["events"]` (empty retrievals, refused searches, repeated sub-questions).
`stop_reason` says why decomposition ended: "finished", "max_steps", "repeated_subquestion",
"no_subquestion" (an empty decomposition output) or "error: ..."; "answered" for the one-call
strategies. Wall time: each batched call's time is split among its requests by their tokens, each
retrieval's time equally among its queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.generation.base import Generator
from knowtrace_train.methods.engine import Engine, InFlight, Job, new_trajectory
import knowtrace_train.methods.mintqa.prompts as prompts
from knowtrace_train.methods.mintqa.config import (
    ANSWER,
    DECOMPOSE_CALL,
    DYNAMIC,
    PARAMETRIC,
    RAG,
    SELFANSWER,
    SUBANSWER,
    MintQAConfig,
)
from knowtrace_train.methods.mintqa.parsing import parse_answer, parse_selfanswer, parse_step
from knowtrace_train.metrics import normalize_answer
from knowtrace_train.retrieval.base import RetrievalError, Retriever
from knowtrace_train.trajectory import ModelCall, Trajectory

#: what the history shows for a sub-question whose answer call gave nothing usable
NO_ANSWER = "unknown"


@dataclass
class _State(InFlight):
    history: list[tuple[str, str]] = field(default_factory=list)
    pending: str | None = None
    #: the dynamic strategy's self-answer of the pending sub-question ({"answer", "confidence"}), when it retrieves
    own: dict | None = None


class MintQA(Engine):
    """One of MINTQA's strategies (`config.name`) over many questions at once (its plumbing methods/engine.py's), on
    the Generator and Retriever protocols only."""

    def __init__(self, config: MintQAConfig) -> None:
        self.config = config
        self.name = config.name

    def run(
        self,
        items: Sequence[QAItem],
        generator: Generator,
        retriever: Retriever,
        on_done: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        self.bind(generator, retriever, on_done, prompts.render_passage)
        states = [_State(item=it, traj=new_trajectory(it, self.name, {"subquestions": [], "retrievals": 0, "events": []}))
                  for it in items]
        if self.name == PARAMETRIC:
            self._answer_once(states, retrieve=False)
        elif self.name == RAG:
            self._answer_once(states, retrieve=True)
        else:
            self._decompose(states)
        assert all(s.done for s in states)
        return [s.traj for s in states]

    # -- the one-call strategies ----------------------------------------------------------------
    def _answer_once(self, states: list[_State], *, retrieve: bool) -> None:
        cfg = self.config
        for s in states:
            s.traj.rounds = 1
        if retrieve:
            hits = self._search([s.item.question for s in states], states, 1)
            jobs = [Job(s, ANSWER, 1, prompts.rag_prompt(s.item.question, found, cfg.fewshot), cfg.answer_tokens,
                         prompts.LINE_STOP, passages=found) for s, found in zip(states, hits)]
        else:
            jobs = [Job(s, ANSWER, 1, prompts.direct_prompt(s.item.question, cfg.fewshot), cfg.answer_tokens,
                         prompts.LINE_STOP) for s in states]
        for job, call in zip(jobs, self.generate(jobs)):
            self._conclude(job.state, call, "answered")

    # -- decomposition ---------------------------------------------------------------------------
    def _decompose(self, states: list[_State]) -> None:
        cfg = self.config
        active = list(states)
        for step in range(1, cfg.max_steps + 1):
            if not active:
                break
            jobs = [Job(s, DECOMPOSE_CALL, step, prompts.decompose_prompt(s.item.question, s.history, cfg.fewshot),
                         cfg.subquestion_tokens, prompts.LINE_STOP) for s in active]
            asking: list[_State] = []
            stopped: list[tuple[_State, str]] = []
            for job, call in zip(jobs, self.generate(jobs)):
                s = job.state
                s.traj.rounds = step
                if call.error is not None:
                    stopped.append((s, f"error: {call.error}"))
                    continue
                res = parse_step(call.output)
                call.parsed, call.error = res.to_dict(), res.error
                if res.finish:
                    stopped.append((s, "no_subquestion" if res.error else "finished"))
                elif any(normalize_answer(res.subquestion or "") == normalize_answer(q) for q, _ in s.history):
                    s.traj.meta["events"].append({"step": step, "event": "repeated sub-question", "subquestion": res.subquestion})
                    stopped.append((s, "repeated_subquestion"))
                else:
                    s.pending = res.subquestion
                    asking.append(s)
            to_retrieve = self._self_answer(asking, step) if self.name == DYNAMIC else asking
            self._answer_with_passages(to_retrieve, step)
            if step == cfg.max_steps:
                stopped.extend((s, "max_steps") for s in asking)
            self._final(stopped, step)
            active = [s for s in asking if not s.done]

    def _self_answer(self, asking: list[_State], step: int) -> list[_State]:
        """The dynamic strategy's self-answer calls; returns the questions whose sub-question retrieves."""
        cfg = self.config
        jobs = [Job(s, SELFANSWER, step, prompts.selfanswer_prompt(s.pending or "", cfg.fewshot), cfg.confidence_tokens,
                     prompts.SELFANSWER_STOP) for s in asking]
        retrieve = []
        for job, call in zip(jobs, self.generate(jobs)):
            s = job.state
            res = parse_selfanswer(call.output) if call.error is None else None
            if res is not None:
                call.parsed, call.error = res.to_dict(), res.error
            if res is not None and res.certain:
                self._record(s, step, res.answer or NO_ANSWER, retrieved=False, confidence=res.confidence,
                             self_answer=res.answer)
            else:
                s.own = None if res is None else res.to_dict()
                retrieve.append(s)
        return retrieve

    def _answer_with_passages(self, states: list[_State], step: int) -> None:
        cfg = self.config
        hits = self._search([s.pending or "" for s in states], states, step)
        jobs = [Job(s, SUBANSWER, step, prompts.rag_prompt(s.pending or "", found, cfg.fewshot), cfg.answer_tokens,
                     prompts.LINE_STOP, passages=found) for s, found in zip(states, hits)]
        for job, call in zip(jobs, self.generate(jobs)):
            answer, err = parse_answer(call.output) if call.error is None else (None, call.error)
            call.parsed, call.error = {"answer": answer}, err
            own, job.state.own = job.state.own, None
            self._record(job.state, step, answer or NO_ANSWER, retrieved=True,
                         confidence=None if own is None else own["confidence"],
                         self_answer=None if own is None else own["answer"])

    def _record(self, s: _State, step: int, answer: str, *, retrieved: bool, confidence: str | None,
                self_answer: str | None) -> None:
        q = s.pending or ""
        s.history.append((q, answer))
        entry = {"step": step, "question": q, "answer": answer, "retrieved": retrieved}
        if self.name == DYNAMIC:
            entry.update(confidence=confidence, self_answer=self_answer)
        s.traj.meta["subquestions"].append(entry)
        s.pending = None

    def _final(self, stopped: list[tuple[_State, str]], step: int) -> None:
        cfg = self.config
        jobs = [Job(s, ANSWER, step, prompts.final_prompt(s.item.question, s.history, cfg.fewshot), cfg.answer_tokens,
                     prompts.LINE_STOP) for s, _ in stopped]
        for (s, reason), call in zip(stopped, self.generate(jobs)):
            self._conclude(s, call, reason)

    def _conclude(self, s: _State, call: ModelCall, reason: str) -> None:
        answer, err = parse_answer(call.output) if call.error is None else (None, call.error)
        call.parsed, call.error = {"answer": answer}, err
        self.finish(s, answer, reason)

    def _search(self, queries: list[str], owners: list[_State], step: int) -> list[tuple[Passage, ...]]:
        """One batched search; an empty or refused retrieval is recorded as an event and the
        question answered over no passages."""
        out = []
        for q, s, found in zip(queries, owners, self.search(queries, owners)):
            s.traj.meta["retrievals"] += 1
            if isinstance(found, RetrievalError):
                s.traj.meta["events"].append({"step": step, "query": q, "event": f"retrieval error: {found}"})
                found = []
            elif not found:
                s.traj.meta["events"].append({"step": step, "query": q, "event": "empty retrieval"})
            out.append(tuple(found))
        return out
