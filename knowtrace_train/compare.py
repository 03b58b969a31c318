"""Methods side by side: every (method, dataset) cell evaluated with one model and retriever, in the layout of the KnowTrace paper's Tables 1 and 5.

`compare(config)` runs each method of `config.methods` on each dataset of `config.datasets` through
`evaluate.evaluate` (one generator for all cells, one retriever per dataset), each cell's trajectories
in `<output_dir>/<dataset>/<method>.jsonl`, so a rerun resumes where it stopped; a cell's
`cell.json` records its settings, and a rerun with other settings for the same folder is refused.
`format_tables` renders Table 1 (EM and F1 per dataset; EM with its 95% bootstrap interval), EM by
question kind (bridge / comparison) where a dataset has kinds, the paired test (exact McNemar on EM)
of each method against the first one (the reference) on the same questions, Table 5 (rounds,
retrieved tokens, seconds per question), and the Mechanism table: per (dataset, method) the method's
own statistics of whether its mechanism runs (`Method.mechanism`: TRACE's chain length and first-step
stops, DoG's hop-1 relation and answer-try Yes rates, ...), each as numerator/denominator = value.
`figures` is the JSON of all of it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from knowtrace_train.config import ConfigError, config_to_dict
from knowtrace_train.data.schema import QAItem
from knowtrace_train.evaluate import (
    CorpusConfig,
    DatasetConfig,
    EvalConfig,
    EvalSummary,
    evaluate,
    load_corpus,
    load_eval_items,
    set_threads,
)
from knowtrace_train.generation import GeneratorConfig, check_generator_installed
from knowtrace_train.io import atomic_write_text, read_json
from knowtrace_train.methods import StrategyConfig, get_method
from knowtrace_train.methods.base import MechanismStat
from knowtrace_train.methods.baselines import IRCoTConfig, IterRetGenConfig, RACoTConfig, ReActConfig, SelfAskConfig
from knowtrace_train.methods.knowtrace import KnowTraceConfig
from knowtrace_train.pairing import QuestionScores, compare_scores
from knowtrace_train.report import diff_cell, em_cell
from knowtrace_train.retrieval import RetrieverConfig, check_retriever_installed
from knowtrace_train.trajectory import Trajectory, read_trajectories

log = logging.getLogger(__name__)


def _paper_methods() -> list[StrategyConfig]:
    return [KnowTraceConfig(), RACoTConfig(), ReActConfig(), IRCoTConfig(), SelfAskConfig(), IterRetGenConfig()]


@dataclass
class CompareDataset:
    """One dataset column: its questions and the corpus retrieval searches."""

    label: str | None = field(default=None, metadata={"help": "the column's name (None: the dataset file's folder name)"})
    dataset: DatasetConfig = field(default_factory=DatasetConfig, metadata={"help": "the questions"})
    corpus: CorpusConfig = field(default_factory=CorpusConfig, metadata={"help": "the passages retrieved from"})

    def name(self) -> str:
        return self.label or Path(self.dataset.path).parent.name or Path(self.dataset.path).stem


@dataclass
class CompareConfig:
    """Methods x datasets with one model and one retriever."""

    methods: list[StrategyConfig] = field(
        default_factory=_paper_methods,
        metadata={"help": "the methods, each a strategy section (`name` and its settings); the first is the reference of the paired tests"},
    )
    datasets: list[CompareDataset] = field(
        default_factory=lambda: [CompareDataset()], metadata={"help": "the datasets, each with its corpus"}
    )
    generator: GeneratorConfig = field(default_factory=GeneratorConfig, metadata={"help": "the one model every method runs on"})
    retriever: RetrieverConfig = field(
        default_factory=RetrieverConfig, metadata={"help": "the one retriever (N is each method's `passages`)"}
    )
    limit: int | None = field(default=None, metadata={"help": "the first `limit` questions of every dataset (None: each dataset's own limit)"})
    output_dir: str = field(default="runs/compare", metadata={"help": "the folder of every cell's trajectories (a rerun resumes)"})
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (None: torch's default)"})
    chunk_size: int = field(default=0, metadata={"help": "questions in flight at once (0: all); KnowTrace starts the next as soon as one ends"})
    seed: int = field(default=0, metadata={"help": "seed of the bootstrap intervals and paired tests"})

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("methods must name at least one method")
        if not self.datasets:
            raise ValueError("datasets must name at least one dataset")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        labels = [d.name() for d in self.datasets]
        if len(set(labels)) != len(labels):
            raise ValueError(f"two datasets share a label ({labels}); give each a `label`")

    def method_labels(self) -> list[str]:
        """The methods' names; a name used twice gets `#2`, `#3` (same method, other settings)."""
        seen: dict[str, int] = {}
        out = []
        for m in self.methods:
            seen[m.name] = seen.get(m.name, 0) + 1
            out.append(m.name if seen[m.name] == 1 else f"{m.name}#{seen[m.name]}")
        return out


