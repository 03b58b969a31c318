"""Gold trajectories of MINTQA's decomposing strategies: the engine run on an item's gold evidence chain, gold texts in place of the model.

The chain is the shared one (methods/gold_chain.py): per hop its sub-question (the item's aligned
sub-question, "#k" resolved, or "What is the <relation> of <entity>?") and its answer (the triple's
object). `GoldMintQA` is the MINTQA engine (engine.py) whose `_generate` writes each call's gold text,
so the prompts, the retrieval (each sub-question sent to the run's retriever, top `passages`) and the
parsing are the engine's own. Per step k of n hops (at most `max_steps`):

    decompose    " <hop k's sub-question>"; at step n + 1 " finish" (none where n = max_steps: the loop
                 stops there by itself, "max_steps")
    selfanswer   (mintqa_dynamic) " unknown\\nConfidence: uncertain": the gold cannot know what a model
                 knows, and a coined world's facts no model does, so every sub-question retrieves and is
                 answered over its passages, as decomposition-then-retrieval does
    subanswer    " <hop k's answer>", over the passages retrieved for the sub-question
    answer       " <answer>", from the sub-question/answer history

An item is skipped, counted under its reason, never raised on, where:

    no_chain / no_chain_entity  the item has no gold chain (gold_chain.py)
    too_many_hops               the chain has more hops than `max_steps`
    unreadable_step             the engine did not read a gold output back as the intended step (a
                                sub-question asked twice ends the loop; one with a question mark inside
                                is cut) or did not end with the gold answer
    unsupported_hop             (`require_support`) a hop's answer is not stated in the passages the
                                strategy retrieved for its sub-question

The records are the STaR records of these trajectories (methods/star.py), every call kept
(methods/gold_records.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP, Hop, checked_chain
from knowtrace_train.methods.gold_chain import supported
from knowtrace_train.methods.gold_records import TOO_MANY_HOPS, UNREADABLE_STEP, GoldRecords, GoldTally, gold_call
from knowtrace_train.methods.gold_records import GoldTrajectories, gold_records, one_line, read_back, words
from knowtrace_train.methods.mintqa.config import (
    DECOMPOSE,
    DECOMPOSE_CALL,
    DYNAMIC,
    SELFANSWER,
    SUBANSWER,
    MintQADecomposeConfig,
)
from knowtrace_train.methods.mintqa.engine import MintQA, _Job, _State
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import ModelCall, Trajectory

#: every reason a MINTQA gold trajectory may be skipped for
SKIP_REASONS = (NO_CHAIN, NO_CHAIN_ENTITY, TOO_MANY_HOPS, UNREADABLE_STEP, UNSUPPORTED_HOP)
#: the strategies with gold trajectories (the one-call ones have no steps to teach beyond the answer)
GOLD_STRATEGIES = (DECOMPOSE, DYNAMIC)
FINISH = "finish"
#: the dynamic strategy's gold self-answer: not known, so it retrieves
UNKNOWN = "unknown"


def _parsed_answer(text: str) -> str:
    """What MINTQA's answer parser keeps of a one-line answer (no final full stop)."""
    return one_line(text).rstrip(".").strip()


def decompose_text(hops: Sequence[Hop], step: int) -> str:
    """The decomposition call of `step` (from 1): hop `step`'s sub-question, or finish after the last hop."""
    return f" {one_line(hops[step - 1].question)}" if step <= len(hops) else f" {FINISH}"


def selfanswer_text() -> str:
    return f" {UNKNOWN}\nConfidence: uncertain"


def answer_text(answer: str) -> str:
    """A sub-answer or the final answer: one line."""
    return f" {one_line(answer)}"


def expected_parse(kind: str, hops: Sequence[Hop], step: int, answer: str) -> dict[str, Any]:
    """What the engine's parser must read from the gold call of `kind` at `step`."""
    if kind == DECOMPOSE_CALL:
        if step > len(hops):
            return {"subquestion": None, "finish": True}
        return {"subquestion": one_line(hops[step - 1].question), "finish": False}
    if kind == SELFANSWER:
        return {"answer": UNKNOWN, "confidence": "uncertain"}
    if kind == SUBANSWER:
        return {"answer": _parsed_answer(hops[step - 1].triplet.object)}
    return {"answer": _parsed_answer(answer)}


