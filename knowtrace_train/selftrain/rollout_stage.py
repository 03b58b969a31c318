"""The rollout stage: a model over questions as a stage of a folder, its trajectories written (rollout.py) and
summarized. Iteration z's rollouts of M(z-1) on its slice of D, a model's dev evaluation and the raw base's probe are
each one; where the model is the raw base or M0 and a run made the same trajectories already, the stage comes from
the reuse cache (reuse.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.evaluate import check_prompts_fit, evidence_check, summarize
from knowtrace_train.metrics import question_kind
from knowtrace_train.selftrain.models import ModelState, sampling
from knowtrace_train.selftrain.rollout import pass_at_samples, run_rollouts

log = logging.getLogger(__name__)


class Rollouts:
    """A model in, its trajectories' figures out. Built with the run's context (context.py)."""

    def __init__(self, run) -> None:
        self.run = run

    def items(self, z: int) -> list[QAItem]:
        """Iteration z's rollout questions: all of D, or with `rollout.questions` k the z-th slice of k of them
        (questions (z-1)k .. zk-1 of D, wrapping round)."""
        d, k = self.run.questions.rollout, self.run.config.rollout.questions
        if k is None or k >= len(d):
            return list(d)
        start = ((z - 1) * k) % len(d)
        return [d[(start + i) % len(d)] for i in range(k)]

    def iteration(self, folder: Path, z: int, prev: ModelState, seed: int) -> dict[str, Any]:
        """Iteration z's rollouts of `prev` = M(z-1) (rollouts.jsonl, at `rollout.*`'s samples and temperature)."""
        roll = self.stage(folder, "rollout", "rollout", prev, self.items(z), "rollouts.jsonl", seed,
                          f"iter {z} rollout", z, rollout=True)
        if roll.get("samples", 1) > 1:
            log.info("iteration %d rollouts: %d of %d trajectories correct; %d of %d questions solved by one of "
                     "their %d samples (pass@%d %.3f)", z, roll["correct"], roll["trajectories"], roll["solved"],
                     roll["questions"], roll["samples"], roll["samples"], roll["pass_at_samples"] or 0.0)
        return roll

    def evaluate(self, folder: Path, state: ModelState, seed: int, iteration: int | None,
                 generator=None) -> dict[str, Any]:
        """`state`'s evaluation on the dev questions (eval.jsonl)."""
        return self.stage(folder, "eval", "eval", state, self.run.questions.dev, "eval.jsonl", seed,
                          f"{folder.name} dev eval", iteration, generator=generator)

    def stage(self, folder: Path, name: str, stage: str, state: ModelState, items: Sequence[QAItem],
              filename: str, seed: int, desc: str, iteration: int | None,
              rollout: bool = False, generator=None) -> dict[str, Any]:
        """A rollout as a stage of `folder` (`rollout`: an iteration's, with `rollout.*`; else an evaluation);
        taken from the reuse cache (stage `stage`) where `state` is the raw base or M0 and a run made the
        same trajectories already (see reuse.py). `generator`: one built already (else built when needed)."""
        inputs = self.inputs(state, items, seed, iteration, rollout)
        return self.run.reuse.stage(folder, name, stage, inputs, lambda: self._rollout(
            state, items, folder / filename, seed, desc, iteration, rollout, generator), [filename])

    def inputs(self, state: ModelState, items: Sequence[QAItem], seed: int, iteration: int | None,
               rollout: bool = False) -> Callable[[], Mapping[str, Any] | None]:
        """What a rollout's reuse key knows (None: a model with adapters, never shared)."""
        reuse = self.run.reuse

        def inputs():
            model = reuse.weights_identity(state)
            return None if model is None else reuse.generation_inputs(model, items, state, seed, iteration, rollout)

        return inputs

    def _rollout(self, state: ModelState, items: Sequence[QAItem], out: Path, seed: int, desc: str,
                 iteration: int | None, rollout: bool = False, generator=None) -> dict[str, Any]:
        run = self.run
        strategy, samples = sampling(run.config, state, seed, rollout)
        trajs = run_rollouts(
            items, out, strategy, (lambda: generator) if generator is not None else lambda: run.build_generator(state),
            run.retriever,
            chunk_size=run.config.chunk_size, procs=run.procs, iteration=iteration, desc=desc,
            progress=run.progress, samples=samples,
        )
        check_prompts_fit(trajs, f"{desc} ({out})")
        s = summarize(trajs, kinds=[question_kind(it) for it in items for _ in range(samples)],
                      evidence=evidence_check(strategy), seed=run.config.seed)
        solved = pass_at_samples(trajs)
        return {
            "model": state.name,
            "questions": len(items),
            "samples": samples,
            "trajectories": len(trajs),
            # questions with at least one correct sample (pass@G; with one sample, the correct count)
            "solved": solved["solved"],
            "pass_at_samples": solved["pass_at_samples"],
            "correct": int(round(sum(t.em or 0.0 for t in trajs))),
            "em": s.em,
            "f1": s.f1,
            "rounds": s.rounds,
            "retrieved_tokens": s.retrieved_tokens,
            "sec_per_question": s.sec_per_question,
            "stop_reasons": s.stop_reasons,
            "unusable_calls": s.unusable_calls,
            **s.figures(),
        }
