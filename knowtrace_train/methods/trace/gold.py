"""Gold trajectories of TRACE: its own engine run over an item's documents with a model that makes the gold decisions.

The chain is the shared one (methods/gold_chain.py): the item's gold triples in hop order. The engine
(`Trace.run`) runs unchanged, documents, prompts, ranker, beam search, parsers and reader included, with
`GoldModel` in place of the generator:

    KG generator  each document -> the gold triples it states (a triple of any of the items' gold chains
                  whose two entities the document names, `gold_chain.states`), "\\n<head; relation; tail>"
                  per triple, at most `max_triples`; nothing for a document that states none
    selector      at each step the option letter of the chain's next gold triple among the K candidates
                  the ranker offers over the graph of those triples (log-probability 0, every other
                  letter -inf), then "A" (stop) once the chain holds every gold triple
    reader        " <answer>"

A document's KG output does not depend on the question (the engine generates each document once per
call and caches it by content), so it is the gold triples of every item the document states, not only
those of the question at hand: the other items' triples are the graph's distractors, and the ones that
let the selector be asked to stop (a graph holding only the chain's triples has nothing left to offer
after the last one: the chain ends "exhausted" without a stop step, as the engine does). The documents
are the engine's (the item's contexts, else the retriever's top `documents` for the question).

The records are the STaR records of these trajectories (methods/star.py), under the calls' kinds: each
KG call whose document states a gold triple (`kg`), each selector step with its gold letter as the
output (`select`: " B", " A"; the engine records an empty output, as it scores rather than decodes), and
the reader (`answer`). Two kinds of record the engine's run does not make are added to each gold trajectory
with a chain reader (`meta["gold_added"]`; each record's `added` names its reason, and the statistics'
`added_records` count them per reason):

    stop_exhausted / stop_at_length   the chain ended without a stop step (its graph had nothing left to
                  offer, or it reached L triples): a selector record " A" after the whole gold chain, its
                  options the ranker's top K of the call's other gold trajectories' graph triples (the
                  distractors a bigger graph offers; none where there are none), so the selector learns to
                  stop where the gold chain ends
    reader_without_context   the reader's prompt without a context block (what it gets when every chain
                  is empty) and the gold answer

An item is skipped, counted under its reason, where:

    no_chain / no_chain_entity  the item has no gold chain (HotpotQA), or a hop without an entity
    too_many_hops               the chain has more triples than `chain_length` (L)
    unreadable_step             TRACE's parser does not read a gold triple back as itself (a tail ending in
                                "." or ")" loses it), its reader's parser the answer, or the engine's
                                chain or answer is not the gold one
    unsupported_hop             (with `require_support`) a hop's triple is stated by none of the item's
                                documents (or was cut by `max_triples`): the retriever never surfaces it.
                                Without `require_support` such a triple is written for the first document
                                naming one of its entities (else the first document): invention allowed
    not_in_candidates           the ranker does not offer the chain's next gold triple among its K
                                candidates at some step
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.decisions import DecisionPrompt
from knowtrace_train.generation.base import Completion, GenerationRequest, OptionScores
from knowtrace_train.kg import Triplet
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP, Hop, checked_chain
from knowtrace_train.methods.gold_chain import mentions, passage_words, states
from knowtrace_train.methods.gold_records import GOLD_ID_SUFFIX, TOO_MANY_HOPS, UNREADABLE_STEP, GoldRecords
from knowtrace_train.methods.gold_records import GoldTally, GoldTrajectories, gold_records, words
from knowtrace_train.methods.trace.chains import EXHAUSTED, LENGTH
from knowtrace_train.methods.trace.config import ANSWER, SELECT, STRATEGY_NAME, TraceConfig
from knowtrace_train.methods.trace.engine import Trace, _Question, clean_answer
from knowtrace_train.methods.trace.kg_generator import parse_triples
from knowtrace_train.methods.trace.prompts import (
    KG_INSTRUCTION,
    READER_INSTRUCTION,
    SELECT_INSTRUCTION,
    render_document,
    render_reader_prompt,
    render_select_prompt,
    option_letters,
    render_triple,
)
from knowtrace_train.methods.trace.ranker import Encoder, TripleRanker, chain_query, top_candidates
from knowtrace_train.metrics import exact_match, normalize_answer, question_kind
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import Trajectory

NOT_IN_CANDIDATES = "not_in_candidates"
#: every reason an item may have no TRACE gold trajectory
SKIP_REASONS = (NO_CHAIN, NO_CHAIN_ENTITY, TOO_MANY_HOPS, UNREADABLE_STEP, UNSUPPORTED_HOP, NOT_IN_CANDIDATES)
#: the option that ends a chain
STOP_LETTER = "A"
#: the records added beside the engine's (module docstring), by reason
STOP_EXHAUSTED, STOP_AT_LENGTH, READER_WITHOUT_CONTEXT = "stop_exhausted", "stop_at_length", "reader_without_context"
ADDED_REASONS = (STOP_EXHAUSTED, STOP_AT_LENGTH, READER_WITHOUT_CONTEXT)


@dataclass(frozen=True)
class GoldItem:
    """An item with a gold chain: the hops and their triples, in order."""

    item: QAItem
    hops: tuple[Hop, ...]

    @property
    def triples(self) -> list[Triplet]:
        return [h.triplet for h in self.hops]


def kg_prompt_key(passage: Passage) -> str:
    """How a KG generator prompt ends for `passage` (the prompt is the instruction, the demonstrations,
    then the document and "Triples:")."""
    return f"{render_document(passage.title, passage.text)}\nTriples:"


def kg_output(triples: Sequence[Triplet]) -> str:
    """The KG generator's gold output: each triple on its own line after "Triples:", as the
    demonstrations show them; empty where the document states none."""
    return "".join(f"\n{render_triple(t)}" for t in triples)


def reads_back(t: Triplet) -> bool:
    """Whether TRACE's KG parser reads the rendered triple back as itself."""
    return parse_triples(render_triple(t), 1).triples == [t]


