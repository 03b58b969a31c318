"""Gold trajectories: the ideal KnowTrace trajectory an item's gold evidence chain implies,
written as SFT records in the same format as backtraced ones (a warm start for small models).

Per hop of the chain: an exploration with one guidance pair (the hop's entity and what to
find about it), a completion with the gold triplet over the passages the retriever returns for
that pair, then a final exploration that concludes with Yes / Thought / Answer. The chain comes
from methods/gold_chain.py (shared with the baselines' gold trajectories): `evidence.triples`
(the synthetic world, 2WikiMultihopQA, MINTQA; the aligned sub-questions, where present, phrase
the guidance) or MuSiQue's decomposition. Items without a chain (HotpotQA) or whose hop answers
the retrieved passages do not state are counted under their reason, never raised on.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from tqdm.auto import tqdm

from knowtrace_train.progress import stderr_is_terminal

import knowtrace_train.methods.knowtrace.outputs as outputs
from knowtrace_train.methods.knowtrace.backtrace.records import backtrace_trajectories
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.kg import KnowledgeGraph, TracedTriplet
from knowtrace_train.methods.gold_chain import (  # noqa: F401  (the chain's names, re-exported)
    NO_CHAIN,
    NO_CHAIN_ENTITY,
    UNSUPPORTED_HOP,
    Hop,
    checked_chain,
    gold_chain,
    gold_thought,
    supported,
)
from knowtrace_train.retrieval.base import Retriever, pair_to_query
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)

GOLD_STRATEGY = "gold"


def build_gold_trajectory(
    item: QAItem,
    hops: Sequence[Hop],
    passages_per_hop: Sequence[Sequence[Passage]],
    *,
    fewshot: bool = True,
    kg_format: str = "triplets",
    count_tokens: Callable[[str], int] | None = None,
    prefill_judgement: bool = True,
) -> Trajectory:
    """The ideal trajectory of `item` over the given hops and the passages retrieved per hop. Its explorations
    record the judgement words as their fed prefix where the engine feeds them (`prefill_judgement`, the
    strategy's setting), as a rollout records them."""
    import knowtrace_train.methods.knowtrace.prompts as prompts

    count = count_tokens or (lambda s: len(s.split()))
    graph = KnowledgeGraph()
    calls: list[ModelCall] = []

    judgement = outputs.JUDGEMENT if prefill_judgement else ""

    def add_call(role: str, rnd: int, prompt: str, output: str, prefix: str = "", **kw: Any) -> ModelCall:
        c = ModelCall(index=len(calls), role=role, round=rnd, prompt=prompt, output=output,
                      prompt_tokens=count(prompt), output_tokens=count(output[len(prefix):]), prefix=prefix, **kw)
        calls.append(c)
        return c

    for rnd, (hop, passages) in enumerate(zip(hops, passages_per_hop), start=1):
        shown = [t.triplet for t in graph.triplets]
        e = add_call("explore", rnd, prompts.render_exploration_prompt(item.question, shown, fewshot=fewshot,
                                                                      kg_format=kg_format),
                     outputs.exploration_guidance([hop.pair]), prefix=judgement,
                     parsed={"sufficient": False, "thought": None, "answer": None,
                             "pairs": [[hop.pair.entity, hop.pair.guidance]], "rejected": [], "error": None})
        graph.note_expansion_point(hop.pair.entity, rnd, e.index)
        c = add_call("complete", rnd, prompts.render_completion_prompt(hop.pair, passages, fewshot=fewshot),
                     outputs.completion([hop.triplet]), pair=hop.pair, passage_ids=[p.id for p in passages],
                     retrieved_tokens=sum(count(p.text) for p in passages),
                     parsed={"triplets": [[hop.triplet.subject, hop.triplet.relation, hop.triplet.object]],
                             "rejected": [], "error": None})
        if graph.add(TracedTriplet(hop.triplet, rnd, hop.pair, c.index, tuple(p.id for p in passages))):
            c.triplets.append(len(graph.triplets) - 1)
    thought = gold_thought(hops, item.answer)
    shown = [t.triplet for t in graph.triplets]
    add_call("explore", len(hops) + 1,
             prompts.render_exploration_prompt(item.question, shown, fewshot=fewshot, kg_format=kg_format),
             outputs.exploration_answer(thought, item.answer), prefix=judgement,
             parsed={"sufficient": True, "thought": thought, "answer": item.answer, "pairs": [],
                     "rejected": [], "error": None})
    return Trajectory(id=f"{item.id}#gold", question_id=item.id, question=item.question, answers=list(item.answers),
                      dataset=item.dataset, strategy=GOLD_STRATEGY, calls=calls, graph=graph,
                      prediction=item.answer, thought=thought, stop_reason="answered", rounds=len(hops) + 1,
                      em=1.0, f1=1.0)


@dataclass
class GoldResult:
    """SFT records per role from gold trajectories, the counts (items with a trajectory,
    items skipped per reason, and the backtracing statistics of the trajectories as a
    consistency check: FA should be 0) and the trajectories themselves."""

    records_by_role: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any]
    trajectories: list[Trajectory] = field(default_factory=list)


