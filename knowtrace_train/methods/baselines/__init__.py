"""The KnowTrace paper's Table 1 baselines, each after its own paper's loop, over the same generator, retriever and N passages.

    config.py       BaselineConfig (N, rounds, exemplars, budgets) and each baseline's config
    common.py       shared prompt pieces and tolerant parsers (passages, CoT exemplars, answers)
    runner.py       batched steps: one generate and one search per step across the live questions
    ra_cot.py       RA-CoT: one retrieval with the question, one chain of thought
    ircot.py        IRCoT: a CoT sentence per round, each sentence the next query
    react.py        ReAct: Thought / Action (Search[...], Finish[...]) / Observation
    self_ask.py     Self-Ask: Follow up / Context / Intermediate answer / So the final answer is
    iter_retgen.py  Iter-RetGen: T iterations, each query the question plus the previous generation
    gold.py         gold trajectories (the bootstrap's records): each loop run on its gold outputs

Each is registered by its own name (ra_cot, ircot, react, self_ask, iter_retgen). Every call of a
baseline runs on one generator role (`role`); its records are the "reason" calls and the forced
"answer" calls, both training that role (`selftrain --mode star`). Each has gold trajectories
(`gold.py`) for the bootstrap of M0.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.base import Method, StrategyConfig, Strategy
from knowtrace_train.methods.baselines.config import (
    ANSWER,
    IRCOT,
    ITER_RETGEN,
    RA_COT,
    REACT,
    REASON,
    SELF_ASK,
    BaselineConfig,
    IRCoTConfig,
    IterRetGenConfig,
    RACoTConfig,
    ReActConfig,
    SelfAskConfig,
)
from knowtrace_train.methods.baselines.ircot import IRCoT
from knowtrace_train.methods.baselines.iter_retgen import IterRetGen
from knowtrace_train.methods.baselines.ra_cot import RACoT
from knowtrace_train.methods.baselines.react import ReAct
from knowtrace_train.methods.baselines.self_ask import SelfAsk
from knowtrace_train.retrieval.base import Retriever


class BaselineMethod(Method):
    """A baseline's registry entry: its config class and strategy class, one generator role."""

    strategy_class: type = RACoT

    def strategy(self, config: StrategyConfig) -> Strategy:
        return self.strategy_class(config)

    def record_roles(self, config: BaselineConfig) -> dict[str, str]:
        return {REASON: config.role, ANSWER: config.role}

    def for_model(self, config: BaselineConfig, trained: frozenset[str], fewshot_trained: bool) -> BaselineConfig:
        """A trained role's prompt follows `fewshot_trained`; an untrained one keeps its exemplars."""
        return dataclasses.replace(config, fewshot=fewshot_trained) if config.role in trained else config

    def gold_records(self, config: BaselineConfig, items: Sequence[QAItem], retriever: Retriever, *, fewshot: bool,
                     require_support: bool, count_tokens: Callable[[str], int], iteration: int | None,
                     make_generator=None, facts=None):
        """The records of the method's loop run on the items' gold chains (gold.py)."""
        from knowtrace_train.methods.baselines.gold import baseline_gold_records

        return baseline_gold_records(self.name, config, items, retriever, record_kinds=list(self.record_roles(config)),
                                     fewshot=fewshot, require_support=require_support, count_tokens=count_tokens,
                                     iteration=iteration)

    def decision_prompts(self, config: BaselineConfig, items: Sequence[QAItem], *, retriever: Retriever | None = None,
                         make_generator=None) -> list:
        """Self-Ask's two decisions on held-out gold prompts (gold.py, `self_ask_prompts`: "Are follow up questions
        needed here:" Yes/No, and after an intermediate answer "So the final answer is:" against "Follow up:"), and
        IRCoT's stop (`ircot_prompts`: "answer is" in its sentence, read from what the model writes: no fixed words
        to score), over `retriever`'s passages (required). ReAct decides where its Action is Finish[...] after a
        free thought, RA-CoT and Iter-RetGen not at all; []. Nothing is decided by threshold."""
        if self.name not in (SELF_ASK, IRCOT):
            return []
        if retriever is None:
            raise ValueError(f"{self.name}'s decision prompts need the run's retriever (their transcripts show its passages)")
        from knowtrace_train.methods.baselines.gold import ircot_prompts, self_ask_prompts

        return (self_ask_prompts if self.name == SELF_ASK else ircot_prompts)(config, items, retriever)


def _method(name: str, config_class: type, strategy_class: type) -> type[BaselineMethod]:
    return type(f"{strategy_class.__name__}Method", (BaselineMethod,),
                {"name": name, "config_class": config_class, "strategy_class": strategy_class,
                 "__doc__": f"The {name} baseline's registry entry."})


RACoTMethod = _method(RA_COT, RACoTConfig, RACoT)
ReActMethod = _method(REACT, ReActConfig, ReAct)
IRCoTMethod = _method(IRCOT, IRCoTConfig, IRCoT)
SelfAskMethod = _method(SELF_ASK, SelfAskConfig, SelfAsk)
IterRetGenMethod = _method(ITER_RETGEN, IterRetGenConfig, IterRetGen)

#: every baseline's Method, in the order of the paper's Table 1
BASELINE_METHODS = (RACoTMethod, ReActMethod, IRCoTMethod, SelfAskMethod, IterRetGenMethod)

__all__ = [
    "BASELINE_METHODS", "BaselineConfig", "BaselineMethod", "IRCoT", "IRCoTConfig", "IRCoTMethod", "IterRetGen",
    "IterRetGenConfig", "IterRetGenMethod", "RACoT", "RACoTConfig", "RACoTMethod", "ReAct", "ReActConfig",
    "ReActMethod", "SelfAsk", "SelfAskConfig", "SelfAskMethod",
]
