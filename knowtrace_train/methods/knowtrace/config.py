"""KnowTrace's settings and the names of its call kinds (the roles its records train)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from knowtrace_train.methods.base import StrategyConfig
from knowtrace_train.methods.knowtrace.prompts import DEFAULT_PROMPT_SET, KG_FORMATS, PROMPT_SETS, check_prompt_set

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

    explore: bool = field(default=True, metadata={"help": "exemplars in the exploration prompt (and the forced answer prompt)"})
    complete: bool = field(default=True, metadata={"help": "exemplars in the completion prompt"})
    kg_to_text: bool = field(default=True, metadata={"help": "exemplars in the graph-to-text prompt (kg_format: text)"})


@dataclass
class MaxNewTokensConfig:
    """Generation budget per call kind. Stop strings end a well-formed call earlier; the
    budget bounds what a small model's repetition loops cost (a completion that repeats its
    triplet until the limit is common with a 135M model)."""

    explore: int = field(default=80, metadata={"help": "new tokens of an exploration call (judgement, thought/answer or guidance)"})
    complete: int = field(default=64, metadata={"help": "new tokens of a completion call (the triplets of one guidance pair)"})
    answer: int = field(default=64, metadata={"help": "new tokens of the forced answer call"})
    kg_to_text: int = field(default=96, metadata={"help": "new tokens of a graph-to-text call (kg_format: text)"})


@dataclass
class RoleConfig:
    """The generator role (adapter) each call kind is sent with. The forced answer is an
    exploration that concludes, so by default it runs on the exploration role."""

    explore: str = field(default="explore", metadata={"help": "generator role (adapter) of exploration calls"})
    complete: str = field(default="complete", metadata={"help": "generator role (adapter) of completion calls"})
    answer: str = field(default="explore", metadata={"help": "generator role (adapter) of the forced answer call"})
    kg_to_text: str = field(default="kg_to_text", metadata={"help": "generator role (adapter) of graph-to-text calls"})


@dataclass
class GoldNoise:
    """The noise the bootstrap's gold trajectories carry, so that M0 explores as the paper's raw model does
    (methods/knowtrace/gold.py): unneeded pairs per exploration round and extraneous triplets per completion, each
    an expected count (its whole part always, one more with the probability of its fraction). The default 0.75
    was chosen by measurement (docs/selftrain.md, "M0 from that gold, measured"): the lowest rate measured whose
    M0 rollouts carry the paper's noise, at M0's EM."""

    pairs: float = field(default=0.75, metadata={"help": "unneeded guidance pairs a gold exploration round adds (expected count)"})
    triplets: float = field(default=0.75, metadata={"help": "extraneous triplets a gold completion adds (expected count)"})

    def __post_init__(self) -> None:
        for name in ("pairs", "triplets"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"gold_noise.{name} must be a number >= 0, got {v!r}")


@dataclass
class KnowTraceConfig(StrategyConfig):
    """KnowTrace's settings (Algorithm 1, and backtracing's path rule for self-training)."""

    name: str = field(default=STRATEGY_NAME, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    max_rounds: int = field(
        default=5, metadata={"help": "L, the most exploration rounds per question (the paper's maximum expansion rounds)"}
    )
    passages: int = field(default=5, metadata={"help": "N, passages retrieved per guidance pair (the paper uses 5)"})
    kg_format: str = field(
        default="triplets", metadata={"help": "how the graph is put into the exploration prompt: triplets, paths or text"}
    )
    prompts: str = field(
        default=DEFAULT_PROMPT_SET,
        metadata={"help": f"the prompt set: {' or '.join(PROMPT_SETS)} (the paper's Figures 4 and 5 word for word; "
                          "'short' shortens them for small models), docs/knowtrace.md"},
    )
    max_pairs: int = field(default=5, metadata={"help": "guidance pairs kept per exploration (the first ones); 0 keeps all"})
    fewshot: FewShotConfig = field(default_factory=FewShotConfig, metadata={"help": "whether each prompt carries its exemplars"})
    gold_noise: GoldNoise = field(
        default_factory=GoldNoise,
        metadata={"help": "the unneeded pairs and extraneous triplets of the bootstrap's gold trajectories"},
    )
    max_new_tokens: MaxNewTokensConfig = field(
        default_factory=MaxNewTokensConfig, metadata={"help": "generation budget per call kind"}
    )
    roles: RoleConfig = field(default_factory=RoleConfig, metadata={"help": "the generator role (adapter) of each call kind"})
    # The words ("Whether the given knowledge triplets are sufficient for answering:") are recorded as the
    # start of ModelCall.output (prompt + output is the exact text), so the recorded prompt is the rendered
    # one and the output is the canonical text. A small model otherwise often keeps listing the graph's triplets.
    prefill_judgement: bool = field(
        default=True,
        metadata={"help": "start each exploration's answer with the judgement words, so the model only decides Yes/No"},
    )
    judgement_threshold: float | None = field(
        default=None,
        metadata={"help": ("the sufficiency judgement as a calibrated decision: Yes where log P(' Yes') - log P(' No') "
                           "after the judgement words exceeds this (scored before the exploration is written; with a "
                           "temperature, Yes is drawn with probability sigmoid((log-odds - threshold) / temperature)); "
                           "null: the greedy next token. Self-training sets it per trained model from held-out gold "
                           "prompts (calibration.questions), docs/decisions.md")},
    )
    forced_answer: bool = field(
        default=True,
        metadata={"help": "a question that stops without 'Yes' (no progress, L rounds, no usable guidance) gets one forced answer; false: Algorithm 1 as written"},
    )
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature of every call (0: greedy)"})
    path_rule: str = field(
        default=DEFAULT_PATH_RULE,
        metadata={"help": "how backtracing traces the evidence subgraph (self-training): 'backward' or 'shortest'"},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.path_rule not in PATH_RULES:
            raise ValueError(f"path_rule must be one of {list(PATH_RULES)}, got {self.path_rule!r}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.passages < 1:
            raise ValueError(f"passages must be >= 1, got {self.passages}")
        check_prompt_set(self.prompts)
        if self.kg_format not in KG_FORMATS:
            raise ValueError(f"kg_format must be one of {list(KG_FORMATS)}, got {self.kg_format!r}")
        if self.judgement_threshold is not None:
            if isinstance(self.judgement_threshold, bool) or not isinstance(self.judgement_threshold, (int, float)) \
                    or not math.isfinite(self.judgement_threshold):
                raise ValueError(f"judgement_threshold must be a finite number or null, got {self.judgement_threshold!r}")
            if not self.prefill_judgement:
                raise ValueError("judgement_threshold needs prefill_judgement: true (the decision is scored after the "
                                 "judgement words)")
        if self.max_pairs < 0:
            raise ValueError(f"max_pairs must be >= 0, got {self.max_pairs}")
        for name in ("explore", "complete", "answer", "kg_to_text"):
            if getattr(self.max_new_tokens, name) < 1:
                raise ValueError(f"max_new_tokens.{name} must be >= 1")
