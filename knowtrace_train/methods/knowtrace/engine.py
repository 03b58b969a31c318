"""KnowTrace inference (the paper's Algorithm 1) as a batched rollout engine.

The questions in flight advance together, each at its own round. Each step makes one batch of
exploration calls, one batched retrieval for every guidance pair of every question, one batch of
completion calls (the paper's parallelizable inner loop), then grows each question's traced
knowledge graph. With `width` (questions in flight at once) smaller than the questions given, a
question that finishes hands its place to the next waiting one at the end of the step, so the
batches stay full instead of shrinking to the slowest questions of a fixed group (pipelined);
without it every question starts together (lockstep rounds). A question's calls do not depend on
its batch-mates: each sampled call draws from its own seeded stream, and greedy decoding gives the
same tokens in any batch up to fp32 rounding (docs/selftrain.md, "Resuming"). A question stops when
its exploration answers ("answered"), after `max_rounds` rounds ("max_rounds"), when a round adds no
new triplet ("no_progress"), or when exploration gives neither an answer nor a usable guidance pair
("no_guidance"); with `forced_answer` (the default) every stop without an answer ends
with one forced answering call over the graph (without it, Algorithm 1 as written: no
prediction). Model text never stops a run: unusable outputs are recorded on the call.

Wall time per question follows methods/engine.py's rule (a batched call's time split by tokens, a
retrieval's equally among its queries, the engine's own work equally among the round's questions): the
shares of one question add up to its `wall_time`; the shares of all questions add up to the run's time.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.decisions import require_scorer
from knowtrace_train.generation.base import Generator
from knowtrace_train.kg import GuidancePair, TracedTriplet
from knowtrace_train.methods.base import check_width
from knowtrace_train.methods.engine import Engine, InFlight, Job, new_trajectory
from knowtrace_train.methods.knowtrace.config import ANSWER, COMPLETE, EXPLORE, KG_TO_TEXT, STRATEGY_NAME, KnowTraceConfig
from knowtrace_train.methods.knowtrace.outputs import JUDGEMENT
from knowtrace_train.methods.knowtrace.parsing import ExplorationResult, parse_completion, parse_exploration, parse_kg_text
from knowtrace_train.methods.knowtrace.prompts import (
    COMPLETE_STOP,
    EXPLORE_STOP,
    KG_TO_TEXT_STOP,
    answer_prefix,
    render_completion_prompt,
    render_exploration_prompt,
    render_kg_to_text_prompt,
    render_passage,
)
from knowtrace_train.retrieval.base import RetrievalError, Retriever, pair_to_query
from knowtrace_train.trajectory import Trajectory

log = logging.getLogger(__name__)

#: each call kind's stop strings
_STOPS = {EXPLORE: EXPLORE_STOP, ANSWER: EXPLORE_STOP, COMPLETE: COMPLETE_STOP, KG_TO_TEXT: KG_TO_TEXT_STOP}

@dataclass
class _State(InFlight):
    """One question in flight."""

    #: KG-to-Text output for the graph's first `kg_text_size` triplets
    kg_text: str | None = None
    kg_text_size: int = 0
    #: why the question stopped without an answer (then it gets a forced answering call)
    pending_stop: str | None = None
    #: the round the question is in (1 in its first step)
    round: int = 0


class KnowTrace(Engine):
    """Algorithm 1 over many questions at once (its plumbing methods/engine.py's). Uses only the Generator and
    Retriever protocols."""

    name = STRATEGY_NAME
    #: `run` takes `width` (methods.base.run_strategy)
    pipelined = True

    def __init__(self, config: KnowTraceConfig | None = None) -> None:
        self.config = config or KnowTraceConfig()

    # -- public -------------------------------------------------------------------
    def run(
        self,
        items: Sequence[QAItem],
        generator: Generator,
        retriever: Retriever,
        on_done: Callable[[Trajectory], None] | None = None,
        width: int | None = None,
    ) -> list[Trajectory]:
        """The questions' trajectories, in their order; `on_done` gets each as it finishes. `width`: the
        questions in flight at once (None: all of them)."""
        cfg = self.config
        check_width(width)
        if cfg.judgement_threshold is not None:
            require_scorer(generator, "strategy knowtrace with judgement_threshold")
        states = [_State(item=it, traj=new_trajectory(it, self.name, {
            "kg_format": cfg.kg_format, "max_rounds": cfg.max_rounds, "passages": cfg.passages, "events": []}))
            for it in items]
        self.bind(generator, retriever, on_done, render_passage)
        waiting = deque(states)
        active: list[_State] = []
        while waiting or active:
            while waiting and (width is None or len(active) < width):
                active.append(waiting.popleft())
            for s in active:
                s.round += 1
            self._round(active)
            # Round L ends every question it reaches (answered, or stopped and answered by force).
            assert all(s.done for s in active if s.round == cfg.max_rounds)
            active = [s for s in active if not s.done]
        return [s.traj for s in states]

    # -- one step: each active question's next round -------------------------------
    def _round(self, active: list[_State]) -> None:
        cfg = self.config
        t_round = self.begin_step()

        if cfg.kg_format == "text":
            self._refresh_kg_text(active)

        # 1. Knowledge exploration, one batch.
        prefix = JUDGEMENT if cfg.prefill_judgement else ""
        jobs = [self._job(s, EXPLORE, self._exploration_prompt(s), prefix=prefix) for s in active]
        if cfg.judgement_threshold is not None:
            self._decide(jobs)
        calls = self.generate(jobs)
        to_complete: list[tuple[_State, GuidancePair, int]] = []
        stopped: list[_State] = []
        for job, call in zip(jobs, calls):
            s = job.state
            s.traj.rounds = s.round
            res = parse_exploration(call.output, cut=call.finish_reason == "length") if call.error is None else None
            if res is not None:
                call.parsed = res.to_dict()
                call.error = res.error
                if job.log_odds is not None:
                    call.parsed["judgement_log_odds"] = round(job.log_odds, 4)
                    call.parsed["judgement_threshold"] = cfg.judgement_threshold
            if res is not None and res.answered:
                self.finish(s, res.answer, "answered", thought=res.thought)
                continue
            # Guidance pairs are followed even when the judgement is missing or contradicts
            # them (the call keeps its recorded error); small models often write them so.
            pairs = list(res.pairs) if res is not None else []
            if cfg.max_pairs:
                pairs = pairs[: cfg.max_pairs]
            if call.parsed is not None:
                # the pairs after these were parsed but never retrieved: neither trained nor counted in FA
                call.parsed["pairs_run"] = len(pairs)
            if not pairs:
                s.pending_stop = "no_guidance" if res is not None else f"error: {call.error}"
                stopped.append(s)
                continue
            for p in pairs:
                s.traj.graph.note_expansion_point(p.entity, round=s.round, call=call.index)
                to_complete.append((s, p, call.index))

        # 2. One batched retrieval for every guidance pair (a query the retriever refuses is recorded, finds nothing).
        queries = [pair_to_query(p.entity, p.guidance) for _, p, _ in to_complete]
        hits = self.search(queries, [s for s, _, _ in to_complete])
        for (s, _, _), q, found in zip(to_complete, queries, hits):
            if isinstance(found, RetrievalError):
                s.traj.meta["events"].append({"round": s.round, "query": q, "event": f"retrieval error: {found}"})

        # 3. Knowledge completion, one batch (a pair with no passage is skipped and recorded).
        jobs = []
        for (s, p, _), found in zip(to_complete, hits):
            passages = () if isinstance(found, RetrievalError) else tuple(found)
            if not passages:
                s.traj.meta["events"].append({"round": s.round, "pair": [p.entity, p.guidance], "event": "empty retrieval"})
                continue
            prompt = render_completion_prompt(p, passages, fewshot=cfg.fewshot.complete, prompt_set=cfg.prompts)
            jobs.append(self._job(s, COMPLETE, prompt, pair=p, passages=passages))
        size_before = {id(s): len(s.traj.graph.triplets) for s, _, _ in to_complete}
        calls = self.generate(jobs)
        for job, call in zip(jobs, calls):
            if call.error is not None:
                continue
            res = parse_completion(call.output, cut=call.finish_reason == "length")
            call.parsed = res.to_dict()
            call.error = res.error
            g = job.state.traj.graph
            for t in res.triplets:
                traced = TracedTriplet(
                    triplet=t, round=job.round, pair=job.pair, call=call.index, passage_ids=tuple(p.id for p in job.passages)
                )
                if g.add(traced):
                    call.triplets.append(len(g.triplets) - 1)

        # 4. Who goes on.
        expanded = {id(s): s for s, _, _ in to_complete}
        for s in expanded.values():
            if len(s.traj.graph.triplets) == size_before[id(s)]:
                s.pending_stop = "no_progress"
                stopped.append(s)
            elif s.round == cfg.max_rounds:
                s.pending_stop = "max_rounds"
                stopped.append(s)

        # Bookkeeping time of this round, shared equally by the round's questions.
        self.end_step(active, t_round)

        if stopped:
            stopped.sort(key=lambda s: active.index(s))
            if cfg.forced_answer:
                self._finish_unanswered(stopped)
            else:
                for s in stopped:
                    self.finish(s, None, s.pending_stop or "max_rounds")

    # -- the parts ----------------------------------------------------------------
    def _job(self, s: _State, kind: str, prompt: str, **more: Any) -> Job:
        """A call of `kind` in the question's round, with that kind's token limit, stop strings and adapter."""
        cfg = self.config
        return Job(s, kind, s.round, prompt, getattr(cfg.max_new_tokens, kind), _STOPS[kind],
                   adapter=getattr(cfg.roles, kind), **more)

    def _exploration_prompt(self, s: _State) -> str:
        cfg = self.config
        return render_exploration_prompt(
            s.item.question,
            [t.triplet for t in s.traj.graph.triplets],
            fewshot=cfg.fewshot.explore,
            kg_format=cfg.kg_format,
            kg_text=s.kg_text,
            prompt_set=cfg.prompts,
        )

    def _refresh_kg_text(self, states: list[_State]) -> None:
        """KG-to-Text: one batched call for every question whose graph grew since its last text."""
        cfg = self.config
        stale = [s for s in states if s.traj.graph.triplets and s.kg_text_size != len(s.traj.graph.triplets)]
        jobs = [
            self._job(s, KG_TO_TEXT, render_kg_to_text_prompt([t.triplet for t in s.traj.graph.triplets], fewshot=cfg.fewshot.kg_to_text))
            for s in stale
        ]
        for job, call in zip(jobs, self.generate(jobs)):
            s = job.state
            text = parse_kg_text(call.output) if call.error is None else ""
            call.parsed = {"text": text}
            if not text:
                call.error = call.error or "empty KG-to-Text output (the graph is shown as triplets instead)"
                text = "\n".join(t.triplet.render() for t in s.traj.graph.triplets)
            s.kg_text, s.kg_text_size = text, len(s.traj.graph.triplets)

    def _finish_unanswered(self, states: list[_State]) -> None:
        """The forced answering call for questions that stopped without an answer, one batch."""
        cfg = self.config
        t0 = self.begin_step()
        if cfg.kg_format == "text":
            self._refresh_kg_text(states)
        # the exploration prompt, its answer started with the judgement fixed to Yes and `Thought:`
        jobs = [self._job(s, ANSWER, self._exploration_prompt(s), prefix=answer_prefix(cfg.prompts)) for s in states]
        for job, call in zip(jobs, self.generate(jobs)):
            if call.error is None:
                res = parse_exploration(call.output, cut=call.finish_reason == "length")
            else:
                res = ExplorationResult(error=call.error)
            call.parsed = res.to_dict()
            call.error = res.error if call.error is None else call.error
            self.finish(job.state, res.answer, job.state.pending_stop or "max_rounds", thought=res.thought)
        self.end_step(states, t0)

    def _decide(self, jobs: list[Job]) -> None:
        """The sufficiency judgement of each exploration as a calibrated decision (`decisions.decide_jobs`): P(" Yes")
        and P(" No") after the judgement words (one batched scoring, no decoding), Yes where the log-odds exceed
        `judgement_threshold` (sampled at the strategy's temperature, on the call's own seeded stream). The chosen
        word is fed after the judgement words and recorded as the model's output: training puts its loss on it,
        as on any generated token. A request the scorer refuses is left to greedy decoding. The seconds are
        shared among the jobs' questions."""
        cfg = self.config
        self.decide(jobs, prefix=JUDGEMENT, role=cfg.roles.explore, threshold=cfg.judgement_threshold, stream="judgement")