def gold_trajectories(
    items: Iterable[QAItem],
    retriever: Retriever,
    *,
    k: int = 5,
    fewshot: bool = True,
    kg_format: str = "triplets",
    require_support: bool = True,
    count_tokens: Callable[[str], int] | None = None,
    batch_size: int = 256,
    prefill_judgement: bool = True,
) -> tuple[list[Trajectory], dict[str, int]]:
    """Gold trajectories of the items that have a chain, and per-reason counts of those that
    have none. With `require_support`, an item whose hop object appears in none of the
    passages retrieved for that hop is skipped (training on it would teach invention)."""
    items = list(items)
    reasons: dict[str, int] = defaultdict(int)
    chains: list[tuple[QAItem, list[Hop]]] = []
    for it in items:
        chain = checked_chain(it)
        if isinstance(chain, str):
            reasons[chain] += 1
        else:
            chains.append((it, chain))
    queries = [pair_to_query(h.pair.entity, h.pair.guidance) for _, ch in chains for h in ch]
    results: list[list[Passage]] = []
    quiet = len(queries) <= batch_size or not stderr_is_terminal()  # no bar redraws in a log file
    for i in tqdm(range(0, len(queries), batch_size), desc="gold retrieval", disable=quiet):
        batch = retriever.search(queries[i : i + batch_size], k)
        results += [[sp.passage for sp in hits] for hits in batch]
    out: list[Trajectory] = []
    pos = 0
    for it, chain in chains:
        per_hop = results[pos : pos + len(chain)]
        pos += len(chain)
        if require_support and not all(supported(h.triplet, ps) for h, ps in zip(chain, per_hop)):
            reasons[UNSUPPORTED_HOP] += 1
            continue
        out.append(build_gold_trajectory(it, chain, per_hop, fewshot=fewshot, kg_format=kg_format,
                                         count_tokens=count_tokens, prefill_judgement=prefill_judgement))
    return out, dict(sorted(reasons.items()))


def gold_trajectory_records(
    items: Iterable[QAItem],
    retriever: Retriever,
    *,
    k: int = 5,
    fewshot: bool = True,
    kg_format: str = "triplets",
    require_support: bool = True,
    count_tokens: Callable[[str], int] | None = None,
    iteration: int | None = 0,
    prefill_judgement: bool = True,
) -> GoldResult:
    """SFT records {"prompt", "completion", "role", "trajectory_id", "iteration"} per role from
    the gold trajectories of `items` (every generation kept: they are ideal by construction)."""
    items = list(items)
    count = count_tokens or (lambda s: len(s.split()))
    trajs, reasons = gold_trajectories(items, retriever, k=k, fewshot=fewshot, kg_format=kg_format,
                                       require_support=require_support, count_tokens=count,
                                       prefill_judgement=prefill_judgement)
    by_id: Mapping[str, QAItem] = {it.id: it for it in items}
    res = backtrace_trajectories(trajs, by_id, count_tokens=count, mode="star", iteration=iteration)
    check = backtrace_trajectories(trajs, by_id, count_tokens=count, mode="backtrace")
    stats = {
        "items": len(items),
        "trajectories": len(trajs),
        "skipped": reasons,
        "records": res.stats["records"],
        "backtrace_check": {"fa_ratio": check.stats["fa_ratio"], "backtraced": check.stats["backtraced"],
                            "skipped": check.stats["skipped"]},
    }
    log.info("gold trajectories: %d of %d items, skipped %s", len(trajs), len(items), reasons)
    return GoldResult(records_by_role=res.records_by_role, stats=stats, trajectories=trajs)
