"""ReAct (Yao et al., 2023) with a retriever: Thought / Action (Search[query] or Finish[answer]) / Observation, until Finish.

The transcript is the model's own answer text (the response prefix). Each call writes "Thought k:"
and "Action k:" and stops where the observation would begin; Search[query] retrieves N passages,
which become "Observation k:"; Finish[answer] ends the question. An action the parser cannot read
is asked for again on its own line ("Action k:", as ReAct's code does); one still unreadable gets
ReAct's "invalid action" observation and the loop goes on; after `max_rounds` thoughts a
question that has not finished gets one forced "Finish[".
"""

from __future__ import annotations

import re

from knowtrace_train.methods.baselines.common import (
    EXEMPLAR_QUESTIONS,
    clean_answer,
    exemplar_passages,
    passages_block,
)
from knowtrace_train.methods.baselines.config import ANSWER, REACT, REASON, ReActConfig
from knowtrace_train.methods.baselines.runner import BaselineStrategy, Live, Runner
from knowtrace_train.methods.engine import Job

INSTRUCTION = ("Solve the question with interleaving Thought, Action and Observation steps. Thought reasons "
               "about the situation; Action is one of: Search[...], which searches the documents for the query in "
               "the brackets and shows the top ones as the Observation; Finish[...], which gives the answer in the brackets and ends.")
STOP = ("\nObservation", "Observation:", "\nQuestion:", "\n\n")
INVALID = "Invalid action. An action is Search[...] with a query, or Finish[...] with the answer."
#: new tokens of an action asked for on its own
ACTION_TOKENS = 24
_ACTION = re.compile(r"\b(search|finish)\s*\[([^\]\n]*)\]?", re.IGNORECASE)
_ACTION_LINE = re.compile(r"action\s*\d*\s*:", re.IGNORECASE)

#: (kind, [(thought, action)]) with "Search[...]" actions observing the exemplar passages in keys
_EXEMPLARS = (
    ("bridge", [("I need to find who founded Brindle Maps, then where that person was born.",
                 "Search[Brindle Maps founder]", ("brindle",)),
                ("Brindle Maps was founded by Tessa Marrow. I need to find where Tessa Marrow was born.",
                 "Search[Tessa Marrow born]", ("marrow",)),
                ("Tessa Marrow was born in Velmoria. So the answer is Velmoria.", "Finish[Velmoria]", ())]),
    ("comparison", [("I need the lengths of the Sarn River and the Oskel River.", "Search[Sarn River length]", ("sarn",)),
                    ("The Sarn River is 412 km long. Now the Oskel River.", "Search[Oskel River length]", ("oskel",)),
                    ("412 km is more than 268 km, so the Sarn River is longer.", "Finish[Sarn River]", ())]),
)


