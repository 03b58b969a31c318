"""MINTQA's four ways of answering, as registered method names, their settings and call kinds."""

from __future__ import annotations

from dataclasses import dataclass, field

from knowtrace_train.methods.base import StrategyConfig

#: The four strategies of MINTQA's evaluation (its Sections 5, 6, 7.1 and 7.2), one method name each.
PARAMETRIC, RAG, DECOMPOSE, DYNAMIC = "mintqa_parametric", "mintqa_rag", "mintqa_decompose", "mintqa_dynamic"
MODES = (PARAMETRIC, RAG, DECOMPOSE, DYNAMIC)

#: Call kinds recorded in ModelCall.role (each trains the adapter of the same name):
#: ANSWER the answer to the main question (directly, over passages, or from the sub-question history);
#: DECOMPOSE the next sub-question or "finish"; SUBANSWER a sub-question answered over its passages;
#: SELFANSWER a sub-question answered from the model's own knowledge with a confidence (dynamic only).
ANSWER, DECOMPOSE_CALL, SUBANSWER, SELFANSWER = "answer", "decompose", "subanswer", "selfanswer"


@dataclass
class MintQAConfig(StrategyConfig):
    """Parametric knowledge QA (MINTQA Section 5): one call answers the question, no retrieval."""

    name: str = field(default=PARAMETRIC, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    fewshot: bool = field(default=True, metadata={"help": "prompts carry their exemplars (trained adapters run without them)"})
    answer_tokens: int = field(default=24, metadata={"help": "new tokens of an answer (main question or sub-question)"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature of every call (0: greedy)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.answer_tokens < 1:
            raise ValueError(f"strategy.answer_tokens must be >= 1, got {self.answer_tokens}")
        if self.temperature < 0:
            raise ValueError(f"strategy.temperature must be >= 0, got {self.temperature}")


@dataclass
class MintQARagConfig(MintQAConfig):
    """Direct RAG (MINTQA Section 6): the top passages for the whole question, then one answer."""

    name: str = field(default=RAG, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    passages: int = field(default=5, metadata={"help": "passages retrieved per query (MINTQA uses 5)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.passages < 1:
            raise ValueError(f"strategy.passages must be >= 1, got {self.passages}")


@dataclass
class MintQADecomposeConfig(MintQARagConfig):
    """Decomposition-then-retrieval (MINTQA Section 7.1): the next sub-question or "finish", its
    passages and its answer, at most `max_steps` times, then the final answer from the history."""

    name: str = field(default=DECOMPOSE, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    max_steps: int = field(default=5, metadata={"help": "most sub-questions per question (MINTQA stops after 5 iterations)"})
    subquestion_tokens: int = field(default=48, metadata={"help": "new tokens of a decomposition call (one sub-question)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps < 1:
            raise ValueError(f"strategy.max_steps must be >= 1, got {self.max_steps}")
        if self.subquestion_tokens < 1:
            raise ValueError(f"strategy.subquestion_tokens must be >= 1, got {self.subquestion_tokens}")


@dataclass
class MintQADynamicConfig(MintQADecomposeConfig):
    """Decomposition with dynamic retrieval (MINTQA Section 7.2): each sub-question is first answered
    from the model's own knowledge with a confidence; only an uncertain (or unreadable) one retrieves."""

    name: str = field(default=DYNAMIC, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    confidence_tokens: int = field(
        default=32, metadata={"help": "new tokens of a self-answer call (the answer and its confidence line)"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.confidence_tokens < 1:
            raise ValueError(f"strategy.confidence_tokens must be >= 1, got {self.confidence_tokens}")


CONFIG_CLASSES: dict[str, type[MintQAConfig]] = {
    PARAMETRIC: MintQAConfig, RAG: MintQARagConfig, DECOMPOSE: MintQADecomposeConfig, DYNAMIC: MintQADynamicConfig,
}
#: The call kinds (= generator roles) each strategy makes.
CALL_KINDS: dict[str, tuple[str, ...]] = {
    PARAMETRIC: (ANSWER,), RAG: (ANSWER,), DECOMPOSE: (DECOMPOSE_CALL, SUBANSWER, ANSWER),
    DYNAMIC: (DECOMPOSE_CALL, SELFANSWER, SUBANSWER, ANSWER),
}