class GoldMintQA(MintQA):
    """The MINTQA engine whose model calls write each question's gold texts; retrieval is the real
    retriever's. A call the script has no text for gets an empty output and `OFF_SCRIPT`."""

    def __init__(self, config: MintQADecomposeConfig, chains: Mapping[str, tuple[list[Hop], str]],
                 count_tokens: Callable[[str], int]) -> None:
        super().__init__(config)
        self.chains = chains
        self.count = count_tokens
        #: every passage a search returned, by id
        self.found: dict[str, Passage] = {}
        #: item id -> per call, the `parsed` the engine's parser must give
        self.expected: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def _gold(self, job: _Job) -> str | None:
        hops, answer = self.chains[job.state.item.id]
        k = job.step
        if job.kind == DECOMPOSE_CALL:
            text = decompose_text(hops, k) if k <= len(hops) + 1 else None
        elif job.kind == SELFANSWER:
            text = selfanswer_text() if k <= len(hops) else None
        elif job.kind == SUBANSWER:
            text = answer_text(hops[k - 1].triplet.object) if k <= len(hops) else None
        else:
            text = answer_text(answer)
        if text is not None:
            self.expected[job.state.item.id].append(expected_parse(job.kind, hops, k, answer))
        return text

    def _generate(self, jobs: list[_Job]) -> list[ModelCall]:
        return [gold_call(job.state.traj, job.kind, job.step, job.prompt, self._gold(job), self.count,
                          passage_ids=[p.id for p in job.passages],
                          retrieved_tokens=sum(self._tokens_of(p) for p in job.passages)) for job in jobs]

    def _search(self, queries: list[str], owners: list[_State], step: int) -> list[tuple[Passage, ...]]:
        hits = super()._search(queries, owners, step)
        for found in hits:
            self.found.update((p.id, p) for p in found)
        return hits

    def _count_tokens(self, text: str) -> int:
        return self.count(text)


def hop_passages(traj: Trajectory, passages: Mapping[str, Passage]) -> list[list[Passage]]:
    """Per sub-question, in order, the passages its sub-answer call was shown (those retrieved for it)."""
    return [[passages[i] for i in c.passage_ids] for c in sorted(traj.calls, key=lambda c: c.index) if c.role == SUBANSWER]


def mintqa_gold_trajectories(config: MintQADecomposeConfig, items: Iterable[QAItem], retriever: Retriever, *,
                             fewshot: bool = True, require_support: bool = True,
                             count_tokens: Callable[[str], int] | None = None, batch_size: int = 256) -> GoldTrajectories:
    """The gold trajectories of the decomposing strategy `config.name` (prompts with exemplars as `fewshot`
    says) for the items that have one, and per-reason counts of those that have none."""
    if config.name not in GOLD_STRATEGIES:
        raise ValueError(f"MINTQA strategy {config.name!r} has no gold trajectories; those that have: {list(GOLD_STRATEGIES)}")
    count = count_tokens or words
    config = dataclasses.replace(config, fewshot=fewshot)
    tally = GoldTally()
    todo: list[tuple[QAItem, list[Hop]]] = []
    for it in items:
        chain = checked_chain(it, need=("question", "object"))
        if isinstance(chain, str):
            tally.skip(chain)
        elif len(chain) > config.max_steps:
            tally.skip(TOO_MANY_HOPS)
        else:
            todo.append((it, chain))
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        engine = GoldMintQA(config, {it.id: (chain, it.answer) for it, chain in batch}, count)
        trajs = engine.run([it for it, _ in batch], None, retriever)  # type: ignore[arg-type]
        for (it, chain), traj in zip(batch, trajs):
            # the loop finishes after the last hop, or stops at max_steps by itself
            stop, reason = "finished" if len(chain) < config.max_steps else "max_steps", None
            if not read_back(traj, engine.expected[it.id], it, stop):
                reason = UNREADABLE_STEP
            elif require_support and not all(supported(h.triplet, ps)
                                             for h, ps in zip(chain, hop_passages(traj, engine.found))):
                reason = UNSUPPORTED_HOP
            tally.add(traj, it, reason)
    return tally.result()


def mintqa_gold_records(config: MintQADecomposeConfig, items: Iterable[QAItem], retriever: Retriever,
                        **keywords: Any) -> GoldRecords:
    """The records of the decomposing strategy `config.name`'s gold trajectories of `items` (`keywords`: those
    of methods/gold_records.py's `gold_records`, `record_kinds` among them)."""
    run = functools.partial(mintqa_gold_trajectories, config, retriever=retriever)
    return gold_records(config.name, run, items, **keywords)
