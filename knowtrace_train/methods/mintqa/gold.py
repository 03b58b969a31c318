"""Gold trajectories of MINTQA's decomposing strategies: the engine run on an item's gold evidence chain, gold texts in place of the model.

The chain is the shared one (methods/gold_chain.py): per hop its sub-question (the item's aligned
sub-question, "#k" resolved, or "What is the <relation> of <entity>?") and its answer (the triple's
object). `GoldMintQA` is the MINTQA engine (engine.py) whose `generate` writes each call's gold text,
so the prompts, the retrieval (each sub-question sent to the run's retriever, top `passages`) and the
parsing are the engine's own. Per step k of n hops (at most `max_steps`):

    decompose    " <hop k's sub-question>"; at step n + 1 " finish" (none where n = max_steps: the loop
                 stops there by itself, "max_steps")
    selfanswer   (mintqa_dynamic) what the raw model knows: " <its answer>\\nConfidence: certain" where the
                 run's raw base, asked the engine's own self-answer prompt of hop k's sub-question (greedy,
                 once per item and hop, batched: `measure_certainty`), answers it right (the hop's answer,
                 the toolkit's EM normalisation); the step then does not retrieve and its answer goes to
                 the history, as the engine does with a certain self-answer. Else " unknown\\nConfidence:
                 uncertain": the sub-question retrieves and is answered over its passages. Without a
                 generator (`make_generator` None) every hop is uncertain, the labels before the
                 measurement (a coined world's facts no model knows: nearly all are uncertain there anyway)
    subanswer    " <hop k's answer>", over the passages retrieved for the sub-question (the steps that retrieve)
    answer       " <answer>", from the sub-question/answer history

An item is skipped, counted under its reason, never raised on, where:

    no_chain / no_chain_entity  the item has no gold chain (gold_chain.py)
    too_many_hops               the chain has more hops than `max_steps`
    unreadable_step             the engine did not read a gold output back as the intended step (a
                                sub-question asked twice ends the loop; one with a question mark inside
                                is cut) or did not end with the gold answer
    unsupported_hop             (`require_support`) a hop's answer is not stated in the passages the
                                strategy retrieved for its sub-question (a certain hop retrieves nothing:
                                the raw model knew it)

The records are the STaR records of these trajectories (methods/star.py), every call kept
(methods/gold_records.py). Each self-answer record marks its decision (knowtrace_train/decisions.py: kind
`certainty`, label certain or uncertain, the span " certain" / " uncertain" after "Confidence:"), so that
training with `decision_weight` weighs the two labels balanced (a kind with one label only is not weighted).
The statistics' `decisions` count the records per label; `certainty` counts the measured hops per outcome
(certain: `right`; uncertain: `wrong`, `no_answer`, `error`; every hop asked, also of items skipped later)
and each kept trajectory's `meta["certainty"]` keeps its hops' raw answers.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.decisions import DecisionPrompt, decision_counts, mark_decision
from knowtrace_train.generation.base import BASE_ROLE, Completion, GenerationRequest, Generator, generate_each
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
    MintQADynamicConfig,
)
from knowtrace_train.methods.engine import Job
from knowtrace_train.methods.mintqa.engine import MintQA, _State
import knowtrace_train.methods.mintqa.prompts as prompts
from knowtrace_train.methods.mintqa.parsing import parse_selfanswer, parse_step
from knowtrace_train.metrics import exact_match, normalize_answer, question_kind
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)

#: every reason a MINTQA gold trajectory may be skipped for
SKIP_REASONS = (NO_CHAIN, NO_CHAIN_ENTITY, TOO_MANY_HOPS, UNREADABLE_STEP, UNSUPPORTED_HOP)
#: the strategies with gold trajectories (the one-call ones have no steps to teach beyond the answer)
GOLD_STRATEGIES = (DECOMPOSE, DYNAMIC)
FINISH = "finish"
#: the dynamic strategy's gold self-answer where the raw model does not know the hop: not known, so it retrieves
UNKNOWN = "unknown"
#: the two confidences of a self-answer, and the decision its record marks (knowtrace_train/decisions.py)
CERTAIN, UNCERTAIN = "certain", "uncertain"
CERTAINTY = "certainty"
#: why the raw model's self-answer of a hop made it certain (`RIGHT`) or uncertain (the others): the hop's
#: answer; another answer; no answer read; the generator refused the request
RIGHT, WRONG, NO_ANSWER, ERROR = "right", "wrong", "no_answer", "error"
_CONFIDENCE_LINE = "\nConfidence:"


def _parsed_answer(text: str) -> str:
    """What MINTQA's answer parser keeps of a one-line answer (no final full stop)."""
    return one_line(text).rstrip(".").strip()


