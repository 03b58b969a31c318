"""LoRA SFT of one role: record encoding, completion-only labels, padding-free batches, training, reload."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from knowtrace_train.train import lora as train_mod
from knowtrace_train.train import precision as precision_mod
from knowtrace_train.train.config import gradient_accumulation_for
from knowtrace_train.train.lora import (
    TRAINING_INFO,
    LoraTrainConfig,
    SFTRecordError,
    encode_record,
    load_records,
    prefix_tree_tokens,
    read_training_info,
    render_prompt_ids,
    resolve_precision,
    tokenize_records,
    train_role,
)

REPO = Path(__file__).resolve().parents[1]

PROMPT = "Question: Where was the founder of Zentor born?\nKnowledge triplets:\n(Zentor; was founded by; Odile Farrant)"
COMPLETION = "Whether the given knowledge triplets are sufficient for answering: No\nRetrieval Guidance:\n- Odile Farrant: the city where she was born"


def _records(n: int = 4) -> list[dict]:
    return [
        {
            "prompt": f"Question: Who founded the company Brand{i}?\nAnswer with a triplet.",
            "completion": f"(Brand{i}; was founded by; Person{i})",
            "role": "complete",
        }
        for i in range(n)
    ]


# -- records -> tokens ---------------------------------------------------------------------------------------


def test_chat_prompt_ids_are_the_generators_and_completion_ends_the_turn(real_tokenizer):
    prompt_ids, completion_ids = encode_record(real_tokenizer, PROMPT, COMPLETION, "chat")
    expected = real_tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert prompt_ids == list(expected)
    assert prompt_ids == render_prompt_ids(real_tokenizer, PROMPT, "chat")
    assert completion_ids[-1] == real_tokenizer.eos_token_id
    assert real_tokenizer.eos_token_id not in completion_ids[:-1]
    assert real_tokenizer.decode(completion_ids) == COMPLETION + real_tokenizer.eos_token
    # the whole sequence is the chat template's rendering of the two turns, up to the end of the assistant turn
    full = real_tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": COMPLETION}], tokenize=False
    )
    assert full.startswith(real_tokenizer.decode(prompt_ids + completion_ids))


@pytest.mark.parametrize("prompt_format", ["chat", "plain"])
def test_a_response_prefix_is_fed_where_training_puts_the_completion(real_tokenizer, prompt_format):
    """The engine sends the judgement words (and the forced answer's "Yes / Thought:") as the start
    of the answer; the generator must feed them as the start of the completion training saw (in the
    chat format: inside the assistant turn, not at the end of the user turn)."""
    from knowtrace_train.generation.prepare import PromptPreparer, RoleAdapters
    from knowtrace_train.methods.knowtrace.outputs import JUDGEMENT

    prompt = PROMPT if prompt_format == "chat" else PROMPT + "\n"
    preparer = PromptPreparer(real_tokenizer, prompt_format, 8192, False, RoleAdapters({}))
    fed = preparer.encode(prompt, prefix=JUDGEMENT)
    prompt_ids, completion_ids = encode_record(real_tokenizer, prompt, COMPLETION, prompt_format)
    assert COMPLETION.startswith(JUDGEMENT)
    assert fed == (prompt_ids + completion_ids)[: len(fed)] and len(fed) > len(prompt_ids)
    assert preparer.encode(prompt) == prompt_ids


def test_chat_messages_prompt_is_accepted(real_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    prompt_ids, _ = encode_record(real_tokenizer, messages, COMPLETION, "chat")
    text = real_tokenizer.decode(prompt_ids)
    assert "Be brief." in text and "helpful AI assistant" not in text  # our system turn replaces the default


def test_plain_format_is_prompt_then_completion_then_eos(real_tokenizer):
    prompt_ids, completion_ids = encode_record(real_tokenizer, PROMPT + "\n", COMPLETION, "plain")
    assert prompt_ids == list(real_tokenizer(PROMPT + "\n")["input_ids"])
    assert completion_ids == list(real_tokenizer(COMPLETION, add_special_tokens=False)["input_ids"]) + [
        real_tokenizer.eos_token_id
    ]
    with pytest.raises(ValueError, match="plain"):
        render_prompt_ids(real_tokenizer, [{"role": "user", "content": "x"}], "plain")


def test_labels_mask_exactly_the_prompt_and_long_records_are_skipped(real_tokenizer):
    recs = load_records(
        [{"prompt": PROMPT, "completion": COMPLETION}, {"prompt": PROMPT * 40, "completion": COMPLETION}], "explore"
    )
    rows, skipped = tokenize_records(real_tokenizer, recs, "chat", max_length=256)
    assert skipped == 1 and len(rows) == 1
    prompt_ids, completion_ids = encode_record(real_tokenizer, PROMPT, COMPLETION, "chat")
    assert rows[0]["input_ids"] == prompt_ids + completion_ids
    assert rows[0]["labels"] == [-100] * len(prompt_ids) + completion_ids
    with pytest.raises(SFTRecordError, match="max_length=8"):
        tokenize_records(real_tokenizer, recs[:1], "chat", max_length=8)


def test_prefix_tree_tokens_count_each_shared_prefix_once(real_tokenizer):
    # [1 2 3 4], [1 2 5], [1 2 3 4] again, [6]: the tree is 1-2-3-4, 2-5 and 6, so 6 tokens against 12
    rows = [{"input_ids": x} for x in ([1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 4], [6])]
    assert prefix_tree_tokens(rows) == 6 and prefix_tree_tokens([]) == 0
    # two records of one prompt share the whole prompt: the tree holds it once, plus each completion
    recs = load_records([{"prompt": PROMPT, "completion": COMPLETION}, {"prompt": PROMPT, "completion": "Answer: no"}], "explore")
    rows, _ = tokenize_records(real_tokenizer, recs, "chat", max_length=4096)
    p, c1 = encode_record(real_tokenizer, PROMPT, COMPLETION, "chat")
    _, c2 = encode_record(real_tokenizer, PROMPT, "Answer: no", "chat")
    common = next(i for i, (a, b) in enumerate(zip(c1, c2)) if a != b)
    assert prefix_tree_tokens(rows) == len(p) + len(c1) + len(c2) - common


@pytest.mark.parametrize(
    "record, match",
    [
        ({"completion": "x"}, r"record 0: field 'prompt'"),
        ({"prompt": "", "completion": "x"}, r"record 0: field 'prompt' is empty"),
        ({"prompt": [{"role": "user"}], "completion": "x"}, r"field 'prompt'\[0\]"),
        ({"prompt": "p", "completion": "  "}, r"field 'completion'"),
        ({"prompt": "p", "completion": "x", "role": "explore"}, r"field 'role' is 'explore'"),
    ],
)
def test_bad_records_name_the_record_and_field(record, match):
    with pytest.raises(SFTRecordError, match=match):
        load_records([record], "complete")


def test_jsonl_records_errors_name_file_and_line(tmp_path):
    path = tmp_path / "sft_complete.jsonl"
    path.write_text(json.dumps({"prompt": "p", "completion": "c"}) + "\n" + json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(SFTRecordError, match=r"sft_complete.jsonl:2: field 'completion'"):
        load_records(path, "complete")
    with pytest.raises(SFTRecordError, match="no records"):
        load_records([], "complete")


# -- config and precision ------------------------------------------------------------------------------------


def test_config_validates_and_rejects_unknown_keys(tmp_path):
    from knowtrace_train.config import load_config

    assert LoraTrainConfig().target_modules == "all-linear"
    with pytest.raises(ValueError, match="rank"):
        LoraTrainConfig(rank=0)
    with pytest.raises(ValueError, match="precision"):
        LoraTrainConfig(precision="int8")
    (tmp_path / "train.yaml").write_text("lr: 1.0e-4\n")
    with pytest.raises(ValueError, match=r"train.yaml: unknown key 'lr' for LoraTrainConfig"):
        load_config(LoraTrainConfig, tmp_path / "train.yaml")
    assert load_config(LoraTrainConfig, data={"rank": 8, "target_modules": ["q_proj"]}).target_modules == ["q_proj"]


def test_every_config_field_has_a_default_and_help():
    from dataclasses import MISSING, fields

    for f in fields(LoraTrainConfig):
        assert f.default is not MISSING or f.default_factory is not MISSING, f.name
        assert f.metadata.get("help"), f.name


def test_precision_auto_takes_fp32_on_cpus_without_native_bf16(monkeypatch):
    monkeypatch.setattr(precision_mod, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu")[0] == "fp32"
    monkeypatch.setattr(precision_mod, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", "cpu")[0] == "bf16"
    assert resolve_precision("fp32", "cuda") == ("fp32", "set in the config")


# -- padding-free batches are the padded batches without the pad tokens ---------------------------------------


def test_padding_free_batch_gives_the_padded_batch_loss(tiny_model_dir, real_tokenizer):
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rows, _ = tokenize_records(
        real_tokenizer, load_records(_records(3) + [{"prompt": PROMPT, "completion": COMPLETION}], "complete"),
        "chat", 512,
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    pad = real_tokenizer.pad_token_id
    padded = DataCollatorForLanguageModeling(pad_token_id=pad)(rows)
    flat = DataCollatorForLanguageModeling(pad_token_id=pad, padding_free=True)(rows)
    assert "attention_mask" not in flat and flat["input_ids"].shape[0] == 1
    assert flat["input_ids"].numel() == sum(len(r["input_ids"]) for r in rows) < padded["input_ids"].numel()
    with torch.no_grad():
        loss_padded = model(**padded).loss
        # use_cache=False as SFTTrainer.compute_loss sets it: with a cache, transformers skips the packed-sequence
        # mask and the flattened records attend to each other
        loss_flat = model(
            input_ids=flat["input_ids"], position_ids=flat["position_ids"], labels=flat["labels"], use_cache=False
        ).loss
    torch.testing.assert_close(loss_flat, loss_padded, rtol=1e-5, atol=1e-5)


def test_the_cpu_completion_loss_is_trls_loss(tiny_model_dir, real_tokenizer):
    """On the CPU the LM head runs on the completion positions only (`completion_loss`); the loss and its
    gradients are TRL's own, which scores every position there."""
    from datasets import Dataset

    from knowtrace_train.train.lora import _load_base, lora_config, sft_args
    from knowtrace_train.train.trainer import completion_loss, counting_trainer_class

    records = load_records(_records(3) + [{"prompt": PROMPT, "completion": COMPLETION}], "complete")
    rows, _ = tokenize_records(real_tokenizer, records, "chat", 512)
    config = LoraTrainConfig(rank=4, dropout=0.0, per_device_batch_size=4, gradient_accumulation_steps=1, seed=1)
    model = _load_base(tiny_model_dir, "fp32", config, "cpu")
    args = sft_args(config, "fp32", "cpu", "/tmp/unused")
    trainer = counting_trainer_class()(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                       processing_class=real_tokenizer, peft_config=lora_config(config))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    peft_model = trainer.model
    for p in peft_model.parameters():  # non-zero B: gradients reach every LoRA weight
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    trls = lambda t, m, i, num_items_in_batch=None: type(t).__mro__[1].compute_loss(t, m, i)  # noqa: E731
    _assert_same_loss_and_gradients(trainer, batch, completion_loss, trls)


def _assert_same_loss_and_gradients(trainer, batch, reference, other):
    """`other`'s loss and every LoRA gradient on `batch` equal `reference`'s."""
    peft_model = trainer.model
    losses, grads = [], []
    for compute in (reference, other):
        peft_model.zero_grad()
        loss = compute(trainer, peft_model, dict(batch), num_items_in_batch=None)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in peft_model.parameters() if p.requires_grad])
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("padding_free", [False, True])
def test_shared_prefix_passes_give_the_per_record_loss_and_gradients(tiny_model_dir, real_tokenizer, padding_free):
    """Records of a batch that begin alike run their common prompt tokens once (`shared_prefix_loss`); the loss
    and every LoRA gradient are those of one pass per record (`completion_loss` on the whole batch), and
    fewer tokens are computed."""
    from datasets import Dataset

    from knowtrace_train.train.lora import _load_base, lora_config, sft_args
    from knowtrace_train.train.trainer import (batch_records, completion_loss, counting_trainer_class, prefix_plan,
                                                 PASS_COST, remainder_batches, shared_prefix_loss)

    records = load_records(_records(3) + [{"prompt": PROMPT, "completion": COMPLETION}], "complete")
    rows, _ = tokenize_records(real_tokenizer, records, "chat", 512)
    config = LoraTrainConfig(rank=4, dropout=0.0, per_device_batch_size=4, gradient_accumulation_steps=1, seed=1,
                             padding_free=padding_free)
    model = _load_base(tiny_model_dir, "fp32", config, "cpu")
    args = sft_args(config, "fp32", "cpu", "/tmp/unused")
    trainer = counting_trainer_class(share_prefixes=True)(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=real_tokenizer,
        peft_config=lora_config(config))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert ("attention_mask" not in batch) == padding_free
    assert sorted(ids for ids, _ in batch_records(batch)) == sorted(r["input_ids"] for r in rows)
    peft_model = trainer.model
    for p in peft_model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    head_rows: list[int] = []
    hook = peft_model.get_base_model().get_output_embeddings().register_forward_pre_hook(
        lambda _m, args: head_rows.append(args[0].shape[-2]))
    try:
        _assert_same_loss_and_gradients(trainer, batch, completion_loss, shared_prefix_loss)
    finally:
        hook.remove()
    # per group of records beginning alike, the prefix's forward pass and one per batch of remainders, in which
    # the model's own head runs on no position; then the head on each batch's gathered completion positions
    records_ = batch_records(batch)
    groups = prefix_plan(records_)
    assert any(shared and len(members) > 1 for shared, members in groups)
    batches = [(shared, [members[i] for i in b]) for shared, members in groups
               for b in remainder_batches([len(records_[m][0]) - shared for m in members])]
    assert any(len(b) > 1 for _, b in batches)  # the three BrandN remainders run as one batch
    completion_positions = sum(sum(1 for label in r["labels"][1:] if label != -100) for r in rows)
    calls = head_rows[1:]  # [0] is completion_loss's call
    passes = sum(1 for shared, _ in groups if shared) + len(batches)
    assert len(calls) == passes + len(batches) and calls.count(0) == passes and sum(calls) == completion_positions
    # positions computed: each prefix once, each batch of remainders padded to its longest
    assert trainer._computed == sum(shared for shared, _ in groups) + sum(
        len(b) * max(len(records_[m][0]) - shared for m in b) for shared, b in batches)
    # the three BrandN records share the chat header and "Question: Who founded the company Brand": counting a
    # pass's fixed cost, the plan costs less than one pass per record
    tokens = sum(len(r["input_ids"]) for r in rows)
    assert passes < len(rows) and trainer._computed + PASS_COST * passes < tokens + PASS_COST * len(rows)


