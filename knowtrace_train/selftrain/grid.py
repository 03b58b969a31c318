"""The search grid's outcome: the point chosen on dev, its final model on held-out test questions, grid.json.

The paper tunes epochs, batch size and learning rate on dev questions and reports the chosen setting on test
questions. After every grid point has run, `finish_grid` picks the point whose final model (its last evaluated
iteration) has the best dev EM, ties going to the earlier point, evaluates that model on `data.test` with
`knowtrace_train.evaluate` (`evaluate --run`: the run's M0, adapters, prompt format and strategy settings),
and writes `<grid folder>/grid.json`. Without `data.test` it reports dev only, and says so. The test
questions are the first `data.test_questions` of `data.test` that the run never used (neither rollout,
bootstrap nor dev questions: the paper's test questions come from HotpotQA's dev file, which also gives the
dev questions). The test evaluation runs in the main process only (evaluate is single-process).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import yaml

from knowtrace_train.config import config_to_dict
from knowtrace_train.errors import RunError
from knowtrace_train.io import atomic_write_text, read_json, write_json, write_jsonl
from knowtrace_train.selftrain.config import SelfTrainConfig

log = logging.getLogger(__name__)

GRID_FILE = "grid.json"
SELECTION = "best dev EM of the point's final model (its last evaluated iteration, else M0, else the raw base); ties: the earlier point"


def final_dev_em(headline: dict[str, Any]) -> float | None:
    """The dev EM of a run's final model, from the run's headline (`report.headline`): the last iteration that
    was evaluated (an iteration that stopped the run has none, and its model is the one before), else M0,
    else the raw base; None where nothing was evaluated."""
    for em in reversed(headline.get("em") or []):
        if em is not None:
            return em
    for key in ("m0_em", "base_em"):
        if headline.get(key) is not None:
            return headline[key]
    return None


def choose_point(results: Sequence[dict[str, Any]]) -> int:
    """The index of the result with the best `final_dev_em`; ties go to the earlier point. A point with no dev
    EM is passed over; raises when no point has one."""
    best: tuple[int, float] | None = None
    for i, r in enumerate(results):
        em = final_dev_em(r)
        if em is not None and (best is None or em > best[1]):
            best = (i, em)
    if best is None:
        raise RunError("no grid point has a dev EM to choose by (every point's last model must be evaluated: eval_every)")
    return best[0]


def select_test_items(config: SelfTrainConfig, used_ids: set[str]):
    """(test items, every item of the test file, how many of the file's questions the run used): the first
    `data.test_questions` questions of `data.test` (all where null) whose ids the run did not use."""
    from knowtrace_train.data.loaders import load_items

    d = config.data
    everything = load_items(d.test, d.format)
    unused = [it for it in everything if it.id not in used_ids]
    chosen = unused if d.test_questions is None else unused[: d.test_questions]
    return chosen, everything, len(everything) - len(unused)


def evaluate_on_test(config: SelfTrainConfig, run_dir: Path, out_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """The final model of the run in `run_dir` on the test questions (`select_test_items`), through
    `evaluate --run`. Writes into `out_dir`: questions.jsonl (the test questions), corpus.jsonl (where the corpus
    is the questions' contexts: those of the whole test file, as `evaluate` on it would build) and eval.yaml,
    which `python recipes/evaluate.py --config <out_dir>/eval.yaml` reruns. The trajectories go where
    `evaluate --run` puts them (<run>/eval/...); a rerun skips the questions already there."""
    from knowtrace_train.data.corpus import build_corpus, write_corpus
    from knowtrace_train.evaluate import evaluate, load_eval_config
    from knowtrace_train.selftrain.models import run_model

    used = read_json((run_dir / "questions.json"))
    items, everything, used_by_run = select_test_items(config, {i for ids in used.values() for i in ids})
    if not items:
        raise RunError(f"data.test {config.data.test}: every question was used by the run; no test question left")
    questions = out_dir / "questions.jsonl"
    write_jsonl(questions, [it.to_dict() for it in items])
    corpus = config_to_dict(config.data.corpus)
    if config.data.corpus.source == "contexts":
        write_corpus(build_corpus(everything), out_dir / "corpus.jsonl")
        corpus = {"source": "file", "path": str(out_dir / "corpus.jsonl")}
    # the run's final model: its last finished iteration (the bootstrap's M0 included), else the raw base
    iteration: str | int = "last" if any(run_dir.glob("iter_*/metrics.json")) else 0
    spec = {
        "dataset": {"path": str(questions)},
        "corpus": corpus,
        "retriever": config_to_dict(config.retriever),
        "generator": config_to_dict(config.generator),
        "chunk_size": config.chunk_size,
        "threads": config.threads,
        "run": str(run_dir),
        "iteration": iteration,
    }
    spec_file = out_dir / "eval.yaml"
    atomic_write_text(spec_file, yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    eval_config = load_eval_config(spec_file)
    model = run_model(run_dir, iteration).state.name
    log.info("test: %s of %s on %d questions of %s (%d of its questions used by the run, left out) -> %s",
             model, run_dir, len(items), config.data.test, used_by_run, eval_config.output)
    summary = evaluate(eval_config, progress=progress)
    return {
        **summary.headline(),
        "path": config.data.test,
        "used_by_run": used_by_run,
        "model": model,
        "trajectories": eval_config.output,
        "eval_config": str(spec_file),
    }


def finish_grid(config: SelfTrainConfig, root: Path, results: Sequence[dict[str, Any]], *,
                progress: bool = True) -> dict[str, Any]:
    """Choose the point (`choose_point`), evaluate its final model on `data.test` where set, write
    <root>/grid.json (main process) and return {"chosen", "chosen_run_dir", "dev_em", "test"} for the recipe's
    last line (`test` None without data.test: dev only)."""
    i = choose_point(results)
    chosen = results[i]
    out: dict[str, Any] = {"chosen": chosen["point"], "chosen_run_dir": chosen["run_dir"],
                           "dev_em": final_dev_em(chosen), "test": None}
    if int(os.environ.get("RANK", "0")) != 0:
        return out
    if config.data.test:
        out["test"] = evaluate_on_test(config, Path(chosen["run_dir"]), root / "test", progress=progress)
    else:
        out["note"] = "dev only: data.test is not set"
        log.info("grid: %s chosen on dev (EM %s); data.test is not set, so dev only is reported", chosen["point"],
                 out["dev_em"])
    write_json(root / GRID_FILE, {
        "run_dir": str(root),
        "selection": SELECTION,
        "points": [{"point": r["point"], "run_dir": r["run_dir"], "dev_em": final_dev_em(r)} for r in results],
        **out,
    })
    return out
