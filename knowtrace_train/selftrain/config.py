"""The self-training run's configuration: typed dataclasses whose defaults are the embedded default run.

`SelfTrainConfig()` with no arguments is recipes/configs/selftrain_default.yaml: the synthetic world,
SmolLM2-135M on CPU, BM25, the bootstrap and 2 iterations sized to finish in minutes on 2 cores.
`validate()` checks what a single field cannot (cross-field rules), before any work starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowtrace_train import tracking
from knowtrace_train.data.corpus import CorpusConfig
from knowtrace_train.generation import GeneratorConfig, check_generator_installed
from knowtrace_train.generation.architectures import is_random_model
from knowtrace_train.methods import METHODS, Method, StrategyConfig, get_method
from knowtrace_train.methods.knowtrace import KnowTraceConfig, MaxNewTokensConfig
from knowtrace_train.retrieval import RetrieverConfig, check_retriever_installed
from knowtrace_train.selftrain.beside import check_beside
from knowtrace_train.train.config import gradient_accumulation_for, launched_processes
from knowtrace_train.train.grpo import GRPOSettings
from knowtrace_train.train.kto import KTOSettings
from knowtrace_train.train.lora import LoraTrainConfig, check_qlora
from knowtrace_train.train.modes import mode_names, resolve
from knowtrace_train.train.precision import training_device

log = logging.getLogger(__name__)

BOOTSTRAP_MODES = ("auto", "always", "never")
#: The section of a run folder's config.yaml that records the launch (not a SelfTrainConfig key).
LAUNCH_KEY = "launch"
ON_EMPTY = ("stop", "continue")


def learning_mode(mode: str, rationalizers) -> tuple[str, str]:
    """(rationalizer, training mode) of a run's `mode` for a method with `rationalizers` (names): a mode picks a
    rationalizer and a trainer (train/modes.py); a `mode` that names a rationalizer trains SFT on its records."""
    rationalizer, trainer = resolve(mode, rationalizers)
    return rationalizer, trainer.name


@dataclass
class DataConfig:
    """Which questions: rollouts on `train_questions` train questions (the same ones every iteration,
    Algorithm 2's D), gold trajectories on the next `bootstrap.questions` of the shuffled train split
    (disjoint from D), dev evaluation on `dev_questions` dev questions, and, where `test` is set, the
    final model (of the grid point chosen on dev) on `test_questions` held-out test questions."""

    train: str = field(
        default="data/world/train.jsonl", metadata={"help": "train split file (rollout and bootstrap questions)"}
    )
    dev: str = field(default="data/world/dev.jsonl", metadata={"help": "dev split file (evaluated after every model)"})
    format: str | None = field(default=None, metadata={"help": "file format for both (None: told from the content)"})
    corpus: CorpusConfig = field(default_factory=CorpusConfig, metadata={"help": "the passages retrieved from"})
    facts: str | None = field(
        default=None,
        metadata={"help": "the facts the corpus states, one {subject, relation, object, passage_id} a line: what gold "
                          "completions write (None: facts.jsonl beside the corpus file where there is one, else the "
                          "gold evidence of the train questions; data/facts.py)"},
    )
    train_questions: int | None = field(
        default=32,
        metadata={"help": "D, rollout questions per iteration (None: the whole train split after the bootstrap's and the calibration's)"},
    )
    dev_questions: int | None = field(
        default=24, metadata={"help": "dev questions evaluated after every stage that makes a model (None: all)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the shuffle that picks the train and dev questions"})
    test: str | None = field(
        default=None, metadata={"help": "held-out test split: after a grid, the point chosen on dev is evaluated here"}
    )
    test_questions: int | None = field(
        default=None, metadata={"help": "test questions: the first ones of `test` that the run did not use (None: all)"}
    )
    allow_overlap: bool = field(
        default=False, metadata={"help": "evaluate on dev questions that are also train questions of the run (refused otherwise)"}
    )

    def __post_init__(self) -> None:
        from knowtrace_train.data.bundled import bundled_path

        self.train, self.dev, self.test = bundled_path(self.train), bundled_path(self.dev), bundled_path(self.test)
        self.facts = bundled_path(self.facts)
        for name in ("train_questions", "dev_questions", "test_questions"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"data.{name} must be >= 1 or null, got {v}")


@dataclass
class BootstrapConfig:
    """Iteration 0: LoRA-train the base on gold trajectories (from gold evidence) and merge the
    adapter(s) into the weights; the merged model is M0 of the loop."""

    mode: str = field(
        default="always",
        metadata={"help": "'always', 'never', or 'auto': bootstrap when the raw base answers < min_em of probe_questions"},
    )
    min_em: float = field(default=0.2, metadata={"help": "auto mode: bootstrap when the raw base's EM on the probe is below this"})
    probe_questions: int = field(
        default=16, metadata={"help": "auto mode: train questions the raw base (few-shot) is probed on (the first rollout questions)"}
    )
    # On the world, 64 questions for 1 epoch gave M0 dev EM 0.292, 32 questions for 2 epochs (as many tokens) 0.167.
    questions: int = field(
        default=64, metadata={"help": "train questions with gold trajectories (taken after the rollout questions)"}
    )
    require_support: bool = field(
        default=True, metadata={"help": "skip an item whose hop the retrieved passages do not state (no training on invention)"}
    )
    joint: bool = field(
        default=True,
        metadata={"help": "true: one adapter on every role's records; false: one adapter per role, merged one after the other"},
    )
    train: LoraTrainConfig = field(
        # decision_weight 4: M0's held-out judgement 0.80 [0.76, 0.84] against 0.71 unweighted, Yes said on 55% of the
        # gold-Yes prompts against 0% (docs/decisions.md)
        default_factory=lambda: LoraTrainConfig(epochs=1.0, learning_rate=1e-3, effective_batch_size=4, decision_weight=4.0),
        metadata={"help": "LoRA training of the bootstrap adapter(s): a higher rate, one pass must teach the formats"},
    )

    def __post_init__(self) -> None:
        if self.mode not in BOOTSTRAP_MODES:
            raise ValueError(f"bootstrap.mode must be one of {list(BOOTSTRAP_MODES)}, got {self.mode!r}")
        if self.questions < 1 or self.probe_questions < 1:
            raise ValueError("bootstrap.questions and bootstrap.probe_questions must be >= 1")


CALIBRATION_SOURCES = ("gold", "explorations")


@dataclass
class CalibrationConfig:
    """Each trained model's decisions (KnowTrace's sufficiency judgement) as thresholds on their log-odds, chosen
    on held-out gold prompts: the gold trajectories of train questions that neither the bootstrap nor the
    rollouts use (docs/decisions.md). Calibrated after the bootstrap and after every iteration that trains the
    deciding role; written to iter_<z>/calibration.json."""

    questions: int = field(default=32, metadata={"help": (
        "train questions after the bootstrap's whose gold decision prompts calibrate each trained model's decision "
        "thresholds; 0: decide by greedy decoding")})

    source: str = field(default="gold", metadata={"help": (
        "'gold': the gold trajectories' decision prompts; 'explorations': the model's own explorations of those "
        "questions, every decision scored and none taken, each labelled by whether its graph names the gold answer "
        "(measured worse: M0 answered too early, docs/decisions.md)")})

    def __post_init__(self) -> None:
        if isinstance(self.questions, bool) or not isinstance(self.questions, int) or self.questions < 0:
            raise ValueError(f"calibration.questions must be an integer >= 0, got {self.questions!r}")
        if self.source not in CALIBRATION_SOURCES:
            raise ValueError(f"calibration.source must be one of {list(CALIBRATION_SOURCES)}, got {self.source!r}")


@dataclass
class RolloutConfig:
    """How each iteration tries its rollout questions: G samples per question (rejection sampling for STaR and
    backtracing: more, and more varied, correct trajectories), at a temperature of their own. Dev evaluations
    keep the strategy's own decoding (greedy by default), one trajectory per question."""

    samples: int = field(default=1, metadata={"help": (
        "G, trajectories per rollout question, each sampling from its own seeded stream (> 1 needs a temperature above 0)")})
    temperature: float | None = field(default=None, metadata={"help": (
        "sampling temperature of the rollouts' calls (None: the strategy's own, greedy by default)")})
    questions: int | None = field(default=None, metadata={"help": (
        "questions per iteration: iteration z rolls out the z-th slice of this many of D's questions, wrapping "
        "round (GRPO's steps, each on a new batch); None: all of D every iteration (Algorithm 2)")})

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"rollout.samples must be an integer >= 1, got {self.samples!r}")
        if self.temperature is not None and (isinstance(self.temperature, bool) or not isinstance(
                self.temperature, (int, float)) or self.temperature < 0):
            raise ValueError(f"rollout.temperature must be a number >= 0 or null, got {self.temperature!r}")
        if self.questions is not None and (isinstance(self.questions, bool) or not isinstance(self.questions, int)
                                           or self.questions < 1):
            raise ValueError(f"rollout.questions must be an integer >= 1 or null, got {self.questions!r}")


