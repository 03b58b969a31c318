"""mode: kto: the rationalizers' undesirable records, TRL's KTO on them (M0 the reference), the loop and its config."""

from __future__ import annotations

import json
import math

import pytest
import torch
from backtrace_fixtures import appendix_f, words

from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.methods.knowtrace.backtrace import backtrace_trajectories
from knowtrace_train.methods.star import star_records
from knowtrace_train.selftrain.config import SelfTrainConfig, learning_mode
from knowtrace_train.train.config import LoraTrainConfig
from knowtrace_train.train.kto import KTOSettings
from knowtrace_train.train.kto import (
    cap_undesirable,
    class_weights,
    kto_args,
    labelled_rows,
    train_role_kto,
)
from knowtrace_train.train.lora import SFTRecordError, encode_record
from knowtrace_train.train.trainer import counting_trainer_class

# -- the rationalizers' labels ------------------------------------------------------------------------------


def _wrong(traj):
    traj.em = 0.0
    traj.id = traj.id + "-wrong"
    return traj


def test_backtracing_labels_the_kept_calls_and_the_wrong_trajectories_calls():
    """With undesirable ["incorrect"], every record carries a label: the calls backtracing keeps (true) and every
    call of the wrong trajectory, written as STaR writes a correct one's (false). The FA ratio and every other
    statistic stay those of the correct trajectories alone."""
    plain = backtrace_trajectories([appendix_f()], count_tokens=words)
    labelled = backtrace_trajectories([appendix_f(), _wrong(appendix_f())], count_tokens=words, undesirable=["incorrect"])
    star = backtrace_trajectories([appendix_f()], count_tokens=words, mode="star")
    for role in ("explore", "complete"):
        good = [r for r in labelled.records_by_role[role] if r["label"]]
        bad = [r for r in labelled.records_by_role[role] if not r["label"]]
        assert [{k: v for k, v in r.items() if k != "label"} for r in good] == plain.records_by_role[role]
        assert [r["completion"] for r in bad] == [r["completion"] for r in star.records_by_role[role]]
        assert all(r["trajectory_id"].endswith("-wrong") for r in bad) and bad
    for key in ("fa_ratio", "tokens_all", "tokens_filtered", "correct", "backtraced", "roles"):
        assert labelled.stats[key] == plain.stats[key], key
    u = labelled.stats["undesirable"]
    assert u["sources"] == ["incorrect"] and u["records"]["explore"] == len(star.records_by_role["explore"])
    assert "label" not in plain.records_by_role["explore"][0] and "undesirable" not in plain.stats


def test_backtracing_can_label_the_calls_it_filters_whole_as_undesirable():
    """appendix_f asks one unavailing pair in an exploration of its own: backtracing drops that call, and with
    undesirable ["filtered"] it is an undesirable record (its full output); the kept calls are unchanged."""
    plain = backtrace_trajectories([appendix_f()], count_tokens=words)
    star = backtrace_trajectories([appendix_f()], count_tokens=words, mode="star")
    res = backtrace_trajectories([appendix_f()], count_tokens=words, undesirable=["filtered"])
    from knowtrace_train.methods.knowtrace.backtrace.filters import filter_trajectory
    from knowtrace_train.methods.knowtrace.backtrace.paths import backtrace
    from knowtrace_train.methods.knowtrace.config import DEFAULT_PATH_RULE

    traj = appendix_f()
    whole = [fc.full_output for fc in filter_trajectory(traj, backtrace(traj, DEFAULT_PATH_RULE).evidence, words)
             if fc.role == "complete" and fc.output is None and fc.full_output]
    bad = [r["completion"] for r in res.records_by_role["complete"] if not r["label"]]
    assert whole and bad == whole and res.stats["undesirable"]["by_source"]["complete"]["filtered"] == len(bad)
    assert set(bad) <= {r["completion"] for r in star.records_by_role["complete"]}
    assert [r for r in res.records_by_role["complete"] if r["label"]] == [dict(r, label=True) for r in plain.records_by_role["complete"]]


