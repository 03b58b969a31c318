"""DoG, Debating over Graphs (Ma et al.): question answering over a knowledge-graph store, one relation per hop.

    config.py    the method's settings and call kinds
    prompts.py   the prompts of relation filtering, answer trying, the three debate roles, the fallback
    parsing.py   tolerant parsing of every call's output
    graph.py     the graph a run answers over (`strategy.graph`) and a question's topic entity
    engine.py    the batched loop (`DoG`)
    explain.py   the walk as the evidence a report highlights
    mechanism.py whether the walk runs: hop-1 relation accuracy, the answer try's Yes at the gold last hop and elsewhere
    gold.py      gold trajectories (the bootstrap's records): the engine walked along the gold chain

Every call kind trains the adapter of its own name under `selftrain --mode star`. See docs/dog.md.
"""

from __future__ import annotations

import dataclasses

from knowtrace_train.methods.base import Method
from knowtrace_train.methods.dog.config import ANSWER_TRY, CALL_KINDS, FALLBACK, NAME, DoGConfig
from knowtrace_train.methods.dog.engine import DoG


class DoGMethod(Method):
    name = NAME
    config_class = DoGConfig

    def strategy(self, config: DoGConfig) -> DoG:
        return DoG(config)

    def record_roles(self, config: DoGConfig) -> dict[str, str]:
        """Each call kind the settings make trains its own adapter (no debate kinds without hops;
        no critic or linguist with 0 debate rounds)."""
        kinds = [FALLBACK] if config.max_hops == 0 else [k for k in CALL_KINDS if k in
                                                          {"relation", "answer_try", FALLBACK, *config.debate_roles()}]
        return {k: k for k in kinds}

    def for_model(self, config: DoGConfig, trained: frozenset[str], fewshot_trained: bool) -> DoGConfig:
        """A model whose roles were trained without exemplars runs its prompts without them."""
        if trained & set(CALL_KINDS) and not fewshot_trained:
            return dataclasses.replace(config, fewshot=False)
        return config

    def gold_records(self, config: DoGConfig, items, retriever, *, fewshot: bool, require_support: bool,
                     count_tokens, iteration, make_generator=None, facts=None):
        """The records of DoG's loop walked along the items' gold chains over its graph (gold.py); the
        retriever is not read."""
        from knowtrace_train.methods.dog.gold import dog_gold_records

        return dog_gold_records(config, items, retriever, record_kinds=list(self.record_roles(config)),
                                fewshot=fewshot, require_support=require_support, count_tokens=count_tokens,
                                iteration=iteration)

    def decision_prompts(self, config: DoGConfig, items, *, retriever=None, make_generator=None) -> list:
        """The answer try's held-out gold prompts: every answer try of the items' gold walks (gold.py), Yes at
        the gold chain's last hop, No at the hops before it, as `config` renders them (its exemplars, its graph);
        then every relation call's, fed the gold sub-question, its choice read from what the model writes."""
        from knowtrace_train.methods.dog.gold import decision_prompts

        return [] if config.max_hops == 0 else decision_prompts(config, items)

    def threshold_decisions(self, config: DoGConfig) -> frozenset[str]:
        """The answer try (none with `max_hops: 0`, which walks nothing)."""
        return frozenset() if config.max_hops == 0 else frozenset({ANSWER_TRY})

    def with_thresholds(self, config: DoGConfig, thresholds) -> DoGConfig:
        t = thresholds.get(ANSWER_TRY)
        return config if t is None else dataclasses.replace(config, answer_try_threshold=float(t))

    def evidence_supported(self, traj, config: DoGConfig) -> bool | None:
        """Answered from the graph: the prediction is an entity of the filled triples."""
        return bool(traj.graph.keys_named([traj.prediction]))

    def explain(self, traj, config: DoGConfig) -> dict:
        """The walk (each hop's first filled triple) as the evidence subgraph (explain.py)."""
        from knowtrace_train.methods.dog.explain import explain_walk

        return explain_walk(traj)

    def mechanism(self, trajectories, config: DoGConfig, items_by_id) -> dict:
        """Hop-1 relation accuracy and the answer try's Yes rate at the gold chain's last hop and elsewhere
        (mechanism.py); {} with `max_hops: 0` (the model alone walks nothing)."""
        if config.max_hops == 0:
            return {}
        from knowtrace_train.methods.dog.mechanism import dog_mechanism

        return dog_mechanism(trajectories, items_by_id)


__all__ = ["DoG", "DoGConfig", "DoGMethod"]