def _prompt_triple(text: str) -> Triplet | None:
    parsed = parse_triples(text, 1).triples
    return parsed[0] if parsed else None


class GoldModel:
    """TRACE's model with the gold decisions (see the module docstring): a `Generator` and `OptionScorer`
    for the engine. KG prompts are matched by their document, reader and selector prompts by their
    question (an engine call must not hold two items with the same question). What goes off the gold
    path is recorded per item id in `failures` (the first reason), never raised."""

    def __init__(self, golds: Iterable[GoldItem], outputs: Mapping[str, str], count_tokens: Callable[[str], int]) -> None:
        self.golds: dict[str, GoldItem] = {}
        for g in golds:
            if g.item.question in self.golds:
                raise ValueError(f"two items with the question {g.item.question!r} in one gold call")
            self.golds[g.item.question] = g
        self.outputs = dict(outputs)
        self._lengths = sorted({len(k) for k in self.outputs}, reverse=True)  # the longest match first
        self.count = count_tokens
        self.failures: dict[str, str] = {}

    def count_tokens(self, text: str) -> int:
        return self.count(text)

    def close(self) -> None:
        pass

    def _fail(self, g: GoldItem, reason: str) -> None:
        self.failures.setdefault(g.item.id, reason)

    def _kg(self, prompt: str) -> str:
        for n in self._lengths:
            out = self.outputs.get(prompt[-n:])
            if out is not None:
                return out
        return ""

    def _reader(self, prompt: str) -> str:
        question = prompt.rsplit("\n\nQuestion: ", 1)[-1].removesuffix("\nAnswer:")
        g = self.golds.get(question)
        return f" {g.item.answer}" if g is not None else ""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            prompt = r.prompt if isinstance(r.prompt, str) else ""
            if prompt.startswith(KG_INSTRUCTION):
                text = self._kg(prompt)
            elif prompt.startswith(READER_INSTRUCTION):
                text = self._reader(prompt)
            else:
                text = ""
            out.append(Completion(text=text, prompt_tokens=self.count(prompt), output_tokens=self.count(text),
                                  finish_reason="stop"))
        return out

    def choose(self, prompt: str, options: Sequence[str]) -> str:
        """The gold letter of a selector prompt: the next gold triple's option, "A" after the chain's
        last triple (and where the next one is not offered: recorded as `not_in_candidates`)."""
        head = f"{SELECT_INSTRUCTION}\n\nQuestion: "
        question, _, rest = prompt[len(head):].partition("\nChosen triples:\n") if prompt.startswith(head) else ("", "", "")
        g = self.golds.get(question)
        if g is None:
            return STOP_LETTER
        chosen_text, _, listed = rest.partition("\nOptions:\n")
        chosen = [] if chosen_text == "None" else [_prompt_triple(x) for x in chosen_text.splitlines()]
        gold = g.triples
        k = len(chosen)
        if k > len(gold) or any(c is None or c.key() != t.key() for c, t in zip(chosen, gold)):
            self._fail(g, UNREADABLE_STEP)  # the chain left the gold path (never, with these scores)
            return STOP_LETTER
        if k == len(gold):
            return STOP_LETTER
        lines = listed.removesuffix("\nAnswer:").splitlines()
        for letter, line in zip(options[1:], lines[1:]):
            offered = _prompt_triple(line.removeprefix(f"{letter}. "))
            if offered is not None and offered.key() == gold[k].key():
                return letter
        self._fail(g, NOT_IN_CANDIDATES)
        return STOP_LETTER

    def score_options(self, requests: Sequence[GenerationRequest], options: Sequence[Sequence[str]]) -> list[OptionScores]:
        out = []
        for r, opts in zip(requests, options):
            pick = self.choose(r.prompt, opts)
            out.append(OptionScores({o: 0.0 if o == pick else -math.inf for o in opts}, prompt_tokens=self.count(r.prompt)))
        return out


