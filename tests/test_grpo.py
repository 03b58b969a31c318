"""mode: grpo: rewards, group-relative advantages and backtracing's credit rule on hand-built groups, TRL's GRPO loss
on given rows (M0 the reference), the loop (the policy continues across iterations) and a killed run's resumption."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from backtrace_fixtures import appendix_f, words

from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.methods import get_method
from knowtrace_train.selftrain.config import SelfTrainConfig, learning_mode
from knowtrace_train.train.config import LoraTrainConfig
from knowtrace_train.train.grpo import GRPOSettings
from knowtrace_train.train.grpo import (
    group_advantages,
    grpo_records,
    train_role_grpo,
    trajectory_reward,
)

KINDS = ("explore", "complete", "answer")


def _sample(k: int, em: float, f1: float, errors: int = 0):
    """appendix_f's trajectory as sample k of its question, scored em/f1, its first `errors` calls unparsed."""
    t = appendix_f()
    t.id = f"{t.id}#s{k}"
    t.em, t.f1 = em, f1
    for c in t.calls[:errors]:
        c.error = "unparsed"
    return t


def _group():
    # right (F1 1); wrong (F1 0); wrong with a partial answer (F1 0.5) and one unparsed call
    return [_sample(0, 1.0, 1.0), _sample(1, 0.0, 0.0), _sample(2, 0.0, 0.5, errors=1)]


def test_rewards_and_advantages_of_a_hand_built_group():
    """reward = F1 + 0.1 x (2 x parsed/calls - 1): 1.1, 0.1 and 0.5 + 0.1 x (10/6 - 1) = 0.5667; mean 0.5889,
    sample std 0.50037: advantages +1.0213, -0.9769, -0.0444 (TRL's (r - mean) / (std + 1e-4))."""
    g = GRPOSettings()
    rewards = [trajectory_reward(t, g) for t in _group()]
    assert rewards == pytest.approx([1.1, 0.1, 0.566667], abs=1e-6)
    assert group_advantages(rewards) == pytest.approx([1.0213, -0.9769, -0.0444], abs=1e-4)
    assert group_advantages(rewards, "none") == pytest.approx([0.511111, -0.488889, -0.022222], abs=1e-6)
    em = GRPOSettings(reward="em", format_weight=0.0)
    assert [trajectory_reward(t, em) for t in _group()] == [1.0, 0.0, 0.0]


def test_equal_rewards_teach_nothing_and_an_unparsed_trajectory_gets_the_format_penalty():
    g = GRPOSettings()
    assert group_advantages([0.1, 0.1, 0.1]) is None and group_advantages([1.0]) is None
    dead = _sample(0, 0.0, 0.0, errors=6)
    empty = _sample(1, 0.0, 0.0)
    empty.calls = []
    assert trajectory_reward(dead, g) == pytest.approx(-0.1) and trajectory_reward(empty, g) == pytest.approx(-0.1)
    rows, stats = grpo_records([_sample(0, 0.0, 0.0), _sample(1, 0.0, 0.0)], g, kinds=KINDS, credited={})
    assert stats["groups"] == 1 and stats["groups_skipped_equal_rewards"] == 1 and stats["groups_trained"] == 0
    assert stats["skipped_group_questions"] == [appendix_f().question_id] and not any(rows.values())