def test_unknown_undesirable_source_is_refused():
    with pytest.raises(ValueError, match="undesirable sources must be among"):
        backtrace_trajectories([appendix_f()], count_tokens=words, undesirable=["wrong"])


def test_the_generic_star_rationalizer_labels_wrong_trajectories_calls():
    ok, bad = appendix_f(), _wrong(appendix_f())
    res = star_records([ok, bad], {}, count_tokens=words, undesirable=["incorrect"])
    plain = star_records([ok], {}, count_tokens=words)
    for role, recs in res.records_by_role.items():
        assert [r["label"] for r in recs] == [True] * len(plain.records_by_role[role]) + [False] * (len(recs) - len(plain.records_by_role[role]))
    assert res.stats["tokens_all"] == plain.stats["tokens_all"] and res.stats["correct"] == 1
    assert sum(res.stats["undesirable"]["records"].values()) == sum(len(v) for v in plain.records_by_role.values())


# -- the trainer --------------------------------------------------------------------------------------------

RECORDS = [{"prompt": f"Question {i}: where was person {i} born?", "completion": f"Answer: in town {i % 4}",
            "label": i % 3 != 0} for i in range(12)]


def test_trl_tokenizes_the_rows_as_the_sft_trainer_does(tiny_model_dir, real_tokenizer, tmp_path):
    """The texts handed to TRL's KTOTrainer become, after its own tokenization, the token ids the SFT trainer
    trains on (and the generator feeds): the prompt ids and the completion ids up to the end of the turn."""
    prompt_format = "chat"
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from knowtrace_train.train.lora import lora_config

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    recs = RECORDS[:4] + [{"prompt": "Passages:\n(1) Ann: born in Rome.\nPair: (Ann; born in)\nTriplets:",
                           "completion": "(Ann; born in; Rome)\n(Rome; capital of; Italy)", "label": False}]
    rows, skipped = labelled_rows(tok, recs, "explore", prompt_format, 1024)
    assert skipped == 0
    cfg = LoraTrainConfig(epochs=1, effective_batch_size=4, prompt_format=prompt_format)
    args = kto_args(cfg, KTOSettings(), (1.0, 1.0), "fp32", "cpu", str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    trainer = counting_trainer_class("kto")(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                            processing_class=tok, peft_config=lora_config(cfg))
    ds = trainer.train_dataset
    for i, rec in enumerate(recs):
        prompt_ids, completion_ids = encode_record(real_tokenizer, rec["prompt"], rec["completion"], prompt_format)
        assert ds[i]["prompt_ids"] == prompt_ids and ds[i]["completion_ids"] == completion_ids, i


def test_plain_prompts_whose_tokens_merge_with_the_completion_are_skipped_and_plain_kto_is_refused(real_tokenizer):
    """In the plain format TRL tokenizes prompt + completion as one text: "Triplets:" and "(Ann" merge into other
    tokens, and TRL would cut the prompt's last token. Such a record is skipped and counted; the config refuses
    mode: kto with plain prompts before any work."""
    merge = {"prompt": "Pair: (Ann; born in)\nTriplets:", "completion": "(Ann; born in; Rome)", "label": True}
    rows, skipped = labelled_rows(real_tokenizer, [RECORDS[0], merge], "explore", "plain", 1024)
    assert skipped == 1 and len(rows) == 1
    rows, skipped = labelled_rows(real_tokenizer, [RECORDS[0], merge], "explore", "chat", 1024)
    assert skipped == 0 and len(rows) == 2
    cfg = load_config(SelfTrainConfig, None, ["--mode", "kto", "--train.prompt_format", "plain",
                                              "--bootstrap.train.prompt_format", "plain", "--generator.prompt_format", "plain"])
    with pytest.raises(ValueError, match="mode: kto needs train.prompt_format: chat"):
        cfg.validate()


def test_records_need_a_boolean_label_named_in_the_error(real_tokenizer):
    with pytest.raises(SFTRecordError, match=r"record 1: field 'label' must be true .* got None"):
        labelled_rows(real_tokenizer, [RECORDS[0], {"prompt": "p", "completion": "c"}], "explore", "chat", 1024)


def test_class_weights_balance_each_role_unless_set():
    assert class_weights(10, 30, KTOSettings()) == (3.0, 1.0)
    assert class_weights(30, 10, KTOSettings()) == (pytest.approx(1 / 3), 1.0)
    assert class_weights(10, 0, KTOSettings()) == (1.0, 1.0)
    assert class_weights(10, 30, KTOSettings(desirable_weight=1.5, undesirable_weight=0.5)) == (1.5, 0.5)


def test_undesirable_records_capped_per_desirable_with_the_seed():
    rows = [{"label": i < 3, "i": i} for i in range(12)]
    kept, left = cap_undesirable(rows, 2.0, seed=0)
    assert left == 3 and sum(not r["label"] for r in kept) == 6 and sum(r["label"] for r in kept) == 3
    assert [r["i"] for r in kept] == sorted(r["i"] for r in kept) and kept == cap_undesirable(rows, 2.0, seed=0)[0]
    assert cap_undesirable(rows, None, 0) == (rows, 0) and cap_undesirable(rows, 5.0, 0) == (rows, 0)


def _completion_logps(model, tok, recs):
    out = []
    for r in recs:
        p, c = encode_record(tok, r["prompt"], r["completion"], "chat")
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : -1].float()
        out.append(float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).sum()))
    return out


