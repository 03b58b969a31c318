"""Gold trajectories of the baselines: the ideal run of each baseline's own loop over an item's gold evidence chain.

The chain is KnowTrace's (methods/gold_chain.py): per hop its sub-question, its answer (the triplet's
object) and the sentence that states it. Each baseline writes the chain in its own call format:

    self_ask     " Yes.\\nFollow up: <q1>", then " <a1>.\\nFollow up: <q2>", ..., " <an>.\\nSo the final answer is: <answer>."
    ircot        one CoT sentence per call (" <s1>", " <s2>", ...), then " So the answer is: <answer>."
    react        " <thought k>\\nAction k: Search[<qk>]" per hop, then " <sn> So the answer is <answer>.\\nAction n+1: Finish[<answer>]"
    ra_cot       one call: " <s1> <s2> ... So the answer is: <answer>."
    iter_retgen  the same chain of thought in each of its T iterations

The trajectory is made by the method's own loop (`strategy.loop`) on a runner whose "generator" writes
these texts: the prompts, response prefixes, transcripts and retrieval queries are the method's own,
the passages are the real retriever's (N = `passages` per query), and the method's own parser reads
every gold output. An item is skipped, counted under its reason, where:

    no_chain / no_chain_entity  the item has no gold chain (HotpotQA) or a step without an entity
    too_many_hops               the chain needs more rounds than the method's `max_rounds` allows
    unreadable_step             the method's loop does not read a gold output back as the intended step
                                (a sub-question asked twice, a sentence its sentence splitter would cut, a
                                bracket in a ReAct answer): the loop ended otherwise than with the gold answer
    unsupported_hop             (with `require_support`) a hop's answer is not stated in the passages the
                                method retrieved for that hop: Self-Ask's follow-up and ReAct's Search of
                                that hop, the passages in IRCoT's prompt when it writes the hop's sentence,
                                RA-CoT's one retrieval, every one of Iter-RetGen's T retrievals

The records are the STaR records of these trajectories (methods/star.py): prompt and output (response
prefix included) of every call, under the call's kind, exactly as a rollout's correct calls are written
(methods/gold_records.py, with what else the methods' gold modules share).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.decisions import DecisionPrompt
from knowtrace_train.methods.baselines.common import ANSWER_MARK, COT_STOP, clean_answer, extract_answer, first_sentence
from knowtrace_train.methods.baselines.config import IRCOT, ITER_RETGEN, RA_COT, REACT, REASON, SELF_ASK, BaselineConfig
from knowtrace_train.methods.baselines.runner import Live, Runner
from knowtrace_train.methods.engine import Job
from knowtrace_train.methods.baselines.self_ask import FINAL, NEEDED
from knowtrace_train.methods.base import get_method
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP, Hop, checked_chain
from knowtrace_train.methods.gold_chain import hop_sentence, supported
from knowtrace_train.methods.gold_records import TOO_MANY_HOPS, UNREADABLE_STEP, GoldRecords, GoldTally, gold_call
from knowtrace_train.methods.gold_records import GoldTrajectories, gold_records, read_back, words
from knowtrace_train.metrics import question_kind
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import ModelCall, Trajectory

#: every reason a baseline's gold trajectory may be skipped for
SKIP_REASONS = (NO_CHAIN, NO_CHAIN_ENTITY, TOO_MANY_HOPS, UNREADABLE_STEP, UNSUPPORTED_HOP)


@dataclass(frozen=True)
class GoldStep:
    """One gold call: the text the model should write after the call's response prefix, and what the
    method's parser must read from it (keys of `ModelCall.parsed` and their values)."""

    text: str
    expect: Mapping[str, Any]


