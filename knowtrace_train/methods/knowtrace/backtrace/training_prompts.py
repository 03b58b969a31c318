"""Training prompts of backtraced records: the prompt the model saw, unhinted, without exemplars, or re-rendered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from knowtrace_train.data.schema import Passage
from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.methods.knowtrace.backtrace.filters import FilteredCall
from knowtrace_train.methods.knowtrace.config import ANSWER, COMPLETE, EXPLORE
from knowtrace_train.trajectory import Trajectory

# -- training prompts ----------------------------------------------------------------------


def _prompts():
    import knowtrace_train.methods.knowtrace.prompts as prompts

    return prompts


def _head_swap(fewshot_text: str, plain_text: str) -> tuple[str, str]:
    """The differing prefixes of the same prompt with and without exemplars."""
    n = 0
    while n < min(len(fewshot_text), len(plain_text)) and fewshot_text[-1 - n] == plain_text[-1 - n]:
        n += 1
    return fewshot_text[: len(fewshot_text) - n], plain_text[: len(plain_text) - n]


def _heads(role: str, prompt_set: str) -> list[tuple[str, str, str]]:
    """(kg_format, few-shot head, plain head) of a role's prompt: the exemplars are a fixed
    block, so removing them is a prefix swap that keeps the rest of the prompt exactly."""
    p = _prompts()
    if role == COMPLETE:
        pair = GuidancePair("E", "G")
        return [("", *_head_swap(p.render_completion_prompt(pair, [], fewshot=True, prompt_set=prompt_set),
                                 p.render_completion_prompt(pair, [], fewshot=False, prompt_set=prompt_set)))]
    out = []
    for fmt in p.KG_FORMATS:
        kw = dict(kg_format=fmt, kg_text=None, prompt_set=prompt_set)
        out.append((fmt, *_head_swap(p.render_exploration_prompt("Q", [], fewshot=True, **kw),
                                     p.render_exploration_prompt("Q", [], fewshot=False, **kw))))
    # a longer head first: "paths"/"text" heads extend the "triplets" one
    return sorted(out, key=lambda h: -len(h[1]))


def _detect_kg_format(prompt: str, prompt_set: str) -> str | None:
    for fmt, with_shots, plain in _heads(EXPLORE, prompt_set):
        if prompt.startswith(with_shots) or prompt.startswith(plain):
            return fmt
    return None


def _without_fewshot(prompt: str, role: str, prompt_set: str) -> str | None:
    """The same prompt without the exemplars; None where it matches no known head."""
    for _, with_shots, plain in _heads(role, prompt_set):
        if prompt.startswith(with_shots):
            return plain + prompt[len(with_shots) :]
    for _, with_shots, plain in _heads(role, prompt_set):
        if prompt.startswith(plain):
            return prompt
    return None


@dataclass(frozen=True)
class PromptOptions:
    """How training prompts are made. `fewshot=False` drops the exemplars (cheaper training
    and rollouts); `rerender=True` shows later explorations only the surviving triplets."""

    fewshot: bool = True
    rerender: bool = False
    #: graph rendering for re-rendered exploration prompts; None: as the rollout prompt used
    kg_format: str | None = None
    #: the prompt set the rollouts were rendered with (prompts.PROMPT_SETS)
    prompt_set: str = "short"


def _render_exploration(
    question: str, triplets: list[Triplet], opts: PromptOptions, seen: str, recorded: str | None = None
) -> str | None:
    p = _prompts()
    fmt = opts.kg_format or recorded or _detect_kg_format(seen, opts.prompt_set) or "triplets"
    if fmt == "text" and triplets:
        return None  # needs a KG-to-Text model call
    return p.render_exploration_prompt(question, triplets, fewshot=opts.fewshot, kg_format=fmt,
                                       prompt_set=opts.prompt_set)


def training_prompt(
    fc: FilteredCall,
    traj: Trajectory,
    question: str,
    s_keys: set[tuple[str, str, str]] | None,
    opts: PromptOptions,
    passages: Mapping[str, Passage],
) -> str | None:
    """The prompt of an SFT record: the one the model saw, with the plain question where the
    rollout was hinted, without exemplars or with only surviving triplets as `opts` asks.
    None where it cannot be made (a passage of a completion prompt is unknown)."""
    from knowtrace_train.methods.hints import unhint_prompt

    call = fc.call
    prompt = call.prompt
    hinted = question.strip() != traj.question.strip()
    if fc.role in (EXPLORE, ANSWER):
        if opts.rerender and s_keys is not None:
            shown = [t.triplet for t in traj.graph.triplets if t.call < call.index and t.triplet.key() in s_keys]
            return _render_exploration(question, shown, opts, prompt, traj.meta.get("kg_format"))
        if hinted:
            plain = unhint_prompt(prompt, traj.question, question)
            if plain is None:
                shown = [t.triplet for t in traj.graph.triplets if t.call < call.index]
                return _render_exploration(question, shown, opts, prompt, traj.meta.get("kg_format"))
            prompt = plain
        if not opts.fewshot:
            stripped = _without_fewshot(prompt, fc.role, opts.prompt_set)
            if stripped is None:
                shown = [t.triplet for t in traj.graph.triplets if t.call < call.index]
                return _render_exploration(question, shown, opts, prompt, traj.meta.get("kg_format"))
            prompt = stripped
        return prompt
    if not opts.fewshot:
        stripped = _without_fewshot(prompt, COMPLETE, opts.prompt_set)
        if stripped is not None:
            return stripped
        if call.pair is None or any(pid not in passages for pid in call.passage_ids):
            return None
        return _prompts().render_completion_prompt(
            call.pair, [passages[pid] for pid in call.passage_ids], fewshot=False, prompt_set=opts.prompt_set
        )
    return prompt
