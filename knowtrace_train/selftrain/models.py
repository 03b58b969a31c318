"""The models of the loop: a model state (weights and an adapter per role), the generator and strategy
settings it runs with, and the model of any iteration of a finished run folder (for `evaluate --run`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from knowtrace_train.errors import RunError
from knowtrace_train.io import iter_jsonl, read_json
from knowtrace_train.methods import StrategyConfig, get_method
from knowtrace_train.selftrain.config import SelfTrainConfig, read_run_config


@dataclass(frozen=True)
class ModelState:
    """A model of the loop: weights (`model`, a folder or alias) and the adapter of each role.
    `trained` names the generator roles whose weights were trained (by the bootstrap or an adapter):
    their prompts follow `fewshot_trained`; untrained roles keep the strategy's exemplars. `thresholds`: its
    decisions' thresholds as calibrated for it ({decision kind: threshold}; none: greedy decisions)."""

    name: str
    model: str
    adapters: Mapping[str, str] = field(default_factory=dict)
    trained: frozenset[str] = frozenset()
    thresholds: Mapping[str, float] = field(default_factory=dict)


#: a model's calibration (knowtrace_train.decisions.calibrate), in the folder of the stage that made the model
CALIBRATION_FILE = "calibration.json"


def read_thresholds(folder: Path) -> dict[str, float] | None:
    """The decision thresholds calibrated in `folder` (iter_<z>/calibration.json); None where it was not calibrated."""
    from knowtrace_train.decisions import thresholds_of

    path = Path(folder) / CALIBRATION_FILE
    if not path.is_file():
        return None
    return thresholds_of(read_json(path).get("decisions"))


def read_records(path: Path) -> list[dict[str, Any]]:
    """The SFT records of a sft_<kind>.jsonl file (none where it does not exist)."""
    return [obj for _, obj in iter_jsonl(path)] if path.is_file() else []


def read_sft(folder: Path, kinds) -> dict[str, list[dict[str, Any]]]:
    """The records of each call kind of `kinds` that a stage wrote in `folder` (sft_<kind>.jsonl)."""
    return {k: read_records(Path(folder) / f"sft_{k}.jsonl") for k in kinds}


def generator_config(config: SelfTrainConfig, state: ModelState):
    """The run's generator settings for `state`: its weights and adapters; the method's roles without
    an adapter run on the base weights."""
    adapters = {k: str(v) for k, v in state.adapters.items()}
    used = get_method(config.strategy.name).generator_roles(config.strategy)
    base_roles = tuple(sorted(used - set(adapters))) if adapters else ()
    return dataclasses.replace(config.generator, model=state.model, adapters=adapters, base_roles=base_roles)


def strategy_config(config: SelfTrainConfig, state: ModelState, seed: int) -> StrategyConfig:
    """The strategy settings `state` runs with (the method's prompts for trained roles) and `seed`."""
    method = get_method(config.strategy.name)
    strategy = method.with_seed(method.for_model(config.strategy, state.trained, config.fewshot_trained), seed)
    return method.with_thresholds(strategy, state.thresholds) if state.thresholds else strategy


def rollout_strategy_config(config: SelfTrainConfig, state: ModelState, seed: int) -> StrategyConfig:
    """`strategy_config` at the rollouts' temperature (`rollout.temperature`, where set)."""
    strategy = strategy_config(config, state, seed)
    if config.rollout.temperature is None:
        return strategy
    return dataclasses.replace(strategy, temperature=float(config.rollout.temperature))


def sampling(config: SelfTrainConfig, state: ModelState, seed: int, rollout: bool) -> tuple[StrategyConfig, int]:
    """The strategy and samples per question of an iteration's rollout (`rollout`: `rollout.*`), or of an
    evaluation (the strategy's own decoding, one trajectory per question)."""
    if rollout:
        return rollout_strategy_config(config, state, seed), config.rollout.samples
    return strategy_config(config, state, seed), 1


@dataclass(frozen=True)
class RunModel:
    """The model of one iteration of a run folder, with the settings the loop evaluated it with."""

    state: ModelState
    #: the seed the loop's dev evaluation of this model used
    seed: int
    config: SelfTrainConfig

    @property
    def generator(self):
        return generator_config(self.config, self.state)

    @property
    def strategy(self) -> StrategyConfig:
        return strategy_config(self.config, self.state, self.seed)