def _period(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _cot(hops: Sequence[Hop], answer: str) -> str:
    """The gold chain of thought: one sentence per hop, then "So the answer is: <answer>."."""
    return " ".join([*(hop_sentence(h) for h in hops), f"{ANSWER_MARK} {_period(answer)}"])


# -- each baseline's gold calls ------------------------------------------------------------------


def self_ask_steps(hops: Sequence[Hop], answer: str) -> list[GoldStep]:
    """Self-Ask: the first call says follow-ups are needed and asks the first sub-question; each
    later call answers the last follow-up and asks the next; the last one answers and concludes."""
    steps = [GoldStep(f" Yes.\nFollow up: {hops[0].question}", {"follow_up": hops[0].question, "final": None})]
    for prev, hop in zip(hops, hops[1:]):
        steps.append(GoldStep(f" {_period(prev.triplet.object)}\nFollow up: {hop.question}",
                              {"intermediate": clean_answer(prev.triplet.object), "follow_up": hop.question,
                               "final": None}))
    steps.append(GoldStep(f" {_period(hops[-1].triplet.object)}\n{FINAL} {_period(answer)}",
                          {"intermediate": clean_answer(hops[-1].triplet.object), "final": clean_answer(answer)}))
    return steps


def ircot_steps(hops: Sequence[Hop], answer: str) -> list[GoldStep]:
    """IRCoT: one sentence per call, each stating a hop's answer (and then the next query), then the answer."""
    last = f"{ANSWER_MARK} {_period(answer)}"
    return [GoldStep(f" {hop_sentence(h)}", {"sentence": hop_sentence(h)}) for h in hops] + [
        GoldStep(f" {last}", {"sentence": last, "answer": clean_answer(answer)})]


def react_query(hop: Hop) -> str:
    """ReAct's Search query for a hop: its sub-question."""
    return hop.question


def react_steps(hops: Sequence[Hop], answer: str) -> list[GoldStep]:
    """ReAct: per hop a thought (what the last observation said, what to find next) and Search[the
    hop's sub-question]; then a thought with the last hop's answer and Finish[answer]."""
    steps = []
    for k, hop in enumerate(hops):
        said = f"{hop_sentence(hops[k - 1])} " if k else ""
        thought = f"{said}Now I need to find out: {hop.question}" if k else f"I need to find out: {hop.question}"
        steps.append(GoldStep(f" {thought}\nAction {k + 1}: Search[{react_query(hop)}]",
                              {"thought": thought, "action": "search", "argument": react_query(hop)}))
    thought = f"{hop_sentence(hops[-1])} So the answer is {_period(answer)}"
    steps.append(GoldStep(f" {thought}\nAction {len(hops) + 1}: Finish[{answer}]",
                          {"thought": thought, "action": "finish", "argument": answer.strip()}))
    return steps


def cot_steps(hops: Sequence[Hop], answer: str, calls: int = 1) -> list[GoldStep]:
    """RA-CoT (one call) and Iter-RetGen (one call per iteration): the whole gold chain of thought."""
    return [GoldStep(f" {_cot(hops, answer)}", {"answer": clean_answer(answer)}) for _ in range(calls)]


def _hops_fit(name: str, hops: Sequence[Hop], config: BaselineConfig) -> bool:
    """Whether the method's loop has the rounds the chain needs (else the loop would force an answer)."""
    if name == SELF_ASK:
        return len(hops) <= config.max_rounds  # one follow-up per hop; the final answer may come after the last
    if name in (IRCOT, REACT):
        return len(hops) + 1 <= config.max_rounds  # a sentence / thought per hop, and one with the answer
    return True


def gold_steps(name: str, hops: Sequence[Hop], answer: str, config: BaselineConfig) -> list[GoldStep]:
    """The gold calls of baseline `name` over `hops`."""
    if name == SELF_ASK:
        return self_ask_steps(hops, answer)
    if name == IRCOT:
        return ircot_steps(hops, answer)
    if name == REACT:
        return react_steps(hops, answer)
    if name == RA_COT:
        return cot_steps(hops, answer)
    if name == ITER_RETGEN:
        return cot_steps(hops, answer, config.max_rounds)
    raise ValueError(f"baseline {name!r} has no gold trajectories; those that have: {sorted(GOLD_BASELINES)}")


def hop_passages(name: str, traj: Trajectory, hops: Sequence[Hop],
                 passages: Mapping[str, Passage]) -> list[list[list[Passage]]]:
    """Per hop, the passage lists that must each state the hop's answer: the passages the method
    retrieved for that hop (see the module docstring)."""
    def ids(found: Iterable[str]) -> list[Passage]:
        return [passages[i] for i in found]

    if name in (SELF_ASK, REACT):  # the k-th retrieval is the k-th hop's sub-question
        queries = traj.meta["queries"]
        return [[ids(queries[k]["passage_ids"])] for k in range(len(hops))]
    if name == IRCOT:  # the passages in the prompt of the call that writes the hop's sentence
        return [[ids(traj.calls[k].passage_ids)] for k in range(len(hops))]
    # RA-CoT's one call, Iter-RetGen's every call: each states the whole chain
    every = [ids(c.passage_ids) for c in traj.calls]
    return [every for _ in hops]


#: the baselines with gold trajectories
GOLD_BASELINES = (RA_COT, REACT, IRCOT, SELF_ASK, ITER_RETGEN)


# -- the runner that writes the gold outputs ----------------------------------------------------------


class GoldRunner(Runner):
    """A Runner whose model calls write each question's gold steps instead of generating: the method's
    loop, parsers and retrieval run as they do in a rollout. A call beyond the script, or of another
    kind than a reasoning step (a forced answer), gets an empty output and `OFF_SCRIPT` as its error."""

    def __init__(self, name: str, config: BaselineConfig, retriever: Retriever,
                 scripts: Mapping[str, Sequence[GoldStep]], count_tokens: Callable[[str], int]) -> None:
        super().__init__(name, config, None, retriever, None)  # type: ignore[arg-type]
        self.scripts = scripts
        self.count = count_tokens
        #: every passage a search returned, by id
        self.found: dict[str, Passage] = {}

    def search(self, lives: Sequence[Live], queries: Sequence[str], rnd: int) -> list[list[Passage]]:
        hits = super().search(lives, queries, rnd)
        for found in hits:
            self.found.update((p.id, p) for p in found)
        return hits

    def count_tokens(self, text: str) -> int:
        return self.count(text)

    def generate(self, steps: Sequence[Job]) -> list[ModelCall]:
        calls = []
        for s in steps:
            script = self.scripts[s.state.item.id]
            index = len(s.state.traj.calls)
            text = script[index].text if s.kind == REASON and index < len(script) else None
            calls.append(gold_call(s.state.traj, s.kind, s.round, s.prompt, text, self.count, prefix=s.prefix,
                                   passage_ids=[p.id for p in s.passages],
                                   retrieved_tokens=self.passage_tokens(s.passages)))
        return calls


# -- gold trajectories and their records ------------------------------------------------------------


def baseline_gold_trajectories(name: str, config: BaselineConfig, items: Iterable[QAItem], retriever: Retriever,
                               *, fewshot: bool = True, require_support: bool = True,
                               count_tokens: Callable[[str], int] | None = None,
                               batch_size: int = 256) -> GoldTrajectories:
    """The gold trajectories of baseline `name` (its settings `config`, prompts with exemplars as
    `fewshot` says) for the items that have one, and per-reason counts of those that have none."""
    if name not in GOLD_BASELINES:
        raise ValueError(f"baseline {name!r} has no gold trajectories; those that have: {sorted(GOLD_BASELINES)}")
    count = count_tokens or words
    config = dataclasses.replace(config, fewshot=fewshot)
    strategy = get_method(name).strategy(config)
    tally = GoldTally()
    todo: list[tuple[QAItem, list[Hop], list[GoldStep]]] = []
    for it in items:
        chain = checked_chain(it, need=("question", "object"))
        if isinstance(chain, str):
            tally.skip(chain)
        elif not _hops_fit(name, chain, config):
            tally.skip(TOO_MANY_HOPS)
        else:
            todo.append((it, chain, gold_steps(name, chain, it.answer, config)))
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        runner = GoldRunner(name, config, retriever, {it.id: steps for it, _, steps in batch}, count)
        lives = runner.start([it for it, _, _ in batch])
        strategy.loop(runner, lives)
        for (it, chain, steps), lv in zip(batch, lives):
            traj, reason = lv.traj, None
            if not read_back(traj, [s.expect for s in steps], it, "answered"):
                reason = UNREADABLE_STEP
            elif require_support and not all(supported(h.triplet, ps) for h, lists in
                                              zip(chain, hop_passages(name, traj, chain, runner.found)) for ps in lists):
                reason = UNSUPPORTED_HOP
            tally.add(traj, it, reason)
    return tally.result()


def baseline_gold_records(name: str, config: BaselineConfig, items: Iterable[QAItem], retriever: Retriever,
                          **keywords: Any) -> GoldRecords:
    """The records of baseline `name`'s gold trajectories of `items` (`keywords`: those of
    methods/gold_records.py's `gold_records`, `record_kinds` among them)."""
    run = functools.partial(baseline_gold_trajectories, name, config, retriever=retriever)
    return gold_records(name, run, items, **keywords)


# -- Self-Ask's decisions as held-out gold prompts ---------------------------------------------------------

#: Self-Ask's two decisions: whether follow-up questions are needed (" Yes" / " No" after "Are follow up questions
#: needed here:"), and after an intermediate answer whether the final answer comes now ("So the final answer is:")
#: or another follow-up ("Follow up:")
FOLLOW_UP_NEEDED, FINAL_ANSWER = "follow_up_needed", "final_answer"


def self_ask_prompts(config: BaselineConfig, items: Iterable[QAItem], retriever: Retriever) -> list[DecisionPrompt]:
    """Self-Ask's held-out gold prompts (`decisions.DecisionPrompt`) from the items' gold trajectories (its own
    loop, prompts and transcripts with `config`'s exemplars, the passages `retriever` returns; `require_support`
    off): the first call's "Are follow up questions needed here:" (kind `follow_up_needed`, " Yes" against
    " No"; the gold says Yes, every chain having a hop), and every later call's line after the gold intermediate
    answer (kind `final_answer`, "So" of "So the final answer is:" against "Follow" of "Follow up:", the first
    word of the line; the gold says So after the last hop's answer), each fed the transcript so far as its prefix."""
    items = list(items)
    trajs, _ = baseline_gold_trajectories(SELF_ASK, config, items, retriever, require_support=False,
                                          fewshot=config.fewshot)
    kinds = {it.id: question_kind(it) for it in items}
    out = []
    for traj in trajs:
        for c in traj.calls:
            if c.role != REASON or not c.output.startswith(c.prefix):
                continue
            written = c.output[len(c.prefix):]
            if c.prefix.endswith(NEEDED):
                out.append(DecisionPrompt(FOLLOW_UP_NEEDED, c.prompt, c.prefix, config.role, (" Yes", " No"),
                                          written.startswith(" Yes"), traj.question_id, kinds.get(traj.question_id)))
            elif "\n" in written:
                cut = written.index("\n") + 1
                out.append(DecisionPrompt(FINAL_ANSWER, c.prompt, c.prefix + written[:cut], config.role,
                                          ("So", "Follow"), written[cut:].startswith(FINAL), traj.question_id,
                                          kinds.get(traj.question_id)))
    return out


#: IRCoT's stop (`ircot_prompts`): its sentence says "answer is" against any other sentence
IRCOT_STOP = "ircot_stop"


def ircot_says_answer(written: str) -> bool:
    """Whether IRCoT's loop ends the question on what the model wrote: its first sentence says "answer is"
    (`extract_answer(first_sentence(...))`, as `IRCoT.loop` reads it)."""
    return extract_answer(first_sentence(written)) is not None


def ircot_prompts(config: BaselineConfig, items: Iterable[QAItem], retriever: Retriever) -> list[DecisionPrompt]:
    """IRCoT's stop on held-out gold prompts: every reasoning call of the items' gold trajectories (its own loop,
    prompts and passages, `config`'s exemplars, `require_support` off), fed the gold chain so far; the gold says
    stop ("answer is") at the last call and another sentence before it. IRCoT stops where its free sentence says
    "answer is", anywhere in it, so the decision has no fixed words to score: each prompt is decoded greedily
    (the call's `max_new_tokens` and stop strings) and read as the loop reads it (`ircot_says_answer`). An
    empty or repeated sentence reads as not stopping on an answer (the loop then forces one)."""
    items = list(items)
    trajs, _ = baseline_gold_trajectories(IRCOT, config, items, retriever, require_support=False,
                                          fewshot=config.fewshot)
    kinds = {it.id: question_kind(it) for it in items}
    return [DecisionPrompt(IRCOT_STOP, c.prompt, c.prefix, config.role, ("answer is", "another sentence"),
                           ircot_says_answer(c.output[len(c.prefix):]), traj.question_id, kinds.get(traj.question_id),
                           reads=ircot_says_answer, max_new_tokens=config.max_new_tokens, stop=COT_STOP)
            for traj in trajs for c in traj.calls if c.role == REASON and c.output.startswith(c.prefix)]
