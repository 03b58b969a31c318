"""The two filters of backtracing: unavailing explorations and extraneous completions, with token accounting.

A guidance pair whose completion produced no triplet of S is removed (the whole exploration
record when no pair is left); a triplet outside S is removed (the whole completion record when
no triplet is left); the final answering exploration is kept. Filtered outputs are written back
with `outputs`, the texts the parser reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from knowtrace_train.kg import GuidancePair, KnowledgeGraph, Triplet
import knowtrace_train.methods.knowtrace.outputs as outputs
from knowtrace_train.methods.knowtrace.backtrace.targets import pair_key
from knowtrace_train.methods.knowtrace.config import ANSWER, COMPLETE, EXPLORE, RECORD_KINDS
from knowtrace_train.trajectory import ModelCall, Trajectory, generated_text

# -- reading a trajectory's calls ----------------------------------------------------------


def _as_triplet(x: Any) -> Triplet | None:
    if isinstance(x, Triplet):
        return x
    if isinstance(x, (list, tuple)) and len(x) == 3:
        return Triplet(*(str(v) for v in x))
    if isinstance(x, dict) and {"subject", "relation", "object"} <= set(x):
        return Triplet(str(x["subject"]), str(x["relation"]), str(x["object"]))
    return None


def _as_pair(x: Any) -> GuidancePair | None:
    if isinstance(x, GuidancePair):
        return x
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return GuidancePair(str(x[0]), str(x[1]))
    if isinstance(x, dict) and {"entity", "guidance"} <= set(x):
        return GuidancePair(str(x["entity"]), str(x["guidance"]))
    return None


def generated_triplets(call: ModelCall, graph: KnowledgeGraph) -> list[Triplet]:
    """The triplets a completion call generated: its parsed triplets (duplicates of graph
    triplets included), else the graph triplets it added."""
    out: list[Triplet] = []
    seen: set[tuple[str, str, str]] = set()
    parsed = (call.parsed or {}).get("triplets") if isinstance(call.parsed, dict) else None
    rows = list(parsed or ())
    rows += [graph.triplets[i].triplet for i in call.triplets if 0 <= i < len(graph.triplets)]
    for row in rows:
        t = _as_triplet(row)
        if t is not None and t.key() not in seen:
            seen.add(t.key())
            out.append(t)
    return out


def is_answer_call(call: ModelCall) -> bool:
    if call.role == ANSWER:
        return True
    p = call.parsed if isinstance(call.parsed, dict) else {}
    return call.role == EXPLORE and bool(p.get("answer")) and p.get("sufficient") is not False


def _parsed_pairs(call: ModelCall) -> list[GuidancePair]:
    p = call.parsed if isinstance(call.parsed, dict) else {}
    return [q for q in (_as_pair(x) for x in p.get("pairs") or ()) if q is not None]


def _pairs_run(call: ModelCall) -> int | None:
    """How many of the parsed pairs the engine retrieved for (`max_pairs` cuts the rest); None
    where the trajectory does not say (recorded before the engine wrote it: all ran)."""
    n = (call.parsed or {}).get("pairs_run") if isinstance(call.parsed, dict) else None
    return n if isinstance(n, int) and n >= 0 else None


def exploration_pairs(call: ModelCall, traj: Trajectory) -> list[GuidancePair]:
    """The guidance pairs of an exploration call that ran: the parsed ones the engine retrieved
    for, else the pairs of the completion calls that followed it (up to the next exploration)."""
    pairs = _parsed_pairs(call)
    if pairs:
        n = _pairs_run(call)
        return pairs if n is None else pairs[:n]
    return [c.pair for c in _served_completions(call, traj) if c.pair is not None]


def unrun_pairs(call: ModelCall) -> list[GuidancePair]:
    """The parsed pairs of an exploration that were never retrieved (beyond `max_pairs`)."""
    n = _pairs_run(call)
    return [] if n is None else _parsed_pairs(call)[n:]


def _served_completions(call: ModelCall, traj: Trajectory) -> list[ModelCall]:
    """Completion calls between this exploration and the next exploration or answer call."""
    out = []
    after = False
    for c in sorted(traj.calls, key=lambda c: c.index):
        if c.index == call.index:
            after = True
            continue
        if not after:
            continue
        if c.role in (EXPLORE, ANSWER):
            break
        if c.role == COMPLETE:
            out.append(c)
    return out


# -- the two filters ---------------------------------------------------------------------


@dataclass
class FilteredCall:
    """One model call after the filters: the output to train on (None: record dropped),
    and its token accounting (`tokens_filtered` + `tokens_kept` == `tokens_all`)."""

    call: ModelCall
    role: str
    output: str | None
    #: the unfiltered content written in the same canonical format (what STaR trains on)
    full_output: str | None
    items_all: int
    items_kept: int
    tokens_all: int
    tokens_filtered: int

    @property
    def tokens_kept(self) -> int:
        return self.tokens_all - self.tokens_filtered

    @property
    def kept(self) -> bool:
        return self.output is not None


def answer_texts(call: ModelCall, traj: Trajectory) -> tuple[str, str] | None:
    p = call.parsed if isinstance(call.parsed, dict) else {}
    thought = p.get("thought") or traj.thought
    answer = p.get("answer") or traj.prediction
    if not answer:
        return None
    return (thought or "").strip(), str(answer)


def answer_output(thought: str, answer: str) -> str:
    """The canonical answering output, of an exploration that answers and of the forced
    answering call alike (whose output starts with the answer prefix it was sent)."""
    return outputs.exploration_answer(thought, answer)


def _bounded(n: int, limit: int) -> int:
    return max(0, min(n, limit))


def contradicting_forced_answers(calls: Iterable[ModelCall]) -> set[int]:
    """Indices of forced answering calls whose prompt is one the model judged insufficient ("No") in an
    exploration of the same trajectory: at a no-progress stop the graph did not change, so the forced
    answer's prompt is that round's exploration prompt. Neither mode trains such a record (it would
    teach "Yes" on the very input the model answered "No" to); its tokens count as filtered."""
    calls = list(calls)
    judged_no = {c.prompt for c in calls if c.role == EXPLORE and not is_answer_call(c)}
    return {c.index for c in calls if c.role == ANSWER and c.prompt in judged_no}


def filter_trajectory(
    traj: Trajectory, evidence: Iterable[int] | None, count_tokens: Callable[[str], int]
) -> list[FilteredCall]:
    """Apply the two filters to every explore/complete/answer call of a trajectory.
    `evidence` None means the trajectory has no backtrace: every record is dropped."""
    s_keys = None if evidence is None else {traj.graph.triplets[i].triplet.key() for i in evidence}
    calls = sorted(traj.calls, key=lambda c: c.index)
    contradicted = contradicting_forced_answers(calls)
    completion_triplets = {c.index: generated_triplets(c, traj.graph) for c in calls if c.role == COMPLETE}
    out: list[FilteredCall] = []
    for call in calls:
        if call.role not in RECORD_KINDS:
            continue
        n_all = count_tokens(generated_text(call))  # output tokens: the prefix the engine fed is none
        if is_answer_call(call):
            texts = answer_texts(call, traj)
            full = None if texts is None or call.index in contradicted else answer_output(*texts)
            keep = full is not None and s_keys is not None
            out.append(FilteredCall(call, call.role, full if keep else None, full, 1, int(keep), n_all,
                                    0 if keep else n_all))
        elif call.role == COMPLETE:
            gen = completion_triplets.get(call.index, [])
            full = outputs.completion(gen)
            kept = [] if s_keys is None else [t for t in gen if t.key() in s_keys]
            out.append(_partial(call, COMPLETE, full, kept, gen, outputs.completion(kept),
                                [t.render() for t in gen if t not in kept], n_all, count_tokens))
        elif call.role == EXPLORE:
            unrun = unrun_pairs(call)
            if unrun:  # output that never ran is no output of the trajectory: not in FA's "all" either
                n_all = _bounded(n_all - count_tokens("\n".join(p.render() for p in unrun)), n_all)
            pairs = exploration_pairs(call, traj)
            full = outputs.exploration_guidance(pairs) if pairs else None
            served = _served_completions(call, traj)
            kept = []
            if s_keys is not None:
                for p in pairs:
                    produced = [t for c in served if c.pair is not None and pair_key(c.pair) == pair_key(p)
                                for t in completion_triplets.get(c.index, [])]
                    if any(t.key() in s_keys for t in produced):
                        kept.append(p)
            out.append(_partial(call, EXPLORE, full, kept, pairs, outputs.exploration_guidance(kept),
                                [p.render() for p in pairs if p not in kept], n_all, count_tokens))
    return out


def _partial(call, role, full, kept, all_items, kept_text, removed_lines, n_all, count_tokens) -> FilteredCall:
    if not kept:
        return FilteredCall(call, role, None, full, len(all_items), 0, n_all, n_all)
    removed = _bounded(count_tokens("\n".join(removed_lines)), n_all) if removed_lines else 0
    return FilteredCall(call, role, kept_text, full, len(all_items), len(kept), n_all, removed)
