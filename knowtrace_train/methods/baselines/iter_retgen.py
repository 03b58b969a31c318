"""Iter-RetGen (Shao et al., 2023): T iterations of retrieval then generation, each query the question plus the previous generation."""

from __future__ import annotations

from knowtrace_train.methods.baselines.common import COT_STOP, cot_prompt
from knowtrace_train.methods.baselines.config import ITER_RETGEN, REASON, IterRetGenConfig
from knowtrace_train.methods.baselines.ra_cot import read_cot_answer
from knowtrace_train.methods.baselines.runner import BaselineStrategy, Live, Runner
from knowtrace_train.methods.engine import Job


def next_query(question: str, generation: str | None) -> str:
    """Iter-RetGen's query: the question, then the previous iteration's generation (none at first)."""
    generation = " ".join((generation or "").split())
    return f"{question} {generation}" if generation else question


class IterRetGen(BaselineStrategy):
    """Every iteration retrieves N passages for its query and writes a whole chain of thought over
    them; the answer is the last iteration's (all T iterations run: the loop has no early stop)."""

    name = ITER_RETGEN

    config_class = IterRetGenConfig

    def loop(self, r: Runner, lives: list[Live]) -> None:
        cfg = self.config
        for rnd in range(1, cfg.max_rounds + 1):
            t0 = r.begin_step()
            found = r.search(lives, [next_query(lv.item.question, lv.state.get("generation")) for lv in lives], rnd)
            steps = [Job(lv, REASON, rnd, cot_prompt(lv.item.question, ps, fewshot=cfg.fewshot), prefix="Answer:",
                          stop=COT_STOP, max_new_tokens=cfg.max_new_tokens, passages=ps) for lv, ps in zip(lives, found)]
            for step, call in zip(steps, r.generate(steps)):
                lv = step.state
                lv.traj.rounds = rnd
                text = r.new_text(call, step)
                answer = read_cot_answer(call, text)
                lv.state["generation"], lv.state["answer"], lv.state["error"] = text.strip(), answer, call.error
            r.end_step(lives, t0)
        for lv in lives:
            reason = "answered" if lv.state.get("error") is None else "no_answer_mark"
            r.finish(lv, lv.state.get("answer"), reason, thought=lv.state.get("generation") or None)
