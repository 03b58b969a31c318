"""TRACE (paper 000): a knowledge graph per retrieved document, reasoning chains built triple by triple, and the readers.

    config.py        TraceConfig (L, R, b, K, the reader) and the call kinds
    prompts.py       the KG generator's instruction and labelled documents, the selector, the reader
    kg_generator.py  documents -> triples, batched across questions, cached by content
    ranker.py        the bi-encoder triple ranker
    chains.py        the beam search over reasoning chains
    readers.py       TRACE-Triple, TRACE-Doc, all documents, no documents
    explain.py       the chains as the evidence a report highlights
    mechanism.py     whether the chain constructor runs: chain length, first-step stops, gold triples in the chains
    engine.py        the batched strategy
"""

from __future__ import annotations

from knowtrace_train.methods.base import Method
from knowtrace_train.methods.trace.config import ANSWER, KG, READERS, SELECT, STRATEGY_NAME, TraceConfig, TraceRoleConfig
from knowtrace_train.methods.trace.engine import Trace


class TraceMethod(Method):
    """TRACE needs no training; under `selftrain --mode star` the KG generator's and the reader's
    generations of correct trajectories train their roles (the selector is scored, never decoded)."""

    name = STRATEGY_NAME
    config_class = TraceConfig

    def strategy(self, config: TraceConfig) -> Trace:
        return Trace(config)

    def record_roles(self, config: TraceConfig) -> dict[str, str]:
        roles = {ANSWER: config.roles.answer}
        if config.uses_chains:
            roles[KG] = config.roles.kg
        return roles

    def generator_roles(self, config: TraceConfig) -> set[str]:
        used = set(self.record_roles(config).values())
        if config.uses_chains:
            used.add(config.roles.select)
        return used

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
