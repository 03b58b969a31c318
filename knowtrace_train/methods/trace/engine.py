"""TRACE as a batched strategy: documents -> per-document triples (KG generator) -> reasoning chains (ranker, selector, beam) -> reader.

All questions of a call advance together: one retrieval for the questions without contexts, one
`generate` call for every uncached document, per beam step one encoder call and one `score_options`
call for every unfinished chain of every question, then one `generate` call for the readers. The
two comparison readers (all documents, no documents) skip the graph and the chains. Each question's
wall time is the run's time split equally among its questions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.generation.base import GenerationError, GenerationRequest, Generator, OptionScorer, OptionScores, generate_each, score_each
from knowtrace_train.kg import KnowledgeGraph, TracedTriplet, Triplet
from knowtrace_train.methods.engine import new_trajectory
from knowtrace_train.methods.trace.chains import Chain, Pending, beam_search, option_probabilities, ranker_fallback
from knowtrace_train.methods.trace.config import ANSWER, KG, SELECT, STRATEGY_NAME, TraceConfig
from knowtrace_train.methods.trace.kg_generator import (
    DocumentTriples,
    KGGenerator,
    content_key,
    default_cache,
    generator_identity,
)
from knowtrace_train.methods.trace.prompts import READER_STOP, option_letters, render_reader_prompt, render_select_prompt
from knowtrace_train.methods.trace.ranker import Encoder, TripleRanker, chain_query, load_encoder
from knowtrace_train.methods.trace.readers import doc_context_passages, documents_context, triple_context
from knowtrace_train.retrieval.base import RetrievalError, Retriever
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)


@dataclass
class _Question:
    item: QAItem
    traj: Trajectory
    documents: list[Passage] = field(default_factory=list)
    embeddings: np.ndarray | None = None


def clean_answer(text: str) -> str | None:
    """The reader's answer: its first line, without a trailing full stop; None where empty."""
    line = text.strip().split("\n", 1)[0].strip()
    if line.lower().startswith("answer:"):
        line = line[7:].strip()
    line = line.rstrip(".").strip()
    return line or None


def merge_graph(docs: Sequence[DocumentTriples], calls: Sequence[int]) -> KnowledgeGraph:
    """The question's graph: every document's triples, an identical triple kept once with the ids of
    every document that yielded it (the first document's call as its call)."""
    merged: dict[tuple[str, str, str], tuple[Triplet, list[str], int]] = {}
    for doc, call in zip(docs, calls):
        for t in doc.triples:
            entry = merged.setdefault(t.key(), (t, [], call))
            if doc.passage.id not in entry[1]:
                entry[1].append(doc.passage.id)
    g = KnowledgeGraph()
    for t, pids, call in merged.values():
        g.add(TracedTriplet(triplet=t, round=0, pair=None, call=call, passage_ids=tuple(pids)))
    return g


