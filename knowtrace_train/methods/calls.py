"""Batched model calls recorded on trajectories: one `generate` for the calls of many questions, each kept
as a ModelCall on its own trajectory with its share of the batch's wall time (by tokens)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from knowtrace_train.data.schema import Passage

from knowtrace_train.generation.base import Completion, GenerationRequest, Generator, generate_each, request_seed
from knowtrace_train.kg import GuidancePair
from knowtrace_train.trajectory import ModelCall, Trajectory


@dataclass(frozen=True)
class CallSpec:
    """One call to make: whose trajectory, its kind (the ModelCall's role), round, prompt and limits.
    `prefix` opens the response (it is part of the recorded output, and recorded as the call's `prefix`: the
    engine feeds it, the model does not write it); `decided` follows it, a decision the engine took from the
    model's scores (decisions.decide): fed as well, but recorded as the model's output (after the prefix, its
    tokens among the output's), so that training puts its loss on it. The passages are the ones shown; `pair` the
    guidance pair a completion call serves; `adapter` the adapter asked for ("": the call's kind)."""

    traj: Trajectory
    kind: str
    round: int
    prompt: str
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    prefix: str = ""
    decided: str = ""
    passage_ids: tuple[str, ...] = ()
    retrieved_tokens: int = 0
    pair: GuidancePair | None = None
    adapter: str = ""


class PassageTokens:
    """The tokens of passages as a prompt shows them (`render`), each passage counted once by `count`: a call's
    `retrieved_tokens`, for every engine and the baselines' Runner."""

    def __init__(self, render: Callable[[Passage], str], count: Callable[[str], int]) -> None:
        self._render, self._count, self._seen = render, count, {}

    def __call__(self, passages: Iterable[Passage]) -> int:
        total = 0
        for p in passages:
            key = p.id or self._render(p)
            if key not in self._seen:
                self._seen[key] = self._count(self._render(p))
            total += self._seen[key]
        return total


def generate_calls(generator: Generator, specs: Sequence[CallSpec], *, temperature: float, seed: int,
                   adapter: str | None = None) -> tuple[list[ModelCall], float]:
    """(the specs' ModelCalls, appended to their trajectories, in order; the batch's seconds). Each request
    samples from its own stream (`request_seed(seed, trajectory id, call index)`, the index the call will have:
    several specs of one trajectory in a batch number on) and asks for the adapter `adapter` (None: the spec's,
    else the call's kind). A request the generator refuses is recorded with an empty output and its error
    (`generate_each`), never raised; a prompt the generator cut is counted in the trajectory's
    `truncated_prompt_tokens`."""
    if not specs:
        return [], 0.0
    next_index: dict[int, int] = {}
    seeds = []
    for s in specs:
        i = next_index.get(id(s.traj), len(s.traj.calls))
        next_index[id(s.traj)] = i + 1
        seeds.append(request_seed(seed, s.traj.id, i))
    requests = [GenerationRequest(prompt=s.prompt, prefix=s.prefix + s.decided, role=adapter or s.adapter or s.kind,
                                  max_new_tokens=s.max_new_tokens, stop=s.stop, temperature=temperature, seed=sd)
                for s, sd in zip(specs, seeds)]
    t0 = time.perf_counter()
    results = generate_each(generator, requests)
    dt = time.perf_counter() - t0
    weights = [max(1, r.prompt_tokens + r.output_tokens) if isinstance(r, Completion) else 1 for r in results]
    total = sum(weights)
    calls = []
    for s, res, w in zip(specs, results, weights):
        s.traj.wall_time += dt * w / total
        ok = isinstance(res, Completion)
        decided = generator.count_tokens(s.decided) if ok and s.decided else 0
        call = ModelCall(
            index=len(s.traj.calls), role=s.kind, round=s.round, prompt=s.prompt,
            output=s.prefix + s.decided + res.text if ok else "",
            prompt_tokens=max(0, res.prompt_tokens - decided) if ok else 0,
            output_tokens=res.output_tokens + decided if ok else 0, finish_reason=res.finish_reason if ok else "error",
            error=None if ok else f"generation error: {res}", passage_ids=list(s.passage_ids),
            retrieved_tokens=s.retrieved_tokens, prefix=s.prefix, pair=s.pair,
        )
        if ok and res.truncated_tokens:
            s.traj.meta["truncated_prompt_tokens"] = s.traj.meta.get("truncated_prompt_tokens", 0) + res.truncated_tokens
        s.traj.calls.append(call)
        calls.append(call)
    return calls, dt