def run_model(run_dir: str | Path, iteration: str | int) -> RunModel:
    """The model of `iteration` of the run in `run_dir`: "base" (the raw model), 0 (M0: the bootstrapped
    model, or the raw base where the run had no bootstrap), z (M0 with iteration z's adapters; an
    iteration that trained nothing is the model before it) or "last" (the last iteration with a model).
    Raises ValueError naming the file that is missing or wrong."""
    run_dir = Path(run_dir)
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.is_file():
        raise RunError(f"{run_dir}: not a self-training run folder (no config.yaml)")
    config = read_run_config(cfg_file)
    base = ModelState(name="base", model=config.generator.model)
    if str(iteration) == "base":
        return RunModel(base, config.strategy.seed, config)
    if str(iteration) == "last":
        done = sorted(int(p.name[5:]) for p in run_dir.glob("iter_*") if p.name[5:].isdigit()
                      and (p / "metrics.json").is_file())
        if not done:
            raise RunError(f"{run_dir}: no iteration has finished (no iter_<z>/metrics.json)")
        iteration = done[-1]
    try:
        z = int(iteration)
    except ValueError:
        raise RunError(f"iteration must be base, last or an integer >= 0, got {iteration!r}") from None
    if z < 0:
        raise RunError(f"iteration must be base, last or an integer >= 0, got {z}")
    if z > config.iterations:
        raise RunError(f"{run_dir}: the run has {config.iterations} iteration(s) (config.yaml), so iteration {z} does "
                       f"not exist: pass --iteration 0..{config.iterations}, base or last")
    m0 = _m0_state(run_dir, config, base)
    state = m0
    for k in range(1, z + 1):
        metrics = run_dir / f"iter_{k}" / "metrics.json"
        if not metrics.is_file():
            raise RunError(f"{metrics}: iteration {k} of {run_dir} has not finished")
        m = read_json(metrics)
        adapters = {a: str(_in_run(run_dir, p)) for a, p in (m.get("adapters") or {}).items()}
        state = next_model(k, state, m0, {} if m.get("status") == "empty" else adapters)
        calibrated = read_thresholds(run_dir / f"iter_{k}")
        if calibrated is not None:
            state = dataclasses.replace(state, thresholds=calibrated)
    return RunModel(state, config.strategy.seed + z, config)


def next_model(z: int, prev: ModelState, m0: ModelState, adapters: Mapping[str, str]) -> ModelState:
    """M(z), the model of iteration z's `adapters` (those it trained, with M(z-1)'s that a continued policy keeps):
    M0 with them, deciding greedily until calibrated for them; M(z-1) under its new name where there are none. The
    loop builds it so (`SelfTrain._iteration`) and so does `run_model` from the run's files."""
    if not adapters:
        return dataclasses.replace(prev, name=f"M{z}")
    return ModelState(name=f"M{z}", model=m0.model, adapters=adapters, trained=m0.trained | frozenset(adapters))


def bootstrapped_m0(config: SelfTrainConfig, model: str | Path, thresholds: Mapping[str, float] | None = None
                    ) -> ModelState:
    """M0 after a bootstrap: the merged model at `model`, every generator role the method's records
    train counted as trained (their prompts follow `fewshot_trained`), deciding with `thresholds`."""
    trained = frozenset(get_method(config.strategy.name).record_roles(config.strategy).values())
    return ModelState(name="M0", model=str(model), trained=trained, thresholds=dict(thresholds or {}))


def recorded_m0_path(run_dir: Path) -> Path | None:
    """The merged M0's folder that the run's m0.json names (relative to the run folder unless absolute);
    None where there is no m0.json, or it records no bootstrap or no path."""
    m0_file = run_dir / "m0.json"
    if not m0_file.is_file():
        return None
    m0 = read_json(m0_file)
    return _in_run(run_dir, m0["path"]) if m0.get("bootstrapped") and m0.get("path") else None


def m0_path(run_dir: Path) -> Path:
    """The merged M0's folder: iter_0/model, or the reuse cache's folder that m0.json names."""
    return recorded_m0_path(run_dir) or run_dir / "iter_0" / "model"


def _m0_state(run_dir: Path, config: SelfTrainConfig, base: ModelState) -> ModelState:
    if not (run_dir / "m0.json").is_file():
        raise RunError(f"{run_dir / 'm0.json'}: the run has no M0 yet")
    path = recorded_m0_path(run_dir)
    return base if path is None else bootstrapped_m0(config, path, read_thresholds(run_dir / "iter_0"))


def run_relative(run_dir: Path, p: str | Path) -> str:
    """A path as a run's files record it: relative to the run folder when inside it, else as given
    (the inverse of `_in_run`)."""
    try:
        return str(Path(p).resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        return str(p)


def _in_run(run_dir: Path, p: str) -> Path:
    """A path as a run's files record it: relative to the run folder unless absolute."""
    return Path(p) if Path(p).is_absolute() else run_dir / p
