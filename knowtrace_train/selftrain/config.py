"""The self-training run's configuration: typed dataclasses whose defaults are the embedded default run.

`SelfTrainConfig()` with no arguments is recipes/configs/selftrain_default.yaml: the synthetic world,
SmolLM2-135M on CPU, BM25, the bootstrap and 2 iterations sized to finish in minutes on 2 cores.
`validate()` checks what a single field cannot (cross-field rules), before any work starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowtrace_train.evaluate import CorpusConfig
from knowtrace_train.generation import GeneratorConfig
from knowtrace_train.methods import StrategyConfig, get_method
from knowtrace_train.methods.knowtrace import KnowTraceConfig, MaxNewTokensConfig
from knowtrace_train.retrieval import RetrieverConfig
from knowtrace_train.train.lora import LoraTrainConfig

BOOTSTRAP_MODES = ("auto", "always", "never")
ON_EMPTY = ("stop", "continue")


@dataclass
class DataConfig:
    """Which questions: rollouts on `train_questions` train questions (the same ones every iteration,
    Algorithm 2's D), gold trajectories on the next `bootstrap.questions` of the shuffled train split
    (disjoint from D), dev evaluation on `dev_questions` dev questions."""

    train: str = "data/world/train.jsonl"
    dev: str = "data/world/dev.jsonl"
    #: file format for both (None: told from the content)
    format: str | None = None
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    #: D, rollout questions per iteration (None: the whole train split after the bootstrap's)
    train_questions: int | None = 32
    #: dev questions evaluated after every stage that makes a model (None: all)
    dev_questions: int | None = 24
    #: seed of the shuffle that picks the train and dev questions
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_questions", "dev_questions"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"data.{name} must be >= 1 or null, got {v}")


def _lora(epochs: float, learning_rate: float = 3e-4) -> LoraTrainConfig:
    """LoRA training sized for the CPU default run."""
    return LoraTrainConfig(
        epochs=epochs,
        learning_rate=learning_rate,
        per_device_batch_size=4,
        gradient_accumulation_steps=1,
        max_length=1024,
        logging_steps=5,
    )


@dataclass
class BootstrapConfig:
    """Iteration 0: LoRA-train the base on gold trajectories (from gold evidence) and merge the
    adapter(s) into the weights; the merged model is M0 of the loop."""

    #: "always", "never", or "auto": bootstrap when the raw base (few-shot) answers fewer than
    #: `min_em` of `probe_questions` train questions (the first rollout questions)
    mode: str = "always"
    min_em: float = 0.2
    probe_questions: int = 16
    #: train questions with gold trajectories (taken after the rollout questions). On the world,
    #: 64 questions for 1 epoch gave M0 dev EM 0.292, 32 questions for 2 epochs (as many tokens) 0.167
    questions: int = 64
    #: skip an item whose hop the retrieved passages do not state (no training on invention)
    require_support: bool = True
    #: true: one adapter on every role's records; false: one adapter per role, merged one after the other
    joint: bool = True
    #: a higher rate than the iterations': one pass over a few hundred records must teach the formats
    train: LoraTrainConfig = field(default_factory=lambda: _lora(epochs=1.0, learning_rate=1e-3))

    def __post_init__(self) -> None:
        if self.mode not in BOOTSTRAP_MODES:
            raise ValueError(f"bootstrap.mode must be one of {list(BOOTSTRAP_MODES)}, got {self.mode!r}")
        if self.questions < 1 or self.probe_questions < 1:
            raise ValueError("bootstrap.questions and bootstrap.probe_questions must be >= 1")


def _generator() -> GeneratorConfig:
    """The generator of the default run: SmolLM2-135M, batches of 16, no per-batch progress bar
    (the rollout bar counts questions)."""
    return GeneratorConfig(model="smollm2-135m", batch_size=16, progress=False)


def _strategy() -> KnowTraceConfig:
    """KnowTrace for the default run: L=3 rounds, N=3 passages, 2 guidance pairs, short outputs."""
    return KnowTraceConfig(
        max_rounds=3,
        passages=3,
        max_pairs=2,
        max_new_tokens=MaxNewTokensConfig(explore=96, complete=48, answer=96, kg_to_text=96),
    )


@dataclass
class SelfTrainConfig:
    """Algorithm 2 (backtracing-guided self-training) with a bootstrap stage, on one dataset."""

    #: run name: the run folder is runs/<name> unless output_dir says otherwise
    name: str = "selftrain_default"
    output_dir: str | None = None
    #: Z, self-training iterations
    iterations: int = 2
    #: the rationalizer of the method: "backtrace" (KnowTrace*: filtered generations) or "star"
    #: (non-backtracing: correct trajectories whole; every method has it)
    mode: str = "backtrace"
    #: whether trained models' prompts (SFT prompts, then rollouts and evaluation) carry the few-shot
    #: exemplars; the raw base always runs with `strategy.fewshot`
    fewshot_trained: bool = False
    #: an iteration whose rollouts give nothing to train on: "stop" the run there, or "continue"
    #: with M(z) = M(z-1)
    on_empty: str = "stop"
    #: evaluate the raw base on the dev questions (the baseline row of the report)
    eval_base: bool = True
    #: questions per engine batch and per resumable rollout chunk
    chunk_size: int = 16
    #: torch CPU threads of each process; None: this machine's cores shared among the processes on it.
    #: (`accelerate launch` without a config sets OMP_NUM_THREADS=1 on CPUs; the run sets its own.)
    threads: int | None = None
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    generator: GeneratorConfig = field(default_factory=_generator)
    #: the method (`name`) and its settings
    strategy: StrategyConfig = field(default_factory=_strategy)
    #: LoRA training of the exploration and completion adapters of every iteration (from M0)
    train: LoraTrainConfig = field(default_factory=lambda: _lora(epochs=2.0))
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    #: hyper-parameter search: dotted config key -> values; the recipe runs every combination as its
    #: own run in <run folder>/<point> (the paper tunes train.epochs, the batch size and the learning rate)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    reuse: bool = field(default=True, metadata={"help": (
        "take the raw base's evaluation and probe, M0, M0's evaluation and iteration 1's rollouts from the cache "
        "home ($KNOWTRACE_CACHE/runs) when a run made them from the same inputs; false: compute everything")})

    def __post_init__(self) -> None:
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations}")
        modes = get_method(self.strategy.name).rationalizers()
        if self.mode not in modes:
            raise ValueError(f"mode must be one of {list(modes)} for method {self.strategy.name!r}, got {self.mode!r}")
        if self.on_empty not in ON_EMPTY:
            raise ValueError(f"on_empty must be one of {list(ON_EMPTY)}, got {self.on_empty!r}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or null, got {self.threads}")
        if not self.name or "/" in self.name:
            raise ValueError(f"name must be a non-empty folder name, got {self.name!r}")

    def validate(self) -> None:
        """Cross-field rules, checked before any work (a run that would fail late fails now)."""
        for where, tc in (("train", self.train), ("bootstrap.train", self.bootstrap.train)):
            if tc.prompt_format != self.generator.prompt_format:
                raise ValueError(
                    f"{where}.prompt_format is {tc.prompt_format!r} but generator.prompt_format is "
                    f"{self.generator.prompt_format!r}: adapters must be trained on the prompts they will see"
                )
        for key, values in self.grid.items():
            _check_dotted(self, key, "grid")
            if not isinstance(values, list) or not values:
                raise ValueError(f"grid.{key} must be a non-empty list of values")
        if self.generator.adapters:
            raise ValueError("generator.adapters must be empty: the loop sets each iteration's adapters itself")
        get_method(self.strategy.name).validate_for_training(self.strategy)
        for name in ("train", "dev"):
            if not Path(getattr(self.data, name)).is_file():
                raise ValueError(f"data.{name}: no such file {getattr(self.data, name)!r}")
        if self.data.corpus.source == "file" and not Path(self.data.corpus.path or "").is_file():
            raise ValueError(f"data.corpus.path: no such file {self.data.corpus.path!r}")


def _check_dotted(obj: Any, dotted: str, where: str) -> None:
    node = obj
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(node) or part not in {f.name for f in dataclasses.fields(node)}:
            raise ValueError(f"{where}: {dotted!r} is not a config key")
        node = getattr(node, part)


__all__ = ["BootstrapConfig", "DataConfig", "SelfTrainConfig"]
