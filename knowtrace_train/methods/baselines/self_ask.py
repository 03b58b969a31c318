"""Self-Ask (Press et al., 2023) with a retriever: Follow up, its N passages as context, Intermediate answer, until "So the final answer is:".

The transcript is the model's own answer text (the response prefix), so each call continues it:
a call writes the intermediate answer of the last follow-up (none at first) and then either the
next "Follow up: <sub-question>" or "So the final answer is: <answer>". Generation stops where the
model would write the context or the intermediate answer itself; the strategy retrieves N passages
for the follow-up, appends them as "Context:" and opens "Intermediate answer:". A sub-question
loop that never finishes is bounded: `max_rounds` follow-ups, a follow-up asked twice, or a call
with neither a follow-up nor a final answer end the question with a forced "So the final answer is:".
"""

from __future__ import annotations

import re

from knowtrace_train.methods.baselines.common import (
    EXEMPLAR_DOCS,
    EXEMPLAR_QUESTIONS,
    clean_answer,
    exemplar_passages,
    normalized,
    passages_block,
)
from knowtrace_train.methods.baselines.config import ANSWER, REASON, SELF_ASK, SelfAskConfig
from knowtrace_train.methods.baselines.runner import BaselineStrategy, Live, Runner

INSTRUCTION = ("Answer the question by asking simpler follow up questions. Each follow up question is "
               "searched and the context found is shown; answer it, then ask the next one or give the final answer.")
NEEDED = "Are follow up questions needed here:"
FINAL = "So the final answer is:"
#: where the model would write the context or the intermediate answer itself, or start a new question
#: (no blank-line stop: a small model often puts a blank line before its first follow-up)
STOP = ("Context:", "Intermediate answer:", "\nQuestion:")
_FOLLOW_UP = re.compile(r"follow[ -]?up\s*:\s*(.*)", re.IGNORECASE)
_FINAL = re.compile(r"final answer is\s*:?\s*(.*)", re.IGNORECASE)

#: (question, [(follow-up, exemplar passage keys, intermediate answer)], final answer)
_EXEMPLARS = (
    ("bridge", [("Who founded Brindle Maps?", ("brindle",), "Tessa Marrow."),
                ("Where was Tessa Marrow born?", ("marrow",), "Velmoria.")]),
    ("comparison", [("How long is the Sarn River?", ("sarn",), "412 km."),
                    ("How long is the Oskel River?", ("oskel",), "268 km.")]),
)


def exemplars() -> str:
    blocks = []
    for kind, steps in _EXEMPLARS:
        question, answer = EXEMPLAR_QUESTIONS[kind]
        lines = [f"Question: {question}", f"{NEEDED} Yes."]
        for sub, keys, mid in steps:
            lines += [f"Follow up: {sub}", f"Context: {passages_block(exemplar_passages(keys))}",
                      f"Intermediate answer: {mid}"]
        lines.append(f"{FINAL} {answer}.")
        blocks.append("\n".join(lines))
    assert all(k in EXEMPLAR_DOCS for k, _ in _EXEMPLARS)
    return "\n\n".join(blocks)


def prompt(fewshot: bool) -> str:
    return INSTRUCTION + ("\n\n" + exemplars() if fewshot else "") + "\n\n"


def parse_step(text: str) -> dict:
    """{"intermediate": the text before the first follow-up or final answer (the last follow-up's
    answer), "follow_up": the last follow-up question written, "final": the final answer} (None
    where absent). A final answer wins over a follow-up written before it."""
    out: dict = {"intermediate": None, "follow_up": None, "final": None}
    lines = [x.strip() for x in (text or "").split("\n")]
    head = []
    for line in lines:
        fin, fol = _FINAL.search(line), _FOLLOW_UP.match(line)
        if fin:
            out["final"] = clean_answer(fin.group(1))
            if out["final"] is not None:
                break
        elif fol:
            out["follow_up"] = fol.group(1).strip() or None
        elif out["follow_up"] is None and line and not line.lower().startswith(NEEDED.lower()[:8]):
            head.append(line)
    out["intermediate"] = clean_answer(" ".join(head)) if head else None
    return out


def kept_text(text: str) -> str:
    """The generated text up to the end of its last "Follow up:" line (what the transcript keeps)."""
    lines = (text or "").rstrip().split("\n")
    last = max((i for i, x in enumerate(lines) if _FOLLOW_UP.match(x.strip())), default=len(lines) - 1)
    return "\n".join(lines[: last + 1]).rstrip()


class SelfAsk(BaselineStrategy):
    name = SELF_ASK

    config_class = SelfAskConfig

    def loop(self, r: Runner, lives: list[Live]) -> None:
        cfg = self.config
        for lv in lives:
            lv.transcript = f"Question: {lv.item.question}\n{NEEDED}"
            lv.state["asked"] = []
        text_prompt = prompt(cfg.fewshot)
        for rnd in range(1, cfg.max_rounds + 2):
            active = [lv for lv in lives if not lv.done]
            if not active:
                break
            t0 = r.begin_step()
            steps = r.continue_transcripts(active, REASON, rnd, text_prompt, STOP, cfg.max_new_tokens)
            stopped: list[tuple[Live, str]] = []
            asking: list[tuple[Live, str]] = []
            for step, call in zip(steps, r.generate(steps)):
                lv = step.state
                text = r.new_text(call, step)
                parsed = parse_step(text)
                call.parsed = parsed
                if parsed["final"] is not None:
                    lv.traj.rounds = max(lv.traj.rounds, 1)
                    r.finish(lv, parsed["final"], "answered", thought=(lv.transcript + text).strip())
                elif parsed["follow_up"] is None:
                    call.error = call.error or "neither a follow up question nor a final answer"
                    stopped.append((lv, "no_guidance"))
                elif normalized(parsed["follow_up"]) in lv.state["asked"]:
                    lv.event(rnd, "follow up asked again", follow_up=parsed["follow_up"])
                    lv.transcript += kept_text(text)
                    stopped.append((lv, "repeated_follow_up"))
                elif rnd > cfg.max_rounds:
                    lv.transcript += kept_text(text)
                    stopped.append((lv, "max_rounds"))
                else:
                    lv.traj.rounds = rnd
                    lv.state["asked"].append(normalized(parsed["follow_up"]))
                    lv.transcript += kept_text(text)
                    asking.append((lv, parsed["follow_up"]))
            hits = r.search([lv for lv, _ in asking], [q for _, q in asking], rnd)
            for (lv, _), found in zip(asking, hits):
                lv.shown.extend(found)
                lv.transcript += f"\nContext: {passages_block(found)}\nIntermediate answer:"
            self._force_answers(r, stopped, rnd, text_prompt)
            r.end_step(active, t0)

    def _force_answers(self, r: Runner, stopped: list[tuple[Live, str]], rnd: int, text_prompt: str) -> None:
        for lv, _ in stopped:
            lv.transcript = lv.transcript.rstrip()
        steps = r.continue_transcripts([lv for lv, _ in stopped], ANSWER, rnd, text_prompt, STOP,
                                       self.config.answer_tokens, suffix=f"\n{FINAL}")
        r.forced_answers(steps, [reason for _, reason in stopped], key="final", thought=lambda lv: lv.transcript.strip())
