"""The chain constructor: beam search over reasoning chains, one triple per step, for many questions at once.

At step i every unfinished chain of every question asks the ranker for its top-K triples (those
already in the chain are not offered), then the selector for a probability per option: option 0
("A", no need for additional knowledge triples) ends the chain, option j adds candidate j. Each chain
expands its top `branch` options; a question keeps its `beams` best chains by the product of the
chosen options' probabilities (finished chains compete unchanged). A chain also ends when the graph
has no triple left to offer ("exhausted") or at `length` triples ("length").

`rank` and `select` are callbacks, so the engine batches one encoder call and one selector call per
step across questions, and tests drive the search with hand-set scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

#: how a chain ended: option A chosen, no triple left to offer, the length limit
STOP, EXHAUSTED, LENGTH = "stop", "exhausted", "length"


@dataclass(frozen=True)
class Chain:
    """Indices into the question's triples, the log of the product of the chosen options' probabilities."""

    triples: tuple[int, ...] = ()
    logprob: float = 0.0
    ended: str | None = None

    def to_dict(self) -> dict:
        return {"triplets": list(self.triples), "logprob": self.logprob, "score": math.exp(self.logprob), "ended": self.ended}


@dataclass(frozen=True)
class Pending:
    """A chain that needs the selector: its question, the chain, the ranker's candidates."""

    question: int
    chain: Chain
    candidates: tuple[int, ...]


#: (question index, chain) per unfinished chain -> candidate triple indices per chain
RankFn = Callable[[Sequence[tuple[int, Chain]]], list[list[int]]]
#: pending chains -> per chain, a probability per option (index 0: stop; j: candidates[j-1])
SelectFn = Callable[[Sequence[Pending]], list[list[float]]]


def expand(chain: Chain, candidates: Sequence[int], probs: Sequence[float], branch: int) -> list[Chain]:
    """The chain's top-`branch` options as new chains (ties: the earlier option); an option of
    probability 0 is never taken."""
    order = sorted(range(len(probs)), key=lambda j: (-probs[j], j))
    out = []
    for j in order[:branch]:
        if probs[j] <= 0:
            continue
        lp = chain.logprob + math.log(probs[j])
        if j == 0:
            out.append(Chain(chain.triples, lp, STOP))
        else:
            out.append(Chain(chain.triples + (candidates[j - 1],), lp))
    return out


def keep_best(chains: Sequence[Chain], beams: int) -> list[Chain]:
    """The `beams` chains of highest score (ties: the earlier one); the same triples ending the same
    way count once (two orders of the same triples stay apart: they are different chains)."""
    seen: set[tuple[tuple[int, ...], str | None]] = set()
    unique = []
    for c in chains:
        if (c.triples, c.ended) not in seen:
            seen.add((c.triples, c.ended))
            unique.append(c)
    order = sorted(range(len(unique)), key=lambda i: (-unique[i].logprob, i))
    return [unique[i] for i in order[:beams]]


def beam_search(n_questions: int, rank: RankFn, select: SelectFn, *, length: int, beams: int, branch: int,
                on_step: Callable[[int, list[list[Chain]]], None] | None = None) -> list[list[Chain]]:
    """Every question's final chains, best first. `on_step(step, beams)` sees the beams after each step."""
    state: list[list[Chain]] = [[Chain()] for _ in range(n_questions)]
    for step in range(length):
        active = [(q, c) for q in range(n_questions) for c in state[q] if c.ended is None]
        if not active:
            break
        ranked = rank(active)
        nxt: list[list[Chain]] = [[c for c in state[q] if c.ended is not None] for q in range(n_questions)]
        pending = []
        for (q, c), cands in zip(active, ranked):
            if cands:
                pending.append(Pending(q, c, tuple(cands)))
            else:
                nxt[q].append(Chain(c.triples, c.logprob, EXHAUSTED))
        for p, probs in zip(pending, select(pending) if pending else []):
            nxt[p.question].extend(expand(p.chain, p.candidates, probs, branch))
        state = [keep_best(chains, beams) for chains in nxt]
        if on_step is not None:
            on_step(step, state)
    return [[c if c.ended else Chain(c.triples, c.logprob, LENGTH) for c in chains] for chains in state]


def option_probabilities(logprobs: Sequence[float | None]) -> list[float] | None:
    """The selector's distribution over its options: the options' next-token probabilities
    renormalised among the options (the letters' share of the model's distribution). A letter the
    backend did not report gets 0; None where no letter was reported at all."""
    known = [lp for lp in logprobs if lp is not None and lp != -math.inf]
    if not known:
        return None
    top = max(known)
    weights = [0.0 if lp is None or lp == -math.inf else math.exp(lp - top) for lp in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def ranker_fallback(n_candidates: int) -> list[float]:
    """What the selector's step uses when its distribution holds no option letter: the ranker's order,
    probabilities 1/2, 1/4, ... over the candidates (renormalised), nothing on stopping."""
    weights = [0.0] + [0.5 ** (j + 1) for j in range(n_candidates)]
    total = sum(weights)
    return [w / total for w in weights]