def test_remainder_batches_pad_similar_lengths_together_and_cut_where_the_pads_cost_more_than_a_pass():
    from knowtrace_train.train.trainer import remainder_batches

    assert remainder_batches([]) == []
    assert remainder_batches([50]) == [[0]]
    # four similar lengths: one pass (128 + 4 x 230 = 1,048 positions) beats two (128 + 420 + 128 + 460 = 1,136)
    assert remainder_batches([230, 200, 220, 210]) == [[1, 3, 2, 0]]
    # a long one apart: 128 + 3 x 110 + 128 + 400 = 986 against 128 + 4 x 400 = 1,728 in one pass
    assert remainder_batches([400, 100, 110, 105]) == [[1, 3, 2], [0]]
    # every index once, whatever the cost of a pass
    for cost in (0, 64, 10_000):
        batches = remainder_batches([7, 300, 40, 41, 900, 8], pass_cost=cost)
        assert sorted(i for b in batches for i in b) == list(range(6))
    assert remainder_batches([7, 300, 40, 41, 900, 8], pass_cost=10_000) == [[0, 5, 2, 3, 1, 4]]
    assert len(remainder_batches([7, 300, 40, 41, 900, 8], pass_cost=0)) == 6


def test_one_record_per_pass_with_accumulation_trains_what_one_flattened_batch_trains(tiny_model_dir, tmp_path):
    """Batches of 4 as 4 passes of 1 record, as one padding-free pass, and as one pass whose shared prompt prefixes
    run once (the CPU default) take the same optimizer step: the loss is normalized over the step's completion
    tokens, not per pass; only the shared-prefix pass computes other positions (its prefix once, its batches of
    remainders padded)."""
    from safetensors.torch import load_file

    # fp32 everywhere: bf16 (a GPU's `auto`) rounds each way's sums differently
    common = dict(rank=4, dropout=0.0, learning_rate=1e-2, max_steps=1, logging_steps=1, seed=2, precision="fp32")
    records = _records(3) + [{"prompt": PROMPT, "completion": COMPLETION, "role": "complete"}]
    ways = {
        "flat": dict(per_device_batch_size=4, gradient_accumulation_steps=1, share_prefixes=False),
        "passes": dict(per_device_batch_size=1, gradient_accumulation_steps=4),
        "shared": dict(effective_batch_size=4),  # the self-training default: auto batch of 4, prefixes shared
    }
    results = {name: train_role(tiny_model_dir, records, tmp_path / name, LoraTrainConfig(**way, **common),
                                role="complete") for name, way in ways.items()}
    assert len({(r.tokens, r.steps) for r in results.values()}) == 1 and results["flat"].steps == 1
    assert results["passes"].computed_tokens == results["flat"].computed_tokens == results["flat"].tokens
    if torch.cuda.is_available():  # GPUs keep the padding-free batch: share_prefixes runs on CPUs only
        assert results["shared"].computed_tokens == results["flat"].tokens
    else:
        assert results["shared"].computed_tokens != results["flat"].tokens
    info = read_training_info(tmp_path / "shared")["config"]
    assert (info["per_device_batch_size"], info["gradient_accumulation_steps"]) == (4, 1)
    adapters = {name: load_file(tmp_path / name / "adapter_model.safetensors") for name in ways}
    for name in ("passes", "shared"):
        assert adapters[name].keys() == adapters["flat"].keys()
        for k in adapters["flat"]:
            torch.testing.assert_close(adapters[name][k], adapters["flat"][k], rtol=1e-4, atol=1e-6)