class _Memo:
    """The retriever, each (query, k) searched once (the documents are looked up before the engine runs,
    and the engine searches them again)."""

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever
        self.hits: dict[tuple[str, int], list] = {}

    def search(self, queries: Sequence[str], k: int) -> list[list]:
        todo = list(dict.fromkeys(q for q in queries if (q, k) not in self.hits))
        if todo:
            for q, h in zip(todo, self.retriever.search(todo, k)):
                self.hits[(q, k)] = h
        return [self.hits[(q, k)] for q in queries]


def gold_config(config: TraceConfig, fewshot: bool) -> TraceConfig:
    """The settings the gold run uses: the KG generator's demonstrations only with `fewshot` (as
    `TraceMethod.for_model` runs a trained KG generator), nothing cached (no model wrote these outputs)."""
    return dataclasses.replace(config, cache=False, demonstrations=config.demonstrations if fewshot else 0)


def _check(it: QAItem, config: TraceConfig) -> GoldItem | str:
    """The item's gold chain, or why it cannot give a gold trajectory before any document is seen."""
    chain = checked_chain(it, need=("subject", "relation", "object"))
    if isinstance(chain, str):
        return chain
    if config.uses_chains and len(chain) > config.chain_length:
        return TOO_MANY_HOPS
    if config.uses_chains and not all(reads_back(h.triplet) for h in chain):
        return UNREADABLE_STEP
    if not any(exact_match(clean_answer(f" {it.answer}") or "", a) for a in it.answers):
        return UNREADABLE_STEP
    return GoldItem(it, tuple(chain))


