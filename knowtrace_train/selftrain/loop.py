"""Algorithm 2 (backtracing-guided self-training) as resumable stages in a run folder, for any registered method (over 500 lines: the stages in the order a run takes them, one place to read a run).

M0 is the base model, or the bootstrapped one (iteration 0: LoRA on the method's gold trajectories,
merged into the weights). Iteration z rolls out the train questions with M(z-1) (M0 at z=1; afterwards
M0 with iteration z-1's adapter for each generator role: KnowTrace's exploration adapter for
exploration and answering calls, its completion adapter for completion calls), scores them, turns the
correct trajectories into SFT records with the rationalizer `mode` names (KnowTrace's "backtrace"
filters them; "star" keeps them whole), trains one adapter per role from M0 on that iteration's
records only, and evaluates M(z) on the dev questions.

Run folder (runs/<name>):

    config.yaml                   the config as run; a rerun must bring the same one
    questions.json                ids of the rollout, bootstrap, dev and calibration questions
    base/eval.jsonl               the raw base (few-shot) on the dev questions; base/probe.jsonl for
                                  bootstrap "auto" (the raw base on the first train questions)
    iter_0/                       the bootstrap: sft_<kind>.jsonl (gold), gold.json, bootstrap_adapters/<a>/
                                  (merged already), model/ (M0), calibration.json (its decision thresholds,
                                  calibration.py), eval.jsonl, metrics.json
    m0.json                       M0: "path" of its model folder (relative to the run folder when inside it), the
                                  raw base, whether bootstrapped, the prompt settings it runs with
    iter_<z>/                     rollouts.jsonl, rationale.json, sft_<kind>.jsonl, adapters/<role>/,
                                  calibration.json, eval.jsonl, metrics.json (with `vs_m0` and `vs_previous`: paired tests
                                  of M(z) against M0 and M(z-1) on the dev questions, read from the
                                  eval.jsonl files)
    <folder>/DONE.<stage>         the stage's marker with its seconds and figures ("reused_from": the cache
                                  folder of a stage another run computed, see reuse.py)
    summary.json                  dev EM/F1 and FA ratios per iteration, wall time per phase
    tracking/                     where `report_to` names trackers: each trainer's run and the loop's figures
                                  per iteration (knowtrace_train/tracking.py)

Every file is written to a temporary name and renamed; a stage whose marker exists is never redone,
so a killed run started again with the same config continues at the first unfinished stage. With
`reuse`, the stages that depend neither on the mode, the iterations nor `train.*` (the base's evaluation
and probe, M0, M0's evaluation, iteration 1's rollouts) come from the cache home when a run on this
machine computed them from the same inputs (reuse.py). With `eval_beside` (on by default for one CPU process)
each model's dev evaluation runs on a worker thread beside the next stages, each stage on a thread count the
schedule fixes (beside.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from knowtrace_train import tracking
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.errors import RunError
from knowtrace_train.evaluate import EvalConfig, check_prompts_fit, evidence_check, load_corpus, summarize
from knowtrace_train.io import read_json, write_json, write_jsonl
from knowtrace_train.methods import Method, StrategyConfig, get_method
from knowtrace_train.pairing import compare_evals
from knowtrace_train.progress import library_bars_off
from knowtrace_train.metrics import question_kind
from knowtrace_train.selftrain.beside import Evaluations, beside_threads
from knowtrace_train.selftrain.bootstrap import Bootstrap
from knowtrace_train.selftrain.calibration import Calibration
from knowtrace_train.selftrain.config import SelfTrainConfig, evaluates
from knowtrace_train.selftrain.folder import check_same_config, run_config_text
from knowtrace_train.selftrain.preflight import check_inputs, preflight
from knowtrace_train.selftrain.training import AdapterTraining
from knowtrace_train.selftrain.models import (
    ModelState, generator_config, next_model, read_records, rollout_strategy_config, run_relative, strategy_config)
from knowtrace_train.selftrain.reuse import Reuse
from knowtrace_train.selftrain.rollout import pass_at_samples, run_rollouts
from knowtrace_train.train.modes import resolve
from knowtrace_train.stages import Processes, StageRunner, remove_leftovers
from knowtrace_train.trajectory import read_trajectories

log = logging.getLogger(__name__)

# -- question selection -----------------------------------------------------------------------------


@dataclass
class Questions:
    rollout: list[QAItem]
    bootstrap: list[QAItem]
    dev: list[QAItem]
    #: every train and dev item (the corpus of "contexts" and the items backtracing looks up)
    all_items: list[QAItem]
    #: held-out train questions whose gold decision prompts calibrate the trained models' thresholds
    calibration: list[QAItem] = dataclasses.field(default_factory=list)

    def ids(self) -> dict[str, list[str]]:
        return {k: [it.id for it in getattr(self, k)] for k in ("rollout", "bootstrap", "dev", "calibration")}


def select_questions(config: SelfTrainConfig, bootstrap: bool) -> Questions:
    """Seeded shuffles of the train and dev splits: D is the first `train_questions` train questions,
    the bootstrap's gold questions the next `bootstrap.questions`, the calibration's the next
    `calibration.questions` (as many as are left), dev the first `dev_questions`."""
    from knowtrace_train.data.loaders import load_items

    d = config.data
    train = load_items(d.train, d.format)
    dev = load_items(d.dev, d.format)
    order = list(train)
    random.Random(d.seed).shuffle(order)
    n_boot = config.bootstrap.questions if bootstrap else 0
    n_cal = config.calibration.questions
    n_roll = d.train_questions if d.train_questions is not None else max(0, len(order) - n_boot - n_cal)
    if n_roll > len(order):
        raise RunError(f"data.train_questions is {n_roll} but {d.train} holds {len(order)} questions")
    rollout = order[:n_roll]
    boot = order[n_roll : n_roll + n_boot]
    if bootstrap and not boot:
        raise RunError(f"{d.train}: no train question left for the bootstrap after {n_roll} rollout questions")
    calibration = order[n_roll + n_boot : n_roll + n_boot + n_cal]
    if len(calibration) < n_cal:
        log.warning("calibration: %d of the %d questions asked are left in %s after the rollouts' and the "
                    "bootstrap's", len(calibration), n_cal, d.train)
    dev_order = list(dev)
    random.Random(d.seed + 1).shuffle(dev_order)
    if d.dev_questions is not None and d.dev_questions > len(dev_order):
        raise RunError(f"data.dev_questions is {d.dev_questions} but {d.dev} holds {len(dev_order)} questions: ask "
                       "for at most that many (or null: all)")
    dev_sel = dev_order if d.dev_questions is None else dev_order[: d.dev_questions]
    if not dev_sel:
        raise RunError(f"{d.dev}: no dev question to evaluate on (data.dev_questions is {d.dev_questions})")
    return Questions(rollout=rollout, bootstrap=boot, dev=dev_sel, all_items=train + dev, calibration=calibration)


# -- the run ----------------------------------------------------------------------------------------


class SelfTrain(Bootstrap, Calibration, Reuse, AdapterTraining, Evaluations):
    """One self-training run in its folder. `run()` walks every stage, skipping the finished ones."""

    def __init__(
        self,
        config: SelfTrainConfig,
        *,
        procs: Processes | None = None,
        progress: bool = True,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
        make_generator: Callable[[Any], Any] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.run_dir = Path(config.output_dir or Path("runs") / config.name)
        self.procs = procs or Processes.detect()
        self.stages = StageRunner(self.procs)
        self.progress = progress
        #: called with each finished model's metrics (the base, M0, every iteration), in order
        self.on_metrics = on_metrics
        #: GeneratorConfig -> Generator (default: generation.build_generator)
        self.make_generator = make_generator
        self._corpus: list[Passage] | None = None
        self._retriever = None
        self._tokenizer = None
        self._base_path: Path | None = None
        # reuse (reuse.py): the cache, the corpus fingerprint, M0's key once the bootstrap knows it
        self._reuse_cache = None
        self._corpus_fp: str | None = None
        self._m0_key: str | None = None
        #: the run's trackers (`report_to`; None: none), set by `run`
        self.tracking: tracking.Tracking | None = None

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

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Every stage in order; returns the summary (also written to summary.json)."""
        cfg = self.config
        t0 = time.perf_counter()
        threads = self._set_threads()
        self._prepare_folder()
        self._beside = beside_threads(cfg.eval_beside, threads, self.procs.world, cfg.generator.backend,
                                      self._generator_device())
        self._threads, self._pending, self._base_waits = threads, None, False
        self._fixed = self._beside > 0 and cfg.eval_beside_fixed
        metrics: list[dict[str, Any]] = []
        self.tracking = tracking.for_run(cfg.report_to, self.run_dir, cfg.run_name, self.procs.is_main)
        with tracking.tracked(self.tracking), library_bars_off():  # one bar per stage: none of the libraries'
            try:
                if cfg.eval_base:  # beside the bootstrap, in turn, or (the fixed schedule) later: _evaluate_base
                    self._evaluate_base(metrics)
                m0 = self._m0(metrics)
                state = m0
                for z in range(1, cfg.iterations + 1):
                    state, stop = self._iteration(z, state, m0, metrics)
                    if stop:
                        break
                self._finish_evaluations(metrics)
            except BaseException as e:
                if self._pending is not None and not isinstance(e, KeyboardInterrupt):
                    self._pending[0].wait_quietly()  # nothing of this run writes after it has failed
                raise
        summary = self._write_summary(metrics)
        log.info("run finished in %.1fs (this invocation)", time.perf_counter() - t0)
        return summary

    def _set_threads(self) -> int:
        """torch threads per process (returned): `threads`, or the cores this process may use divided among the
        processes on this machine. `accelerate launch` without a config sets OMP_NUM_THREADS=1 on
        CPUs, which left one of two cores idle in the default run."""
        import torch

        from knowtrace_train.train.precision import training_device

        n = self.config.threads
        if n is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.procs.world) or 1)
            n = max(1, cores // max(1, local))
        if torch.get_num_threads() != n:
            log.info("torch threads: %d (was %d; config threads: %s)", n, torch.get_num_threads(), self.config.threads)
            torch.set_num_threads(n)
        if n > 1 and os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE" and training_device() == "cpu":
            log.warning("OMP_WAIT_POLICY=PASSIVE with %d torch threads: every parallel region wakes sleeping threads, "
                        "which slows a run alone on its cores (measured in docs/training.md, \"Threads\"). Unset it here; where other jobs share the cores, keep it and run one "
                        "thread per process (--threads 1, or torchrun)", n)
        return n

    def _emit(self, m: dict[str, Any]) -> None:
        if self.tracking is not None:
            self.tracking.log_model(m)  # the main process's trackers (tracking.py)
        if self.on_metrics is not None and self.procs.is_main:
            self.on_metrics(m)

    # -- folder and questions ---------------------------------------------------------------------
    def _prepare_folder(self) -> None:
        cfg = self.config
        saved = self.run_dir / "config.yaml"
        resumed = saved.is_file()
        if resumed:
            check_same_config(cfg, saved, self.procs.world)
        # the preflight (preflight.py), before config.yaml is written: a failed start leaves none behind
        self.questions = select_questions(cfg, bootstrap=cfg.bootstrap.mode != "never")
        preflight(self)
        if resumed:
            if self.procs.is_main:  # a killed run's half-written temporary files (none of this run's yet)
                remove_leftovers(self.run_dir)
        elif self.procs.is_main:
            from knowtrace_train.io import atomic_write_text

            atomic_write_text(saved, run_config_text(cfg, self.procs.world))
        check_inputs(self.run_dir, cfg, self.procs.is_main)
        self.procs.barrier()
        qfile = self.run_dir / "questions.json"
        ids = self.questions.ids()
        if qfile.is_file():
            if read_json(qfile) != ids:
                raise RunError(f"{qfile}: the data files now give other questions than this run used; "
                                 "restore them or start a new run folder")
        elif self.procs.is_main:
            write_json(qfile, ids)
        self.procs.barrier()
        self.items_by_id = {it.id: it for it in self.questions.all_items}

    # -- models -----------------------------------------------------------------------------------
    @property
    def method(self) -> Method:
        """The registered method the config's `strategy.name` names."""
        return get_method(self.config.strategy.name)

    def record_kinds(self) -> list[str]:
        """The call kinds whose records the method writes (sft_<kind>.jsonl)."""
        return list(self.method.record_roles(self.config.strategy))

    def generator_config(self, state: ModelState):
        return generator_config(self.config, state)

    def strategy_config(self, state: ModelState, seed: int) -> StrategyConfig:
        return strategy_config(self.config, state, seed)

    def sampling(self, state: ModelState, seed: int, rollout: bool) -> tuple[StrategyConfig, int]:
        """The strategy and samples per question of an iteration's rollout (`rollout`: `rollout.*`), or of an
        evaluation (the strategy's own decoding, one trajectory per question)."""
        if rollout:
            return rollout_strategy_config(self.config, state, seed), self.config.rollout.samples
        return self.strategy_config(state, seed), 1

    def build_generator(self, state: ModelState):
        """The generator of `state` (`make_generator`, else the configured backend)."""
        from knowtrace_train.generation import build_generator

        return (self.make_generator or build_generator)(self.generator_config(state))

    def _rollout(self, state: ModelState, items: Sequence[QAItem], out: Path, seed: int, desc: str,
                 iteration: int | None, rollout: bool = False, generator=None) -> dict[str, Any]:
        strategy, samples = self.sampling(state, seed, rollout)
        trajs = run_rollouts(
            items, out, strategy, (lambda: generator) if generator is not None else lambda: self.build_generator(state),
            self.retriever,
            chunk_size=self.config.chunk_size, procs=self.procs, iteration=iteration, desc=desc,
            progress=self.progress, samples=samples,
        )
        check_prompts_fit(trajs, f"{desc} ({out})")
        s = summarize(trajs, kinds=[question_kind(it) for it in items for _ in range(samples)],
                      evidence=evidence_check(strategy), seed=self.config.seed)
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

    def _rollout_stage(self, folder: Path, name: str, stage: str, state: ModelState, items: Sequence[QAItem],
                       filename: str, seed: int, desc: str, iteration: int | None,
                       rollout: bool = False, generator=None) -> dict[str, Any]:
        """A rollout as a stage of `folder` (`rollout`: an iteration's, with `rollout.*`; else an evaluation);
        taken from the reuse cache (stage `stage`) where `state` is the raw base or M0 and a run made the
        same trajectories already (see reuse.py). `generator`: one built already (else built when needed)."""
        inputs = self.rollout_inputs(state, items, seed, iteration, rollout)
        return self.reusable_stage(folder, name, stage, inputs, lambda: self._rollout(
            state, items, folder / filename, seed, desc, iteration, rollout, generator), [filename])

    def rollout_inputs(self, state: ModelState, items: Sequence[QAItem], seed: int, iteration: int | None,
                       rollout: bool = False) -> Callable[[], Mapping[str, Any] | None]:
        """What a rollout's reuse key knows (None: a model with adapters, never shared)."""
        def inputs():
            model = self.weights_identity(state)
            return None if model is None else self.generation_inputs(model, items, state, seed, iteration, rollout)

        return inputs

    def _eval(self, folder: Path, state: ModelState, seed: int, iteration: int | None,
              generator=None) -> dict[str, Any]:
        return self._rollout_stage(folder, "eval", "eval", state, self.questions.dev, "eval.jsonl", seed,
                                   f"{folder.name} dev eval", iteration, generator=generator)

    def _compare(self, against: str, a_folder: Path, b_folder: Path) -> dict[str, Any] | None:
        """The model evaluated in `b_folder` against the one in `a_folder` (named `against`) on the
        dev questions: {"model": against, "n", "em", "f1"} (paired tests, `pairing.compare_evals`,
        read from the two eval.jsonl files). None where either was not evaluated; {"model",
        "refused"} where the files hold other questions (they never should in one run folder)."""
        a, b = a_folder / "eval.jsonl", b_folder / "eval.jsonl"
        if not (a.is_file() and b.is_file()):
            return None
        try:
            return {"model": against, **compare_evals(a, b, seed=self.config.seed)}
        except ValueError as e:
            log.warning("no paired test of %s against %s: %s", b_folder.name, against, e)
            return {"model": against, "refused": str(e)}

    def m0_folder(self, m0: ModelState) -> Path:
        """Where M0's dev evaluation is: iter_0 (bootstrapped) or base (M0 is the raw base)."""
        return self.run_dir / ("iter_0" if m0.name == "M0" else "base")

    # -- the raw base -----------------------------------------------------------------------------
    def raw_base(self) -> ModelState:
        return ModelState(name="base", model=self.config.generator.model)

    def _base_metrics(self, ev: dict[str, Any] | None) -> dict[str, Any]:
        m = {"iteration": "base", "model": "base", "eval": ev, "seconds": {"eval": ev["seconds"]}}
        if self.procs.is_main:
            write_json(self.run_dir / "base" / "metrics.json", m)
        return m

    # -- one iteration ----------------------------------------------------------------------------
    def _records_per_adapter(self, records: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        """Records of each call kind go to the adapter of the role that kind runs with."""
        out: dict[str, list[dict[str, Any]]] = {}
        for kind, adapter in self.method.record_roles(self.config.strategy).items():
            out.setdefault(adapter, []).extend(records.get(kind, []))
        return out

    def _iteration(self, z: int, prev: ModelState, m0: ModelState,
                   metrics: list[dict[str, Any]]) -> tuple[ModelState, bool]:
        """Iteration z's stages; its metrics go to `metrics` once M(z) is evaluated (see `_evaluate`).
        Returns M(z) and whether the run stops here."""
        cfg = self.config
        folder = self.run_dir / f"iter_{z}"
        seed = cfg.strategy.seed + z
        roll = self._rollout_stage(folder, "rollout", "rollout", prev, self.rollout_items(z), "rollouts.jsonl", seed,
                                   f"iter {z} rollout", z, rollout=True)
        if roll.get("samples", 1) > 1:
            log.info("iteration %d rollouts: %d of %d trajectories correct; %d of %d questions solved by one of "
                     "their %d samples (pass@%d %.3f)", z, roll["correct"], roll["trajectories"], roll["solved"],
                     roll["questions"], roll["samples"], roll["samples"], roll["pass_at_samples"] or 0.0)
        bt = self.stages.run(folder, "rationalize", lambda: self._rationalize(folder, z))
        if self._fixed:  # the evaluation beside the rollouts is joined here: the training gets every thread
            self._finish_pending(metrics)
        records = {k: read_records(folder / f"sft_{k}.jsonl") for k in self.record_kinds()}
        groups = self._records_per_adapter(records)
        base = Path(m0.model) if m0.name == "M0" else self.base_path
        train_info: dict[str, dict[str, Any]] = {}
        mode = self.training_mode
        for i, (adapter, recs) in enumerate(groups.items()):
            train_info[adapter] = self.stages.run(folder, f"train_{adapter}", lambda a=adapter, r=recs, i=i: self._train(
                folder, a, r, base, cfg.train, seed=cfg.seed * 1000 + z * 10 + i, trainer=mode.name,
                init_adapter=prev.adapters.get(a) if mode.continues_policy else None))
        adapters = {a: str(folder / "adapters" / a) for a, t in train_info.items() if t.get("records", 0) > 0}
        if mode.continues_policy and adapters:  # the policy goes on: a role without rows keeps M(z-1)'s adapter
            adapters = {**prev.adapters, **adapters}
        status = "trained" if adapters else "empty"
        stop = not adapters and cfg.on_empty == "stop"
        state = next_model(z, prev, m0, adapters)
        if adapters:
            state = self.calibrated(folder, state, seed)
        else:
            log.warning("iteration %d: %d of %d rollouts correct, %d records: nothing to train on (%s)",
                        z, roll["correct"], roll["questions"], sum((bt.get("records") or {}).values()),
                        "the run stops here" if cfg.on_empty == "stop" else "M%d = M%d" % (z, z - 1))
        m = {
            "iteration": z,
            "model": state.name,
            "status": status,
            "rollout": roll,
            "rationale": bt,
            "sft_records": {a: len(r) for a, r in groups.items()},
            "train": train_info,
            "adapters": {a: run_relative(self.run_dir, p) for a, p in adapters.items()},
        }

        def finish(ev: dict[str, Any] | None) -> dict[str, Any]:
            vs_m0 = vs_prev = None
            if ev is not None:
                vs_m0 = self._compare(m0.name, self.m0_folder(m0), folder)
                vs_prev = vs_m0 if z == 1 else self._compare(prev.name, self.run_dir / f"iter_{z - 1}", folder)
            m.update({"eval": ev, "vs_m0": vs_m0, "vs_previous": vs_prev, "seconds": {
                "rollout": roll["seconds"],
                "rationalize": bt["seconds"],
                "train": sum(t["seconds"] for t in train_info.values()),
                "eval": ev["seconds"] if ev else 0.0,
            }})
            if self.procs.is_main:
                write_json(folder / "metrics.json", m)
            self.procs.barrier()
            return m

        if not stop and evaluates(z, cfg.iterations, cfg.eval_every):
            self._evaluate(folder, state, seed, z, finish, metrics, last=z == cfg.iterations)
        else:
            self._finish_pending(metrics)
            self._record(finish(None), metrics)
        return state, stop

    def _rationalize(self, folder: Path, z: int) -> dict[str, Any]:
        """Correct rollouts -> sft_<kind>.jsonl with the rationalizer `mode` names, and rationale.json."""
        cfg = self.config
        info: dict[str, Any] = {}
        if self.procs.is_main:
            from knowtrace_train.data.store import passages_by_id

            name, mode = resolve(cfg.mode, self.method.rationalizers())
            trajs = read_trajectories(folder / "rollouts.jsonl")
            res = self.method.rationalizers()[name](
                trajs, self.items_by_id, strategy=cfg.strategy,
                count_tokens=self.count_tokens, fewshot=cfg.fewshot_trained, iteration=z,
                passages=passages_by_id(self.corpus),  # a store's id index: not every passage in memory
                **mode.rationalizer_options(cfg),
            )
            records, st = mode.records(res.records_by_role, res.stats, trajectories=trajs, iteration=z, config=cfg,
                                       method=self.method, kinds=self.record_kinds(), count_tokens=self.count_tokens)
            self._write_records(folder, records)
            write_json(folder / "rationale.json", st)
            info = {k: st.get(k) for k in ("mode", "trajectories", "correct", "backtraced", "skipped", "fa_ratio",
                                            "tokens_all", "tokens_filtered", "records")}
            info["fa_by_role"] = {r: v.get("fa_ratio") for r, v in st.get("roles", {}).items()}
            for key in ("fa_decomposed", "backtrace_records"):  # backtracing's (KnowTrace): why FA filtered
                if key in st:
                    info[key] = st[key]
            info.update({k: st[k] for k in mode.rationale_keys if k in st})
        return self.procs.broadcast(info)

    def _write_records(self, folder: Path, records_by_role: Mapping[str, list[dict[str, Any]]]) -> None:
        """sft_<kind>.jsonl for every record kind of the method (empty files included) and any other
        kind the records name."""
        for k in dict.fromkeys([*self.record_kinds(), *records_by_role]):
            write_jsonl(folder / f"sft_{k}.jsonl", records_by_role.get(k, []))

    @property
    def training_mode(self):
        """The config's `mode` as a registered TrainingMode (train/modes.py)."""
        return resolve(self.config.mode, self.method.rationalizers())[1]

    # -- summary ----------------------------------------------------------------------------------
    def _write_summary(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        from knowtrace_train.report import summarize_run

        summary = summarize_run(self.config, self.run_dir, metrics)
        if self.procs.is_main:
            write_json(self.run_dir / "summary.json", summary)
        return summary