def decompose_text(hops: Sequence[Hop], step: int) -> str:
    """The decomposition call of `step` (from 1): hop `step`'s sub-question, or finish after the last hop."""
    return f" {one_line(hops[step - 1].question)}" if step <= len(hops) else f" {FINISH}"


def selfanswer_text(known: str | None = None) -> str:
    """The gold self-answer: `known` (the raw model's right answer) rated certain, or, where None, unknown and
    uncertain."""
    if known is None:
        return f" {UNKNOWN}\nConfidence: {UNCERTAIN}"
    return f" {one_line(known)}\nConfidence: {CERTAIN}"


def answer_text(answer: str) -> str:
    """A sub-answer or the final answer: one line."""
    return f" {one_line(answer)}"


def expected_parse(kind: str, hops: Sequence[Hop], step: int, answer: str,
                   known: Sequence[str | None] = ()) -> dict[str, Any]:
    """What the engine's parser must read from the gold call of `kind` at `step` (`known`: per hop the raw
    model's right answer, or None: see `measure_certainty`)."""
    if kind == DECOMPOSE_CALL:
        if step > len(hops):
            return {"subquestion": None, "finish": True}
        return {"subquestion": one_line(hops[step - 1].question), "finish": False}
    if kind == SELFANSWER:
        own = known[step - 1] if step <= len(known) else None
        return {"answer": UNKNOWN, "confidence": UNCERTAIN} if own is None else {"answer": own, "confidence": CERTAIN}
    if kind == SUBANSWER:
        return {"answer": _parsed_answer(hops[step - 1].triplet.object)}
    return {"answer": _parsed_answer(answer)}


def measure_certainty(config: MintQADynamicConfig, chains: Sequence[tuple[QAItem, Sequence[Hop]]],
                      generator: Generator, *, batch_size: int = 256) -> dict[str, list[dict[str, Any]]]:
    """What the raw model knows of each hop: per item id, per hop in order {"step", "question", "output",
    "answer", "outcome", "known"}. Each hop's sub-question (as the engine reads the gold decomposition) is asked
    with the engine's self-answer prompt (exemplars as `config.fewshot` says, the raw model's own setting), greedy,
    `confidence_tokens` new tokens, on the plain model (`BASE_ROLE`), `batch_size` requests a `generate`. The
    outcome is `RIGHT` where the answer the engine's parser reads (whatever confidence the model stated) is the
    hop's answer under the toolkit's EM normalisation, then `known` is that answer as the gold text states it
    (" <known>\\nConfidence: certain" reads back as it); else `WRONG`, `NO_ANSWER` or `ERROR`, `known` None."""
    asks = []
    for it, hops in chains:
        for k, h in enumerate(hops, 1):
            q = parse_step(decompose_text(hops, k)).subquestion or one_line(h.question)
            asks.append((it, k, h, q))
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for start in range(0, len(asks), batch_size):
        batch = asks[start : start + batch_size]
        requests = [GenerationRequest(prompt=prompts.selfanswer_prompt(q, config.fewshot), role=BASE_ROLE,
                                      max_new_tokens=config.confidence_tokens, stop=prompts.SELFANSWER_STOP,
                                      temperature=0.0) for _, _, _, q in batch]
        for (it, k, h, q), res in zip(batch, generate_each(generator, requests)):
            entry: dict[str, Any] = {"step": k, "question": q, "output": None, "answer": None, "outcome": ERROR,
                                     "known": None}
            if isinstance(res, Completion):
                answer = parse_selfanswer(res.text).answer
                entry.update(output=res.text, answer=answer, outcome=NO_ANSWER if answer is None else WRONG)
                gold = h.triplet.object
                if answer is not None and normalize_answer(answer) and exact_match(answer, gold):
                    again = parse_selfanswer(selfanswer_text(answer))
                    if again.certain and again.error is None and exact_match(again.answer or "", gold):
                        entry.update(outcome=RIGHT, known=again.answer)
            out[it.id].append(entry)
    return out