def document_triples(golds: Sequence[GoldItem], documents: Mapping[str, Sequence[Passage]],
                     require_support: bool) -> dict[str, list[Triplet]]:
    """Per document id, the gold triples the gold KG generator writes for it: every item's gold triple
    (deduplicated by key, in item and hop order) whose two entities the document names; without
    `require_support`, an item's triple no document of its states is added to its first document
    naming one of the triple's entities (else its first document)."""
    pool: dict[tuple[str, str, str], Triplet] = {}
    for g in golds:
        for t in g.triples:
            pool.setdefault(t.key(), t)
    passages: dict[str, Passage] = {}
    for g in golds:
        for p in documents[g.item.id]:
            passages.setdefault(p.id, p)
    # a document can name an entity only where it holds the entity's first word: test those triples only
    first = {key: {w for e in (t.subject, t.object) for w in normalize_answer(e).split()[:1]} for key, t in pool.items()}
    out: dict[str, list[Triplet]] = {}
    for pid, p in passages.items():
        words = passage_words(p)
        vocab = set(words.split())
        out[pid] = [t for key, t in pool.items() if first[key] <= vocab and states(t, words)]
    if not require_support:
        for g in golds:
            docs = documents[g.item.id]
            for t in g.triples:
                if docs and not any(x.key() == t.key() for p in docs for x in out[p.id]):
                    home = next((p for p in docs if mentions(t.subject, p) or mentions(t.object, p)), docs[0])
                    out[home.id].append(t)
    return out


def _batches(golds: Sequence[GoldItem], size: int) -> list[list[GoldItem]]:
    """Engine calls of at most `size` items, no two with the same question (the gold model tells the
    items of a call apart by their questions)."""
    batches: list[list[GoldItem]] = []
    questions: list[set[str]] = []
    for g in golds:
        for b, qs in zip(batches, questions):
            if len(b) < size and g.item.question not in qs:
                b.append(g)
                qs.add(g.item.question)
                break
        else:
            batches.append([g])
            questions.append({g.item.question})
    return batches


def _gold_letter(call) -> str | None:
    parsed = call.parsed or {}
    probs, options = parsed.get("probs") or [], parsed.get("options") or []
    if not probs or len(probs) != len(options):
        return None
    return options[max(range(len(probs)), key=lambda j: (probs[j], -j))]


def _write_letters(traj: Trajectory, count: Callable[[str], int]) -> None:
    """Each selector call's output: its gold letter (the engine records an empty output: it scores the options)."""
    for c in traj.calls:
        if c.role == SELECT:
            letter = _gold_letter(c)
            c.output = f" {letter}" if letter else ""
            c.output_tokens = count(c.output)


def _verify(traj: Trajectory, g: GoldItem, config: TraceConfig, failure: str | None) -> str | None:
    """Why the engine's run is not the item's gold trajectory (None: it is)."""
    if config.uses_chains:
        in_graph = {t.triplet.key() for t in traj.graph.triplets}
        if any(t.key() not in in_graph for t in g.triples):
            return UNSUPPORTED_HOP
        if failure is not None:
            return failure
        chains = traj.meta.get("chains") or []
        best = [traj.graph.triplets[i].triplet.key() for i in chains[0]["triplets"]] if chains else []
        if best != [t.key() for t in g.triples]:
            return UNREADABLE_STEP
    elif failure is not None:
        return failure
    if traj.stop_reason != "answered" or not any(exact_match(traj.prediction or "", a) for a in g.item.answers):
        return UNREADABLE_STEP
    return None


