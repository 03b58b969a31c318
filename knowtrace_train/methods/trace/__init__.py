"""TRACE (paper 000): a knowledge graph per retrieved document, reasoning chains built triple by triple, and the readers.

    config.py        TraceConfig (L, R, b, K, the reader) and the call kinds
    prompts.py       the KG generator's instruction and labelled documents, the selector, the reader
    kg_generator.py  documents -> triples, batched across questions, cached by content
    ranker.py        the bi-encoder triple ranker
    chains.py        the beam search over reasoning chains
    readers.py       TRACE-Triple, TRACE-Doc, all documents, no documents
    explain.py       the chains as the evidence a report highlights
    gold.py          gold trajectories: the engine run with the gold KG triples, selector letters and answer
    mechanism.py     whether the chain constructor runs: chain length, first-step stops, gold triples in the chains
    engine.py        the batched strategy
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.base import Method
from knowtrace_train.methods.trace.config import ANSWER, KG, READERS, SELECT, STRATEGY_NAME, TraceConfig, TraceRoleConfig
from knowtrace_train.methods.trace.engine import Trace
from knowtrace_train.retrieval.base import Retriever


class TraceMethod(Method):
    """TRACE needs no training; under `selftrain --mode star` the KG generator's and the reader's
    generations of correct trajectories train their roles. The selector is scored, never decoded, so a
    rollout gives it no record; its records (the gold option letters) come from the gold trajectories
    of the bootstrap (gold.py)."""

    name = STRATEGY_NAME
    config_class = TraceConfig

    def strategy(self, config: TraceConfig) -> Trace:
        return Trace(config)

    def record_roles(self, config: TraceConfig) -> dict[str, str]:
        roles = {ANSWER: config.roles.answer}
        if config.uses_chains:
            roles[KG] = config.roles.kg
            roles[SELECT] = config.roles.select
        return roles

    def generator_roles(self, config: TraceConfig) -> set[str]:
        used = set(self.record_roles(config).values())
        if config.uses_chains:
            used.add(config.roles.select)
        return used

    def for_model(self, config: TraceConfig, trained: frozenset[str], fewshot_trained: bool) -> TraceConfig:
        """A trained KG generator's prompt follows `fewshot_trained` (without it: no demonstrations, as its
        gold records were written); an untrained one keeps its demonstrations. The selector and the
        reader have none."""
        if config.roles.kg in trained and not fewshot_trained and config.uses_chains:
            return dataclasses.replace(config, demonstrations=0)
        return config

    def gold_records(self, config: TraceConfig, items: Sequence[QAItem], retriever: Retriever, *, fewshot: bool,
                     require_support: bool, count_tokens: Callable[[str], int], iteration: int | None,
                     make_generator=None, facts=None):
        """The records of TRACE's engine run with the gold decisions on the items' gold chains (gold.py)."""
        from knowtrace_train.methods.trace.gold import trace_gold_records

        return trace_gold_records(config, items, retriever, record_kinds=list(self.record_roles(config)),
                                  fewshot=fewshot, require_support=require_support, count_tokens=count_tokens,
                                  iteration=iteration)

    def decision_prompts(self, config: TraceConfig, items, *, retriever=None, make_generator=None) -> list:
        """The selector's stop on held-out gold prompts: every selector step of the items' gold trajectories,
        "A" (stop) where the gold chain is complete, the gold triple's letter before (gold.py,
        `selector_prompts`); the engine picks the best-scored letter, so nothing is decided by threshold.
        The documents are the items' contexts, else `retriever`'s (required then)."""
        from knowtrace_train.methods.trace.gold import selector_prompts

        if not config.uses_chains:
            return []
        if retriever is None:
            raise ValueError("TRACE's decision prompts need the run's retriever (its documents)")
        return selector_prompts(config, items, retriever)

    def explain(self, traj, config: TraceConfig) -> dict:
        """The reasoning chains as the evidence subgraph (explain.py)."""
        from knowtrace_train.methods.trace.explain import explain_chains

        return explain_chains(traj)

    def mechanism(self, trajectories, config: TraceConfig, items_by_id) -> dict:
        """The chosen chain's length, the selector's first-step stop rate and the gold triples the chains
        hold (mechanism.py); {} for the `all_docs` and `no_docs` readers, which build no chains."""
        if not config.uses_chains:
            return {}
        from knowtrace_train.methods.trace.mechanism import trace_mechanism

        return trace_mechanism(trajectories, items_by_id)


__all__ = ["ANSWER", "KG", "READERS", "SELECT", "STRATEGY_NAME", "Trace", "TraceConfig", "TraceMethod", "TraceRoleConfig"]
