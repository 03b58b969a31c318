"""Evaluation of any registered method on a dataset split: resumable trajectory files, EM/F1 and the paper's cost columns.

`evaluate(config)` loads the items, builds the corpus, the retriever and the generator,
skips questions whose trajectory is already in `config.output`, runs the strategy, appends
each finished trajectory (scored) to the output the moment it is done, and returns the
summary over every selected question in the file: EM, F1, average rounds, retrieved tokens
read per question and seconds per question (the engine's attributed wall time; loading
the model and building the index are not counted).

Every EM and F1 comes with its 95% bootstrap interval (seeded, so the same trajectories give the
same interval; none under `metrics.MIN_QUESTIONS_FOR_INTERVAL` questions, and the printout says
so), EM by question kind (bridge / comparison, from `QAItem.type`: a comparison is a two-way
choice, so guessing scores about 0.5), and the evidence-supported EM where the method can tell
(`Method.evidence_supported`: answered right AND backed by the model's own traced graph).

Two models are compared on the same questions from their trajectory files (`compare_evals`):
each scored trajectory carries its question's `em` and `f1`, so a paired test needs nothing
but the two files, and it refuses files that do not hold the same questions in the same order.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from knowtrace_train.data.corpus import CORPUS_SOURCES, CorpusConfig  # noqa: F401 - the eval config's section
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.errors import RunError
from knowtrace_train.generation import GeneratorConfig, check_generator_installed
from knowtrace_train.methods import StrategyConfig, get_method, run_scored, written
from knowtrace_train.methods.knowtrace import KnowTraceConfig
from knowtrace_train.metrics import (
    MIN_QUESTIONS_FOR_INTERVAL,
    Interval,
    aggregate,
    bootstrap_interval,
    em_by_kind,
    question_kind,
    score,
)
from knowtrace_train.progress import question_bar
from knowtrace_train.retrieval import RetrieverConfig, check_retriever_installed
from knowtrace_train.trajectory import Trajectory

log = logging.getLogger(__name__)


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

    def __post_init__(self) -> None:
        from knowtrace_train.data.bundled import bundled_path

        self.path = bundled_path(self.path)  # the world's default, from an installed package too
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit must be >= 0 or null, got {self.limit}")


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
        default=0, metadata={"help": "questions in flight at once (0: all); KnowTrace starts the next as soon as one ends"}
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
    check_retriever_installed(config.retriever)
    check_generator_installed(config.generator)
    config.strategy.check_installed()
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
    #: 95% bootstrap intervals of EM and F1 (no bounds under MIN_QUESTIONS_FOR_INTERVAL questions;
    #: None for no questions)
    em_interval: Interval | None = None
    f1_interval: Interval | None = None
    #: EM per question kind ("bridge", "comparison", "unknown"), each with its interval; None where
    #: the kinds were not given
    by_kind: dict[str, Interval] | None = None
    #: questions answered right AND backed by the model's own graph, and their share of all
    #: questions; None where the method cannot tell
    evidence_supported: int | None = None
    evidence_supported_em: float | None = None
    #: how the method explores (`exploration_shape`); None where its calls are not explorations and completions
    exploration: dict[str, float] | None = None

    def figures(self) -> dict[str, Any]:
        """The uncertainty figures as JSON: em_interval, f1_interval (Interval fields), by_kind
        ({kind: {"n", "em", "interval"}}), evidence_supported, evidence_supported_em."""
        return {
            "em_interval": _interval_dict(self.em_interval),
            "f1_interval": _interval_dict(self.f1_interval),
            "by_kind": None if self.by_kind is None else {
                k: {"n": iv.n, "em": iv.mean, "interval": _interval_dict(iv)} for k, iv in self.by_kind.items()},
            "evidence_supported": self.evidence_supported,
            "evidence_supported_em": self.evidence_supported_em,
            "exploration": self.exploration,
        }

    def headline(self) -> dict[str, Any]:
        """The last line evaluate prints. Intervals are [low, high], or null with `interval_note`
        saying why (too few questions)."""
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {
            "em": round(self.em, 4),
            "f1": round(self.f1, 4),
            "em_interval": _bounds(self.em_interval),
            "f1_interval": _bounds(self.f1_interval),
            "interval_note": None if self.em_interval is None else self.em_interval.note,
            "em_by_kind": None if self.by_kind is None else {
                k: {"n": iv.n, "em": round(iv.mean, 4), "em_interval": _bounds(iv)} for k, iv in self.by_kind.items()},
            "evidence_supported_em": r(self.evidence_supported_em),
            "rounds": round(self.rounds, 3),
            "retrieved_tokens": round(self.retrieved_tokens, 1),
            "sec_per_question": round(self.sec_per_question, 3),
            "questions": self.questions,
        }


def _interval_dict(iv: Interval | None) -> dict[str, Any] | None:
    return None if iv is None else dataclasses.asdict(iv)


def _bounds(iv: Interval | None) -> list[float] | None:
    if iv is None or iv.low is None or iv.high is None:
        return None
    return [round(iv.low, 4), round(iv.high, 4)]


def check_prompts_fit(trajectories: Sequence[Trajectory], what: str) -> None:
    """A run whose every question met a prompt too long for the model's context has measured nothing: one line
    (RunError) instead of an EM of 0. Some questions alone are scored wrong, their calls carrying the error."""
    from knowtrace_train.errors import RunError
    from knowtrace_train.generation.base import TOO_LONG

    def too_long(t: Trajectory) -> bool:
        return any(c.error and TOO_LONG in c.error for c in t.calls)

    if trajectories and all(too_long(t) for t in trajectories):
        first = next(c.error for c in trajectories[0].calls if c.error and TOO_LONG in c.error)
        raise RunError(f"{what}: every one of the {len(trajectories)} questions met a prompt longer than the model's "
                       f"context ({first.split(': ', 1)[-1]}); fewer passages (strategy.passages), shorter prompts "
                       "(no exemplars) or a model with a longer context")


def summarize(
    trajectories: Sequence[Trajectory],
    new: int = 0,
    kinds: Sequence[str | None] | None = None,
    evidence: Callable[[Trajectory], bool | None] | None = None,
    *,
    seed: int = 0,
) -> EvalSummary:
    """The summary of scored questions. `kinds[i]` is `metrics.question_kind` of trajectory i's
    question (None: unknown); without `kinds` there is no EM by kind. `evidence(t)` is the method's
    `evidence_supported` (None from it, or no `evidence`, leaves the evidence-supported EM None).
    Intervals are seeded percentile bootstraps (`metrics.bootstrap_interval`, seed `seed`)."""
    n = len(trajectories)
    scores = [score(t.prediction, t.answers, dataset=t.dataset) for t in trajectories]
    agg = aggregate(scores)
    unusable: Counter[str] = Counter(c.role for t in trajectories for c in t.calls if c.error)
    em = [s["em"] for s in scores]
    by_kind = None
    if kinds is not None:
        if len(kinds) != n:
            raise ValueError(f"summarize: {n} trajectories but {len(kinds)} question kinds; they must align")
        by_kind = em_by_kind(em, list(kinds), seed=seed) if n else {}
    supported = None
    if evidence is not None and n:
        said = [evidence(t) for t in trajectories]
        if all(v is not None for v in said):
            supported = sum(1 for v, e in zip(said, em) if v and e == 1.0)
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
        em_interval=bootstrap_interval(em, seed=seed) if n else None,
        f1_interval=bootstrap_interval([s["f1"] for s in scores], seed=seed) if n else None,
        by_kind=by_kind,
        evidence_supported=supported,
        evidence_supported_em=None if supported is None else supported / n,
        exploration=exploration_shape(trajectories),
    )


def exploration_shape(trajectories: Sequence[Trajectory]) -> dict[str, float] | None:
    """How a model explores (the paper's Table 5 and the shape of its rounds): rounds a question (#Iter), retrieved
    tokens a question (#Tok), guidance pairs an exploration that asks for knowledge, triplets a completion. None
    where no call is an exploration with guidance pairs (a method of other calls)."""
    def run(parsed: dict) -> int:  # the pairs the engine retrieved for (`max_pairs` cuts the rest)
        n, pairs = parsed.get("pairs_run"), parsed.get("pairs") or ()
        return min(n, len(pairs)) if isinstance(n, int) else len(pairs)

    asked = [run(c.parsed) for t in trajectories for c in t.calls
             if c.role == "explore" and isinstance(c.parsed, dict) and c.parsed.get("pairs")]
    if not asked:
        return None
    done = [len(c.parsed.get("triplets") or ()) for t in trajectories for c in t.calls
            if c.role == "complete" and isinstance(c.parsed, dict)]
    n = len(trajectories)
    return {
        "rounds_per_question": round(sum(t.rounds for t in trajectories) / n, 4),
        "retrieved_tokens_per_question": round(sum(t.retrieved_tokens for t in trajectories) / n, 1),
        "pairs_per_round": round(sum(asked) / len(asked), 4),
        "triplets_per_completion": round(sum(done) / len(done), 4) if done else 0.0,
    }


def evidence_check(strategy: StrategyConfig) -> Callable[[Trajectory], bool | None]:
    """The registered method's `evidence_supported`, bound to its settings."""
    method = get_method(strategy.name)
    return lambda t: method.evidence_supported(t, strategy)


def load_eval_items(config: EvalConfig) -> tuple[list[QAItem], list[QAItem]]:
    """(selected items, all items of the file): the corpus of "contexts" uses all of them."""
    from knowtrace_train.data.loaders import load_items

    d = config.dataset
    everything = load_items(d.path, d.format, dataset=d.dataset, split=d.split)
    selected = everything if d.limit is None else everything[: d.limit]
    if not selected:
        raise RunError(f"{d.path}: no question to evaluate (dataset.limit is {d.limit})")
    return selected, everything


def load_corpus(config: EvalConfig, all_items: Sequence[QAItem]) -> list[Passage]:
    from knowtrace_train.data.corpus import build_corpus, item_triples, kg_corpus, read_corpus, read_triples, use_store

    if config.corpus.source == "contexts":
        return build_corpus(all_items)
    if config.corpus.source == "kg":
        if config.corpus.triples == "world":
            from knowtrace_train.data.bundled import world_triples

            return kg_corpus(world_triples())
        return kg_corpus(item_triples(all_items) if config.corpus.triples == "items" else read_triples(config.corpus.triples))
    if config.corpus.source == "name":
        from knowtrace_train.data.corpus import read_named_corpus

        return read_named_corpus(config.corpus.name)  # type: ignore[arg-type]
    if config.corpus.source == "generated":
        from knowtrace_train.data.generated import open_generated

        # always a passage store (`store` implied): written once into the cache home, BM25 sharded
        return open_generated(config.corpus.passages, config.corpus.seed, config.corpus.path)  # type: ignore[arg-type,return-value]
    if use_store(config.corpus.store, config.corpus.path):  # type: ignore[arg-type]
        from knowtrace_train.data.store import open_store

        return open_store(config.corpus.path)  # type: ignore[arg-type,return-value]
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
    done: dict[str, Trajectory] = written([config.output] if config.output else [], key=lambda t: t.question_id)
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
        bar = question_bar(len(todo), "questions", progress, mininterval=2.0)

        def finished(t: Trajectory) -> None:
            done[t.question_id] = t
            if on_done is not None:
                on_done(t)

        t0 = time.perf_counter()
        try:
            run_scored(engine, todo, generator, retriever, config.output, width=config.chunk_size or None,
                       stamp=lambda t: t.meta.setdefault("dataset_path", config.dataset.path), bar=bar, on_done=finished)
        finally:
            if owned:
                generator.close()  # a generator passed in stays the caller's to close
        if bar is not None:
            bar.close()
        log.info("ran %d questions in %.1fs", len(todo), time.perf_counter() - t0)
    have = [it for it in items if it.id in done]
    check_prompts_fit([done[it.id] for it in have], str(out) if (out := config.output) else "evaluation")
    return summarize([done[it.id] for it in have], new=len(todo), kinds=[question_kind(it) for it in have],
                     evidence=evidence_check(config.strategy))


def format_summary(s: EvalSummary) -> str:
    """The human-readable table evaluate prints before the JSON line."""
    lines = [
        f"questions          {s.questions} ({s.new} run now)",
        f"EM                 {_with_interval(s.em, s.em_interval)}",
        f"F1                 {_with_interval(s.f1, s.f1_interval)}",
        *_kind_lines(s),
        f"evidence-supported {_evidence_text(s)}",
        f"rounds / question  {s.rounds:.2f}",
        f"retrieved tokens   {s.retrieved_tokens:.1f} per question",
        f"seconds / question {s.sec_per_question:.2f}",
        f"stop reasons       {json.dumps(s.stop_reasons, sort_keys=True)}",
        f"unusable calls     {json.dumps(s.unusable_calls, sort_keys=True)}",
    ]
    return "\n".join(lines)


def _with_interval(mean: float, iv: Interval | None) -> str:
    """`0.2500 [0.1667, 0.3333] (n=24, 95% bootstrap)`, or `0.2500 (n=12: too few questions for an
    interval, under 20)`."""
    if iv is None:
        return f"{mean:.4f}"
    if iv.low is None or iv.high is None:
        return f"{mean:.4f} (n={iv.n}: too few questions for an interval, under {MIN_QUESTIONS_FOR_INTERVAL})"
    return f"{mean:.4f} [{iv.low:.4f}, {iv.high:.4f}] (n={iv.n}, {iv.confidence:.0%} bootstrap)"


def _kind_lines(s: EvalSummary) -> list[str]:
    if not s.by_kind:
        return []
    lines = []
    for kind, iv in s.by_kind.items():
        text = _with_interval(iv.mean, iv)
        if kind == "comparison":
            text += "; a two-way choice: a guess scores about 0.5"
        lines.append(f"EM {kind:15} {text}")
    return lines


def _evidence_text(s: EvalSummary) -> str:
    if s.evidence_supported is None or s.evidence_supported_em is None:
        return "- (this method cannot tell whether its evidence backs an answer)"
    right = int(round(s.em * s.questions))
    return (f"{s.evidence_supported_em:.4f} ({s.evidence_supported} of {s.questions} questions answered right "
            f"with the answer traced in the model's own graph; {right} answered right)")
