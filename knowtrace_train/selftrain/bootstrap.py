"""Iteration 0 of the loop: M0 is the raw base, or the base LoRA-trained on gold trajectories and merged.

`bootstrap.mode` "always" or "never" decides, or "auto": a probe of the raw base on the first train
questions. The method writes the gold records (`Method.gold_records`); the loop trains one adapter on
all of them (`bootstrap.joint`) or one per role, merges them into the weights (iter_0/model) and
records where M0 is in m0.json. With `reuse`, an M0 made by another run from the same base, records
and training settings comes from the cache home instead (reuse.py): its files hard-linked into
iter_0/, or, where links cannot be made, m0.json pointing at the cache folder. `Bootstrap` is the stage.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from knowtrace_train.config import config_to_dict
from knowtrace_train.errors import RunError
from knowtrace_train.io import write_json
from knowtrace_train.selftrain.models import (
    ModelState, bootstrapped_m0, read_sft, read_thresholds, m0_path, run_relative, strategy_config)
from knowtrace_train.selftrain.reuse import link_tree, reused
from knowtrace_train.stages import is_done

log = logging.getLogger(__name__)

#: Where the bootstrap's adapters go: not iter_0/adapters/, as they are merged into M0 already (an
#: export of "the latest iteration with adapters" must never merge them a second time).
BOOTSTRAP_ADAPTERS = "bootstrap_adapters"


class Bootstrap:
    """Iteration 0: the raw base in, M0 out (trained, merged, calibrated; its evaluation started). Built with the
    run's context (context.py) and the stages it runs: the probe's rollouts, the adapters' training, the
    calibration and the dev evaluations."""

    def __init__(self, run, rollouts, train, calibrate, evaluations) -> None:
        self.run = run
        self.rollouts = rollouts
        self.train = train
        self.calibrate = calibrate
        self.evaluations = evaluations

    def m0_state(self, bootstrapped: bool) -> ModelState:
        """M0 as the loop runs it (the merged model, or the raw base)."""
        if not bootstrapped:
            return self.run.raw_base()
        run_dir = self.run.run_dir
        return bootstrapped_m0(self.run.config, m0_path(run_dir), read_thresholds(run_dir / "iter_0"))

    def __call__(self, metrics: list[dict[str, Any]]) -> ModelState:
        """M0; its metrics go to `metrics` once it is evaluated."""
        cfg = self.run.config
        if cfg.bootstrap.mode == "always":
            bootstrap = True
        elif cfg.bootstrap.mode == "never":
            bootstrap = False
        else:
            bootstrap = self._probe()
        if not bootstrap:
            self._write_m0(str(self.run.base_path), bootstrapped=False)
            self.evaluations.base(metrics, m0=True)  # where it waited: M0's evaluation
            return self.run.raw_base()
        return self._bootstrap(metrics)

    def _probe(self) -> bool:
        """Bootstrap "auto": whether the raw base answers too few of the first train questions."""
        cfg = self.run.config
        folder = self.run.run_dir / "base"
        items = self.run.questions.rollout[: cfg.bootstrap.probe_questions]
        info = self.rollouts.stage(folder, "probe", "probe", self.run.raw_base(), items, "probe.jsonl",
                                   cfg.strategy.seed, "probe (raw base)", None)
        need = info["em"] < cfg.bootstrap.min_em
        log.info("bootstrap auto: the raw base answers %.3f of %d train questions (threshold %.3f): %s",
                 info["em"], info["questions"], cfg.bootstrap.min_em, "bootstrapping" if need else "no bootstrap")
        return need

    def _bootstrap(self, metrics: list[dict[str, Any]]) -> ModelState:
        """M0, trained and merged; its metrics go to `metrics` once it is evaluated (`Evaluations.evaluate`)."""
        cfg = self.run.config
        folder = self.run.run_dir / "iter_0"
        gold = self.run.stages.run(folder, "gold", lambda: self._gold(folder))
        kinds = self.run.record_kinds()
        records = read_sft(folder, kinds)
        if cfg.bootstrap.joint:
            groups = {"bootstrap": [r for k in kinds for r in records[k]]}
        else:
            groups = self.train.groups(records)
        entry = cached = None
        reuse = self.run.reuse
        if reuse.cache is not None:
            inputs = reuse.m0_inputs(groups)
            # M0's own key is what the keys of its evaluation and of iteration 1's rollouts know of it
            reuse.m0_key = reuse.cache.entry("m0", inputs).key
            # a run that has trained part of its M0 already finishes it, and stores it as an uninterrupted run does
            # (under the entry's lock: the store removes what a store of it that a kill cut short left)
            if not (is_done(folder, "merge") or any(is_done(folder, f"train_{a}") for a in groups)):
                entry, cached = reuse.lookup("m0", lambda: inputs, "M0 (iter_0/model)")
            elif not is_done(folder, "merge") and self.run.procs.is_main:
                entry = reuse.cache.entry("m0", inputs)
                reuse.cache.claim(entry, "M0 (iter_0/model)", self.run.run_dir)
        try:  # the M0 entry's lock (taken by the lookup) is held until M0 is stored or linked
            train_info = {}
            for i, (adapter, recs) in enumerate(groups.items()):
                if cached is not None:
                    body = lambda a=adapter: reused(cached["train"].get(a, {}), entry.path if entry else None,
                                                    self.run.procs)
                else:
                    body = lambda a=adapter, r=recs, i=i: self.train.adapter(
                        folder, a, r, self.run.base_path, cfg.bootstrap.train, seed=cfg.seed * 1000 + i,
                        subdir=BOOTSTRAP_ADAPTERS)
                train_info[adapter] = self.run.stages.run(folder, f"train_{adapter}", body)
            trained = [a for a, t in train_info.items() if t.get("records", 0) > 0]
            if not trained:
                raise RunError(f"bootstrap: no gold trajectory could be built from {len(self.run.questions.bootstrap)} "
                                 f"train questions ({gold.get('skipped')}); set bootstrap.mode: never or check the data")
            if cached is not None:
                merge = self.run.stages.run(folder, "merge", lambda: self._reuse_m0(folder, entry, cached))
            else:
                merge = self.run.stages.run(folder, "merge", lambda: self._merge(
                    folder, [folder / BOOTSTRAP_ADAPTERS / a for a in trained], entry, train_info))
        finally:
            reuse.release(entry)
        state = self.m0_state(bootstrapped=True)
        if not (Path(state.model) / "config.json").is_file():
            raise RunError(f"M0 of this run, {state.model} (m0.json), is gone or incomplete (a cleared reuse "
                             f"cache?); remove {folder / 'DONE.merge'} and the train_* markers beside it to rebuild it")
        state = self.calibrate(folder, state, cfg.strategy.seed)

        def finish(ev: dict[str, Any] | None) -> dict[str, Any]:
            m = {
                "iteration": 0,
                "model": "M0 (bootstrapped)",
                "gold": gold,
                "sft_records": {k: len(v) for k, v in records.items()},
                "sft_records_per_adapter": {a: len(r) for a, r in self.train.groups(records).items()},
                "train": train_info,
                "eval": ev,
                # M0 against the raw base on the dev questions (None where the base was not evaluated)
                # None where the raw base's evaluation comes later (the fixed schedule: it fills this in then)
                "vs_base": (self.evaluations.compare("base", base, folder)
                            if is_done(base := self.run.run_dir / "base", "eval") else None),
                "seconds": {
                    "gold": gold["seconds"],
                    "train": sum(t["seconds"] for t in train_info.values()),
                    "merge": merge["seconds"],
                    "eval": ev["seconds"],
                },
            }
            if self.run.procs.is_main:
                write_json(folder / "metrics.json", m)
            return m

        self.evaluations.evaluate(folder, state, cfg.strategy.seed, 0, finish, metrics, last=cfg.iterations == 0)
        return state

    def _gold(self, folder: Path) -> dict[str, Any]:
        cfg = self.run.config
        info: dict[str, Any] = {}
        if self.run.procs.is_main:
            res = self.run.method.gold_records(
                cfg.strategy, self.run.questions.bootstrap, self.run.retriever, fewshot=cfg.fewshot_trained,
                require_support=cfg.bootstrap.require_support, count_tokens=self.run.count_tokens, iteration=0,
                # the raw base, built only by a method whose gold labels ask it (MINTQA-dynamic's certainty)
                make_generator=lambda: self.run.build_generator(self.run.raw_base()),
                facts=self._facts(),
            )
            self.run.write_records(folder, res.records_by_role)
            write_json(folder / "gold.json", res.stats)
            info = {"items": res.stats["items"], "trajectories": res.stats["trajectories"],
                    "skipped": res.stats["skipped"], "records": res.stats["records"]}
        return self.run.procs.broadcast(info)

    def _facts(self):
        """The facts the corpus states (`data.facts`, facts.jsonl beside the corpus file, else the gold evidence of
        the bootstrap's and rollouts' questions): what gold completions write (data/facts.py)."""
        from knowtrace_train.data.facts import load_facts

        d = self.run.config.data
        q = self.run.questions
        corpus = d.corpus.path if d.corpus.source == "file" else None
        facts = load_facts(d.facts, corpus, [*q.bootstrap, *q.rollout])
        log.info("gold facts: %d from %s", len(facts), facts.source)
        return facts

    def _merge(self, folder: Path, adapters: list[Path], entry=None, train_info=None) -> dict[str, Any]:
        """Merge the bootstrap adapters into the base (iter_0/model = M0); with a reuse `entry`, store M0
        (and its adapters) in the cache for the next run."""
        import time

        from knowtrace_train.train.merge import merge_adapters_into_base

        t0 = time.perf_counter()
        info: dict[str, Any] = {"adapters": [a.name for a in adapters]}
        if self.run.procs.is_main:
            merge_adapters_into_base(self.run.base_path, adapters, folder / "model")
            self._write_m0(str(folder / "model"), bootstrapped=True)
            info["seconds"] = round(time.perf_counter() - t0, 3)
            if entry is not None:
                files = {"model": folder / "model", BOOTSTRAP_ADAPTERS: folder / BOOTSTRAP_ADAPTERS}
                self.run.reuse.cache.store(entry, files, {"train": train_info, "merge": info}, self.run.run_dir,
                                           link=True)
        return info

    def _reuse_m0(self, folder: Path, entry, cached: dict[str, Any]) -> dict[str, Any]:
        """M0 from the reuse cache: its model folder and adapters hard-linked into iter_0/ (no disk
        used), or, where the file system refuses links, m0.json pointing at the cache's folder."""
        how = None
        if self.run.procs.is_main:
            linked = link_tree(entry.path / "model", folder / "model")
            if linked and (entry.path / BOOTSTRAP_ADAPTERS).is_dir():
                linked = link_tree(entry.path / BOOTSTRAP_ADAPTERS, folder / BOOTSTRAP_ADAPTERS)
            self._write_m0(str(folder / "model" if linked else entry.path / "model"), bootstrapped=True)
            how = "hard links in iter_0/" if linked else "m0.json points at the cache folder"
            log.info("M0: %s", how)
        info = reused(cached.get("merge") or {}, entry.path if entry else None, self.run.procs)
        info["m0_files"] = self.run.procs.broadcast(how)
        return info

    def _write_m0(self, model: str, bootstrapped: bool) -> None:
        if not self.run.procs.is_main:
            return
        write_json(self.run.run_dir / "m0.json", {
            "path": run_relative(self.run.run_dir, model),
            "base_model": str(self.run.base_path),
            "bootstrapped": bootstrapped,
            "prompt_format": self.run.config.generator.prompt_format,
            # the strategy settings M0 runs with (its trained roles' prompts follow fewshot_trained)
            "strategy": config_to_dict(strategy_config(self.run.config, self.m0_state(bootstrapped),
                                                       self.run.config.strategy.seed)),
        })