def test_an_auto_per_device_batch_takes_each_process_share_of_the_effective_batch():
    from knowtrace_train.train.config import as_trained, per_device_batch_for

    config = LoraTrainConfig(effective_batch_size=4)
    assert config.per_device_batch_size is None
    assert [per_device_batch_for(config, p) for p in (1, 2, 4)] == [4, 2, 1]
    assert [gradient_accumulation_for(config, p) for p in (1, 2, 4)] == [1, 1, 1]
    assert per_device_batch_for(LoraTrainConfig(effective_batch_size=8), 3) == 1  # 8 does not split over 3
    with pytest.raises(ValueError, match="not a multiple"):
        as_trained(LoraTrainConfig(effective_batch_size=8), 3)
    assert per_device_batch_for(LoraTrainConfig(), 1) == 1  # no effective batch: one record per pass, accumulated
    assert as_trained(LoraTrainConfig(per_device_batch_size=2, effective_batch_size=8), 2).gradient_accumulation_steps == 2
    with pytest.raises(ValueError, match="per_device_batch_size"):
        LoraTrainConfig(per_device_batch_size=0)


# -- training ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """One role trained on a few repeated records; the in-memory PEFT model kept for comparison."""
    kept = {}
    save = train_mod._save_adapter

    def keep_and_save(peft_model, *args, **kwargs):
        kept["model"] = peft_model
        return save(peft_model, *args, **kwargs)

    out = tmp_path_factory.mktemp("run") / "iter_1" / "adapters" / "complete"
    config = LoraTrainConfig(
        rank=8, alpha=16, dropout=0.0, epochs=6, learning_rate=2e-2, per_device_batch_size=2,
        gradient_accumulation_steps=1, logging_steps=1, seed=3,
    )
    train_mod._save_adapter = keep_and_save
    try:
        result = train_role(tiny_model_dir, _records(4), out, config, role="complete")
    finally:
        train_mod._save_adapter = save
    return result, kept["model"], config