class Trace:
    """The TRACE strategy (`strategy: {name: trace, reader: triple | doc | all_docs | no_docs}`)."""

    name = STRATEGY_NAME

    def __init__(self, config: TraceConfig, *, encoder: Encoder | None = None) -> None:
        self.config = config
        self._encoder = encoder
        #: documents' triples, and the selector's scores (by prompt, options and model): a second run
        #: over the same questions, or another reader of the chains, scores nothing again
        self.cache = default_cache(config.cache, config.cache_dir, "kg")
        self.score_cache = default_cache(config.cache, config.cache_dir, "select")

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = load_encoder(self.config.encoder)
        return self._encoder

    def kg_generator(self) -> KGGenerator:
        c = self.config
        return KGGenerator(role=c.roles.kg, demonstrations=c.demonstrations, max_triples=c.max_triples,
                           max_new_tokens=c.kg_max_new_tokens, seed=c.seed, cache=self.cache,
                           encoder=self.encoder if c.demonstrations and c.demo_selection == "similar" else None,
                           selection=c.demo_selection)

    # -- the strategy ------------------------------------------------------------------------------

    def run(self, items: Sequence[QAItem], generator: Generator, retriever: Retriever,
            on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        if not items:
            return []
        c = self.config
        if c.uses_chains and not isinstance(generator, OptionScorer):
            raise GenerationError(f"strategy trace (reader {c.reader!r}) needs a generator with score_options "
                                  f"(knowtrace_train.generation.base.OptionScorer); {type(generator).__name__} has none")
        t0 = time.perf_counter()
        qs = [_Question(it, new_trajectory(it, self.name, {"reader": c.reader})) for it in items]
        self._documents(qs, retriever)
        chains: list[list[Chain]] = [[] for _ in qs]
        if c.uses_chains:
            self._graphs(qs, generator)
            chains = self._chains(qs, generator)
        self._read(qs, chains, generator)
        share = (time.perf_counter() - t0) / len(qs)
        for q in qs:
            q.traj.wall_time = share
            if on_done is not None:
                on_done(q.traj)
        return [q.traj for q in qs]

    def _documents(self, qs: list[_Question], retriever: Retriever) -> None:
        c = self.config
        need = []
        for q in qs:
            if c.document_source == "contexts" or (c.document_source == "auto" and q.item.context):
                q.documents = list(q.item.context)
            else:
                need.append(q)
        if need:
            try:
                hits = retriever.search([q.item.question for q in need], c.documents)
            except RetrievalError as e:
                log.warning("trace: retrieval failed (%s)", e)
                hits = [[] for _ in need]
                for q in need:
                    q.traj.meta["retrieval_error"] = str(e)
            for q, h in zip(need, hits):
                q.documents = [s.passage for s in h]
        for q in qs:
            q.traj.meta["documents"] = [p.id for p in q.documents]

    def _graphs(self, qs: list[_Question], generator: Generator) -> None:
        """The KG generator over every question's documents at once; each question's calls and graph."""
        kg = self.kg_generator()
        by_id = kg.run([p for q in qs for p in q.documents], generator)
        for q in qs:
            docs = [by_id[p.id] for p in q.documents]
            calls = []
            for d in docs:
                calls.append(len(q.traj.calls))
                q.traj.calls.append(ModelCall(
                    index=len(q.traj.calls), role=KG, round=0, prompt=d.prompt, output=d.output,
                    prompt_tokens=d.prompt_tokens, output_tokens=d.output_tokens, finish_reason=d.finish_reason,
                    parsed={"triples": [[t.subject, t.relation, t.object] for t in d.triples], "cached": d.cached,
                            "skipped_lines": d.skipped_lines},
                    error=d.error, passage_ids=[d.passage.id]))
            q.traj.graph = merge_graph(docs, calls)
            q.traj.meta["kg"] = {"documents": len(docs), "cached": sum(d.cached for d in docs),
                                 "without_triples": [d.passage.id for d in docs if not d.triples],
                                 "skipped_lines": sum(d.skipped_lines for d in docs),
                                 "triples": len(q.traj.graph.triplets)}
            n = len(q.traj.graph.triplets)
            q.traj.meta["graph_smaller_than_k"] = n < self.config.candidates
            q.embeddings = TripleRanker(self.encoder).encode_triples([t.triplet for t in q.traj.graph.triplets]) if n else None

    def _chains(self, qs: list[_Question], generator) -> list[list[Chain]]:
        c = self.config
        ranker = TripleRanker(self.encoder)
        step = {"i": 0}

        def triples(qi: int) -> list[Triplet]:
            return [t.triplet for t in qs[qi].traj.graph.triplets]

        def rank(active: Sequence[tuple[int, Chain]]) -> list[list[int]]:
            out: list[list[int] | None] = [None] * len(active)
            live = [i for i, (qi, _) in enumerate(active) if qs[qi].embeddings is not None]
            for i, (qi, _) in enumerate(active):
                if qs[qi].embeddings is None:
                    out[i] = []
            queries = [chain_query(qs[active[i][0]].item.question, [triples(active[i][0])[j] for j in active[i][1].triples])
                       for i in live]
            ranked = ranker.rank(queries, [qs[active[i][0]].embeddings for i in live],
                                 [active[i][1].triples for i in live], c.candidates)
            for i, r in zip(live, ranked):
                out[i] = r
            return [r or [] for r in out]

        def select(pending: Sequence[Pending]) -> list[list[float]]:
            step["i"] += 1
            requests, letters = [], []
            for p in pending:
                ts = triples(p.question)
                prompt = render_select_prompt(qs[p.question].item.question, [ts[j] for j in p.chain.triples],
                                              [ts[j] for j in p.candidates])
                requests.append(GenerationRequest(prompt=prompt, role=c.roles.select, max_new_tokens=1))
                letters.append(option_letters(len(p.candidates)))
            scores = self._score(generator, requests, letters)
            out = []
            for p, req, opts, s in zip(pending, requests, letters, scores):
                traj = qs[p.question].traj
                error = None
                if isinstance(s, GenerationError):
                    probs, error = ranker_fallback(len(p.candidates)), f"selector failed ({s}); the ranker's order used"
                    logprobs, prompt_tokens = None, 0
                else:
                    logprobs, prompt_tokens = [s.logprobs.get(o) for o in opts], s.prompt_tokens
                    probs = option_probabilities(logprobs)
                    if probs is None:
                        probs = ranker_fallback(len(p.candidates))
                        error = "no option letter in the selector's distribution; the ranker's order used"
                traj.calls.append(ModelCall(
                    index=len(traj.calls), role=SELECT, round=step["i"], prompt=req.prompt, output="",
                    prompt_tokens=prompt_tokens, output_tokens=0, finish_reason="scored",
                    parsed={"chain": list(p.chain.triples), "candidates": list(p.candidates), "options": opts,
                            "logprobs": logprobs, "probs": probs}, error=error))
                if error:
                    traj.meta["selector_fallbacks"] = traj.meta.get("selector_fallbacks", 0) + 1
                out.append(probs)
            return out

        result = beam_search(len(qs), rank, select, length=c.chain_length, beams=c.beams, branch=c.branch)
        for q, chains in zip(qs, result):
            q.traj.meta["chains"] = [ch.to_dict() for ch in chains]
            q.traj.rounds = max((len(ch.triples) for ch in chains), default=0)
        return result

    def _score(self, generator, requests, letters) -> list:
        """Option scores per request (from the cache where the same prompt was scored by the same model);
        a request the backend refuses comes back as its GenerationError."""
        identity = generator_identity(generator, self.config.roles.select)
        keys = [content_key({"prompt": r.prompt, "role": r.role, "options": o, "model": identity})
                for r, o in zip(requests, letters)]
        out: list = [None] * len(requests)
        for i, key in enumerate(keys):
            record = self.score_cache.get(key)
            if record is not None and isinstance(record.get("logprobs"), dict):
                out[i] = OptionScores(record["logprobs"], int(record.get("prompt_tokens", 0)))
        todo = [i for i, o in enumerate(out) if o is None]
        for i, s in zip(todo, self._score_uncached(generator, [requests[i] for i in todo], [letters[i] for i in todo])):
            out[i] = s
            if isinstance(s, OptionScores):
                self.score_cache.put(keys[i], {"logprobs": s.logprobs, "prompt_tokens": s.prompt_tokens})
        return out

    @staticmethod
    def _score_uncached(generator, requests, letters) -> list:
        return score_each(generator, requests, letters)

    def _read(self, qs: list[_Question], chains: list[list[Chain]], generator: Generator) -> None:
        c = self.config
        prompts, contexts = [], []
        for q, ch in zip(qs, chains):
            passages: list[Passage] = []
            if c.reader == "triple":
                context = triple_context(ch, q.traj.graph.triplets)
            elif c.reader == "doc":
                passages = doc_context_passages(ch, q.traj.graph.triplets, q.documents)
                context = documents_context(passages)
            elif c.reader == "all_docs":
                passages = list(q.documents)
                context = documents_context(passages)
            else:
                context = None
            if context is None and c.reader != "no_docs":
                q.traj.meta["empty_context"] = True
            tokens = generator.count_tokens(context) if context else 0
            q.traj.meta["context_tokens"] = tokens
            contexts.append((context, passages, tokens))
            prompts.append(render_reader_prompt(q.item.question, context))
        requests = [GenerationRequest(prompt=p, role=c.roles.answer, max_new_tokens=c.answer_max_new_tokens, stop=READER_STOP)
                    for p in prompts]
        for q, req, (context, passages, tokens), out in zip(qs, requests, contexts, generate_each(generator, requests)):
            traj = q.traj
            if isinstance(out, GenerationError):
                traj.calls.append(ModelCall(index=len(traj.calls), role=ANSWER, round=traj.rounds + 1, prompt=req.prompt,
                                            output="", prompt_tokens=0, output_tokens=0, error=f"generation failed: {out}",
                                            passage_ids=[p.id for p in passages], retrieved_tokens=tokens))
                traj.stop_reason = f"error: {out}"
                continue
            answer = clean_answer(out.text)
            traj.calls.append(ModelCall(index=len(traj.calls), role=ANSWER, round=traj.rounds + 1, prompt=req.prompt,
                                        output=out.text, prompt_tokens=out.prompt_tokens, output_tokens=out.output_tokens,
                                        finish_reason=out.finish_reason, parsed={"answer": answer},
                                        error=None if answer else "empty answer",
                                        passage_ids=[p.id for p in passages], retrieved_tokens=tokens))
            traj.prediction = answer
            traj.stop_reason = "answered" if answer else "no_answer"
