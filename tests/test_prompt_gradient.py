"""`train.prompt_gradient: false`: SFT with every prompt position computed without gradient (trainer.py's
`shared_prefix_loss(detach_prompts=True)`): the loss of the exact pass, the gradient of a pass whose prompt keys
and values are constants, and refused where a trainer computes its own loss."""

from __future__ import annotations

import pytest
import torch

from knowtrace_train.config import load_config
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.train.lora import LoraTrainConfig, load_records, tokenize_records, train_role

PROMPT = "Question: Where was the founder of Zentor born?\nKnowledge triplets:\n(Zentor; was founded by; Odile Farrant)"
COMPLETION = "Whether the given knowledge triplets are sufficient for answering: No\nRetrieval Guidance:\n- Odile Farrant: the city"


def _records(n: int = 3) -> list[dict]:
    rows = [{"prompt": f"Question: Who founded the company Brand{i}?\nAnswer with a triplet.",
             "completion": f"(Brand{i}; was founded by; Person{i})"} for i in range(n)]
    return rows + [{"prompt": PROMPT, "completion": COMPLETION}]


def _trainer(tiny_model_dir, real_tokenizer, padding_free: bool, prompt_gradient: bool = True):
    from datasets import Dataset

    from knowtrace_train.train.lora import _load_base, lora_config, sft_args
    from knowtrace_train.train.trainer import counting_trainer_class

    rows, _ = tokenize_records(real_tokenizer, load_records(_records(), "complete"), "chat", 512)
    config = LoraTrainConfig(rank=4, dropout=0.0, per_device_batch_size=4, gradient_accumulation_steps=1, seed=1,
                             padding_free=padding_free)
    model = _load_base(tiny_model_dir, "fp32", config, "cpu")
    trainer = counting_trainer_class("sft", True, prompt_gradient)(
        model=model, args=sft_args(config, "fp32", "cpu", "/tmp/unused"), train_dataset=Dataset.from_list(rows),
        processing_class=real_tokenizer, peft_config=lora_config(config))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    torch.manual_seed(3)
    for p in trainer.model.parameters():  # non-zero B: gradients reach every LoRA weight
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    return trainer, batch


def _prompt_mask(batch) -> torch.Tensor:
    """[rows, positions, 1]: True at every prompt position (before the record's first loss-carrying logit)."""
    from knowtrace_train.train.trainer import batch_records, first_logits

    firsts = first_logits(batch_records(batch))
    ids = batch["input_ids"]
    if "attention_mask" in batch:  # padded: one record per row
        local = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        first = torch.tensor(firsts)[:, None]
    else:  # padding-free: one row, positions restarting at 0 per record
        local = batch["position_ids"]
        record = torch.cumsum((local == 0).long(), dim=1) - 1
        first = torch.tensor(firsts)[record]
    return (local < first)[..., None]


def _loss_and_grads(trainer, batch, compute):
    model = trainer.model
    model.zero_grad()
    loss = compute(trainer, model, dict(batch))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("padding_free", [False, True])
def test_detached_prompts_keep_the_loss_and_take_the_gradient_with_the_prompts_keys_and_values_constant(
        tiny_model_dir, real_tokenizer, padding_free):
    """The reference is one whole pass per record where every layer's keys and values at prompt positions are
    detached (hooks on each k_proj and v_proj): attention is the only path between positions, so that is the
    gradient of a prompt computed without gradient."""
    from knowtrace_train.train.trainer import completion_loss, shared_prefix_loss

    trainer, batch = _trainer(tiny_model_dir, real_tokenizer, padding_free)
    exact_loss, exact = _loss_and_grads(trainer, batch, lambda t, m, i: completion_loss(t, m, i))
    detached_loss, detached = _loss_and_grads(
        trainer, batch, lambda t, m, i: shared_prefix_loss(t, m, i, detach_prompts=True))

    mask = _prompt_mask(batch)
    hooks = [module.register_forward_hook(lambda mod, args, out: torch.where(mask, out.detach(), out))
             for name, module in trainer.model.named_modules() if name.endswith(("self_attn.k_proj", "self_attn.v_proj"))]
    assert len(hooks) == 2 * 2  # the tiny model's 2 layers
    try:
        reference_loss, reference = _loss_and_grads(trainer, batch, lambda t, m, i: completion_loss(t, m, i))
    finally:
        for h in hooks:
            h.remove()

    torch.testing.assert_close(detached_loss, exact_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reference_loss, exact_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(detached, reference):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    # and it is another gradient than the exact one: the path through the prompt's states is gone
    assert max(float((a - b).abs().max()) for a, b in zip(detached, exact)) > 1e-3


def test_the_trainer_takes_the_detached_path_where_prompt_gradient_is_false(tiny_model_dir, real_tokenizer):
    from knowtrace_train.train.trainer import shared_prefix_loss

    trainer, batch = _trainer(tiny_model_dir, real_tokenizer, padding_free=False, prompt_gradient=False)
    via_trainer = _loss_and_grads(trainer, batch, lambda t, m, i: t.compute_loss(m, i))
    direct = _loss_and_grads(trainer, batch, lambda t, m, i: shared_prefix_loss(t, m, i, detach_prompts=True))
    torch.testing.assert_close(via_trainer[0], direct[0])
    for a, b in zip(via_trainer[1], direct[1]):
        torch.testing.assert_close(a, b)


def test_training_with_detached_prompts_computes_the_same_positions_and_writes_another_adapter(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    records = _records() * 2
    results, weights = [], []
    for pg in (True, False):
        config = LoraTrainConfig(rank=4, epochs=1.0, effective_batch_size=4, seed=0, logging_steps=1, prompt_gradient=pg)
        results.append(train_role(tiny_model_dir, records, tmp_path / str(pg), config, role="complete"))
        weights.append(load_file(str(tmp_path / str(pg) / "adapter_model.safetensors")))
    exact, detached = results
    assert (detached.steps, detached.tokens, detached.computed_tokens) == (exact.steps, exact.tokens, exact.computed_tokens)
    assert detached.losses[0] == pytest.approx(exact.losses[0], rel=1e-5)  # the first step's loss: same weights
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_prompt_gradient_is_checked_and_refused_for_trainers_with_their_own_loss():
    from knowtrace_train.train.trainer import counting_trainer_class

    with pytest.raises(ValueError, match="LoraTrainConfig.prompt_gradient: must be true or false"):
        LoraTrainConfig(prompt_gradient="no")
    with pytest.raises(ValueError, match="prompt_gradient: false is an SFT option"):
        counting_trainer_class("kto", prompt_gradient=False)
    from knowtrace_train.train.grpo import GRPOSettings, train_role_grpo

    with pytest.raises(ValueError, match="prompt_gradient: false is an SFT option; the 'grpo' trainer"):
        train_role_grpo("unused", [], "unused", LoraTrainConfig(prompt_gradient=False), GRPOSettings(),
                        role="explore", temperature=1.0)
    for mode in ("kto", "grpo"):
        cfg = load_config(SelfTrainConfig, None, ["--mode", mode, "--train.prompt_gradient", "false"])
        with pytest.raises(ValueError, match=f"train.prompt_gradient: false is an SFT option; mode {mode}"):
            cfg.validate()
    # the bootstrap trains SFT in every mode
    load_config(SelfTrainConfig, None, ["--mode", "kto", "--bootstrap.train.prompt_gradient", "false"]).validate()
