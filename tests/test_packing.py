"""Packed training (records packed into rows, a pass a batch of rows) gives the loss and gradients of one pass per
record, on the tiny random architecture with the real tokenizer, fp32."""

from __future__ import annotations

import pytest

from knowtrace_train.train.config import LoraTrainConfig
from knowtrace_train.train.trainer import PackedRowsCollator, packed_row_tokens

RECORDS = [
    {"prompt": f"Question {i}: which city is {'the ' * (i % 3)}capital of country number {i}? " + "Context. " * (5 * i),
     "completion": f"Thought: it is listed. Answer: City {i}" + " and more" * (i % 4)}
    for i in range(9)
]


@pytest.fixture(scope="module")
def random_tiny(tmp_path_factory, real_tokenizer):
    from knowtrace_train.generation.models import resolve_model

    cache = tmp_path_factory.mktemp("cache")
    tokenizer_dir = cache / "tokenizer"
    real_tokenizer.save_pretrained(tokenizer_dir)
    return resolve_model("random:tiny", cache, tokenizer_dir)


def _trainer(model_dir, config, tmp_path):
    from knowtrace_train.train.lora import load_records, sft_trainer, tokenize_records, training_setup

    device, precision, _, tokenizer = training_setup(model_dir, config)
    rows, _ = tokenize_records(tokenizer, load_records(RECORDS, "t"), config.prompt_format, config.max_length)
    trainer = sft_trainer(model_dir, rows, config, device, precision, tokenizer, str(tmp_path))
    import torch

    torch.manual_seed(1)  # LoRA's B starts at 0, which gives A no gradient: the same nonzero B in both models
    for name, p in trainer.model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.1)
    return trainer


def _loss_and_grads(trainer, compute_loss):
    """Every batch of one epoch through `compute_loss`, normalised over all of their loss-carrying tokens (as the
    Trainer's `num_items_in_batch` does over an optimizer step), backpropagated: the summed loss and the grads."""
    import torch

    batches = list(trainer.get_train_dataloader())
    items = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    model = trainer.model
    model.train()
    model.zero_grad()
    total = 0.0
    for batch in batches:
        loss = compute_loss(trainer, model, batch, num_items_in_batch=torch.tensor(items))
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return total, grads, batches


@pytest.mark.parametrize("path", ["ours", "trl"])
def test_packed_rows_give_the_loss_and_gradients_of_one_pass_per_record(random_tiny, tmp_path, path):
    one = LoraTrainConfig(precision="fp32", per_device_batch_size=1, gradient_accumulation_steps=1, packing=False,
                          max_length=256)
    packed = LoraTrainConfig(precision="fp32", per_device_batch_size=2, gradient_accumulation_steps=1, packing=True,
                             max_length=256)
    a, b = _trainer(random_tiny, one, tmp_path / "a"), _trainer(random_tiny, packed, tmp_path / "b")
    # "ours": the counting trainer's loss (the CPU's completion-only head); "trl": TRL's own, the GPUs' path
    compute = (lambda t, *x, **k: t.compute_loss(*x, **k)) if path == "ours" else (
        lambda t, *x, **k: type(t).__mro__[1].compute_loss(t, *x, **k))
    loss_a, grads_a, batches_a = _loss_and_grads(a, compute)
    loss_b, grads_b, batches_b = _loss_and_grads(b, compute)
    assert len(batches_a) == len(RECORDS)
    assert len(batches_b) < len(RECORDS) and batches_b[0]["input_ids"].shape[0] == 2  # rows, several records each
    assert "attention_mask" not in batches_b[0]
    assert loss_b == pytest.approx(loss_a, abs=1e-4)
    assert grads_a.keys() == grads_b.keys() and any("lora_A" in n for n in grads_a)
    for name in grads_a:
        assert (grads_a[name] - grads_b[name]).abs().max() <= 1e-4 * max(1.0, grads_a[name].abs().max()), name


def test_a_packed_rows_batch_keeps_records_apart_and_counts_no_pad():
    batch = PackedRowsCollator(pad_token_id=7)([
        {"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, -100, -100, 5], "seq_lengths": [2, 3]},
        {"input_ids": [8, 9, 10], "labels": [-100, -100, 10], "seq_lengths": [3]},
    ])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [8, 9, 10, 7, 7]]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2], [0, 1, 2, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, -100, -100, 5], [-100, -100, 10, -100, -100]]
    assert packed_row_tokens(batch["position_ids"]) == 8


def test_train_role_trains_packed_rows_and_counts_their_tokens(random_tiny, tmp_path):
    from knowtrace_train.train.lora import train_role

    config = LoraTrainConfig(precision="fp32", per_device_batch_size=2, gradient_accumulation_steps=1, packing=True,
                             max_length=256, max_steps=2, logging_steps=1)
    result = train_role(random_tiny, RECORDS, tmp_path / "adapter", config, role="t")
    assert result.steps == 2 and all(loss == loss for loss in result.losses)
    assert 0 < result.tokens <= result.computed_tokens
