"""The trainers of every role: TRL's SFTTrainer (and KTOTrainer for `mode: kto`) counting the tokens it trains on, with the loss-carrying LM
head on the completion positions only on CPUs (TRL's fused head scores every position there)."""

from __future__ import annotations


def counting_trainer_class(kind: str = "sft"):
    """TRL's SFTTrainer (`kind` "sft") or KTOTrainer ("kto") counting the non-pad tokens, the loss-carrying
    tokens and the positions (pad included) of every batch it trains on."""
    import torch

    if kind == "sft":
        from trl import SFTTrainer as Base
    elif kind == "kto":
        from trl import KTOTrainer as Base
    else:
        raise ValueError(f"unknown trainer kind {kind!r}; expected 'sft' or 'kto'")

    class Counting(Base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen_tokens = 0
            self.seen_completion_tokens = 0
            self.seen_positions = 0

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            # TRL's fused LM head scores only the loss-carrying positions where Triton runs (GPUs); elsewhere it
            # scores every position (a third of a CPU step here, prompts being ~90% of the tokens): on the CPU
            # the SFT head runs on the completion positions only, the same loss
            if kind != "sft" or self.accelerator.device.type != "cpu":
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return completion_loss(self, model, inputs, return_outputs, num_items_in_batch)

        def training_step(self, model, inputs, num_items_in_batch=None):
            if "attention_mask" in inputs:
                self.seen_tokens += int(inputs["attention_mask"].sum())
            else:  # padding-free: one flattened row, no pad tokens (pad_to_multiple_of is None)
                self.seen_tokens += int(inputs["input_ids"].numel())
            if "labels" in inputs:
                self.seen_completion_tokens += int((inputs["labels"] != -100).sum())
            elif "completion_mask" in inputs:  # KTO's batches mark the completion instead
                self.seen_completion_tokens += int(inputs["completion_mask"].sum())
            self.seen_positions += int(inputs["input_ids"].numel())
            return super().training_step(model, inputs, num_items_in_batch)

        def global_counts(self) -> tuple[int, int, int]:
            """(tokens, completion tokens, positions) summed over all processes."""
            counts = torch.tensor(
                [self.seen_tokens, self.seen_completion_tokens, self.seen_positions], device=self.accelerator.device
            )
            counts = self.accelerator.reduce(counts, reduction="sum")
            return int(counts[0]), int(counts[1]), int(counts[2])

    Counting.__name__ = f"Counting{Base.__name__}"
    return Counting


def completion_loss(trainer, model, inputs, return_outputs=False, num_items_in_batch=None):
    """The SFT loss with the LM head on the completion positions only: the mean (over `num_items_in_batch`
    where the Trainer accumulates, else over this batch) of the next-token cross-entropy where the label is
    not -100; logs the trainer's `mean_token_accuracy` as TRL does."""
    import torch
    import torch.nn.functional as F

    labels = inputs["labels"]
    shift = labels[:, 1:]
    keep = (shift != -100).any(dim=0).nonzero().squeeze(-1)  # positions whose next token carries loss
    forward = {k: v for k, v in inputs.items() if k != "labels"}
    out = model(**forward, use_cache=False, logits_to_keep=keep)
    logits = out.logits.float()
    target = shift[:, keep]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum")
    valid = target != -100
    denominator = num_items_in_batch if num_items_in_batch is not None else valid.sum().clamp(min=1)
    loss = loss / torch.as_tensor(denominator, device=loss.device)
    if trainer.args.average_tokens_across_devices and num_items_in_batch is not None:
        loss = loss * trainer.accelerator.num_processes  # DDP averages the gradients over the processes
    with torch.no_grad():
        mode = "train" if model.training else "eval"
        correct = ((logits.argmax(-1) == target) & valid).sum()
        total = trainer.accelerator.gather_for_metrics(valid.sum()).sum()
        correct = trainer.accelerator.gather_for_metrics(correct).sum()
        trainer._metrics[mode]["mean_token_accuracy"].append((correct / total).item() if total > 0 else 0.0)
    return (loss, out) if return_outputs else loss
