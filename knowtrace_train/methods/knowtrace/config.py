"""KnowTrace's settings and the names of its call kinds (the roles its records train)."""

from __future__ import annotations

from dataclasses import dataclass, field

from knowtrace_train.methods.base import StrategyConfig
from knowtrace_train.methods.knowtrace.prompts import KG_FORMATS

STRATEGY_NAME = "knowtrace"

#: Call kinds recorded in ModelCall.role.
EXPLORE, COMPLETE, ANSWER, KG_TO_TEXT = "explore", "complete", "answer", "kg_to_text"
#: The call kinds whose outputs become SFT records (sft_<kind>.jsonl).
RECORD_KINDS = (EXPLORE, COMPLETE, ANSWER)

#: How backtracing traces S: "backward" follows the edges back from the targets along the direction
#: in which exploration found them (the entity of the guidance pair that produced a triplet points at
#: the triplet's other entity); "shortest" takes all shortest paths between initial entities and
#: targets on the undirected graph (what the authors' code does). "backward" is the default: it was
#: the more precise on simulated and real rollouts of the world and HotpotQA (docs/backtracing.md).
PATH_RULES = ("backward", "shortest")
DEFAULT_PATH_RULE = "backward"


@dataclass
class FewShotConfig:
    """Whether each prompt carries its 4 exemplars (trained adapters run without them)."""

    explore: bool = True  # also the forced answer prompt
    complete: bool = True
    kg_to_text: bool = True


@dataclass
class MaxNewTokensConfig:
    """Generation budget per call kind. Stop strings end a well-formed call earlier; the
    budget bounds what a small model's repetition loops cost (a completion that repeats its
    triplet until the limit is common with a 135M model)."""

    explore: int = 80
    complete: int = 64
    answer: int = 64
    kg_to_text: int = 96


@dataclass
class RoleConfig:
    """The generator role (adapter) each call kind is sent with. The forced answer is an
    exploration that concludes, so by default it runs on the exploration role."""

    explore: str = "explore"
    complete: str = "complete"
    answer: str = "explore"
    kg_to_text: str = "kg_to_text"


@dataclass
class KnowTraceConfig(StrategyConfig):
    """KnowTrace's settings (Algorithm 1, and backtracing's path rule for self-training)."""

    name: str = STRATEGY_NAME
    #: L, the most exploration rounds per question (the paper's maximum expansion rounds)
    max_rounds: int = 5
    #: N, passages retrieved per guidance pair (the paper uses 5)
    passages: int = 5
    #: how the graph is put into the exploration prompt: triplets (default), paths or text
    kg_format: str = "triplets"
    #: guidance pairs kept per exploration (the first ones); 0 keeps all
    max_pairs: int = 5
    fewshot: FewShotConfig = field(default_factory=FewShotConfig)
    max_new_tokens: MaxNewTokensConfig = field(default_factory=MaxNewTokensConfig)
    roles: RoleConfig = field(default_factory=RoleConfig)
    #: send the judgement words ("Whether the given knowledge triplets are sufficient for
    #: answering:") as the start of each exploration's answer, so the model only decides Yes/No
    #: and goes on; a small model otherwise often keeps listing the graph's triplets. The words
    #: are recorded as the start of ModelCall.output (prompt + output is the exact text), so
    #: the recorded prompt is the rendered one and the output is the canonical text.
    prefill_judgement: bool = True
    #: a question that stops without "Yes" (no progress, L rounds, no usable guidance) gets one forced
    #: answering call over its graph; false is Algorithm 1 as written: no answer, no prediction
    forced_answer: bool = True
    temperature: float = 0.0
    #: how backtracing traces the evidence subgraph (self-training): "backward" or "shortest"
    path_rule: str = DEFAULT_PATH_RULE

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.path_rule not in PATH_RULES:
            raise ValueError(f"path_rule must be one of {list(PATH_RULES)}, got {self.path_rule!r}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.passages < 1:
            raise ValueError(f"passages must be >= 1, got {self.passages}")
        if self.kg_format not in KG_FORMATS:
            raise ValueError(f"kg_format must be one of {list(KG_FORMATS)}, got {self.kg_format!r}")
        if self.max_pairs < 0:
            raise ValueError(f"max_pairs must be >= 0, got {self.max_pairs}")
        for name in ("explore", "complete", "answer", "kg_to_text"):
            if getattr(self.max_new_tokens, name) < 1:
                raise ValueError(f"max_new_tokens.{name} must be >= 1")