COMPARE_ALIASES = {"output": "output_dir"}


def load_compare_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> CompareConfig:
    from knowtrace_train.config import load_config

    config = load_config(CompareConfig, path, list(overrides), aliases=COMPARE_ALIASES)
    check_retriever_installed(config.retriever)
    check_generator_installed(config.generator)
    for method in config.methods:
        method.check_installed()
    return config


# -- the run -----------------------------------------------------------------------------------------


@dataclass
class Cell:
    method: str
    dataset: str
    output: Path
    summary: EvalSummary
    scores: QuestionScores
    vs_reference: dict[str, Any] | None = None
    #: the method's mechanism statistics on the cell's questions (`Method.mechanism`; {}: it has none)
    mechanism: dict[str, MechanismStat] = field(default_factory=dict)


def cell_config(config: CompareConfig, method: StrategyConfig, ds: CompareDataset, output: Path) -> EvalConfig:
    dataset = ds.dataset if config.limit is None else dataclasses.replace(ds.dataset, limit=config.limit)
    return EvalConfig(dataset=dataset, corpus=ds.corpus, retriever=config.retriever, generator=config.generator,
                      strategy=method, output=str(output), chunk_size=config.chunk_size, threads=config.threads)


#: settings that change no output: left out of a cell's settings check
_NO_EFFECT = {"generator": ("progress",), "retriever": ("show_progress",), "dataset": ("limit",)}


def _settings(d: dict[str, Any]) -> dict[str, Any]:
    return {k: {f: v for f, v in sec.items() if f not in _NO_EFFECT.get(k, ())} if isinstance(sec, dict) else sec
            for k, sec in d.items()}


def output_settings(ev: EvalConfig, folder: Path, what: str = "the cell") -> tuple[Path, dict[str, Any]]:
    """(the settings file of `ev.output`, `ev`'s settings), refused where that file records other settings: a run
    with other settings into the same trajectory file would mix two runs."""
    mine = _settings({k: config_to_dict(getattr(ev, k)) for k in ("strategy", "generator", "retriever", "corpus", "dataset")})
    path = folder / (Path(ev.output).stem + ".cell.json")  # type: ignore[arg-type]
    if path.exists():
        had = read_json(path)
        had = _settings(had) if isinstance(had, dict) else {}
        if had != mine:
            diff = sorted(k for k in mine if had.get(k) != mine[k])
            raise ConfigError(f"{path}: {what} was run with other {', '.join(diff)} settings; "
                              "use another output (or delete its files)")
    return path, mine


def record_settings(path: Path, settings: dict[str, Any]) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(settings, indent=1, sort_keys=True) + "\n")


def _check_cell_settings(ev: EvalConfig, folder: Path) -> None:
    """cell.json holds what the cell's trajectories were made with (all but the question count and
    progress bars); a rerun with other settings into the same file would mix two runs: refused."""
    record_settings(*output_settings(ev, folder))


def _scores(output: Path, trajs: Sequence[Trajectory], ids: Sequence[str]) -> QuestionScores:
    """EM and F1 of the selected questions in a cell's trajectories (`output`'s), in the dataset's order (what
    the paired test pairs)."""
    by_id = {t.question_id: t for t in trajs}
    have = [i for i in ids if i in by_id]
    return QuestionScores(str(output), have, [float(by_id[i].em or 0.0) for i in have],
                          [float(by_id[i].f1 or 0.0) for i in have])