def exemplars() -> str:
    blocks = []
    for kind, steps in _EXEMPLARS:
        lines = [f"Question: {EXEMPLAR_QUESTIONS[kind][0]}"]
        for k, (thought, action, keys) in enumerate(steps, 1):
            lines += [f"Thought {k}: {thought}", f"Action {k}: {action}"]
            if keys:
                lines.append(f"Observation {k}: {passages_block(exemplar_passages(keys))}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def prompt(fewshot: bool) -> str:
    return INSTRUCTION + ("\n\n" + exemplars() if fewshot else "") + "\n\n"


def parse_action(text: str) -> dict:
    """{"thought", "action": "search" | "finish" | None, "argument"}: the first Search[...] or
    Finish[...] on an "Action:" line (or anywhere, where no line says Action), its argument
    stripped; a missing closing bracket is tolerated."""
    text = text or ""
    thought = text.split("\n", 1)[0].strip()
    lines = [x for x in text.split("\n") if _ACTION_LINE.search(x)] or [text]
    for line in lines:
        m = _ACTION.search(line)
        if m:
            return {"thought": thought, "action": m.group(1).lower(), "argument": m.group(2).strip()}
    return {"thought": thought, "action": None, "argument": None}


def kept_text(text: str) -> str:
    """The generated text up to the end of its first action line (what the transcript keeps)."""
    lines = (text or "").rstrip().split("\n")
    for i, line in enumerate(lines):
        if _ACTION_LINE.search(line) and _ACTION.search(line):
            return "\n".join(lines[: i + 1])
    return "\n".join(lines)


class ReAct(BaselineStrategy):
    name = REACT

    config_class = ReActConfig

    def loop(self, r: Runner, lives: list[Live]) -> None:
        cfg = self.config
        for lv in lives:
            lv.transcript = f"Question: {lv.item.question}\nThought 1:"
        text_prompt = prompt(cfg.fewshot)
        for rnd in range(1, cfg.max_rounds + 1):
            active = [lv for lv in lives if not lv.done]
            if not active:
                break
            t0 = r.begin_step()
            steps = r.continue_transcripts(active, REASON, rnd, text_prompt, STOP, cfg.max_new_tokens)
            acts: dict[int, tuple[dict, object]] = {}
            no_action: list[Live] = []
            for step, call in zip(steps, r.generate(steps)):
                lv = step.state
                lv.traj.rounds = rnd
                text = r.new_text(call, step)
                act = parse_action(text)
                call.parsed = act
                if act["action"] is None and call.error is None:
                    # ReAct's own loop: a thought without an action is kept to its first line and the
                    # action asked for on its own ("Action k:", up to the line's end)
                    lv.transcript += " " + act["thought"]
                    no_action.append(lv)
                else:
                    lv.transcript += " " + kept_text(text).strip() if text.strip() else ""
                acts[id(lv)] = (act, call)
            asked = r.continue_transcripts(no_action, REASON, rnd, text_prompt, ("\n",), ACTION_TOKENS,
                                           suffix=f"\nAction {rnd}:")
            for step, call in zip(asked, r.generate(asked)):
                text = r.new_text(call, step)
                act = parse_action(f"{acts[id(step.state)][0]['thought']}\nAction {rnd}:{text}")
                call.parsed = act
                step.state.transcript += f"\nAction {rnd}:{text.rstrip()}"
                acts[id(step.state)] = (act, call)
            searching: list[tuple[Live, str]] = []
            observed: list[tuple[Live, str]] = []
            for lv in active:
                act, call = acts[id(lv)]
                if act["action"] == "finish":
                    answer = clean_answer(act["argument"] or "")
                    if answer is not None:
                        r.finish(lv, answer, "answered", thought=act["thought"] or None)
                        continue
                    call.error = "Finish[] without an answer"
                    observed.append((lv, INVALID))
                elif act["action"] == "search" and act["argument"]:
                    searching.append((lv, act["argument"]))
                else:
                    call.error = call.error or "no Search[query] or Finish[answer] action"
                    observed.append((lv, INVALID))
            hits = r.search([lv for lv, _ in searching], [q for _, q in searching], rnd)
            for (lv, _), found in zip(searching, hits):
                lv.shown.extend(found)
                observed.append((lv, passages_block(found)))
            for lv, observation in observed:
                lv.transcript += f"\nObservation {rnd}: {observation}\nThought {rnd + 1}:"
            if rnd == cfg.max_rounds:
                self._force_answers(r, [lv for lv in active if not lv.done], rnd, text_prompt)
            r.end_step(active, t0)

    def _force_answers(self, r: Runner, lives: list[Live], rnd: int, text_prompt: str) -> None:
        """One batch: the transcript, then "Action: Finish[", for every question still going."""
        steps = []
        for lv in lives:
            head = lv.transcript.rsplit(f"\nThought {rnd + 1}:", 1)[0]
            steps.append(Job(lv, ANSWER, rnd, text_prompt, prefix=f"{head}\nAction {rnd + 1}: Finish[",
                              stop=("]", "\n"), max_new_tokens=self.config.answer_tokens,
                              passages=tuple(lv.shown)))
        r.forced_answers(steps, ["max_rounds"] * len(steps))
