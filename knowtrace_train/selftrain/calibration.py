"""Each trained model's decisions calibrated: the threshold on a decision's log-odds (KnowTrace's sufficiency
judgement: log P(" Yes") - log P(" No") after the judgement words; DoG's answer try: the same as the call's first
word) that tells held-out gold prompts apart best.

The prompts are the method's (`Method.decision_prompts`) over `calibration.questions` train questions that neither
the bootstrap nor the rollouts use, rendered as the model runs them. The stage "calibrate" runs after the bootstrap's
merge (M0) and after every iteration that trained an adapter, before the model's evaluation and the next rollouts,
and writes iter_<z>/calibration.json: per decision kind the threshold chosen, its balanced accuracy and recalls on
those prompts and the greedy decision's beside them (`knowtrace_train.decisions.choose_threshold`). A model
deciding with thresholds is a ModelState with `thresholds`; the strategy settings it runs with carry them (and so
do the reuse cache's keys). `Calibrate` is the stage, built with the run's context (context.py).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable

from knowtrace_train.io import write_json
from knowtrace_train.selftrain.models import CALIBRATION_FILE, ModelState, read_thresholds, strategy_config

log = logging.getLogger(__name__)


class Calibrate:
    """The "calibrate" stage: a trained model in, the same model deciding with its calibrated thresholds out."""

    def __init__(self, run) -> None:
        #: the run's context (context.RunContext): config, questions, method, stages, processes, generators
        self.run = run

    def __call__(self, folder: Path, state: ModelState, seed: int) -> ModelState:
        """`state` deciding with the thresholds calibrated for it in `folder` (computed there once); `state` as it
        is where the run holds no calibration question or the method no decision to calibrate."""
        run = self.run
        items = run.questions.calibration
        if not items:
            return state
        plain = dataclasses.replace(state, thresholds={})
        strategy = strategy_config(run.config, plain, seed)
        kinds = run.method.threshold_decisions(strategy)
        if not kinds:  # the method's other decisions are measured (scripts/lab/decisions.py), not decided by threshold
            return state
        if run.config.calibration.source == "explorations":
            probe = run.method.probe_decisions(strategy)
            if probe is not None:
                run.stages.run(folder, "calibrate", lambda: self._on_explorations(folder, plain, probe, items))
                return dataclasses.replace(state, thresholds=read_thresholds(folder) or {})
        prompts = [p for p in run.method.decision_prompts(strategy, items) if p.kind in kinds]
        if not prompts:
            return state
        run.stages.run(folder, "calibrate", lambda: self._on_gold(folder, plain, prompts, len(items)))
        return dataclasses.replace(state, thresholds=read_thresholds(folder) or {})

    def _on_gold(self, folder: Path, state: ModelState, prompts, questions: int) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self.run.procs.is_main:
            info = calibrate_model(lambda: self.run.build_generator(state), prompts, folder, state.name, questions)
        return self.run.procs.broadcast(info)

    def _on_explorations(self, folder: Path, state: ModelState, probe, items) -> dict[str, Any]:
        """The model's own explorations of the calibration questions, every decision scored and none taken
        (`Method.probe_decisions`), each labelled by its outcome (`Method.decision_outcomes`: KnowTrace's graph
        names the gold answer or not); the thresholds chosen on them. A generator that scores no options falls
        back to the gold prompts."""
        from knowtrace_train.decisions import thresholds_by_kind
        from knowtrace_train.generation.base import OptionScorer
        from knowtrace_train.selftrain.rollout import run_rollouts

        run = self.run
        generator = run.build_generator(state)
        if not isinstance(generator, OptionScorer):
            close = getattr(generator, "close", None)
            if callable(close):
                close()
            kinds = run.method.threshold_decisions(probe)
            prompts = [p for p in run.method.decision_prompts(probe, items) if p.kind in kinds]
            return self._on_gold(folder, state, prompts, len(items)) if prompts else {}
        trajs = run_rollouts(items, folder / CALIBRATION_ROLLOUTS, probe, lambda: generator, run.retriever,
                             chunk_size=run.config.chunk_size, procs=run.procs, iteration=None,
                             desc=f"{folder.name} calibration", progress=run.progress)
        info: dict[str, Any] = {}
        if run.procs.is_main:
            outcomes = run.method.decision_outcomes(trajs, run.items_by_id)
            decisions = thresholds_by_kind(outcomes, "the explorations carry one outcome only, or none was scored")
            info = write_calibration(folder, state.name, len(items), len(outcomes), decisions, "explorations")
        return run.procs.broadcast(info)


#: the calibration's own rollouts (source "explorations"), beside calibration.json
CALIBRATION_ROLLOUTS = "calibration_rollouts.jsonl"


def calibrate_model(make_generator: Callable[[], Any], prompts, folder: Path, name: str, questions: int
                    ) -> dict[str, Any]:
    """Calibrate the model `make_generator` builds on `prompts` (`decisions.DecisionPrompt`s of `questions`
    held-out questions), write `folder`/calibration.json and log what was chosen; returns {"thresholds",
    "prompts"}. A generator that scores no options leaves every decision greedy (said in the file)."""
    from knowtrace_train.decisions import calibrate
    from knowtrace_train.generation.base import OptionScorer

    generator = make_generator()
    try:
        if isinstance(generator, OptionScorer):
            decisions = calibrate(generator, prompts)
        else:
            why = f"the generator ({type(generator).__name__}) scores no options"
            decisions = {p.kind: {"threshold": None, "why": why} for p in prompts}
    finally:
        close = getattr(generator, "close", None)
        if callable(close):
            close()
    return write_calibration(folder, name, questions, len(prompts), decisions, "gold")


def write_calibration(folder: Path, name: str, questions: int, prompts: int, decisions: dict[str, dict[str, Any]],
                      source: str) -> dict[str, Any]:
    """Write `folder`/calibration.json and log each decision's threshold; returns {"thresholds", "prompts"}."""
    from knowtrace_train.decisions import thresholds_of

    write_json(Path(folder) / CALIBRATION_FILE, {"model": name, "source": source, "questions": questions,
                                                 "prompts": prompts, "decisions": decisions})
    for kind, c in decisions.items():
        if c.get("threshold") is None:
            log.warning("%s: %s is not calibrated (%s); it decides greedily", name, kind, c.get("why"))
        else:
            log.info("%s: %s threshold %.3f on %d held-out %s: balanced accuracy %.3f (Yes %.2f, No %.2f; greedy "
                     "%.3f)", name, kind, c["threshold"], c["prompts"],
                     "gold prompts" if source == "gold" else "explorations", c["balanced_accuracy"], c["recall_yes"],
                     c["recall_no"], c["greedy"]["balanced_accuracy"])
    return {"thresholds": thresholds_of(decisions), "prompts": prompts}