def test_training_loss_falls_and_tokens_are_counted(trained, real_tokenizer):
    result, _, config = trained
    assert result.steps == 12 and len(result.losses) == 12
    assert result.losses[-1] < result.losses[0] - 0.5, result.losses
    rows, _ = tokenize_records(real_tokenizer, load_records(_records(4), "complete"), "chat", config.max_length)
    assert result.tokens == config.epochs * sum(len(r["input_ids"]) for r in rows)
    assert result.completion_tokens == config.epochs * sum(sum(t != -100 for t in r["labels"]) for r in rows)
    assert result.tokens_per_second == pytest.approx(result.tokens / result.seconds)
    # 'auto' precision on the device the trainer used (CUDA where available, as train_role picks)
    if torch.cuda.is_available():
        assert result.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    else:
        assert result.precision == ("bf16" if precision_mod.cpu_has_native_bf16() else "fp32")


def test_saved_adapter_reloads_with_the_same_logits(trained, tiny_model_dir, real_tokenizer):
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    result, trained_model, config = trained
    assert (result.adapter_dir / "adapter_model.safetensors").is_file()
    assert not [p for p in result.adapter_dir.parent.iterdir() if p.name.startswith(".")]  # no temp folder left
    info = read_training_info(result.adapter_dir)
    assert info["role"] == "complete" and info["prompt_format"] == "chat"
    assert info["base_model"] == str(Path(tiny_model_dir).resolve())
    assert info["config"]["rank"] == 8 and info["result"]["steps"] == 12

    # the reloaded model follows the trained one: its device (train_role trains on CUDA where available)
    # and its base weights' dtype (bf16 on GPUs that have it, fp32 elsewhere)
    device = next(trained_model.parameters()).device
    ids = torch.tensor([render_prompt_ids(real_tokenizer, _records(1)[0]["prompt"], "chat")], device=device)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=trained_model.get_base_model().dtype).to(device)
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
        reloaded = PeftModel.from_pretrained(base, result.adapter_dir).eval()
        # the same LoRA weights, bit for bit
        saved = get_peft_model_state_dict(reloaded)
        trained_weights = get_peft_model_state_dict(trained_model)
        assert saved.keys() == trained_weights.keys() and len(saved) > 0
        for k in saved:
            assert torch.equal(saved[k], trained_weights[k]), k
        # and the same logits (the Trainer left its mixed-precision autocast on the trained model's forward)
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(result.precision)
        with torch.autocast(device.type, dtype=half or torch.bfloat16, enabled=half is not None):
            logits = reloaded(input_ids=ids).logits
        expected = trained_model.eval()(input_ids=ids).logits
    torch.testing.assert_close(logits.float(), expected.float(), rtol=1e-5, atol=1e-5)
    assert (logits - base_logits).abs().max() > 1e-2  # the adapter is not a no-op