class GoldMintQA(MintQA):
    """The MINTQA engine whose model calls write each question's gold texts; retrieval is the real
    retriever's. A call the script has no text for gets an empty output and `OFF_SCRIPT`. `known`: per item id,
    per hop the raw model's right answer (a certain self-answer) or None (uncertain); none given: every hop
    uncertain."""

    def __init__(self, config: MintQADecomposeConfig, chains: Mapping[str, tuple[list[Hop], str]],
                 count_tokens: Callable[[str], int], known: Mapping[str, Sequence[str | None]] | None = None) -> None:
        super().__init__(config)
        self.chains = chains
        self.count = count_tokens
        self.known = known or {}
        #: every passage a search returned, by id
        self.found: dict[str, Passage] = {}
        #: item id -> per call, the `parsed` the engine's parser must give
        self.expected: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def _gold(self, job: Job) -> str | None:
        hops, answer = self.chains[job.state.item.id]
        known = self.known.get(job.state.item.id, ())
        k = job.round
        if job.kind == DECOMPOSE_CALL:
            text = decompose_text(hops, k) if k <= len(hops) + 1 else None
        elif job.kind == SELFANSWER:
            text = selfanswer_text(known[k - 1] if k <= len(known) else None) if k <= len(hops) else None
        elif job.kind == SUBANSWER:
            text = answer_text(hops[k - 1].triplet.object) if k <= len(hops) else None
        else:
            text = answer_text(answer)
        if text is not None:
            self.expected[job.state.item.id].append(expected_parse(job.kind, hops, k, answer, known))
        return text

    def generate(self, jobs: list[Job]) -> list[ModelCall]:
        return [gold_call(job.state.traj, job.kind, job.round, job.prompt, self._gold(job), self.count,
                          passage_ids=[p.id for p in job.passages],
                          retrieved_tokens=self.passage_tokens(job.passages)) for job in jobs]

    def _search(self, queries: list[str], owners: list[_State], step: int) -> list[tuple[Passage, ...]]:
        hits = super()._search(queries, owners, step)
        for found in hits:
            self.found.update((p.id, p) for p in found)
        return hits

    def count_tokens(self, text: str) -> int:
        return self.count(text)


def hop_passages(traj: Trajectory, passages: Mapping[str, Passage]) -> dict[int, list[Passage]]:
    """Per step whose sub-question retrieved, the passages its sub-answer call was shown (those retrieved for it);
    a step answered from the model's own knowledge (a certain self-answer) has none."""
    return {c.round: [passages[i] for i in c.passage_ids] for c in traj.calls if c.role == SUBANSWER}


def certainty_span(prefix: str, completion: str) -> tuple[str, int, int] | None:
    """(label, start, end) of a self-answer's confidence: " certain" or " uncertain" after its last
    "\\nConfidence:", ending the completion (characters of `completion`); None where it states neither, or a
    prefix was fed."""
    if prefix or _CONFIDENCE_LINE not in completion:
        return None
    start = completion.rindex(_CONFIDENCE_LINE) + len(_CONFIDENCE_LINE)
    for label in (CERTAIN, UNCERTAIN):
        if completion[start:] == " " + label:
            return label, start, len(completion)
    return None


def mintqa_gold_trajectories(config: MintQADecomposeConfig, items: Iterable[QAItem], retriever: Retriever, *,
                             fewshot: bool = True, require_support: bool = True,
                             count_tokens: Callable[[str], int] | None = None, batch_size: int = 256,
                             make_generator: Callable[[], Generator] | None = None,
                             certainty: dict[str, Any] | None = None) -> GoldTrajectories:
    """The gold trajectories of the decomposing strategy `config.name` (prompts with exemplars as `fewshot`
    says) for the items that have one, and per-reason counts of those that have none. For the dynamic strategy,
    `make_generator()` builds the raw model whose answers decide each hop's certainty (`measure_certainty`; it
    is built only where some hop is asked, and closed after); None: every hop uncertain. `certainty`, where
    given, receives the measurement's counts ({"measured", "hops", "certain": {reason: n}, "uncertain":
    {reason: n}})."""
    if config.name not in GOLD_STRATEGIES:
        raise ValueError(f"MINTQA strategy {config.name!r} has no gold trajectories; those that have: {list(GOLD_STRATEGIES)}")
    count = count_tokens or words
    raw_config = config
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
    measured: dict[str, list[dict[str, Any]]] = {}
    if config.name == DYNAMIC and make_generator is not None and todo:
        generator = make_generator()
        try:
            measured = measure_certainty(raw_config, todo, generator, batch_size=batch_size)  # type: ignore[arg-type]
        finally:
            close = getattr(generator, "close", None)
            if callable(close):
                close()
    if certainty is not None and config.name == DYNAMIC:
        outcomes = Counter(e["outcome"] for es in measured.values() for e in es)
        certainty.update(measured=make_generator is not None, hops=sum(outcomes.values()),
                         certain={k: outcomes[k] for k in (RIGHT,) if outcomes[k]},
                         uncertain={k: outcomes[k] for k in (WRONG, NO_ANSWER, ERROR) if outcomes[k]})
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        known = {it.id: [e["known"] for e in measured.get(it.id, ())] for it, _ in batch}
        engine = GoldMintQA(config, {it.id: (chain, it.answer) for it, chain in batch}, count, known)
        trajs = engine.run([it for it, _ in batch], None, retriever)  # type: ignore[arg-type]
        for (it, chain), traj in zip(batch, trajs):
            # the loop finishes after the last hop, or stops at max_steps by itself
            stop, reason = "finished" if len(chain) < config.max_steps else "max_steps", None
            retrieved = hop_passages(traj, engine.found)
            if not read_back(traj, engine.expected[it.id], it, stop):
                reason = UNREADABLE_STEP
            elif require_support and not all(supported(h.triplet, retrieved[k])
                                             for k, h in enumerate(chain, 1) if k in retrieved):
                reason = UNSUPPORTED_HOP
            if it.id in measured:
                traj.meta["certainty"] = measured[it.id]
            tally.add(traj, it, reason)
    return tally.result()


