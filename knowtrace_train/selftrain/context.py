"""What every stage of a self-training run shares: its config and folder, its processes and their stage runner, its
questions, and what is built on first use (the corpus, the retriever, the raw base's folder and tokenizer). A finished
run loads none of them.

`SelfTrain` (loop.py) is a RunContext; each of its stages (rollout_stage.py, rationalize.py, training.py,
calibration.py, beside.py, bootstrap.py) is an object built with it, taking the model it works on and returning the
stage's result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from knowtrace_train import tracking
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.evaluate import EvalConfig, load_corpus
from knowtrace_train.io import write_jsonl
from knowtrace_train.methods import Method, get_method
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.selftrain.models import ModelState, generator_config
from knowtrace_train.selftrain.reuse import RunCache
from knowtrace_train.stages import Processes, StageRunner
from knowtrace_train.train.modes import resolve


class RunContext:
    """The run's config, folder, processes and lazily built parts, shared by its stages."""

    def __init__(
        self,
        config: SelfTrainConfig,
        *,
        procs: Processes | None = None,
        progress: bool = True,
        make_generator: Callable[[Any], Any] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.run_dir = Path(config.output_dir or Path("runs") / config.name)
        self.procs = procs or Processes.detect()
        self.stages = StageRunner(self.procs)
        self.progress = progress
        #: GeneratorConfig -> Generator (default: generation.build_generator)
        self.make_generator = make_generator
        #: the run's questions, and every train and dev item by id (set once the run folder is prepared)
        self.questions: Any = None
        self.items_by_id: dict[str, QAItem] = {}
        self._corpus: list[Passage] | None = None
        self._retriever = None
        self._tokenizer = None
        self._base_path: Path | None = None
        #: the run's trackers (`report_to`; None: none), set by `SelfTrain.run`
        self.tracking: tracking.Tracking | None = None
        #: stage outputs shared with other runs (reuse.py)
        self.reuse = RunCache(self)

    # -- lazily built parts (a finished run loads nothing) ----------------------------------------
    @property
    def corpus(self) -> list[Passage]:
        if self._corpus is None:
            self._corpus = load_corpus(EvalConfig(corpus=self.config.data.corpus), self.questions.all_items)
        return self._corpus

    @property
    def retriever(self):
        if self._retriever is None:
            from knowtrace_train.retrieval import build_retriever

            self._retriever = build_retriever(self.config.retriever, self.corpus)
        return self._retriever

    @property
    def base_path(self) -> Path:
        """The raw base as a plain model folder."""
        if self._base_path is None:
            from knowtrace_train.generation import resolve_model

            self._base_path = Path(resolve_model(self.config.generator.model, self.config.generator.cache_dir))
        return self._base_path

    def count_tokens(self, text: str) -> int:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.base_path))
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- the method, the training mode and the models ---------------------------------------------
    @property
    def method(self) -> Method:
        """The registered method the config's `strategy.name` names."""
        return get_method(self.config.strategy.name)

    @property
    def training_mode(self):
        """The config's `mode` as a registered TrainingMode (train/modes.py)."""
        return resolve(self.config.mode, self.method.rationalizers())[1]

    def record_kinds(self) -> list[str]:
        """The call kinds whose records the method writes (sft_<kind>.jsonl)."""
        return list(self.method.record_roles(self.config.strategy))

    def raw_base(self) -> ModelState:
        return ModelState(name="base", model=self.config.generator.model)

    def build_generator(self, state: ModelState):
        """The generator of `state` (`make_generator`, else the configured backend)."""
        from knowtrace_train.generation import build_generator

        return (self.make_generator or build_generator)(generator_config(self.config, state))

    def write_records(self, folder: Path, records_by_role: Mapping[str, list[dict[str, Any]]]) -> None:
        """sft_<kind>.jsonl for every record kind of the method (empty files included) and any other
        kind the records name."""
        for k in dict.fromkeys([*self.record_kinds(), *records_by_role]):
            write_jsonl(folder / f"sft_{k}.jsonl", records_by_role.get(k, []))