def trace_gold_trajectories(config: TraceConfig, items: Iterable[QAItem], retriever: Retriever, *, fewshot: bool = True,
                            require_support: bool = True, count_tokens: Callable[[str], int] | None = None,
                            encoder: Encoder | None = None, batch_size: int = 64) -> GoldTrajectories:
    """TRACE's gold trajectories (its settings `config`; `encoder` the ranker's bi-encoder, None: the
    configured one) for the items that have one, and per-reason counts of those that have none."""
    count = count_tokens or words
    config = gold_config(config, fewshot)
    engine = Trace(config, encoder=encoder)
    tally = GoldTally()
    golds: list[GoldItem] = []
    for it in items:
        checked = _check(it, config)
        if isinstance(checked, str):
            tally.skip(checked)
        else:
            golds.append(checked)
    if not golds:
        return tally.result()
    memo = _Memo(retriever)
    qs = [_Question(g.item, Trajectory(id=g.item.id, question_id=g.item.id, question=g.item.question,
                                       answers=list(g.item.answers), dataset=g.item.dataset, strategy=engine.name))
          for g in golds]
    engine._documents(qs, memo)  # the engine's own choice of documents (contexts or the retriever's top ones)
    documents = {q.item.id: q.documents for q in qs}
    triples = document_triples(golds, documents, require_support)
    supported_golds = []
    for g in golds:
        stated = {t.key() for p in documents[g.item.id] for t in triples[p.id][: config.max_triples]}
        if require_support and any(t.key() not in stated for t in g.triples):
            tally.skip(UNSUPPORTED_HOP)
        else:
            supported_golds.append(g)
    passages = {p.id: p for docs in documents.values() for p in docs}
    outputs = {kg_prompt_key(passages[pid]): kg_output(ts[: config.max_triples]) for pid, ts in triples.items()}
    kept: list[tuple[Trajectory, GoldItem]] = []
    for batch in _batches(supported_golds, batch_size):
        model = GoldModel(batch, outputs, count)
        for g, traj in zip(batch, engine.run([g.item for g in batch], model, memo)):
            why = _verify(traj, g, config, model.failures.get(g.item.id))
            if why is None:
                _write_letters(traj, count)
                kept.append((traj, g))
            tally.add(traj, g.item, why)
    if config.uses_chains:
        _add_records(kept, config, TripleRanker(engine.encoder))
    return tally.result()


def _add_records(kept: Sequence[tuple[Trajectory, GoldItem]], config: TraceConfig, ranker: TripleRanker) -> None:
    """Each kept trajectory's added records (module docstring) in its `meta["gold_added"]`: {"role", "prompt",
    "completion", "reason"}."""
    pool: dict[tuple[str, str, str], Triplet] = {}
    for traj, _ in kept:
        for t in traj.graph.triplets:
            pool.setdefault(t.triplet.key(), t.triplet)
    triples = list(pool.values())
    embeddings = ranker.encode_triples(triples) if triples else None
    for traj, g in kept:
        added = []
        ended = (traj.meta.get("chains") or [{}])[0].get("ended")
        if ended in (EXHAUSTED, LENGTH):
            chain = {t.key() for t in g.triples}
            candidates: list[Triplet] = []
            if embeddings is not None:
                (row,) = ranker.encoder([chain_query(g.item.question, g.triples)])
                exclude = [i for i, t in enumerate(triples) if t.key() in chain]
                candidates = [triples[i] for i in top_candidates(embeddings @ row, exclude, config.candidates)]
            added.append({"role": SELECT, "prompt": render_select_prompt(g.item.question, g.triples, candidates),
                          "completion": f" {STOP_LETTER}", "reason": STOP_EXHAUSTED if ended == EXHAUSTED else STOP_AT_LENGTH,
                          "options": option_letters(len(candidates))})
        reader = next((c for c in reversed(traj.calls) if c.role == ANSWER), None)
        if reader is not None and reader.output.strip():
            added.append({"role": ANSWER, "prompt": render_reader_prompt(g.item.question, None),
                          "completion": reader.output, "reason": READER_WITHOUT_CONTEXT})
        traj.meta["gold_added"] = added