def test_rows_carry_their_trajectorys_advantage_and_backtracing_masks_the_dropped_call():
    """Backtracing keeps calls 0, 1, 3, 4 and 5 of the correct sample and drops call 2 (a completion none of whose
    triplets reached the evidence subgraph): under credit backtrace that call gets no positive advantage; the
    wrong samples' calls all carry their (negative) advantages; under credit outcome every call carries its
    trajectory's."""
    group = _group()
    credited = get_method("knowtrace").credited_calls(group, strategy=get_method("knowtrace").config_class(),
                                                      count_tokens=words)
    assert credited == {group[0].id: {0, 1, 3, 4, 5}}
    adv = dict(zip([t.id for t in group], group_advantages([trajectory_reward(t, GRPOSettings()) for t in group])))
    rows, stats = grpo_records(group, GRPOSettings(), kinds=KINDS, credited=credited, iteration=3)
    got = sorted((r["trajectory_id"], r["call"], r["role"], round(r["advantage"], 4)) for k in KINDS for r in rows[k])
    want = sorted((t.id, c.index, c.role, round(adv[t.id], 4)) for t in group for c in t.calls
                  if not (t is group[0] and c.index == 2))
    assert got == want
    assert stats["masked_by_credit"] == 1 and stats["rows_positive"] == 5 and stats["rows_negative"] == 12
    row = next(r for r in rows["complete"] if r["trajectory_id"] == group[0].id and r["call"] == 1)
    call = group[0].calls[1]
    assert (row["prompt"], row["completion"], row["iteration"], row["question_id"]) == (
        call.prompt, call.output, 3, group[0].question_id)
    assert row["reward"] == pytest.approx(1.1)
    outcome, ostats = grpo_records(group, GRPOSettings(credit="outcome"), kinds=KINDS, credited=None)
    assert ostats["masked_by_credit"] == 0 and sum(map(len, outcome.values())) == 18
    assert stats["reward_mean"] == pytest.approx((1.1 + 0.1 + 0.566667) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="credit: backtrace needs the method's credit rule"):
        grpo_records(group, GRPOSettings(), kinds=KINDS, credited=None)


def test_a_correct_trajectory_backtracing_cannot_trace_earns_no_positive_credit():
    t = _sample(0, 1.0, 1.0)
    t.prediction = "Somewhere else entirely"  # the answer names no graph entity: no path to the evidence
    t.answers = ["Somewhere else entirely"]
    for c in t.calls:
        if isinstance(c.parsed, dict) and "answer" in c.parsed:
            c.parsed = {**c.parsed, "answer": "Somewhere else entirely", "thought": "It is somewhere else entirely."}
    t.thought = "It is somewhere else entirely."
    credited = get_method("knowtrace").credited_calls([t], strategy=get_method("knowtrace").config_class(),
                                                      count_tokens=words)
    assert credited == {t.id: set()}
    wrong = _sample(1, 0.0, 0.0)
    rows, stats = grpo_records([t, wrong], GRPOSettings(), kinds=KINDS, credited=credited)
    assert stats["masked_by_credit"] == len(t.calls) and stats["rows_positive"] == 0
    assert {r["trajectory_id"] for k in KINDS for r in rows[k]} == {wrong.id}


ROWS = [{"prompt": f"Who wrote book {i}?", "completion": f"Author {i} wrote it.", "advantage": 1.0 if i % 2 else -1.0,
         "reward": 1.0 if i % 2 else 0.0, "role": "explore"} for i in range(8)]


def _completion_logps(model, tokenizer, rows):
    from knowtrace_train.train.lora import encode_record

    out = []
    for r in rows:
        p, c = encode_record(tokenizer, r["prompt"], r["completion"], "chat")
        with torch.no_grad():
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float()
        out.append(float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).sum()))
    return out