def test_kto_moves_the_desirable_calls_up_against_m0_and_the_undesirable_down(tiny_model_dir, real_tokenizer, tmp_path):
    """Against the reference (the base: the adapter off), the trained adapter raises the desirable records'
    log-likelihood and lowers the undesirable ones'; the adapter folder records the KTO settings and figures."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = LoraTrainConfig(epochs=6, effective_batch_size=4, learning_rate=3e-3, logging_steps=1, seed=3)
    res, figures = train_role_kto(tiny_model_dir, RECORDS, tmp_path / "kto", cfg, KTOSettings(beta=0.5), role="explore")
    assert res.steps == 18 and res.records == 12 and len(res.losses) >= 18 and res.tokens > 0
    assert figures["desirable"] == 8 and figures["undesirable"] == 4 and figures["desirable_weight"] == 0.5
    assert figures["log"][-1]["rewards/margins"] > figures["log"][0]["rewards/margins"]
    info = json.loads((tmp_path / "kto/knowtrace_training.json").read_text())
    assert info["kto"]["beta"] == 0.5 and info["kto"]["undesirable"] == 4 and info["config"]["per_device_batch_size"] == 4
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    before = _completion_logps(base, real_tokenizer, RECORDS)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), str(tmp_path / "kto"))
    after = _completion_logps(tuned, real_tokenizer, RECORDS)
    good = [a - b for a, b, r in zip(after, before, RECORDS) if r["label"]]
    bad = [a - b for a, b, r in zip(after, before, RECORDS) if not r["label"]]
    assert all(math.isfinite(x) for x in good + bad)
    assert sum(good) / len(good) > 0 > sum(bad) / len(bad)


# -- the config and the loop --------------------------------------------------------------------------------


def test_kto_settings_are_checked_naming_the_key():
    for args, match in [(["--kto.batch_size", "1"], r"kto.batch_size must be an integer >= 2"),
                        (["--kto.beta", "0"], r"kto.beta must be a positive number"),
                        (["--kto.undesirable", '["wrong"]'], r"kto.undesirable: unknown source"),
                        (["--kto.undesirable_per_desirable", "0"], r"kto.undesirable_per_desirable must be a positive number or null"),
                        (["--mode", "dpo"], r"mode must be one of \['backtrace', 'star', 'kto', 'grpo'\]")]:
        with pytest.raises(ConfigError, match=match):
            load_config(SelfTrainConfig, None, args)
    with pytest.raises(ConfigError, match=r"'filtered' needs a rationalizer that filters"):
        load_config(SelfTrainConfig, None, ["--strategy.name", "trace", "--mode", "kto", "--kto.undesirable", '["filtered"]'])
    bad_batch = load_config(SelfTrainConfig, None, ["--mode", "kto", "--kto.batch_size", "3"])
    with pytest.raises(ValueError, match=r"train: effective_batch_size 4 is not a multiple of per_device_batch_size 3"):
        bad_batch._check_batches(1)
    assert learning_mode("kto", {"backtrace": 0, "star": 0}) == ("backtrace", "kto")
    assert learning_mode("kto", {"star": 0}) == ("star", "kto") and learning_mode("star", {"star": 0}) == ("star", "sft")


def test_a_kto_iteration_through_the_loop(tmp_path, tiny_model_dir):
    """The oracle answers the short questions and fails the others: iteration 1 writes labelled records (the
    calls backtracing keeps, and the wrong trajectories' calls), trains each role's adapter with KTO and reports
    the classes, the weights and the KL; the FA ratio is backtracing's."""
    from selftrain_helpers import oracle_factory, tiny_overrides

    from knowtrace_train.selftrain import SelfTrain

    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, iterations=1, mode="kto"))
    run = SelfTrain(cfg, progress=False)
    run.make_generator = oracle_factory(run)
    run.run()
    it = run.run_dir / "iter_1"
    m = json.loads((it / "metrics.json").read_text())
    assert m["status"] == "trained" and m["rationale"]["mode"] == "backtrace" and 0 < m["rationale"]["fa_ratio"] < 1
    assert m["rollout"]["correct"] < m["rollout"]["trajectories"]
    for role in ("explore", "complete"):
        recs = [json.loads(x) for x in (it / f"sft_{role}.jsonl").read_text().splitlines()]
        assert {r["label"] for r in recs} == {True, False}
        k = m["train"][role]["kto"]
        assert k["desirable"] > 0 and k["undesirable"] > 0 and k["undesirable_weight"] == 1.0
        assert k["desirable_weight"] == pytest.approx(k["undesirable"] / k["desirable"]) and k["log"]
        assert (it / f"adapters/{role}/adapter_config.json").is_file()
    assert sum(m["rationale"]["undesirable"]["records"].values()) > 0