def test_retraining_replaces_the_adapter(tiny_model_dir, tmp_path):
    out = tmp_path / "adapters" / "explore"
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("from a killed run")
    config = LoraTrainConfig(epochs=1, per_device_batch_size=4, gradient_accumulation_steps=1, rank=4)
    result = train_role(tiny_model_dir, [dict(r, role="explore") for r in _records(2)], out, config, role="explore")
    assert result.steps == 1 and result.records == 2
    assert (out / "adapter_config.json").is_file() and not (out / "stale.txt").exists()
    assert (out / TRAINING_INFO).is_file()


def test_packing_trains_every_token_once_in_fewer_steps(tiny_model_dir, tmp_path, real_tokenizer):
    config = LoraTrainConfig(
        epochs=1, packing=True, max_length=256, per_device_batch_size=1, gradient_accumulation_steps=1, rank=4
    )
    result = train_role(tiny_model_dir, _records(6), tmp_path / "a", config, role="complete")
    rows, _ = tokenize_records(real_tokenizer, load_records(_records(6), "complete"), "chat", 256)
    assert result.records == 6
    assert result.tokens == sum(len(r["input_ids"]) for r in rows)
    assert result.steps == -(-result.tokens // 256) < 6  # blocks of max_length, best fit


# -- the effective batch ---------------------------------------------------------------------------------------


def test_effective_batch_size_derives_the_accumulation_for_any_process_count():
    config = LoraTrainConfig(per_device_batch_size=4, effective_batch_size=32)
    assert gradient_accumulation_for(config, 1) == 8
    assert gradient_accumulation_for(config, 2) == 4
    for processes in (1, 2, 4, 8):
        assert config.per_device_batch_size * gradient_accumulation_for(config, processes) * processes == 32
    # without it the accumulation is the configured one, and the effective batch grows with the processes
    plain = LoraTrainConfig(per_device_batch_size=4, gradient_accumulation_steps=8)
    assert [gradient_accumulation_for(plain, p) for p in (1, 2)] == [8, 8]


def test_an_indivisible_effective_batch_names_the_three_numbers():
    config = LoraTrainConfig(per_device_batch_size=8, effective_batch_size=32)
    with pytest.raises(ValueError, match=r"effective_batch_size 32 .*per_device_batch_size 8 x 3 processes = 24"):
        gradient_accumulation_for(config, 3)
    with pytest.raises(ValueError, match=r"effective_batch_size 32 .*per_device_batch_size 8 x 8 processes = 64"):
        gradient_accumulation_for(config, 8)
    with pytest.raises(ValueError, match="effective_batch_size"):
        LoraTrainConfig(effective_batch_size=0)


def test_the_training_record_holds_the_effective_batch_as_trained(tiny_model_dir, tmp_path, real_tokenizer):
    # the configured accumulation (32) is replaced by the one the effective batch implies: 4 / (2 x 1 process)
    config = LoraTrainConfig(rank=4, per_device_batch_size=2, effective_batch_size=4, max_steps=1, logging_steps=1)
    result = train_role(tiny_model_dir, _records(4), tmp_path / "a", config, role="complete")
    assert (result.effective_batch_size, result.gradient_accumulation_steps, result.processes) == (4, 2, 1)
    rows, _ = tokenize_records(real_tokenizer, load_records(_records(4), "complete"), "chat", 2048)
    assert result.steps == 1 and result.tokens == sum(len(r["input_ids"]) for r in rows)  # one step: all 4
    info = read_training_info(tmp_path / "a")
    assert info["result"]["effective_batch_size"] == 4 and info["config"]["gradient_accumulation_steps"] == 2
    assert info["config"]["effective_batch_size"] == 4


def test_bench_train_flops_estimate_counts_the_linear_weights_and_knows_its_peaks(tiny_model_dir, real_tokenizer):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train", REPO / "scripts" / "bench" / "bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # tiny model: 2 layers of q 64x64, k and v 64x32 (2 KV heads of 16), o 64x64, MLP 3 x 64x128; LM head tied
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128
    assert bench.matmul_params(tiny_model_dir) == 2 * per_layer + len(real_tokenizer) * 64
    assert bench.flops_figures(1000, 2.0, 10**9)["tflops_6n"] == 6 * 10**9 * 1000 / 2.0 / 1e12
    assert bench.peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989
    assert bench.peak_bf16_tflops("NVIDIA H100 PCIe") == 756
    assert bench.peak_bf16_tflops("NVIDIA H200") == 989
    assert bench.peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312
    assert bench.peak_bf16_tflops("NVIDIA GeForce RTX 4090") is None


# -- QLoRA (GPU runs: tests/test_qlora_gpu.py) --------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of machines without CUDA")
def test_qlora_without_cuda_is_a_clear_error_before_any_work(tiny_model_dir, tmp_path, monkeypatch):
    import sys
    import types

    from knowtrace_train.config import load_config
    from knowtrace_train.errors import MissingExtraError
    from knowtrace_train.selftrain.config import SelfTrainConfig

    # without bitsandbytes: the extra to install, whatever the device
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(MissingExtraError, match=r"train.qlora: true needs bitsandbytes .*pip install 'knowtrace-train\[qlora\]'"):
        train_role(tiny_model_dir, _records(2), tmp_path / "a", LoraTrainConfig(qlora=True), role="complete")
    with pytest.raises(ValueError, match=r"^train: train.qlora: true needs bitsandbytes"):
        load_config(SelfTrainConfig, None, ["--train.qlora", "true"]).validate()
    # with it (a stand-in here), on a CPU: the GPU it needs
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    with pytest.raises(ValueError, match=r"qlora: true needs a CUDA GPU .*training runs on cpu"):
        train_role(tiny_model_dir, _records(2), tmp_path / "a", LoraTrainConfig(qlora=True), role="complete")
    assert not (tmp_path / "a").exists()
    run = load_config(SelfTrainConfig, None, ["--train.qlora", "true"])
    with pytest.raises(ValueError, match=r"^train: train.qlora: true needs a CUDA GPU"):
        run.validate()


def test_merging_refuses_a_quantized_base(tiny_model_dir, tmp_path, trained):
    import shutil

    from knowtrace_train.train.merge import merge_adapters_into_base

    result, _, _ = trained
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    cfg = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"load_in_4bit": True}}))
    with pytest.raises(ValueError, match="quantized checkpoint: merge the adapter into the unquantized base"):
        merge_adapters_into_base(base, result.adapter_dir, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


# -- data-parallel under torchrun (two gloo processes) --------------------------------------------------------

DDP_SCRIPT = """
import json, sys
from pathlib import Path
import knowtrace_train.train.lora as lora
from knowtrace_train.train.lora import LoraTrainConfig, train_role

model, out, result_dir = sys.argv[1:4]
weights = []
measured = lora.train_measured
def keep_weights(trainer, *args, **kwargs):  # each process's LoRA weights after training: synced, they agree
    r = measured(trainer, *args, **kwargs)
    weights.append([float(p.detach().double().sum()) for p in trainer.model.parameters() if p.requires_grad])
    return r
lora.train_measured = keep_weights
records = [{"prompt": f"Question: Who founded the company Brand{i}?\\nAnswer with a triplet.",
            "completion": f"(Brand{i}; was founded by; Person{i})"} for i in range(8)]
# effective batch 4 over 2 processes of 2 records (auto), whose shared prefix runs once: accumulation 1
config = LoraTrainConfig(rank=4, epochs=1, effective_batch_size=4, logging_steps=1)
r = train_role(model, records, out, config, role="complete")
import torch.distributed as dist
rank = dist.get_rank()
Path(result_dir, f"rank{rank}.json").write_text(json.dumps(
    {"backend": dist.get_backend(), "world": dist.get_world_size(), "steps": r.steps, "tokens": r.tokens,
     "effective": r.effective_batch_size, "accumulation": r.gradient_accumulation_steps,
     "computed": r.computed_tokens, "weights": weights[0]}))
# both ranks leave together: a rank that exits while the other's gloo threads still run aborts at teardown
# ("terminate called without an active exception", seen once under a loaded full suite)
dist.barrier()
dist.destroy_process_group()
"""


def test_two_process_data_parallel_training_writes_once(tiny_model_dir, tmp_path, real_tokenizer):
    script = tmp_path / "ddp_train.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    out = tmp_path / "adapters" / "complete"
    # CPU processes on every machine: two processes on one GPU would be NCCL on a shared device (refused)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), str(tiny_model_dir), str(out), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["backend"] == "gloo" and r["world"] == 2 for r in results)
    # 8 records, 2 per process per step, 2 processes: 2 optimizer steps; tokens summed over both processes
    assert [r["steps"] for r in results] == [2, 2]
    assert all(r["effective"] == 4 and r["accumulation"] == 1 for r in results)
    rows, _ = tokenize_records(real_tokenizer, load_records(_records(8), "complete"), "chat", 2048)
    assert results[0]["tokens"] == results[1]["tokens"] == sum(len(r["input_ids"]) for r in rows)
    assert results[0]["computed"] < results[0]["tokens"]  # the pairs of records ran their shared prefix once
    # the gradients of the shared-prefix passes were averaged over the processes: both hold the same adapter
    # (each trained on other records, so unsynced they would differ)
    torch.testing.assert_close(results[0]["weights"], results[1]["weights"], rtol=1e-6, atol=1e-7)
    assert (out / "adapter_model.safetensors").is_file()
    assert [p.name for p in out.parent.iterdir()] == ["complete"]  # one writer, no temp folders left


def test_prompt_ids_are_the_generation_backends(real_tokenizer):
    """The contract with knowtrace_train.generation: training sees the prompt tokens the generator feeds."""
    prepare = pytest.importorskip("knowtrace_train.generation.prepare")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    for fmt, prompts in (("chat", [PROMPT, messages]), ("plain", [PROMPT + "\nAnswer:"])):
        preparer = prepare.PromptPreparer(real_tokenizer, fmt, 8192, False, prepare.RoleAdapters({}))
        for p in prompts:
            assert render_prompt_ids(real_tokenizer, p, fmt) == preparer.encode(p)


# -- stopping where the loss has flattened ------------------------------------------------------------------------


def test_loss_flattened_compares_the_last_window_with_the_one_before():
    # windows of 2: means 1.0 -> 0.5 (a 50% drop) is not flat; 0.5 -> 0.475 (5%) is flat under a 10% rule
    assert not train_mod.loss_flattened([1.2, 0.8, 0.6, 0.4], 2, 0.1)
    assert train_mod.loss_flattened([0.6, 0.4, 0.5, 0.45], 2, 0.1)
    assert not train_mod.loss_flattened([0.6, 0.4, 0.5, 0.45], 2, 0.01)  # 5% is a drop under a 1% rule
    assert train_mod.loss_flattened([0.3, 0.3, 0.35, 0.31], 2, 0.1)  # a rise is flat too
    # exactly the threshold: 1.0 -> 0.9 is a 10% drop, which is enough
    assert not train_mod.loss_flattened([1.0, 0.9], 1, 0.1)
    assert not train_mod.loss_flattened([0.5, 0.5, 0.5], 2, 0.1)  # fewer than two windows: not yet
    assert not train_mod.loss_flattened([], 0, 0.1)


@pytest.mark.parametrize("field, value, match", [
    ("plateau_steps", -1, "plateau_steps"), ("plateau_steps", 7, "multiple of logging_steps"),
    ("plateau_min_drop", 0.0, "plateau_min_drop"), ("plateau_min_drop", 1.0, "plateau_min_drop"),
])
def test_plateau_settings_are_checked(field, value, match):
    with pytest.raises(ValueError, match=match):
        LoraTrainConfig(**{field: value})


def test_training_stops_where_the_loss_is_flat_and_records_the_step(tiny_model_dir, tmp_path):
    # one record repeated, no dropout, a negligible rate: the loss is the same every step, so the rule
    # (windows of 2 logged steps) stops at step 4 of the 16 planned
    same = [dict(_records(1)[0]) for _ in range(16)]
    config = LoraTrainConfig(rank=4, dropout=0.0, learning_rate=1e-9, per_device_batch_size=1, gradient_accumulation_steps=1, epochs=1,
                             logging_steps=1, plateau_steps=2, plateau_min_drop=0.1)
    result = train_role(tiny_model_dir, same, tmp_path / "a", config, role="complete")
    assert (result.steps, result.plateau_stop_step) == (4, 4)
    assert read_training_info(tmp_path / "a")["result"]["plateau_stop_step"] == 4
    # off (the default for every iteration's adapters): all 16 steps
    full = train_role(tiny_model_dir, same, tmp_path / "b", dataclasses.replace(config, plateau_steps=0), role="complete")
    assert (full.steps, full.plateau_stop_step) == (16, None)


# -- grouped passes --------------------------------------------------------------------------------------------


def test_grouped_passes_are_a_seeded_permutation_whose_full_passes_hold_one_group():
    from knowtrace_train.train.trainer import GroupedPassSampler, grouped_pass_order

    groups = ["a"] * 9 + ["b"] * 6 + ["c"]  # a: 2 full passes + 1 left, b: 1 full + 2 left, c: 1 left
    order = grouped_pass_order(groups, 4, seed=0)
    assert sorted(order) == list(range(len(groups)))
    passes = [order[i : i + 4] for i in range(0, len(order), 4)]
    single = [p for p in passes if len({groups[i] for i in p}) == 1]
    assert len(single) == 3 and len(passes) == 4  # 2 of a, 1 of b; the 4 left (a, b, b, c) make one mixed pass
    assert sorted(groups[p[0]] for p in single) == ["a", "a", "b"]
    assert order == grouped_pass_order(groups, 4, seed=0) != grouped_pass_order(groups, 4, seed=1)
    for seed in range(20):  # a short pass (5 a + 4 b: one row left) comes last, so the others stay aligned
        order = grouped_pass_order(["a"] * 5 + ["b"] * 4, 4, seed)
        assert [len({("a" if i < 5 else "b") for i in order[k : k + 4]}) for k in (0, 4)] == [1, 1]
    sampler = GroupedPassSampler(groups, 4, seed=5)
    first, second = list(sampler), list(sampler)  # a new order each epoch, every row once in each
    assert first == grouped_pass_order(groups, 4, 5) and second == grouped_pass_order(groups, 4, 6)
    assert sorted(second) == list(range(16)) and len(sampler) == 16


def test_pass_groups_key_rows_by_their_prompt_start_only_where_passes_share_prefixes():
    from knowtrace_train.train.trainer import pass_groups

    rows = [{"input_ids": [1, 2, 3, 9], "labels": [-100, -100, -100, 9]},  # prompt of 3 tokens
            {"input_ids": [1, 2, 4, 5, 9], "labels": [-100, -100, -100, -100, 9]},
            {"input_ids": [1, 9], "labels": [-100, 9]}]  # a prompt shorter than the key: its whole prompt
    on = LoraTrainConfig(group_prefix_tokens=2, per_device_batch_size=4)
    assert pass_groups(rows, on, "cpu") == [(1, 2), (1, 2), (1,)]
    assert pass_groups(rows, dataclasses.replace(on, group_prefix_tokens=0), "cpu") is None
    assert pass_groups(rows, on, "cuda") is None  # GPUs keep the padding-free batch and the uniform shuffle
    assert pass_groups(rows, dataclasses.replace(on, per_device_batch_size=1), "cpu") is None
    assert pass_groups(rows, dataclasses.replace(on, share_prefixes=False), "cpu") is None
    with pytest.raises(ValueError, match="group_prefix_tokens"):
        LoraTrainConfig(group_prefix_tokens=-1)


def test_grouped_passes_train_every_record_once_in_fewer_positions(tiny_model_dir, tmp_path):
    """Two kinds of prompt, mixed: passes drawn from one kind share that kind's long instruction, so one epoch
    trains the same tokens computing fewer positions than the uniform shuffle (the seed fixed, both ways)."""
    explain = "Extract the triplets that the guidance asks for. Write one triplet per line, nothing else. " * 3
    ask = "Judge whether the knowledge is sufficient; if not, ask for the next entity and relation to find. " * 3
    records = [{"prompt": f"{(explain, ask)[i % 2]}\nQuestion {i}: who made Brand{i}?",
                "completion": f"(Brand{i}; was made by; Person{i})"} for i in range(16)]
    common = dict(rank=4, epochs=1, learning_rate=1e-3, effective_batch_size=4, logging_steps=1, seed=1)
    results = {n: train_role(tiny_model_dir, records, tmp_path / str(n), LoraTrainConfig(group_prefix_tokens=n, **common),
                             role="x") for n in (0, 24)}
    assert results[0].tokens == results[24].tokens and results[0].steps == results[24].steps == 4
    if torch.cuda.is_available():  # no pass shares a prefix on a GPU, so grouping is left off (a plain shuffle)
        assert results[24].computed_tokens == results[0].computed_tokens == results[0].tokens
    else:
        assert results[24].computed_tokens < results[0].computed_tokens
    assert read_training_info(tmp_path / "24")["config"]["group_prefix_tokens"] == 24


# -- bf16 on CPUs: the frozen weights cast once ----------------------------------------------------------------


def test_frozen_in_bf16_casts_the_base_layers_and_unties_the_head(tiny_model_dir):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                           train_mod.lora_config(LoraTrainConfig(rank=4)))
    # only where asked, and only for bf16 training on a CPU
    for config, precision, device in ((LoraTrainConfig(frozen_bf16=False), "bf16", "cpu"),
                                      (LoraTrainConfig(), "fp32", "cpu"), (LoraTrainConfig(), "bf16", "cuda")):
        assert precision_mod.frozen_in_bf16(model, config, precision, device) == 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    lora_layers = [m for m in model.modules() if hasattr(m, "lora_A")]
    assert precision_mod.frozen_in_bf16(model, LoraTrainConfig(), "bf16", "cpu") == len(lora_layers) + 1  # + LM head
    base = model.get_base_model()
    assert all(m.get_base_layer().weight.dtype == torch.bfloat16 for m in lora_layers)
    # no copy of a layer's input to the fp32 LoRA weights' dtype, which autocast would copy back to bf16
    assert not any(m.cast_input_dtype_enabled for m in lora_layers)
    assert base.lm_head.weight.dtype == torch.bfloat16 and not base.lm_head.weight.requires_grad
    assert base.model.embed_tokens.weight.dtype == torch.float32  # untied: the embedding keeps its fp32 weight
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert precision_mod.frozen_in_bf16(model, LoraTrainConfig(), "bf16", "cpu") == 0  # nothing left to cast


