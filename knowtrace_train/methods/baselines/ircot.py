"""IRCoT (Trivedi et al., 2023): one chain-of-thought sentence per round, each sentence the query of the next retrieval.

Round 1 retrieves N passages for the question. Each round the model writes the next sentence of its
chain of thought over every passage gathered so far (at most `max_passages`, the first ones found);
a sentence saying "answer is" ends the question, any other sentence is the next query and its N
passages join the prompt. A question whose chain ends without an answer (`max_rounds` sentences, an
empty sentence, or a sentence repeated) gets one forced answer: the chain so far, then
"So the answer is:".
"""

from __future__ import annotations

from knowtrace_train.methods.baselines.common import (
    ANSWER_MARK,
    COT_STOP,
    cot_prompt,
    extract_answer,
    first_sentence,
    normalized,
)
from knowtrace_train.methods.baselines.config import ANSWER, IRCOT, REASON, IRCoTConfig
from knowtrace_train.methods.baselines.runner import BaselineStrategy, Live, Runner
from knowtrace_train.methods.engine import Job


class IRCoT(BaselineStrategy):
    name = IRCOT

    config_class = IRCoTConfig

    def _prefix(self, lv: Live) -> str:
        return " ".join(["Answer:", *lv.state["chain"]])

    def _step(self, lv: Live, kind: str, rnd: int, extra: str = "") -> Job:
        cfg = self.config
        prefix = self._prefix(lv) + extra
        return Job(lv, kind, rnd, cot_prompt(lv.item.question, lv.passages, fewshot=cfg.fewshot), prefix=prefix,
                    stop=COT_STOP, max_new_tokens=cfg.max_new_tokens if kind == REASON else cfg.answer_tokens,
                    passages=tuple(lv.passages))

    def loop(self, r: Runner, lives: list[Live]) -> None:
        cfg = self.config
        for lv in lives:
            lv.state["chain"] = []
        # the first retrieval: the question
        t0 = r.begin_step()
        for lv, found in zip(lives, r.search(lives, [lv.item.question for lv in lives], 1)):
            lv.add_passages(found, cfg.max_passages)
        r.end_step(lives, t0)
        for rnd in range(1, cfg.max_rounds + 1):
            active = [lv for lv in lives if not lv.done]
            if not active:
                break
            t0 = r.begin_step()
            steps = [self._step(lv, REASON, rnd) for lv in active]
            stopped: list[tuple[Live, str]] = []
            querying: list[tuple[Live, str]] = []
            for step, call in zip(steps, r.generate(steps)):
                lv = step.state
                lv.traj.rounds = rnd
                sentence = first_sentence(r.new_text(call, step))
                call.parsed = {"sentence": sentence}
                answer = extract_answer(sentence)
                if answer is not None:
                    call.parsed["answer"] = answer
                    lv.state["chain"].append(sentence)
                    r.finish(lv, answer, "answered", thought=" ".join(lv.state["chain"]))
                elif not sentence:
                    call.error = call.error or "empty CoT sentence"
                    stopped.append((lv, "no_progress"))
                elif normalized(sentence) in {normalized(s) for s in lv.state["chain"]}:
                    lv.event(rnd, "repeated sentence", sentence=sentence)
                    stopped.append((lv, "no_progress"))
                else:
                    lv.state["chain"].append(sentence)
                    if rnd == cfg.max_rounds:
                        stopped.append((lv, "max_rounds"))
                    else:
                        querying.append((lv, sentence))
            # the sentence is the next query; its passages join the prompt
            hits = r.search([lv for lv, _ in querying], [q for _, q in querying], rnd + 1)
            for (lv, _), found in zip(querying, hits):
                lv.add_passages(found, cfg.max_passages)
            self._force_answers(r, stopped, rnd)
            r.end_step(active, t0)

    def _force_answers(self, r: Runner, stopped: list[tuple[Live, str]], rnd: int) -> None:
        """One batch: the chain so far, then "So the answer is:", for every question that stopped without one."""
        r.forced_answers([self._step(lv, ANSWER, rnd, extra=" " + ANSWER_MARK) for lv, _ in stopped],
                         [reason for _, reason in stopped], thought=lambda lv: " ".join(lv.state["chain"]) or None)
