"""Training modes as a registry (knowtrace_train/train/modes.py): the built-in three by name, and a toy mode
registered from this one file that the self-training loop runs an iteration with, asking the registry only."""

from __future__ import annotations

import dataclasses
import json

import pytest

from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.train.lora import train_role
from knowtrace_train.train.modes import MODES, TrainingMode, get_mode, register, resolve, trained_info, unregister


def test_the_builtin_modes_are_registered_by_name():
    assert {"sft", "kto", "grpo"} <= set(MODES)
    assert get_mode("grpo").continues_policy and not get_mode("kto").continues_policy
    assert resolve("kto", {"backtrace": 0, "star": 0}) == ("backtrace", get_mode("kto"))
    assert resolve("star", {"star": 0}) == ("star", get_mode("sft"))
    with pytest.raises(KeyError, match="unknown training mode 'dpo'"):
        get_mode("dpo")
    with pytest.raises(ConfigError, match="mode must be one of"):
        load_config(SelfTrainConfig, None, ["--mode", "toy_every_other"])  # not registered here


class EveryOtherRecord(TrainingMode):
    """A toy mode: SFT on every other record of the STaR rationalizer's, reported under "toy"."""

    name = "toy_every_other"
    rationalizers = ("star",)
    rationale_keys = ("toy",)

    def records(self, records, stats, **_):
        halved = {k: v[::2] for k, v in records.items()}
        return halved, {**stats, "toy": {k: [len(records[k]), len(v)] for k, v in halved.items()}}

    def train(self, records, *, base, output_dir, train, seed, config, role, where, init_adapter):
        rows, empty = self.usable(records)
        if not rows:
            return {"records": 0, "empty_completions": empty}
        res = train_role(base, rows, output_dir, dataclasses.replace(train, seed=seed), role=role)
        return {"toy": True, **trained_info(res, seed)}


@pytest.fixture
def toy_mode():
    register(EveryOtherRecord())
    yield MODES["toy_every_other"]
    unregister("toy_every_other")


def test_a_mode_registered_from_one_file_runs_an_iteration(tmp_path, tiny_model_dir, toy_mode):
    from selftrain_helpers import oracle_factory, tiny_overrides

    from knowtrace_train.selftrain import SelfTrain

    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, iterations=1,
                                                            mode="toy_every_other"))
    run = SelfTrain(cfg, progress=False)
    assert run.training_mode is toy_mode
    run.make_generator = oracle_factory(run)
    run.run()
    it = run.run_dir / "iter_1"
    m = json.loads((it / "metrics.json").read_text())
    rationale = json.loads((it / "rationale.json").read_text())
    assert rationale["mode"] == "star" and m["rationale"]["toy"] == rationale["toy"]
    for kind, (before, after) in rationale["toy"].items():
        assert after == (before + 1) // 2
        assert len((it / f"sft_{kind}.jsonl").read_text().splitlines()) == after
    trained = {a: t for a, t in m["train"].items() if t["records"]}
    assert trained and all(t["toy"] is True for t in trained.values())
    assert all((it / "adapters" / a / "adapter_config.json").is_file() for a in trained)