def _selected(trajs: Sequence[Trajectory], ids: Sequence[str]) -> list[Trajectory]:
    """The selected questions' trajectories in the dataset's order, the first of a question where a file
    holds two (what `evaluate` summarizes)."""
    by_id: dict[str, Trajectory] = {}
    for t in trajs:
        by_id.setdefault(t.question_id, t)
    return [by_id[i] for i in ids if i in by_id]


def mechanism(method: StrategyConfig, trajs: Sequence[Trajectory], items: Sequence[QAItem]) -> dict[str, MechanismStat]:
    """The registered method's mechanism statistics over a cell's trajectories (`Method.mechanism`)."""
    return get_method(method.name).mechanism(_selected(trajs, [it.id for it in items]), method,
                                             {it.id: it for it in items})


def compare(config: CompareConfig, *, generator=None, progress: bool = True) -> list[Cell]:
    """Run every cell (resuming each), then pair every method with the first on each dataset."""
    labels = config.method_labels()
    owned = generator is None
    cells: list[Cell] = []
    try:
        for ds in config.datasets:
            retriever = None
            for label, method in zip(labels, config.methods):
                folder = Path(config.output_dir) / ds.name()
                ev = cell_config(config, method, ds, folder / f"{label}.jsonl")
                _check_cell_settings(ev, folder)
                items, everything = load_eval_items(ev)
                done = {t.question_id for t in read_trajectories(ev.output)}  # type: ignore[arg-type]
                if retriever is None and any(it.id not in done for it in items):
                    from knowtrace_train.retrieval import build_retriever

                    retriever = build_retriever(config.retriever, load_corpus(ev, everything))
                if generator is None and any(it.id not in done for it in items):
                    from knowtrace_train.generation import build_generator

                    set_threads(config.threads)
                    generator = build_generator(config.generator)
                log.info("%s on %s: %d questions (%d done)", label, ds.name(), len(items), len(done & {i.id for i in items}))
                summary = evaluate(ev, generator=generator, retriever=retriever, progress=progress)
                trajs = list(read_trajectories(ev.output))  # type: ignore[arg-type]
                cells.append(Cell(label, ds.name(), Path(ev.output), summary,  # type: ignore[arg-type]
                                  _scores(Path(ev.output), trajs, [it.id for it in items]),  # type: ignore[arg-type]
                                  mechanism=mechanism(method, trajs, items)))
    finally:
        if owned and generator is not None:
            generator.close()
    _pair_with_reference(cells, labels[0], config.seed)
    return cells


def _pair_with_reference(cells: list[Cell], reference: str, seed: int) -> None:
    refs = {c.dataset: c for c in cells if c.method == reference}
    for c in cells:
        ref = refs.get(c.dataset)
        if c.method == reference or ref is None or not c.scores.ids:
            continue
        c.vs_reference = compare_scores(ref.scores, c.scores, seed=seed)


# -- tables ------------------------------------------------------------------------------------------


def _iv(iv) -> dict[str, Any] | None:
    return None if iv is None else dataclasses.asdict(iv)


