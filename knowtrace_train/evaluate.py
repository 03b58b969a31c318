"""Evaluation of any registered method on a dataset split: resumable trajectory files, EM/F1 and the paper's cost columns.

`evaluate(config)` loads the items, builds the corpus, the retriever and the generator,
skips questions whose trajectory is already in `config.output`, runs the strategy, appends
each finished trajectory (scored) to the output the moment it is done, and returns the
summary over every selected question in the file: EM, F1, average rounds, retrieved tokens
read per question and seconds per question (the engine's attributed wall time; loading
the model and building the index are not counted).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.generation import GeneratorConfig
from knowtrace_train.io import append_jsonl
from knowtrace_train.methods import StrategyConfig, get_method
from knowtrace_train.methods.knowtrace import KnowTraceConfig
from knowtrace_train.metrics import aggregate, score
from knowtrace_train.retrieval import RetrieverConfig
from knowtrace_train.trajectory import Trajectory, read_trajectories

log = logging.getLogger(__name__)

CORPUS_SOURCES = ("contexts", "file")


@dataclass
class DatasetConfig:
    """The benchmark file and which of its questions to evaluate."""

    path: str = field(
        default="data/world/dev.jsonl",
        metadata={"help": "the benchmark file (HotpotQA/2Wiki/MuSiQue/MINTQA/FlashRAG/our JSONL)"},
    )
    format: str | None = field(
        default=None,
        metadata={"help": "the file's format (hotpotqa, 2wikimultihopqa, musique, mintqa, generic, flashrag); None: told from its first record"},
    )
    dataset: str | None = field(default=None, metadata={"help": "overrides the dataset name the file gives"})
    split: str | None = field(default=None, metadata={"help": "overrides the split name the file gives"})
    limit: int | None = field(default=None, metadata={"help": "evaluate only the first `limit` questions (None: all)"})


@dataclass
class CorpusConfig:
    """The passages retrieval searches."""

    source: str = field(
        default="file",
        metadata={"help": "'file': the corpus JSONL at `path`; 'contexts': the context passages of every item in the dataset file (whatever `limit`)"},
    )
    path: str | None = field(
        default="data/world/corpus.jsonl", metadata={"help": "the corpus JSONL (source 'file'; unused for 'contexts')"}
    )

    def __post_init__(self) -> None:
        if self.source not in CORPUS_SOURCES:
            raise ValueError(f"corpus.source must be one of {list(CORPUS_SOURCES)}, got {self.source!r}")
        if self.source == "file" and not self.path:
            raise ValueError("corpus.source is 'file' but corpus.path is empty")


@dataclass
class EvalConfig:
    """One evaluation: the questions, the corpus, the retriever, the model and the method."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig, metadata={"help": "the questions"})
    corpus: CorpusConfig = field(default_factory=CorpusConfig, metadata={"help": "the passages retrieved from"})
    retriever: RetrieverConfig = field(
        default_factory=RetrieverConfig,
        metadata={"help": "how passages are retrieved (its `k` is not used here: N is strategy.passages)"},
    )
    generator: GeneratorConfig = field(
        default_factory=GeneratorConfig, metadata={"help": "the model, its adapters per role, batching"}
    )
    strategy: StrategyConfig = field(
        default_factory=KnowTraceConfig, metadata={"help": "the method (`name`) and its settings"}
    )
    output: str | None = field(
        default=None, metadata={"help": "trajectories JSONL; questions already in it are skipped (resume)"}
    )
    chunk_size: int = field(
        default=0, metadata={"help": "questions handed to the engine at once (0: all); smaller chunks lose less on a kill"}
    )
    threads: int | None = field(
        default=None,
        metadata={"help": "torch CPU threads (None: torch's default, one per core; 1 on a machine other jobs share)"},
    )
    run: str | None = field(
        default=None,
        metadata={"help": "a self-training run folder whose model to evaluate: its M0, adapters, prompt format and strategy"},
    )
    iteration: str | int = field(
        default="last", metadata={"help": "the run's model: base (raw), 0 (M0), an iteration z, or last"}
    )

    def __post_init__(self) -> None:
        if self.chunk_size < 0:
            raise ValueError(f"chunk_size must be >= 0, got {self.chunk_size}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


def set_threads(threads: int | None) -> None:
    """Apply EvalConfig.threads to torch (no-op for None)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


#: Short command-line keys: `--limit 16` is `--dataset.limit 16`.
EVAL_ALIASES = {"limit": "dataset.limit"}


def load_eval_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> EvalConfig:
    """EvalConfig from a YAML file and `--key value` overrides (see knowtrace_train.config). With
    `run` set, the model comes from that self-training run (`with_run_model`)."""
    from knowtrace_train.config import load_config

    config = load_config(EvalConfig, path, list(overrides), aliases=EVAL_ALIASES)
    return config if config.run is None else with_run_model(config, path, overrides)


def with_run_model(config: EvalConfig, path: str | Path | None, overrides: Sequence[str]) -> EvalConfig:
    """The config with the model of `config.run` at `config.iteration`: its weights, adapters per role,
    prompt format and strategy settings exactly as the run evaluated it (the file's `generator` keeps its
    other keys; its `strategy` is replaced); command-line overrides still apply on top. The output
    defaults to <run>/eval/<dataset folder>_<file stem>_<model>.jsonl."""
    from knowtrace_train.config import COMMAND_LINE, ConfigError, config_to_dict, load_config, parse_overrides, read_yaml
    from knowtrace_train.selftrain.models import run_model

    try:
        rm = run_model(config.run, config.iteration)
    except ValueError as e:
        raise ConfigError(f"{COMMAND_LINE} (--run {config.run} --iteration {config.iteration}): {e}") from e
    data = read_yaml(path) if path is not None else {}
    g = rm.generator
    data["generator"] = {**(data.get("generator") or {}), "model": g.model, "adapters": dict(g.adapters),
                         "base_roles": list(g.base_roles), "prompt_format": g.prompt_format}
    data["strategy"] = config_to_dict(rm.strategy)
    if "output" not in parse_overrides(overrides, EVAL_ALIASES):
        d = Path(config.dataset.path)
        data["output"] = str(Path(config.run) / "eval" / f"{d.parent.name}_{d.stem}_{rm.state.name}.jsonl")
    log.info("evaluating %s of %s (model %s, adapters %s)", rm.state.name, config.run, g.model, dict(g.adapters) or "none")
    return load_config(EvalConfig, path, list(overrides), aliases=EVAL_ALIASES, data=data)


# -- the run --------------------------------------------------------------------------------


@dataclass
class EvalSummary:
    em: float
    f1: float
    rounds: float
    retrieved_tokens: float
    sec_per_question: float
    questions: int
    #: how many of `questions` this call ran (the rest were already in the output)
    new: int = 0
    stop_reasons: dict[str, int] = field(default_factory=dict)
    #: model calls whose output could not be used, by call kind
    unusable_calls: dict[str, int] = field(default_factory=dict)

    def headline(self) -> dict[str, float | int]:
        """The last line evaluate prints."""
        return {
            "em": round(self.em, 4),
            "f1": round(self.f1, 4),
            "rounds": round(self.rounds, 3),
            "retrieved_tokens": round(self.retrieved_tokens, 1),
            "sec_per_question": round(self.sec_per_question, 3),
            "questions": self.questions,
        }


def summarize(trajectories: Sequence[Trajectory], new: int = 0) -> EvalSummary:
    n = len(trajectories)
    scores = [score(t.prediction, t.answers) for t in trajectories]
    agg = aggregate(scores)
    unusable: Counter[str] = Counter(c.role for t in trajectories for c in t.calls if c.error)
    return EvalSummary(
        em=float(agg["em"]),
        f1=float(agg["f1"]),
        rounds=sum(t.rounds for t in trajectories) / n if n else 0.0,
        retrieved_tokens=sum(t.retrieved_tokens for t in trajectories) / n if n else 0.0,
        sec_per_question=sum(t.wall_time for t in trajectories) / n if n else 0.0,
        questions=n,
        new=new,
        stop_reasons=dict(Counter(t.stop_reason for t in trajectories)),
        unusable_calls=dict(unusable),
    )


def load_eval_items(config: EvalConfig) -> tuple[list[QAItem], list[QAItem]]:
    """(selected items, all items of the file): the corpus of "contexts" uses all of them."""
    from knowtrace_train.data.loaders import load_items

    d = config.dataset
    everything = load_items(d.path, d.format, dataset=d.dataset, split=d.split)
    selected = everything if d.limit is None else everything[: d.limit]
    return selected, everything


def load_corpus(config: EvalConfig, all_items: Sequence[QAItem]) -> list[Passage]:
    from knowtrace_train.data.corpus import build_corpus, read_corpus

    if config.corpus.source == "contexts":
        return build_corpus(all_items)
    return read_corpus(config.corpus.path)  # type: ignore[arg-type]


def evaluate(
    config: EvalConfig,
    *,
    generator=None,
    retriever=None,
    progress: bool = True,
    on_done: Callable[[Trajectory], None] | None = None,
) -> EvalSummary:
    """Run `config`; `generator`/`retriever` replace the configured ones when given."""
    items, everything = load_eval_items(config)
    done: dict[str, Trajectory] = {}
    if config.output:
        for t in read_trajectories(config.output):
            done.setdefault(t.question_id, t)
    todo = [it for it in items if it.id not in done]
    log.info("%d questions selected, %d already in %s, %d to run", len(items), len(items) - len(todo), config.output, len(todo))

    if todo:
        if retriever is None:
            from knowtrace_train.retrieval import build_retriever

            retriever = build_retriever(config.retriever, load_corpus(config, everything))
        owned = generator is None
        if owned:
            from knowtrace_train.generation import build_generator

            set_threads(config.threads)
            generator = build_generator(config.generator)
        engine = get_method(config.strategy.name).strategy(config.strategy)
        bar = _progress(len(todo), progress)

        def finished(t: Trajectory) -> None:
            s = score(t.prediction, t.answers)
            t.em, t.f1 = s["em"], s["f1"]
            t.meta.setdefault("dataset_path", config.dataset.path)
            if config.output:
                append_jsonl(config.output, t.to_dict())
            done[t.question_id] = t
            if bar is not None:
                bar.update(1)
            if on_done is not None:
                on_done(t)

        chunk = config.chunk_size or len(todo)
        t0 = time.perf_counter()
        try:
            for start in range(0, len(todo), chunk):
                engine.run(todo[start : start + chunk], generator, retriever, on_done=finished)
        finally:
            if owned:
                generator.close()  # a generator passed in stays the caller's to close
        if bar is not None:
            bar.close()
        log.info("ran %d questions in %.1fs", len(todo), time.perf_counter() - t0)
    return summarize([done[it.id] for it in items if it.id in done], new=len(todo))


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="questions", unit="q", mininterval=2.0)


def format_summary(s: EvalSummary) -> str:
    """The human-readable table evaluate prints before the JSON line."""
    lines = [
        f"questions          {s.questions} ({s.new} run now)",
        f"EM                 {s.em:.4f}",
        f"F1                 {s.f1:.4f}",
        f"rounds / question  {s.rounds:.2f}",
        f"retrieved tokens   {s.retrieved_tokens:.1f} per question",
        f"seconds / question {s.sec_per_question:.2f}",
        f"stop reasons       {json.dumps(s.stop_reasons, sort_keys=True)}",
        f"unusable calls     {json.dumps(s.unusable_calls, sort_keys=True)}",
    ]
    return "\n".join(lines)