def test_grpo_steps_raise_positive_rows_and_lower_negative_ones_and_continue_an_adapter(tiny_model_dir, real_tokenizer,
                                                                                      tmp_path):
    """TRL's loss on the given rows: after the steps the positive-advantage calls are likelier than under M0 and
    the negative ones less likely; the KL to M0 (the adapter disabled) is logged; a second call continues the
    saved adapter instead of starting a new one."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = LoraTrainConfig(logging_steps=1, seed=3)
    g = GRPOSettings(batch_size=4, epochs=3, learning_rate=1e-2, beta=0.0)
    res, fig = train_role_grpo(tiny_model_dir, ROWS, tmp_path / "a", cfg, g, role="explore", temperature=1.0)
    assert res.steps == 6 and res.records == 8 and fig["positive"] == 4 and fig["negative"] == 4
    assert fig["from"] == "new adapter on M0" and fig["steps_per_pass"] == 2 and res.tokens > 0
    info = json.loads((tmp_path / "a/knowtrace_training.json").read_text())
    assert info["grpo"]["credit"] == "backtrace" and info["config"]["per_device_batch_size"] == 4
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    before = _completion_logps(base, real_tokenizer, ROWS)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), str(tmp_path / "a"))
    after = _completion_logps(tuned, real_tokenizer, ROWS)
    up = [a - b for a, b, r in zip(after, before, ROWS) if r["advantage"] > 0]
    down = [a - b for a, b, r in zip(after, before, ROWS) if r["advantage"] < 0]
    assert all(math.isfinite(x) for x in up + down) and sum(up) / 4 > 0 > sum(down) / 4
    res2, fig2 = train_role_grpo(tiny_model_dir, ROWS[:4], tmp_path / "b", cfg, GRPOSettings(batch_size=4, beta=0.1),
                                 role="explore", temperature=1.0, init_adapter=tmp_path / "a")
    assert fig2["from"] == "previous adapter" and res2.steps == 1
    assert fig2["log"][0]["kl"] > 0  # the continued adapter starts away from M0



def test_accumulated_passes_take_the_same_steps_as_whole_ones(tiny_model_dir, tmp_path):
    """grpo.per_device_batch_size 2 with batch_size 4: two passes of 2 rows per optimizer step give the adapter of
    one pass of 4 (TRL's token normalisation spans the accumulation), up to float rounding (a pass of 2 pads its
    prompts less: measured 1.8e-5 apart after two steps at rate 1e-2). In fp32 on every machine: on a CPU with native
    bf16, `auto` trains in bf16, which rounds the two ways' sums differently by more than that."""
    from safetensors.torch import load_file

    cfg = LoraTrainConfig(logging_steps=1, seed=5, precision="fp32")
    whole, _ = train_role_grpo(tiny_model_dir, ROWS, tmp_path / "whole", cfg,
                               GRPOSettings(batch_size=4, learning_rate=1e-2), role="explore", temperature=1.0)
    parts, _ = train_role_grpo(tiny_model_dir, ROWS, tmp_path / "parts", cfg,
                               GRPOSettings(batch_size=4, per_device_batch_size=2, learning_rate=1e-2), role="explore",
                               temperature=1.0)
    assert whole.steps == parts.steps == 2 and parts.gradient_accumulation_steps == 2
    a, b = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("whole", "parts"))
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
    assert whole.losses == pytest.approx(parts.losses, abs=1e-5)
    with pytest.raises(ConfigError, match=r"grpo.batch_size 4 is not a multiple of grpo.per_device_batch_size 3"):
        load_config(SelfTrainConfig, None, ["--grpo.batch_size", "4", "--grpo.per_device_batch_size", "3"])


def test_grpo_rows_need_a_finite_advantage_named_in_the_error(tiny_model_dir, tmp_path):
    from knowtrace_train.train.lora import SFTRecordError

    bad = [dict(ROWS[0], advantage=float("nan"))]
    with pytest.raises(SFTRecordError, match=r"field 'advantage' must be a finite number"):
        train_role_grpo(tiny_model_dir, bad, tmp_path / "x", LoraTrainConfig(), GRPOSettings(), role="explore",
                        temperature=1.0)


def test_grpo_settings_are_checked_naming_the_key():
    for args, match in [(["--grpo.credit", "evidence"], r"grpo.credit must be one of \['backtrace', 'outcome'\]"),
                        (["--grpo.reward", "acc"], r"grpo.reward must be one of"),
                        (["--grpo.batch_size", "0"], r"grpo.batch_size must be an integer >= 1"),
                        (["--grpo.beta", "-1"], r"grpo.beta must be a number >= 0"),
                        (["--eval_every", "0"], r"eval_every must be an integer >= 1")]:
        with pytest.raises(ConfigError, match=match):
            load_config(SelfTrainConfig, None, args)
    one = load_config(SelfTrainConfig, None, ["--mode", "grpo"])
    with pytest.raises(ValueError, match=r"mode: grpo compares a question's samples: set rollout.samples >= 2"):
        one._check_mode()
    trace = load_config(SelfTrainConfig, None, ["--mode", "grpo", "--strategy.name", "self_ask", "--rollout.samples",
                                                "4", "--rollout.temperature", "0.7"])
    with pytest.raises(ValueError, match=r"grpo.credit: backtrace needs a method whose calls backtracing credits "
                                         r"\(knowtrace\); method 'self_ask' has none"):
        trace._check_mode()
    assert learning_mode("grpo", {"backtrace": 0, "star": 0}) == ("backtrace", "grpo")