def _grid(cells: Sequence[Cell]) -> tuple[list[str], list[str], dict[tuple[str, str], Cell]]:
    methods = list(dict.fromkeys(c.method for c in cells))
    datasets = list(dict.fromkeys(c.dataset for c in cells))
    return methods, datasets, {(c.method, c.dataset): c for c in cells}


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def format_tables(cells: Sequence[Cell]) -> str:
    """Table 1 (EM/F1), EM by kind, paired tests against the reference, Table 5 (costs), as markdown."""
    methods, datasets, at = _grid(cells)
    n = {d: max((at[m, d].summary.questions for m in methods if (m, d) in at), default=0) for d in datasets}
    out = []

    head = ["method"] + [f"{d} (n={n[d]}) {k}" for d in datasets for k in ("EM", "F1")]
    rows = [[m] + [f"{at[m, d].summary.em:.3f}" if k == "EM" else f"{at[m, d].summary.f1:.3f}"
                   for d in datasets for k in ("EM", "F1")] for m in methods]
    out += ["Table 1 layout: EM and F1", markdown_table(head, rows), ""]

    head = ["method"] + [f"{d} EM [95% CI]" for d in datasets]
    rows = [[m] + [em_cell(at[m, d].summary.em, _iv(at[m, d].summary.em_interval)) for d in datasets] for m in methods]
    out += ["EM with its 95% bootstrap interval (none under 20 questions)", markdown_table(head, rows), ""]

    kinds = {d: [k for k in ("bridge", "comparison") if any((at[m, d].summary.by_kind or {}).get(k) for m in methods)]
             for d in datasets}
    if any(len(v) > 1 for v in kinds.values()):
        head = ["method"] + [f"{d} {k} (n={at[methods[0], d].summary.by_kind[k].n})" for d in datasets
                             for k in kinds[d] if len(kinds[d]) > 1]
        rows = [[m] + [em_cell(at[m, d].summary.by_kind[k].mean, _iv(at[m, d].summary.by_kind[k]))
                       for d in datasets for k in kinds[d] if len(kinds[d]) > 1] for m in methods]
        out += ["EM by question kind (a comparison is a two-way choice: a guess scores about 0.5)", markdown_table(head, rows), ""]

    if len(methods) > 1:
        head = ["method"] + [f"{d} EM vs {methods[0]}" for d in datasets]
        rows = [[m] + [diff_cell(at[m, d].vs_reference) for d in datasets] for m in methods[1:]]
        out += [f"EM difference from {methods[0]} on the same questions (exact McNemar p)", markdown_table(head, rows), ""]

    head = ["method"] + [f"{d} {k}" for d in datasets for k in ("#Iter", "#Tok", "#Time (s)")]
    rows = [[m] + [v for d in datasets for v in (f"{at[m, d].summary.rounds:.2f}",
                                                 f"{at[m, d].summary.retrieved_tokens:,.0f}",
                                                 f"{at[m, d].summary.sec_per_question:.1f}")] for m in methods]
    out += ["Table 5 layout: rounds, retrieved tokens read by the model and seconds per question", markdown_table(head, rows)]
    out += ["", *mechanism_table(cells)]
    return "\n".join(out)


def mechanism_table(cells: Sequence[Cell]) -> list[str]:
    """The Mechanism table's lines: one row per (dataset, method), each of the method's statistics a cell
    "name: numerator/denominator = value" ("-" and why, where the denominator is empty)."""
    methods, datasets, at = _grid(cells)
    width = max((len(c.mechanism) for c in cells), default=0) or 1
    head = ["dataset", "method", "statistic: numerator/denominator = value"] + [""] * (width - 1)
    rows = []
    for d in datasets:
        for m in methods:
            if (m, d) not in at:
                continue
            stats = ([f"{name}: {stat.cell()}" for name, stat in at[m, d].mechanism.items()]
                     or ["none (the method records no mechanism statistic)"])
            rows.append([d, m] + stats + [""] * (width - len(stats)))
    return ["Mechanism: whether each method's own mechanism runs (its statistics: docs/trace.md, docs/dog.md, docs/mintqa.md)",
            markdown_table(head, rows)]


def figures(cells: Sequence[Cell], config: CompareConfig) -> dict[str, Any]:
    """The JSON of every cell: {method: {dataset: evaluate's headline + vs_reference}}, with the model
    and the machine's load average (wall times on a shared machine are contended)."""
    out: dict[str, Any] = {}
    for c in cells:
        entry = c.summary.headline()
        entry["stop_reasons"] = c.summary.stop_reasons
        entry["mechanism"] = {name: stat.to_dict() for name, stat in c.mechanism.items()}
        if c.vs_reference is not None:
            em = c.vs_reference["em"]
            entry["vs_reference"] = {"n": c.vs_reference["n"], "em_diff": round(em["diff"], 4),
                                     "p_value": em["p_value"], "test": em["test"]}
        out.setdefault(c.method, {})[c.dataset] = entry
    return {"model": config.generator.model, "reference": config.method_labels()[0], "output_dir": config.output_dir,
            "load_average": [round(x, 2) for x in os.getloadavg()], "cells": out}