def certainty_prompts(config: MintQADynamicConfig, items: Iterable[QAItem], make_generator: Callable[[], Generator], *,
                      batch_size: int = 256) -> list[DecisionPrompt]:
    """The certainty rating's held-out gold prompts (`decisions.DecisionPrompt`, kind `certainty`): per hop of the
    items' gold chains (at most `max_steps` hops), the self-answer prompt of its sub-question as `config` renders
    it, the raw model's own answer fed after it (`measure_certainty`, with the exemplars: the raw base's setting,
    as the bootstrap measures it; " unknown" where none was read) and "\nConfidence:"; labelled certain where
    that answer is the hop's answer (as the gold labels it), uncertain otherwise. The options are the words the
    model rates with, " certain" against " uncertain"."""
    chains = []
    for it in items:
        chain = checked_chain(it, need=("question", "object"))
        if not isinstance(chain, str) and len(chain) <= config.max_steps:
            chains.append((it, chain))
    if not chains:
        return []
    generator = make_generator()
    try:
        measured = measure_certainty(dataclasses.replace(config, fewshot=True), chains, generator, batch_size=batch_size)
    finally:
        close = getattr(generator, "close", None)
        if callable(close):
            close()
    out = []
    for it, _ in chains:
        for e in measured.get(it.id, ()):
            said = one_line(e["answer"]) if e["answer"] else UNKNOWN
            out.append(DecisionPrompt(CERTAINTY, prompts.selfanswer_prompt(e["question"], config.fewshot),
                                      f" {said}{_CONFIDENCE_LINE}", SELFANSWER, (f" {CERTAIN}", f" {UNCERTAIN}"),
                                      e["outcome"] == RIGHT, it.id, question_kind(it)))
    return out


def mintqa_gold_records(config: MintQADecomposeConfig, items: Iterable[QAItem], retriever: Retriever, *,
                        make_generator: Callable[[], Generator] | None = None, **keywords: Any) -> GoldRecords:
    """The records of the decomposing strategy `config.name`'s gold trajectories of `items` (`keywords`: those
    of methods/gold_records.py's `gold_records`, `record_kinds` among them). The dynamic strategy's certainty is
    the raw model's (`make_generator`, see `mintqa_gold_trajectories`), each self-answer record's confidence
    marked as its decision; the statistics' `decisions` count the records per label and `certainty` the
    measured hops per outcome."""
    counts: dict[str, Any] = {}
    run = functools.partial(mintqa_gold_trajectories, config, retriever=retriever, make_generator=make_generator,
                            certainty=counts)
    res = gold_records(config.name, run, items, **keywords)
    if config.name == DYNAMIC:
        if make_generator is None:
            log.warning("%s gold: no generator to measure what the raw model knows: every sub-question is rated "
                        "uncertain", config.name)
        for rec in res.records_by_role.get(SELFANSWER, []):
            span = certainty_span(rec.get("prefix", ""), rec["completion"])
            if span is not None:
                mark_decision(rec, CERTAINTY, *span)
        res.stats["decisions"] = decision_counts([r for v in res.records_by_role.values() for r in v])
        res.stats["certainty"] = counts
    return res