def _grpo_overrides(tmp_path, model_dir, **extra):
    from selftrain_helpers import tiny_overrides

    values = {"iterations": 2, "mode": "grpo", "bootstrap.mode": "never", "rollout.samples": 2,
              "rollout.temperature": 1.0, "grpo.batch_size": 8, "grpo.learning_rate": 1e-3, "eval_every": 2,
              "data.train_questions": 4, "fewshot_trained": True}  # the oracle knows the few-shot prompts
    values.update(extra)
    return tiny_overrides(tmp_path, model_dir, **values)


def _adapter_tensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_grpo_iterations_through_the_loop_continue_the_policy_and_a_killed_run_resumes_to_the_same_adapter(
        tmp_path, tiny_model_dir, monkeypatch):
    """Two GRPO iterations on the tiny model (sampled: the samples' format terms differ): iteration 1 trains
    each role from a new adapter, iteration 2 continues iteration 1's; only the last is evaluated (eval_every 2);
    the reward curve and the groups are in metrics.json. Killed in iteration 2's training and started again, the
    run keeps iteration 1's adapters as they were and ends with the adapters of the run that was never killed."""
    from selftrain_helpers import coin_oracle_factory

    import knowtrace_train.train.grpo as grpo_module
    from knowtrace_train.selftrain import SelfTrain

    def run(folder):
        r = SelfTrain(load_config(SelfTrainConfig, None, _grpo_overrides(folder, tiny_model_dir)), progress=False)
        r.make_generator = coin_oracle_factory(r)
        r.run()
        return r

    whole = run(tmp_path / "whole")
    m1 = json.loads((whole.run_dir / "iter_1/metrics.json").read_text())
    m2 = json.loads((whole.run_dir / "iter_2/metrics.json").read_text())
    g = m1["rationale"]["grpo"]
    assert g["trajectories"] == 8 and g["groups"] == 4 and g["groups_trained"] >= 1 and g["reward_mean"] is not None
    trained = [r for r, t in m1["train"].items() if t.get("records", 0) > 0]
    assert trained and all(m1["train"][r]["grpo"]["from"] == "new adapter on M0" for r in trained)
    assert m1["eval"] is None and m2["eval"] is not None and m2["vs_m0"] is not None
    again = [r for r, t in m2["train"].items() if t.get("records", 0) > 0]
    assert all(m2["train"][r]["grpo"]["from"] == "previous adapter" for r in again if r in trained)
    assert set(m2["adapters"]) >= set(trained)  # a role without rows keeps iteration 1's adapter

    calls = {"n": 0}
    real = grpo_module.train_role_grpo

    def dies_in_iteration_2(base, rows, out, *a, **kw):
        if "iter_2" in str(out):
            raise KeyboardInterrupt("killed")
        calls["n"] += 1
        return real(base, rows, out, *a, **kw)

    monkeypatch.setattr(grpo_module, "train_role_grpo", dies_in_iteration_2)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed")
    monkeypatch.setattr(grpo_module, "train_role_grpo", real)
    kdir = tmp_path / "killed" / "run"
    first = {r: copy.deepcopy(_adapter_tensors(kdir / "iter_1/adapters" / r)) for r in trained}
    run(tmp_path / "killed")
    for r in trained:
        for k, v in _adapter_tensors(kdir / "iter_1/adapters" / r).items():
            assert torch.equal(v, first[r][k])
    for r in again:
        want = _adapter_tensors(whole.run_dir / "iter_2/adapters" / r)
        got = _adapter_tensors(kdir / "iter_2/adapters" / r)
        assert want.keys() == got.keys() and all(torch.allclose(want[k], got[k], atol=1e-6) for k in want)


