"""MINTQA's ways of answering (Sections 5-7 of the MINTQA paper), four registered methods over the shared generator and retriever.

    config.py    the four method names, their settings and call kinds
    prompts.py   the prompts and their exemplars
    parsing.py   tolerant parsing of answers, sub-questions and confidences
    engine.py    the batched engine that runs all four (`MintQA`)

`mintqa_parametric` (no retrieval), `mintqa_rag` (top-5 passages for the whole question),
`mintqa_decompose` (decomposition-then-retrieval) and `mintqa_dynamic` (decomposition with
retrieval only for sub-questions the model is not certain of). Each call kind trains the adapter
of its own name under `selftrain --mode star`; MINTQA's breakdowns (accuracy by hop count and by
the share of popular/new facts) are `scripts/mintqa_breakdown.py`.
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


def mintqa_methods() -> list[MintQAMethod]:
    """The four registry entries, in MINTQA's order."""
    return [MintQAMethod(name) for name in MODES]


__all__ = ["DECOMPOSE", "DYNAMIC", "MODES", "PARAMETRIC", "RAG", "MintQA", "MintQAConfig", "MintQADecomposeConfig",
           "MintQADynamicConfig", "MintQAMethod", "MintQARagConfig", "mintqa_methods"]
