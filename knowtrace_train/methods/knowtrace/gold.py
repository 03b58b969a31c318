"""Gold trajectories: the ideal KnowTrace trajectory an item's gold evidence chain implies,
written as SFT records in the same format as backtraced ones (a warm start for small models).

Per round (`gold_chain.chain_rounds`): an exploration asking for every hop the question needs at that point
(a comparison's two entities in one round, a bridge's next hop), a completion per pair writing every triplet
its retrieved passages state about the pair (the gold one first), then a final exploration that concludes with
Yes / Thought / Answer. At the rates `strategy.gold_noise` names, a round also asks for plausible but unneeded
pairs (other facts of the entities known by then) and a completion adds extraneous facts its passages state
about its entity, as the paper's raw 8B model does (its Appendix F), so that M0 explores with noise for
backtracing to filter. Which facts a passage states comes from data/facts.py. The chain comes
from methods/gold_chain.py (shared with the baselines' gold trajectories): `evidence.triples`
(the synthetic world, 2WikiMultihopQA, MINTQA; the aligned sub-questions, where present, phrase
the guidance) or MuSiQue's decomposition. Items without a chain (HotpotQA) or whose hop answers
the retrieved passages do not state are counted under their reason, never raised on.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from tqdm.auto import tqdm

from knowtrace_train.progress import stderr_is_terminal

import knowtrace_train.methods.knowtrace.outputs as outputs
from knowtrace_train.methods.knowtrace.backtrace.records import backtrace_trajectories
from knowtrace_train.data.facts import Fact, FactIndex
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.kg import GuidancePair, KnowledgeGraph, TracedTriplet, Triplet
from knowtrace_train.methods.knowtrace.config import GoldNoise
from knowtrace_train.metrics import normalize_answer
from knowtrace_train.methods.gold_chain import (  # noqa: F401  (the chain's names, re-exported)
    NO_CHAIN,
    NO_CHAIN_ENTITY,
    UNSUPPORTED_HOP,
    Hop,
    chain_rounds,
    checked_chain,
    gold_chain,
    gold_thought,
    supported,
)
from knowtrace_train.retrieval.base import Retriever, pair_to_query
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)

GOLD_STRATEGY = "gold"


@dataclass(frozen=True)
class GoldAsk:
    """One guidance pair of a gold round: the triplets its completion writes (the gold one first where the pair
    is a hop of the chain) over the passages retrieved for it, and whether the answer needs it."""

    pair: GuidancePair
    triplets: tuple[Triplet, ...]
    passages: tuple[Passage, ...]
    needed: bool = True


def build_gold_trajectory(
    item: QAItem,
    hops: Sequence[Hop],
    rounds: Sequence[Sequence[GoldAsk]],
    *,
    fewshot: bool = True,
    kg_format: str = "triplets",
    count_tokens: Callable[[str], int] | None = None,
    prefill_judgement: bool = True,
    prompt_set: str = "short",
) -> Trajectory:
    """The ideal trajectory of `item`: per round, one exploration asking for every pair of the round, one
    completion per pair writing its triplets, then a final exploration that concludes with the chain's thought.
    Its explorations record the judgement words as their fed prefix where the engine feeds them
    (`prefill_judgement`, the strategy's setting), as a rollout records them."""
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

    def explore_prompt() -> str:
        return prompts.render_exploration_prompt(item.question, [t.triplet for t in graph.triplets], fewshot=fewshot,
                                                 kg_format=kg_format, prompt_set=prompt_set)

    for rnd, asks in enumerate(rounds, start=1):
        pairs = [a.pair for a in asks]
        e = add_call("explore", rnd, explore_prompt(), outputs.exploration_guidance(pairs), prefix=judgement,
                     parsed={"sufficient": False, "thought": None, "answer": None,
                             "pairs": [[p.entity, p.guidance] for p in pairs], "rejected": [], "error": None,
                             "pairs_run": len(pairs)})
        for p in pairs:
            graph.note_expansion_point(p.entity, rnd, e.index)
        for a in asks:
            tokens = sum(count(p.text) for p in a.passages)
            c = add_call("complete", rnd, prompts.render_completion_prompt(a.pair, a.passages, fewshot=fewshot,
                                                                           prompt_set=prompt_set),
                         outputs.completion(a.triplets), pair=a.pair, passage_ids=[p.id for p in a.passages],
                         retrieved_tokens=tokens,
                         parsed={"triplets": [[t.subject, t.relation, t.object] for t in a.triplets],
                                 "rejected": [], "error": None})
            for t in a.triplets:
                if graph.add(TracedTriplet(t, rnd, a.pair, c.index, tuple(p.id for p in a.passages))):
                    c.triplets.append(len(graph.triplets) - 1)
    thought = gold_thought(hops, item.answer)
    add_call("explore", len(rounds) + 1, explore_prompt(), outputs.exploration_answer(thought, item.answer),
             prefix=judgement, parsed={"sufficient": True, "thought": thought, "answer": item.answer, "pairs": [],
                                       "rejected": [], "error": None})
    return Trajectory(id=f"{item.id}#gold", question_id=item.id, question=item.question, answers=list(item.answers),
                      dataset=item.dataset, strategy=GOLD_STRATEGY, calls=calls, graph=graph,
                      prediction=item.answer, thought=thought, stop_reason="answered", rounds=len(rounds) + 1,
                      em=1.0, f1=1.0)


def _draw(rng: random.Random, rate: float) -> int:
    """How many noisy items to add where `rate` is their expected number: its whole part, and one more with the
    probability of its fraction."""
    whole = int(rate)
    return whole + int(rng.random() < rate - whole)


def _guidance_templates(chains: Sequence[tuple[QAItem, Sequence[Hop]]]) -> dict[str, list[str]]:
    """Per relation (normalized), the guidance texts the chains phrase it with, their entity a `{e}` slot: how an
    unneeded pair is worded in the data's own voice."""
    out: dict[str, list[str]] = defaultdict(list)
    for _, chain in chains:
        for h in chain:
            e, g = h.pair.entity, h.pair.guidance
            if e and e in g:
                t = g.replace("{", "(").replace("}", ")").replace(e, "{e}")
                key = normalize_answer(h.triplet.relation)
                if t not in out[key]:
                    out[key].append(t)
    return out


@dataclass
class _Plan:
    """One item's gold trajectory before retrieval: per round its needed hops and candidate unneeded pairs."""

    item: QAItem
    chain: list[Hop]
    rounds: list[list[Hop]]
    noise: list[list[tuple[GuidancePair, Fact]]]
    wanted: list[int]
    rng: random.Random
    #: the chain's facts, and the entities that carry it or name the answer: no noisy fact may be one or point at one
    chain_keys: set[tuple[str, str, str]]
    protected: set[str]


def _plan(item: QAItem, chain: list[Hop], facts: FactIndex, noise: GoldNoise, templates: Mapping[str, list[str]],
          seed: int, max_pairs: int) -> _Plan:
    rng = random.Random(f"{item.id}|gold-noise|{seed}")
    rounds = chain_rounds(chain)
    chain_keys = {_fact_key(h.triplet) for h in chain}
    # entities that carry the chain (or name the answer): a noisy fact pointing at one would be evidence, not noise
    protected = {normalize_answer(x) for h in chain for x in (h.triplet.subject, h.triplet.object)}
    protected |= {normalize_answer(a) for a in item.answers}
    known: list[str] = []
    asked: set[tuple[str, str]] = set()
    plans: list[list[tuple[GuidancePair, Fact]]] = []
    wanted: list[int] = []
    for r, hops in enumerate(rounds):
        for h in hops:
            if normalize_answer(h.pair.entity) not in {normalize_answer(k) for k in known}:
                known.append(h.pair.entity)
            asked.add((normalize_answer(h.pair.entity), normalize_answer(h.triplet.relation)))
        n = _draw(rng, noise.pairs)
        if max_pairs:
            n = min(n, max(0, max_pairs - len(hops)))
        cands = []
        for e in known:
            for f in facts.about(e):
                t = f.triplet
                key = (normalize_answer(e), normalize_answer(t.relation))
                if key in asked or _fact_key(t) in chain_keys or normalize_answer(t.object) in protected:
                    continue
                cands.append((e, f))
        rng.shuffle(cands)
        picked, rels = [], set()
        for e, f in cands:  # twice as many as wanted: one whose passages do not state it is dropped
            t = f.triplet
            key = (normalize_answer(e), normalize_answer(t.relation))
            if key in rels:
                continue
            rels.add(key)
            forms = templates.get(normalize_answer(t.relation))
            guidance = rng.choice(forms).replace("{e}", e) if forms else f"find the {t.relation} of {e}"
            picked.append((GuidancePair(e, guidance), f))
            if len(picked) >= 2 * n:
                break
        for p, f in picked:
            asked.add((normalize_answer(p.entity), normalize_answer(f.triplet.relation)))
        plans.append(picked)
        wanted.append(n)
        for h in hops:  # the next round knows what this one found
            if normalize_answer(h.triplet.object) not in {normalize_answer(k) for k in known}:
                known.append(h.triplet.object)
    return _Plan(item, chain, rounds, plans, wanted, rng, chain_keys, protected)


def _fact_key(t: Triplet) -> tuple[str, str, str]:
    return normalize_answer(t.subject), normalize_answer(t.relation), normalize_answer(t.object)


def _completion_triplets(first: Triplet, passages: Sequence[Passage], facts: FactIndex, plan: _Plan,
                         noise: GoldNoise) -> tuple[list[Triplet], int]:
    """What a gold completion writes: `first`, every other fact the passages state about its pair (its entity
    and relation), then as many extraneous facts about the entity as `noise.triplets` draws (the passages state
    them; none is on the chain or points at a chain entity). Also how many of them are extraneous."""
    chain_keys, protected = plan.chain_keys, plan.protected
    out = [first]
    seen = {_fact_key(first)}
    rel = normalize_answer(first.relation)
    stated = facts.stated_about(first.subject, passages)
    for t in stated:
        if normalize_answer(t.relation) == rel and _fact_key(t) not in seen and _fact_key(t) not in chain_keys:
            out.append(t)
            seen.add(_fact_key(t))
    extra = [t for t in stated if normalize_answer(t.relation) != rel and _fact_key(t) not in seen
             and _fact_key(t) not in chain_keys and normalize_answer(t.object) not in protected]
    plan.rng.shuffle(extra)
    n = _draw(plan.rng, noise.triplets)
    out += extra[:n]
    return out, min(n, len(extra))


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
    prompt_set: str = "short",
    facts: FactIndex | None = None,
    noise: GoldNoise | None = None,
    seed: int = 0,
    max_pairs: int = 0,
    tally: dict[str, int] | None = None,
) -> tuple[list[Trajectory], dict[str, int]]:
    """Gold trajectories of the items that have a chain, and per-reason counts of those that have none. Each
    round asks every hop the question needs at that point (`chain_rounds`) and, at the rates `noise` names,
    unneeded pairs about the entities known by then; each completion writes every fact its passages state about
    its pair (`facts`: the run's facts, else the items' own gold evidence) and, at the rate `noise` names,
    extraneous facts about its entity. With `require_support`, an item whose hop object appears in none of the
    passages retrieved for that hop is skipped (training on it would teach invention). `tally` gets the counts of
    needed and unneeded pairs and triplets."""
    items = list(items)
    noise = noise or GoldNoise()
    reasons: dict[str, int] = defaultdict(int)
    chains: list[tuple[QAItem, list[Hop]]] = []
    for it in items:
        chain = checked_chain(it)
        if isinstance(chain, str):
            reasons[chain] += 1
        else:
            chains.append((it, chain))
    facts = facts if facts is not None else FactIndex.from_items(items)
    templates = _guidance_templates(chains)
    plans = [_plan(it, chain, facts, noise, templates, seed, max_pairs) for it, chain in chains]
    pairs = [h.pair for pl in plans for hops, cands in zip(pl.rounds, pl.noise) for h in hops] + \
            [p for pl in plans for cands in pl.noise for p, _ in cands]
    queries = [pair_to_query(p.entity, p.guidance) for p in pairs]
    results: list[list[Passage]] = []
    quiet = len(queries) <= batch_size or not stderr_is_terminal()  # no bar redraws in a log file
    for i in tqdm(range(0, len(queries), batch_size), desc="gold retrieval", disable=quiet):
        batch = retriever.search(queries[i : i + batch_size], k)
        results += [[sp.passage for sp in hits] for hits in batch]
    n_needed = sum(len(hops) for pl in plans for hops in pl.rounds)
    needed_hits, noise_hits = iter(results[:n_needed]), iter(results[n_needed:])
    counts = tally if tally is not None else {}
    for key in ("pairs_needed", "pairs_unneeded", "triplets_needed", "triplets_extraneous", "rounds", "completions"):
        counts.setdefault(key, 0)
    out: list[Trajectory] = []
    for pl in plans:
        per_round_hits = [[next(needed_hits) for _ in hops] for hops in pl.rounds]
        per_round_noise = [[next(noise_hits) for _ in cands] for cands in pl.noise]
        if require_support and not all(supported(h.triplet, ps) for hops, hits in zip(pl.rounds, per_round_hits)
                                       for h, ps in zip(hops, hits)):
            reasons[UNSUPPORTED_HOP] += 1
            continue
        rounds: list[list[GoldAsk]] = []
        local = dict.fromkeys(counts, 0)
        for hops, hits, cands, noise_ps, n in zip(pl.rounds, per_round_hits, pl.noise, per_round_noise, pl.wanted):
            asks = []
            for h, ps in zip(hops, hits):
                trips, extra = _completion_triplets(h.triplet, ps, facts, pl, noise)
                asks.append(GoldAsk(h.pair, tuple(trips), tuple(ps), needed=True))
                local["pairs_needed"] += 1
                local["triplets_needed"] += len(trips) - extra
                local["triplets_extraneous"] += extra
            added = 0
            for (pair, fact), ps in zip(cands, noise_ps):
                if added >= n or not facts.stated(fact, ps):
                    continue
                trips, extra = _completion_triplets(fact.triplet, ps, facts, pl, noise)
                asks.append(GoldAsk(pair, tuple(trips), tuple(ps), needed=False))
                added += 1
                local["pairs_unneeded"] += 1
                local["triplets_extraneous"] += len(trips)
            rounds.append(asks)
            local["rounds"] += 1
            local["completions"] += len(asks)
        for key, v in local.items():
            counts[key] += v
        out.append(build_gold_trajectory(pl.item, pl.chain, rounds, fewshot=fewshot, kg_format=kg_format,
                                         count_tokens=count_tokens, prefill_judgement=prefill_judgement,
                                         prompt_set=prompt_set))
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
    prompt_set: str = "short",
    facts: FactIndex | None = None,
    noise: GoldNoise | None = None,
    seed: int = 0,
    max_pairs: int = 0,
) -> GoldResult:
    """SFT records {"prompt", "completion", "role", "trajectory_id", "iteration"} per role from the gold
    trajectories of `items`: every generation kept, the unneeded pairs and extraneous triplets of `noise` too, so
    that M0 explores as a larger raw model does (backtracing then has something to filter in its rollouts)."""
    items = list(items)
    count = count_tokens or (lambda s: len(s.split()))
    tally: dict[str, int] = {}
    trajs, reasons = gold_trajectories(items, retriever, k=k, fewshot=fewshot, kg_format=kg_format,
                                       require_support=require_support, count_tokens=count,
                                       prefill_judgement=prefill_judgement, prompt_set=prompt_set, facts=facts,
                                       noise=noise, seed=seed, max_pairs=max_pairs, tally=tally)
    by_id: Mapping[str, QAItem] = {it.id: it for it in items}
    res = backtrace_trajectories(trajs, by_id, count_tokens=count, mode="star", iteration=iteration,
                                 prompt_set=prompt_set)
    check = backtrace_trajectories(trajs, by_id, count_tokens=count, mode="backtrace", prompt_set=prompt_set)
    stats = {
        "items": len(items),
        "trajectories": len(trajs),
        "skipped": reasons,
        "records": res.stats["records"],
        # what backtracing filters of the gold itself: the noise the config adds, nothing else (fa_decomposed)
        "backtrace_check": {"fa_ratio": check.stats["fa_ratio"], "backtraced": check.stats["backtraced"],
                            "skipped": check.stats["skipped"], "fa_decomposed": check.stats.get("fa_decomposed")},
        "noise": {"pairs": (noise or GoldNoise()).pairs, "triplets": (noise or GoldNoise()).triplets,
                  "facts": facts.source if facts is not None else "the items' gold evidence"},
        "shape": tally,
    }
    log.info("gold trajectories: %d of %d items, skipped %s", len(trajs), len(items), reasons)
    return GoldResult(records_by_role=res.records_by_role, stats=stats, trajectories=trajs)