def test_the_cpu_completion_head_gives_trls_log_probabilities_and_entropies(tiny_model_dir, real_tokenizer, tmp_path):
    """RowsGRPOTrainer scores only the completion positions on CPUs; TRL's fused head scores every position: the
    same per-token log probabilities and entropies, at a temperature too."""
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from knowtrace_train.train.grpo import (
        encode_rows,
        grpo_args,
        row_rewards,
        rows_trainer_class,
    )
    from knowtrace_train.train.lora import lora_config

    rows, _ = encode_rows(real_tokenizer, ROWS[:3], "explore", "chat", 1024)
    cfg = LoraTrainConfig()
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), lora_config(cfg))
    trainer = rows_trainer_class()(
        model=model, reward_funcs=[row_rewards], args=grpo_args(cfg, GRPOSettings(), 1, 0.7, "fp32", "cpu", str(tmp_path)),
        processing_class=real_tokenizer, rows=rows, train_dataset=Dataset.from_list([{"prompt": "", "reward": 0.0}] * 3))
    step = trainer._score_rows(rows, 1)[0]
    ids = torch.cat([step["prompt_ids"], step["completion_ids"]], 1)
    mask = torch.cat([step["prompt_mask"], step["completion_mask"]], 1)
    k = step["completion_ids"].size(1)
    with torch.no_grad():
        ours = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, k, compute_entropy=True)
        trls = super(type(trainer), trainer)._get_per_token_logps_and_entropies(trainer.model, ids, mask, k,
                                                                                compute_entropy=True)
    keep = step["completion_mask"].bool()
    assert torch.allclose(ours[0][keep], trls[0][keep], atol=1e-4)
    assert torch.allclose(ours[1][keep], trls[1][keep], atol=1e-4)


def test_the_grpo_configs_load_and_size_the_gpu_passes():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "recipes" / "configs"
    cpu = load_config(SelfTrainConfig, configs / "selftrain_grpo.yaml")
    cpu.validate()
    assert cpu.mode == "grpo" and cpu.rollout.samples == 4 and cpu.rollout.questions == 8 and cpu.grpo.credit == "backtrace"
    assert {k: v for k, v in vars(cpu).items() if k not in ("mode", "name", "iterations", "eval_every", "on_empty",
                                                              "rollout", "grpo")} == {
        k: v for k, v in vars(SelfTrainConfig()).items() if k not in ("mode", "name", "iterations", "eval_every",
                                                                      "on_empty", "rollout", "grpo")}
    gpu = load_config(SelfTrainConfig, configs / "selftrain_grpo_gpu.yaml")
    assert gpu.generator.backend == "vllm" and "Llama-3" in gpu.generator.model and gpu.train.gradient_checkpointing
    assert gpu.grpo.rows_per_pass == 2 and gpu.grpo.accumulation == 8 and gpu.train.max_length == 4096
    gpu._check_mode()


def test_rollout_questions_take_the_next_slice_of_d_each_iteration_wrapping_round():
    from types import SimpleNamespace

    from knowtrace_train.selftrain.rollout_stage import Rollouts

    run = SimpleNamespace(questions=SimpleNamespace(rollout=list("abcde")),
                          config=SimpleNamespace(rollout=SimpleNamespace(questions=2)))
    assert [Rollouts(run).items(z) for z in (1, 2, 3, 4)] == [
        ["a", "b"], ["c", "d"], ["e", "a"], ["b", "c"]]
    run.config.rollout.questions = None
    assert Rollouts(run).items(3) == list("abcde")
    with pytest.raises(ConfigError, match=r"rollout.questions must be an integer >= 1 or null"):
        load_config(SelfTrainConfig, None, ["--rollout.questions", "0"])
