"""The baselines' settings: what every baseline shares (N passages, rounds, exemplars, budgets) and each one's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from knowtrace_train.methods.base import StrategyConfig

#: Call kinds recorded in ModelCall.role: a reasoning step (a CoT sentence, a Thought/Action, a
#: follow-up, a whole CoT answer) and the forced final answer of a question whose loop ended without one.
REASON, ANSWER = "reason", "answer"

RA_COT, REACT, IRCOT, SELF_ASK, ITER_RETGEN = "ra_cot", "react", "ircot", "self_ask", "iter_retgen"


@dataclass
class BaselineConfig(StrategyConfig):
    """What every baseline of the KnowTrace paper's Table 1 shares: N passages per retrieval from the
    same retriever as KnowTrace, a bound on rounds, few-shot exemplars, greedy decoding."""

    passages: int = field(default=5, metadata={"help": "N, passages retrieved per query (the KnowTrace paper's N = 5 for every method)"})
    max_rounds: int = field(default=5, metadata={"help": "the most reasoning-retrieval rounds per question (then a forced answer)"})
    fewshot: bool = field(default=True, metadata={"help": "the prompt carries the method's exemplars (a trained role runs without them)"})
    max_new_tokens: int = field(default=64, metadata={"help": "new tokens of one reasoning call"})
    answer_tokens: int = field(default=24, metadata={"help": "new tokens of the forced final answer"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature of every call (0: greedy, as the paper)"})
    role: str = field(default="reason", metadata={"help": "generator role (adapter) of every call of the method"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.passages < 1:
            raise ValueError(f"passages must be >= 1, got {self.passages}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.max_new_tokens < 1 or self.answer_tokens < 1:
            raise ValueError("max_new_tokens and answer_tokens must be >= 1")
        if not self.role:
            raise ValueError("role must name a generator role")


@dataclass
class RACoTConfig(BaselineConfig):
    """RA-CoT: one retrieval with the question as the query, then one chain of thought over the N passages."""

    name: str = field(default=RA_COT, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    max_rounds: int = field(default=1, metadata={"help": "RA-CoT retrieves once: always 1"})
    max_new_tokens: int = field(default=96, metadata={"help": "new tokens of the chain of thought"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_rounds != 1:
            raise ValueError(f"RA-CoT retrieves once: max_rounds must be 1, got {self.max_rounds}")


@dataclass
class IRCoTConfig(BaselineConfig):
    """IRCoT: one CoT sentence per round, each sentence the next retrieval's query, passages accumulated."""

    name: str = field(default=IRCOT, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    max_passages: int = field(
        default=15, metadata={"help": "most passages kept in the prompt (IRCoT's cap; the first ones found are kept)"}
    )
    max_new_tokens: int = field(default=40, metadata={"help": "new tokens of one CoT step (its first sentence is kept)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_passages < self.passages:
            raise ValueError(f"max_passages ({self.max_passages}) must be >= passages ({self.passages})")


@dataclass
class ReActConfig(BaselineConfig):
    """ReAct: Thought / Action (Search[query] or Finish[answer]) / Observation (the N passages)."""

    name: str = field(default=REACT, metadata={"help": "the method: a name registered in knowtrace_train.methods"})


@dataclass
class SelfAskConfig(BaselineConfig):
    """Self-Ask: Follow up / (retrieved context) / Intermediate answer until "So the final answer is:"."""

    name: str = field(default=SELF_ASK, metadata={"help": "the method: a name registered in knowtrace_train.methods"})


@dataclass
class IterRetGenConfig(BaselineConfig):
    """Iter-RetGen: T iterations of retrieve-then-generate, each query the question plus the previous generation."""

    name: str = field(default=ITER_RETGEN, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    max_rounds: int = field(default=3, metadata={"help": "T, the retrieval-generation iterations (all are run)"})
    max_new_tokens: int = field(default=96, metadata={"help": "new tokens of each iteration's chain of thought"})
