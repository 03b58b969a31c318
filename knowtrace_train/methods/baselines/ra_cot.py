"""RA-CoT (the KnowTrace paper's Appendix C): one retrieval with the question as the query, then one chain of thought over the N passages."""

from __future__ import annotations

from knowtrace_train.methods.baselines.common import COT_STOP, cot_prompt, extract_answer, last_sentence
from knowtrace_train.methods.baselines.config import RA_COT, REASON, RACoTConfig
from knowtrace_train.methods.baselines.runner import BaselineStrategy, Live, Runner
from knowtrace_train.methods.engine import Job
from knowtrace_train.trajectory import ModelCall

NO_ANSWER = 'no "So the answer is:" in the chain of thought; its last sentence is taken as the answer'


def read_cot_answer(call: ModelCall, text: str) -> str | None:
    """The answer of a whole chain of thought (`text`): after "answer is", else its last sentence
    with the call's error saying so; recorded in `call.parsed`."""
    answer = extract_answer(text)
    if answer is None and call.error is None:
        answer = last_sentence(text)
        call.error = NO_ANSWER
    call.parsed = {"answer": answer}
    return answer


class RACoT(BaselineStrategy):
    name = RA_COT

    config_class = RACoTConfig

    def loop(self, r: Runner, lives: list[Live]) -> None:
        cfg = self.config
        t0 = r.begin_step()
        found = r.search(lives, [lv.item.question for lv in lives], 1)
        steps = [Job(lv, REASON, 1, cot_prompt(lv.item.question, ps, fewshot=cfg.fewshot), prefix="Answer:",
                      stop=COT_STOP, max_new_tokens=cfg.max_new_tokens, passages=ps) for lv, ps in zip(lives, found)]
        calls = r.generate(steps)
        for step, call in zip(steps, calls):
            lv = step.state
            lv.traj.rounds = 1
            text = r.new_text(call, step)
            answer = read_cot_answer(call, text)
            r.finish(lv, answer, "answered" if call.error is None else "no_answer_mark", thought=text.strip() or None)
        r.end_step(lives, t0)