def _generator() -> GeneratorConfig:
    """The generator of the default run: SmolLM2-135M, batches of 32 (an M0 evaluation of 24 dev questions took
    52 s against 60 s with 16), no per-batch progress bar
    (the rollout bar counts questions)."""
    return GeneratorConfig(model="smollm2-135m", batch_size=32, progress=False)


def _strategy() -> KnowTraceConfig:
    """KnowTrace for the default run: L=3 rounds, N=3 passages, 2 guidance pairs, short outputs."""
    return KnowTraceConfig(
        max_rounds=3,
        passages=3,
        max_pairs=2,
        max_new_tokens=MaxNewTokensConfig(explore=96, complete=48, answer=96, kg_to_text=96),
    )


def evaluates(z: int, iterations: int, eval_every: int) -> bool:
    """Whether a run of `iterations` evaluates model z on the dev questions: M0, every `eval_every`-th iteration
    and the last."""
    return z % eval_every == 0 or z == iterations


@dataclass
class SelfTrainConfig:
    """Algorithm 2 (backtracing-guided self-training) with a bootstrap stage, on one dataset."""

    name: str = field(
        default="selftrain_default", metadata={"help": "run name: the run folder is runs/<name> unless output_dir is set"}
    )
    output_dir: str | None = field(default=None, metadata={"help": "the run folder (None: runs/<name>)"})
    iterations: int = field(default=2, metadata={"help": "Z, self-training iterations"})
    mode: str | None = field(
        default=None,
        metadata={"help": "what an iteration learns: 'backtrace' (SFT on the calls backtracing keeps, KnowTrace*), 'star' "
                          "(SFT on correct trajectories whole), 'kto' (KTO: kept calls desirable, `kto.undesirable` ones not) "
                          "or 'grpo' (policy steps on every call with its trajectory's group-relative advantage, `grpo.*`); "
                          "null: the method's own rationalizer (backtrace for KnowTrace, star for the others), logged"},
    )
    fewshot_trained: bool = field(
        default=False,
        metadata={"help": "trained models' prompts carry the few-shot exemplars (the raw base always follows strategy.fewshot)"},
    )
    on_empty: str = field(
        default="stop",
        metadata={"help": "an iteration with nothing to train on: 'stop' the run, or 'continue' with M(z) = M(z-1)"},
    )
    eval_base: bool = field(
        default=True, metadata={"help": "evaluate the raw base on the dev questions (the baseline row of the report)"}
    )
    chunk_size: int = field(default=32, metadata={"help": "questions in flight at once in rollouts and evaluations (KnowTrace starts the next as soon as one ends)"})
    # `accelerate launch` without a config sets OMP_NUM_THREADS=1 on CPUs; the run sets its own.
    threads: int | None = field(
        default=None,
        metadata={"help": "torch CPU threads of each process (None: this machine's cores shared among its processes)"},
    )
    seed: int = field(
        default=0, metadata={"help": "seed of LoRA training, the bootstrap's and every iteration's: each adapter's "
                                     "initialisation and record order derive from it (train.seed, bootstrap.train.seed unused)"}
    )
    seeds: list[int] = field(
        default_factory=list,
        metadata={"help": "repeat the run once per seed, each in <run folder>/seed_<s> (`--seeds 0,1,2`), then print "
                          "the across-seed table (scripts/compare_runs.py); []: one run with `seed`"},
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "the questions and the corpus"})
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig, metadata={"help": "how passages are retrieved"})
    generator: GeneratorConfig = field(
        default_factory=_generator, metadata={"help": "the base model and how it generates (adapters are set by the loop)"}
    )
    strategy: StrategyConfig = field(default_factory=_strategy, metadata={"help": "the method (`name`) and its settings"})
    # One epoch: on 100 world dev questions, iteration 2 of the default run scored EM 0.26 with one epoch and
    # 0.24 with two (McNemar p = 0.80), and one epoch trains in a third of the time (README, the main job).
    train: LoraTrainConfig = field(
        default_factory=lambda: LoraTrainConfig(epochs=1.0, effective_batch_size=4, decision_weight=4.0),
        metadata={"help": "LoRA training of every iteration's adapters (one per role, from M0; one epoch by default)"},
    )
    bootstrap: BootstrapConfig = field(
        default_factory=BootstrapConfig, metadata={"help": "iteration 0: LoRA on gold trajectories, merged into M0"}
    )
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig, metadata={
        "help": "each trained model's decision thresholds from held-out gold prompts (KnowTrace's judgement)"})
    rollout: RolloutConfig = field(
        default_factory=RolloutConfig, metadata={"help": "each iteration's rollouts: samples per question and their temperature"}
    )
    kto: KTOSettings = field(
        default_factory=KTOSettings, metadata={"help": "mode: kto's preference training (read only in that mode)"}
    )
    grpo: GRPOSettings = field(
        default_factory=GRPOSettings, metadata={"help": "mode: grpo's policy steps and credit rule (read only in that mode)"}
    )
    eval_every: int = field(default=1, metadata={"help": (
        "evaluate M(z) on the dev questions every this many iterations, and always after the last (GRPO runs many "
        "cheap iterations)")})
    grid: dict[str, list[Any]] = field(
        default_factory=dict,
        metadata={"help": "hyper-parameter search: dotted key -> values; every combination runs in <run folder>/<point>"},
    )
    eval_beside: bool | None = field(default=None, metadata={"help": (
        "evaluate models on a worker thread beside the next stages on half the threads (see eval_beside_fixed); null: "
        "on for one process on a CPU with the transformers backend and 2+ threads")})
    eval_beside_fixed: bool = field(default=True, metadata={"help": (
        "with eval_beside, a fixed schedule: M(z)'s evaluation runs beside iteration z+1's rollouts and is joined "
        "before its training, which gets every thread, as does the bootstrap; the last evaluation runs on as many "
        "threads as one beside, the raw base's beside it, so every stage runs on a thread count the schedule fixes, "
        "a run repeats, and every row is decoded on the same thread count; false: the raw base's beside "
        "the bootstrap, M(z)'s beside iteration z+1's rollouts and training, the main thread taking the threads back "
        "as soon as the evaluation ends, so a stage's thread count, and on CPUs whose products round differently on "
        "one thread and on two its results, depend on timing (docs/selftrain.md)")})
    reuse: bool = field(default=True, metadata={"help": (
        "take the raw base's evaluation and probe, M0, M0's evaluation and iteration 1's rollouts from the cache "
        "home ($KNOWTRACE_CACHE/runs) when a run made them from the same inputs; false: compute everything")})
    report_to: str | list[str] = field(default="none", metadata={"help": (
        "experiment tracking: 'none', 'tensorboard', 'trackio', 'wandb', 'mlflow' or a list ([tensorboard,trackio]): "
        "every trainer's run (<run_name>/iter_<z>/<role>) and the loop's figures per iteration (<run_name>/loop), "
        "written under <run folder>/tracking/ (knowtrace_train/tracking.py); nothing reaches the network unless "
        "asked (wandb runs offline without WANDB_MODE or WANDB_API_KEY)")})
    run_name: str | None = field(default=None, metadata={"help": (
        "the trackers' name of this run (null: the run folder's name)")})
    reuse_wait_minutes: float | None = field(default=600.0, metadata={"help": (
        "the longest wait for a reuse-cache entry that another run computes (its lock), then the run stops in one "
        "line naming the holder; null: no bound")})
    resume_anyway: bool = field(default=False, metadata={"help": (
        "resume a run folder made by another knowtrace-train version (refused otherwise, naming both; another "
        "commit of the same version is only warned about), or whose data files or corpus changed since it started "
        "(inputs.json; logged)")})

    def __post_init__(self) -> None:
        if self.iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {self.iterations}")
        rationalizers = get_method(self.strategy.name).rationalizers()
        if self.mode is None:  # none named: the method's own (first) rationalizer; a named one is checked below
            self.mode = next(iter(rationalizers))
            log.info("mode: none given; method %r learns with its own rationalizer, mode %r", self.strategy.name, self.mode)
        modes = [*rationalizers, *mode_names()]
        if self.mode not in modes:
            raise ValueError(f"mode must be one of {modes} for method {self.strategy.name!r}, got {self.mode!r}")
        resolve(self.mode, rationalizers)[1].check_settings(self, rationalizers)
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 1:
            raise ValueError(f"eval_every must be an integer >= 1, got {self.eval_every!r}")
        if self.on_empty not in ON_EMPTY:
            raise ValueError(f"on_empty must be one of {list(ON_EMPTY)}, got {self.on_empty!r}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or null, got {self.threads}")
        if not self.name or "/" in self.name:
            raise ValueError(f"name must be a non-empty folder name, got {self.name!r}")
        self.report_to = tracking.canonical(self.report_to)  # an unknown backend is refused here
        if self.run_name is not None and (not isinstance(self.run_name, str) or not self.run_name.strip()):
            raise ValueError(f"run_name must be a non-empty string or null, got {self.run_name!r}")

    def validate(self) -> None:
        """Cross-field rules, checked before any work (a run that would fail late fails now)."""
        for model in [self.generator.model, *self.grid.get("generator.model", [])]:
            if is_random_model(model):
                raise ValueError(f"generator.model {model!r} has random weights, which answer nothing: for benchmarks "
                                 "only (scripts/bench/bench_paper_gpu.py, bench_train.py, bench_generation.py), not self-training")
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
        self._check_batches(launched_processes())
        for where, tc in (("train", self.train), ("bootstrap.train", self.bootstrap.train)):
            if tc.qlora:
                try:
                    check_qlora(training_device())
                except (ValueError, ImportError) as e:
                    raise ValueError(f"{where}: {e}") from None
        if self.generator.adapters:
            raise ValueError("generator.adapters must be empty: the loop sets each iteration's adapters itself")
        self._check_mode()
        check_beside(self.eval_beside, launched_processes(), self.generator.backend)
        tracking.check_installed(tracking.backends(self.report_to))
        self._check_rollout()
        check_retriever_installed(self.retriever)
        check_generator_installed(self.generator)
        self.strategy.check_installed()
        get_method(self.strategy.name).validate_for_training(self.strategy)
        self._check_bootstrap()
        from knowtrace_train.data.registry import check_data_ref

        for name in ("train", "dev", "test"):
            value = getattr(self.data, name)
            if value is not None and not check_data_ref(value, f"data.{name}") and not Path(value).is_file():
                raise ValueError(f"data.{name}: no such file {value!r}")
        if self.data.corpus.source in ("file", "generated") and not Path(self.data.corpus.path or "").is_file():
            raise ValueError(f"data.corpus.path: no such file {self.data.corpus.path!r}")
        if self.data.corpus.source == "name":
            check_data_ref(self.data.corpus.name, "data.corpus.name", corpus=True)

    def _check_bootstrap(self) -> None:
        """A bootstrap (mode "always", or "auto", whose probe may ask for one) builds M0 from the method's
        gold trajectories: a method without them is refused here, not after the base's evaluation."""
        if self.bootstrap.mode == "never" or has_gold_trajectories(get_method(self.strategy.name)):
            return
        have = sorted(name for name, m in METHODS.items() if has_gold_trajectories(m))
        raise ValueError(
            f"bootstrap.mode: {self.bootstrap.mode} builds M0 from gold trajectories, and method "
            f"{self.strategy.name!r} has none (methods with gold trajectories: {', '.join(have)}); set "
            f"bootstrap.mode: never to self-train {self.strategy.name!r} from the raw base")

    @property
    def rollout_temperature(self) -> float:
        """The temperature the rollouts sample at: `rollout.temperature`, else the strategy's (0: greedy)."""
        r = self.rollout.temperature
        return float(r) if r is not None else float(getattr(self.strategy, "temperature", 0.0))

    def _check_rollout(self) -> None:
        """rollout.temperature needs a method that samples; G > 1 samples need a temperature above 0 (greedy
        decoding would give G identical trajectories)."""
        r = self.rollout
        sampled = hasattr(self.strategy, "temperature")
        if r.temperature is not None and not sampled:
            raise ValueError(f"rollout.temperature: method {self.strategy.name!r} decodes greedily and has no temperature")
        temperature = self.rollout_temperature
        if r.samples > 1 and not temperature > 0:
            raise ValueError(
                f"rollout.samples is {r.samples} but the rollouts decode greedily (temperature {temperature}): the "
                f"{r.samples} samples would be one trajectory repeated; set rollout.temperature (e.g. 0.7)"
                + ("" if sampled else f", which method {self.strategy.name!r} does not have"))

    def _check_mode(self) -> None:
        """The training mode's own checks (train/modes.py: KTO's chat prompts and labels, GRPO's groups and credit)."""
        rationalizers = get_method(self.strategy.name).rationalizers()
        resolve(self.mode, rationalizers)[1].check(self, rationalizers)

    def _check_batches(self, processes: int) -> None:
        """Every training section, at every grid point that changes its batch settings, must divide its
        effective batch among `processes` (checked before any work, not at the grid point that fails)."""
        names = ("effective_batch_size", "per_device_batch_size", "gradient_accumulation_steps")
        sections = [("train", self.train), ("bootstrap.train", self.bootstrap.train)]
        # a mode may train another batch per forward pass (KTO: kto.batch_size records)
        sections[0] = ("train", resolve(self.mode, get_method(self.strategy.name).rationalizers())[1].train_section(
            self, self.train))
        for where, tc in sections:
            keys = [k for k in self.grid if k.rpartition(".")[0] == where and k.rpartition(".")[2] in names]
            for values in itertools.product(*(self.grid[k] for k in keys)):
                changes = {k.rpartition(".")[2]: v for k, v in zip(keys, values)}
                try:
                    gradient_accumulation_for(dataclasses.replace(tc, **changes), processes)
                except ValueError as e:
                    at = f" (grid point {changes})" if changes else ""
                    raise ValueError(f"{where}{at}: {e}") from None


def has_gold_trajectories(method: Method) -> bool:
    """Whether `method` writes gold trajectories for the bootstrap (it implements Method.gold_records)."""
    return type(method).gold_records is not Method.gold_records


def _check_dotted(obj: Any, dotted: str, where: str) -> None:
    node = obj
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(node) or part not in {f.name for f in dataclasses.fields(node)}:
            raise ValueError(f"{where}: {dotted!r} is not a config key")
        node = getattr(node, part)


def read_run_config(path: str | Path) -> SelfTrainConfig:
    """The SelfTrainConfig of a run folder's config.yaml (its `launch:` record set aside)."""
    from knowtrace_train.config import load_config, read_yaml

    data = read_yaml(path)
    data.pop(LAUNCH_KEY, None)
    return load_config(SelfTrainConfig, path, data=data)


__all__ = ["LAUNCH_KEY", "learning_mode", "BootstrapConfig", "DataConfig", "SelfTrainConfig", "read_run_config"]