def trace_gold_records(config: TraceConfig, items: Iterable[QAItem], retriever: Retriever, *,
                       encoder: Encoder | None = None, **keywords: Any) -> GoldRecords:
    """The records of TRACE's gold trajectories of `items` (`keywords`: those of methods/gold_records.py's
    `gold_records`, `record_kinds` among them), and in the statistics `stop_records`: the selector records
    that stop the chain (" A", the engine's and the added ones), and `added_records`: the records added beside
    the engine's, per reason (module docstring)."""
    run = functools.partial(trace_gold_trajectories, config, retriever=retriever, encoder=encoder)
    res = gold_records(STRATEGY_NAME, run, items, **keywords)
    count = keywords.get("count_tokens") or words
    iteration = keywords.get("iteration", 0)
    added = {r: 0 for r in ADDED_REASONS} if config.uses_chains else {}
    for traj in res.trajectories:
        for a in traj.meta.get("gold_added", []):
            res.records_by_role.setdefault(a["role"], []).append(
                {"prompt": a["prompt"], "prefix": "", "completion": a["completion"], "role": a["role"],
                 "trajectory_id": traj.id, "iteration": iteration if iteration is not None else traj.iteration,
                 "added": a["reason"]})
            added[a["reason"]] += 1
            tokens = count(a["completion"])
            res.stats["tokens_all"] += tokens
            role = res.stats["roles"].setdefault(a["role"], {"tokens_all": 0, "tokens_filtered": 0, "fa_ratio": None})
            role["tokens_all"] += tokens
    res.stats["records"] = {k: len(v) for k, v in res.records_by_role.items()}
    res.stats["added_records"] = added
    res.stats["stop_records"] = sum(r["completion"] == f" {STOP_LETTER}" for r in res.records_by_role.get(SELECT, []))
    return res


#: the selector's decision to end the chain (option A), as `selector_prompts` labels it
SELECTOR_STOP = "selector_stop"


def selector_prompts(config: TraceConfig, items: Iterable[QAItem], retriever: Retriever, *,
                     encoder: Encoder | None = None) -> list[DecisionPrompt]:
    """The selector's held-out gold prompts (`decisions.DecisionPrompt`, kind `selector_stop`): every selector
    step of the items' gold trajectories (`trace_gold_trajectories`, `require_support` off: a hop no document
    states is written into one, as `gold_records` does without support) and the stop steps added after a chain
    that ended without one (`stop_exhausted` / `stop_at_length`). The options are the step's letters, "A"
    (stop) first; the label is True where the gold letter is "A" (the gold chain is complete), and elsewhere
    `choice` is the gold triple's letter (its rank among the candidates is the second figure). A step whose
    only option is "A" decides nothing and is left out. None without chains (the `all_docs` and `no_docs`
    readers build none)."""
    if not config.uses_chains:
        return []
    items = list(items)
    trajs, _ = trace_gold_trajectories(config, items, retriever, fewshot=True, require_support=False, encoder=encoder)
    kinds = {it.id: question_kind(it) for it in items}
    out = []
    for traj in trajs:
        steps = [(c.prompt, list((c.parsed or {}).get("options") or []), _gold_letter(c))
                 for c in traj.calls if c.role == SELECT]
        steps += [(a["prompt"], list(a["options"]), STOP_LETTER) for a in traj.meta.get("gold_added", [])
                  if a["role"] == SELECT]
        for prompt, options, letter in steps:
            if len(options) < 2 or letter is None or options[0] != STOP_LETTER:
                continue
            out.append(DecisionPrompt(SELECTOR_STOP, prompt, "", config.roles.select, tuple(options),
                                      letter == STOP_LETTER, traj.question_id, kinds.get(traj.question_id),
                                      None if letter == STOP_LETTER else letter))
    return out


__all__ = ["ADDED_REASONS", "SELECTOR_STOP", "selector_prompts", "GOLD_ID_SUFFIX", "GoldItem", "GoldModel", "NOT_IN_CANDIDATES", "SKIP_REASONS",
           "TOO_MANY_HOPS", "UNREADABLE_STEP", "document_triples", "gold_config", "kg_output",
           "kg_prompt_key", "reads_back", "trace_gold_records", "trace_gold_trajectories"]
