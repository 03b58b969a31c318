"""MINTQA's ways of answering (Sections 5-7 of the MINTQA paper), four registered methods over the shared generator and retriever.

    config.py    the four method names, their settings and call kinds
    prompts.py   the prompts and their exemplars
    parsing.py   tolerant parsing of answers, sub-questions and confidences
    engine.py    the batched engine that runs all four (`MintQA`)
    gold.py      gold trajectories of the two decomposing strategies (the bootstrap's records)

`mintqa_parametric` (no retrieval), `mintqa_rag` (top-5 passages for the whole question),
`mintqa_decompose` (decomposition-then-retrieval) and `mintqa_dynamic` (decomposition with
retrieval only for sub-questions the model is not certain of). Each call kind trains the adapter
of its own name under `selftrain --mode star`; MINTQA's breakdowns (accuracy by hop count and by
the share of popular/new facts) are `scripts/lab/mintqa_breakdown.py`.
"""

from __future__ import annotations

import dataclasses

from knowtrace_train.methods.base import Method
from knowtrace_train.methods.mintqa.config import (
    CALL_KINDS,
    CONFIG_CLASSES,
    DECOMPOSE,
    DYNAMIC,
    MODES,
    PARAMETRIC,
    RAG,
    MintQAConfig,
    MintQADecomposeConfig,
    MintQADynamicConfig,
    MintQARagConfig,
)
from knowtrace_train.methods.mintqa.engine import MintQA


class MintQAMethod(Method):
    """One of the four strategies, by `name` (one of `MODES`)."""

    def __init__(self, name: str) -> None:
        if name not in CONFIG_CLASSES:
            raise ValueError(f"unknown MINTQA strategy {name!r}; one of {list(MODES)}")
        self.name = name
        self.config_class = CONFIG_CLASSES[name]

    def strategy(self, config: MintQAConfig) -> MintQA:
        if config.name != self.name:
            raise ValueError(f"method {self.name!r} was given the settings of {config.name!r}")
        return MintQA(config)

    def record_roles(self, config: MintQAConfig) -> dict[str, str]:
        return {kind: kind for kind in CALL_KINDS[self.name]}

    def for_model(self, config: MintQAConfig, trained: frozenset[str], fewshot_trained: bool) -> MintQAConfig:
        """A model whose roles were trained without exemplars runs its prompts without them."""
        if trained & set(CALL_KINDS[self.name]) and not fewshot_trained:
            return dataclasses.replace(config, fewshot=False)
        return config


    def mechanism(self, trajectories, config: MintQAConfig, items_by_id) -> dict:
        """Of the decomposing strategies, sub-questions per question (`meta["subquestions"]`: every
        sub-question asked and answered, over the questions); of the dynamic one also the share of its
        sub-answers the model rated certain (an entry's `confidence` "certain", over its sub-questions;
        an unreadable or refused self-answer was recorded without one and counts as not certain). {} for
        the one-call strategies, which neither decompose nor rate."""
        if self.name not in (DECOMPOSE, DYNAMIC):
            return {}
        from knowtrace_train.methods.base import MechanismStat

        entries = [e for t in trajectories for e in (t.meta.get("subquestions") if isinstance(t.meta.get("subquestions"), list)
                                                     else ())]
        n = len(trajectories)
        out = {"subquestions_per_question": MechanismStat(len(entries), n, None if n else "no trajectories")}
        if self.name == DYNAMIC:
            certain = sum(isinstance(e, dict) and e.get("confidence") == "certain" for e in entries)
            out["certain_share"] = MechanismStat(certain, len(entries), None if entries else (
                "no sub-question was asked" if n else "no trajectories"))
        return out


class MintQADecomposingMethod(MintQAMethod):
    """`mintqa_decompose` or `mintqa_dynamic`: a strategy with sub-questions, so with gold trajectories
    (the engine run on the items' gold chains, gold.py)."""

    def __init__(self, name: str) -> None:
        if name not in (DECOMPOSE, DYNAMIC):
            raise ValueError(f"MINTQA strategy {name!r} does not decompose; those that do: {[DECOMPOSE, DYNAMIC]}")
        super().__init__(name)

    def gold_records(self, config: MintQADecomposeConfig, items, retriever, *, fewshot: bool, require_support: bool,
                     count_tokens, iteration, make_generator=None, facts=None):
        """The records of the engine run on the items' gold chains (gold.py); the dynamic strategy's certainty is
        what the raw model (`make_generator`) answers right, every hop uncertain without one."""
        from knowtrace_train.methods.mintqa.gold import mintqa_gold_records

        return mintqa_gold_records(config, items, retriever, record_kinds=list(self.record_roles(config)),
                                   fewshot=fewshot, require_support=require_support, count_tokens=count_tokens,
                                   iteration=iteration, make_generator=make_generator)


    def decision_prompts(self, config: MintQADecomposeConfig, items, *, retriever=None, make_generator=None) -> list:
        """Of the dynamic strategy, the certainty rating on held-out gold prompts: per gold hop the raw model's own
        answer, certain where it is right (gold.py, `certainty_prompts`; `make_generator` builds the raw base, and
        is required). The rating is decoded with the answer, so nothing is decided by threshold. The decomposing
        strategy decides nothing between fixed words: []."""
        if self.name != DYNAMIC:
            return []
        if make_generator is None:
            raise ValueError(f"{self.name}'s certainty prompts need the raw base model (make_generator): their labels "
                             "are whether it answers each hop right")
        from knowtrace_train.methods.mintqa.gold import certainty_prompts

        return certainty_prompts(config, items, make_generator)


def mintqa_methods() -> list[MintQAMethod]:
    """The four registry entries, in MINTQA's order (the decomposing two with gold trajectories)."""
    return [MintQADecomposingMethod(name) if name in (DECOMPOSE, DYNAMIC) else MintQAMethod(name) for name in MODES]


__all__ = ["DECOMPOSE", "DYNAMIC", "MODES", "PARAMETRIC", "RAG", "MintQA", "MintQAConfig", "MintQADecomposeConfig",
           "MintQADecomposingMethod", "MintQADynamicConfig", "MintQAMethod", "MintQARagConfig", "mintqa_methods"]