def test_a_role_with_one_class_is_trained_by_sft_or_skipped_as_the_config_says(tmp_path, tiny_model_dir):
    """No undesirable record: SFT on the desirable ones (kto.one_class: sft, the default) or left on M0 (skip); no
    desirable record: left on M0 either way. Each case is reported in the training record, nothing raises."""
    from selftrain_helpers import tiny_overrides

    from knowtrace_train.selftrain import SelfTrain
    from knowtrace_train.train.kto import kto_plan

    good = [dict(r, label=True) for r in RECORDS[:4]]
    bad = [dict(r, label=False) for r in RECORDS[4:8]]
    assert kto_plan(good + bad, KTOSettings()) == ("kto", "")
    assert kto_plan(good, KTOSettings())[0] == "sft" and kto_plan(good, KTOSettings(one_class="skip"))[0] == "skip"
    assert kto_plan(bad, KTOSettings())[0] == "skip" and "no desirable record" in kto_plan(bad, KTOSettings())[1]
    with pytest.raises(ConfigError, match="kto.one_class must be 'sft' or 'skip'"):
        load_config(SelfTrainConfig, None, ["--kto.one_class", "dpo"])
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, mode="kto"))
    run = SelfTrain(cfg, progress=False)
    sft = run.train.adapter(tmp_path, "explore", good, tiny_model_dir, cfg.train, seed=0, trainer="kto")
    assert sft["kto_fallback"]["plan"] == "sft" and sft["records"] == 4 and "kto" not in sft
    assert (tmp_path / "adapters/explore/adapter_config.json").is_file()
    skipped = run.train.adapter(tmp_path, "complete", bad, tiny_model_dir, cfg.train, seed=0, trainer="kto")
    assert skipped["records"] == 0 and skipped["kto_fallback"]["plan"] == "skip"
    assert not (tmp_path / "adapters/complete").exists()