@pytest.mark.skipif(torch.cuda.is_available(), reason="train_role trains on CUDA where it is available")
def test_bf16_training_on_cpu_is_bit_identical_with_the_frozen_weights_cast_once(tiny_model_dir, tmp_path, caplog):
    """Autocast rounds each frozen fp32 weight to bf16 at every call; casting them once gives the same products:
    the same losses and the same trained LoRA weights, bit for bit, with 4 records per pass (shared prefixes)."""
    import logging

    from safetensors.torch import load_file

    common = dict(rank=4, dropout=0.0, learning_rate=1e-2, max_steps=3, logging_steps=1, seed=3, precision="bf16",
                  effective_batch_size=4)
    records = _records(6) + [{"prompt": PROMPT, "completion": COMPLETION, "role": "complete"}] * 2
    results = {}
    for cast in (False, True):
        with caplog.at_level(logging.INFO, logger="knowtrace_train.train.precision"):
            caplog.clear()
            results[cast] = train_role(tiny_model_dir, records, tmp_path / str(cast),
                                       LoraTrainConfig(frozen_bf16=cast, **common), role="complete")
            said = [r.getMessage() for r in caplog.records if "frozen weights to bf16" in r.getMessage()]
        assert bool(said) == cast, said  # cast only where asked
    off, on = results[False], results[True]
    assert on.precision == off.precision == "bf16" and on.steps == 3
    assert on.losses == off.losses and len(on.losses) == 3
    a = load_file(off.adapter_dir / "adapter_model.safetensors")
    b = load_file(on.adapter_dir / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)  # trained: B left zero
