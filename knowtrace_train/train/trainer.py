"""The trainers of every role: TRL's SFTTrainer (and KTOTrainer for `mode: kto`) counting the tokens it trains on, with the loss-carrying LM
head on the completion positions only on CPUs (TRL's fused head scores every position there) and, there, the prompt
tokens that a batch's records share run once (`shared_prefix_loss`), each batch drawn, where
`group_prefix_tokens` is set, from records that begin alike (`GroupedPassSampler`); packed records (`packing`) stay rows
of `max_length` tokens each, a pass a batch of rows, each record seeing only itself (`PackedRowsCollator`); and
GRPO's TRL GRPOTrainer fed with given rows (`rows_trainer_class`)."""

from __future__ import annotations

from typing import Any

from knowtrace_train.threads import follow as follow_threads


def counting_trainer_class(kind: str = "sft", share_prefixes: bool = False, packed_rows: bool = False):
    """TRL's SFTTrainer (`kind` "sft") or KTOTrainer ("kto") counting the non-pad tokens, the loss-carrying
    tokens and the positions its forward passes computed (pad included; a shared prefix once) of every batch it
    trains on. `share_prefixes`: on CPUs, an SFT batch of several records runs through `shared_prefix_loss`.
    `packed_rows`: TRL's packed rows (`packing`) are batched as rows (`PackedRowsCollator`), not flattened into
    one row as TRL does for FlashAttention's variable-length kernel."""
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
            if kind == "sft":
                inner = PackedRowsCollator(self.processing_class.pad_token_id) if packed_rows else self.data_collator
                self.data_collator = WeightedCollator(inner)
            self.seen_tokens = 0
            self.seen_completion_tokens = 0
            self.seen_positions = 0
            self._computed: int | None = None  # positions the last shared-prefix batch computed

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            # TRL's fused LM head scores only the loss-carrying positions where Triton runs (GPUs); elsewhere it
            # scores every position (a third of a CPU step here, prompts being ~90% of the tokens): on the CPU
            # the SFT head runs on the completion positions only, the same loss
            # decision weights (loss_weights, train.decision_weight) need the per-token loss: computed here too
            weighted = "loss_weights" in inputs
            if kind != "sft" or (self.accelerator.device.type != "cpu" and not weighted):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            records = batch_records(inputs) if share_prefixes and self.accelerator.device.type == "cpu" else []
            if len(records) > 1:
                return shared_prefix_loss(self, model, inputs, return_outputs, num_items_in_batch, records=records)
            return completion_loss(self, model, inputs, return_outputs, num_items_in_batch)

        def _get_train_sampler(self, train_dataset=None):
            # `record_groups` (set by train_role where grouped passes pay): one group key per dataset row
            groups = getattr(self, "record_groups", None)
            if groups is None:
                return super()._get_train_sampler(train_dataset)
            return GroupedPassSampler(groups, self.args.per_device_train_batch_size, self.args.seed)

        def training_step(self, model, inputs, num_items_in_batch=None):
            follow_threads()  # the threads an evaluation beside this training has given back (threads.py)
            if "attention_mask" in inputs:
                self.seen_tokens += int(inputs["attention_mask"].sum())
            elif packed_rows:
                self.seen_tokens += packed_row_tokens(inputs["position_ids"])
            else:  # padding-free: one flattened row, no pad tokens (pad_to_multiple_of is None)
                self.seen_tokens += int(inputs["input_ids"].numel())
            if "labels" in inputs:
                self.seen_completion_tokens += int((inputs["labels"] != -100).sum())
            elif "completion_mask" in inputs:  # KTO's batches mark the completion instead
                self.seen_completion_tokens += int(inputs["completion_mask"].sum())
            self._computed = None
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.seen_positions += int(inputs["input_ids"].numel()) if self._computed is None else self._computed
            return loss

        def global_counts(self) -> tuple[int, int, int]:
            """(tokens, completion tokens, positions computed) summed over all processes."""
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
    forward = {k: v for k, v in inputs.items() if k not in ("labels", "loss_weights")}
    out = model(**forward, use_cache=False, logits_to_keep=keep)
    logits = out.logits.float()
    target = shift[:, keep]
    if "loss_weights" in inputs:  # each token's loss times its weight (a decision's tokens weigh more)
        each = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                               reduction="none")
        loss = (each * inputs["loss_weights"][:, 1:][:, keep].reshape(-1).to(each.dtype)).sum()
    else:
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                               reduction="sum")
    valid = target != -100
    with torch.no_grad():
        correct = ((logits.argmax(-1) == target) & valid).sum()
    loss = _normalized(trainer, model, loss, correct, valid.sum(), num_items_in_batch)
    return (loss, out) if return_outputs else loss


def _normalized(trainer, model, loss_sum, correct, valid, num_items_in_batch):
    """The summed completion loss as the Trainer wants it: over `num_items_in_batch` where it accumulates (else
    over the `valid` loss-carrying tokens), scaled for DDP's averaging; logs `mean_token_accuracy` as TRL does."""
    import torch

    denominator = num_items_in_batch if num_items_in_batch is not None else valid.clamp(min=1)
    loss = loss_sum / torch.as_tensor(denominator, device=loss_sum.device)
    if trainer.args.average_tokens_across_devices and num_items_in_batch is not None:
        loss = loss * trainer.accelerator.num_processes  # DDP averages the gradients over the processes
    with torch.no_grad():
        mode = "train" if model.training else "eval"
        total = trainer.accelerator.gather_for_metrics(valid).sum()
        correct = trainer.accelerator.gather_for_metrics(correct).sum()
        trainer._metrics[mode]["mean_token_accuracy"].append((correct / total).item() if total > 0 else 0.0)
    return loss


#: a forward pass's fixed cost in positions, for `remainder_batches` (docs/training.md, "One pass for a group's
#: remainders", has the timings it comes from)
PASS_COST = 128


def batch_records(inputs, key: str = "labels") -> list[tuple[list[int], list]]:
    """A padded (right-padded, `attention_mask`) or padding-free (one flattened row, `position_ids` restarting at
    0) SFT batch as one (input ids, labels) pair per record, pads removed; `key` "loss_weights": the weights
    instead of the labels."""
    ids, labels = inputs["input_ids"], inputs[key]
    if "attention_mask" in inputs:
        out = []
        for row, mask, lab in zip(ids.tolist(), inputs["attention_mask"].tolist(), labels.tolist()):
            n = sum(mask)
            if any(mask[n:]) or not all(mask[:n]):
                raise ValueError("shared-prefix training needs right-padded batches (pads after every record's tokens)")
            out.append((row[:n], lab[:n]))
        return out
    starts = (inputs["position_ids"][0] == 0).nonzero().squeeze(-1).tolist() + [ids.shape[1]]
    row, lab = ids[0].tolist(), labels[0].tolist()
    return [(row[a:b], lab[a:b]) for a, b in zip(starts, starts[1:])]


class PackedRowsCollator:
    """TRL's packed rows (records packed into rows of up to `max_length` tokens, `seq_lengths` per row) as a batch
    of rows: input ids right-padded with `pad_token_id`, labels -100 there and on every record's first token,
    position ids restarting at 0 for each record and 0 on every pad, and no attention mask, so transformers builds
    each row's block-diagonal causal mask from the position ids (`find_packed_sequence_indices`): a record attends
    to itself only, and a pad (a lone position 0) to itself only. The loss is that of the records one by one: the
    same loss-carrying tokens, over the same `num_items_in_batch` (tests/test_packing.py). TRL flattens a pass's
    rows into one, which FlashAttention's variable-length kernel wants; SDPA would then build and compute one mask
    over the whole pass, quadratic in its length."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, examples):
        import torch

        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(examples), width), -100, dtype=torch.long)
        positions = torch.zeros((len(examples), width), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            ids[i, :n] = torch.tensor(e["input_ids"])
            labels[i, :n] = torch.tensor(e.get("labels", e["input_ids"]))
            lengths = e.get("seq_lengths") or [n]
            positions[i, :n] = torch.cat([torch.arange(k) for k in lengths])
        labels[positions == 0] = -100  # a record's first token has no token of its own before it
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


def packed_row_tokens(position_ids) -> int:
    """The real tokens of a `PackedRowsCollator` batch: every position but the pads, which are lone 0s (a position
    0 followed by another 0 or the row's end; a record has at least 2 tokens, a prompt's and a completion's)."""
    import torch

    zero = position_ids == 0
    lone = zero & torch.cat([zero[:, 1:], torch.ones_like(zero[:, :1])], dim=1)
    return int(position_ids.numel() - lone.sum())


class WeightedCollator:
    """TRL's collator, with each example's "loss_weights" (`lora.tokenize_records`) batched beside its labels:
    padded with 0 (right) or flattened with the rows (padding-free), so that weight t belongs to label t. A
    batch without weights is TRL's as it was."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __call__(self, examples):
        import torch

        if not examples or "loss_weights" not in examples[0]:
            return self.inner(examples)
        weights = [list(e["loss_weights"]) for e in examples]
        batch = self.inner([{k: v for k, v in e.items() if k != "loss_weights"} for e in examples])
        width = batch["labels"].shape[1]
        if batch["labels"].shape[0] == 1 and len(examples) > 1:  # padding-free: one flattened row
            flat = [w for ws in weights for w in ws]
            rows = [flat + [0.0] * (width - len(flat))]
        else:
            rows = [ws + [0.0] * (width - len(ws)) for ws in weights]
        batch["loss_weights"] = torch.tensor(rows, dtype=torch.float32) * (batch["labels"] != -100)
        return batch


def prefix_plan(records: list[tuple[list[int], list[int]]], min_prefix: int = 16) -> list[tuple[int, list[int]]]:
    """How `shared_prefix_loss` runs a batch's (input ids, labels) records: (shared prefix length, members) per
    group (generation.prefix.plan_prefix_groups), each prefix capped before its records' first loss-carrying
    position, so no prefix position needs the LM head. The positions computed are, per group, the prefix once
    plus each member's remainder."""
    from knowtrace_train.generation.prefix import plan_prefix_groups

    # the logits at position t predict token t + 1: a record's first needed logit is just before its first label
    firsts = []
    for ids, labels in records:
        carrying = [t for t in range(1, len(labels)) if labels[t] != -100]
        if not carrying:
            raise ValueError("a record in the batch carries no loss-bearing token")
        firsts.append(carrying[0] - 1)
    return plan_prefix_groups([ids[: f + 1] for (ids, _), f in zip(records, firsts)], min_prefix)


def shared_prefix_loss(trainer, model, inputs, return_outputs=False, num_items_in_batch=None, min_prefix: int = 16,
                       records: list[tuple[list[int], list[int]]] | None = None):
    """`completion_loss` over a batch of several records, where records beginning with the same prompt tokens run
    those tokens once: the shared prefix's forward pass yields its keys and values, and the group's remainders run
    on top of them in right-padded batches of similar lengths (`remainder_batches`; one backward pass through all
    of it). The attention is causal, so a prefix's states do not depend on what follows it, and a remainder's
    positions do not see the pads after it: the loss and gradients are those of one pass per record (dropout 0
    aside), for fewer tokens computed. Groups and their prefixes: `prefix_plan`. `records`: the batch as
    `batch_records` splits it, where the caller has it already. A batch of remainders, not one pass per record: a
    CPU pass has a large fixed cost in small operations (docs/training.md, "One pass for a group's remainders")."""
    import torch
    import torch.nn.functional as F
    from transformers import DynamicCache

    records = batch_records(inputs) if records is None else records
    weights = [w for _, w in batch_records(inputs, "loss_weights")] if "loss_weights" in inputs else None
    device = inputs["input_ids"].device
    groups = prefix_plan(records, min_prefix)
    head = output_head(model)
    pad = getattr(trainer.processing_class, "pad_token_id", None) or 0  # never attended to: it follows every real token
    loss = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    valid_total = torch.zeros((), dtype=torch.long, device=device)
    computed = 0
    # the model's own head runs on no position (an empty index for `logits_to_keep`): the prefix pass needs only
    # keys and values, and a remainder's loss-carrying positions differ by row, so they are gathered for the head
    no_logits = torch.zeros(0, dtype=torch.long, device=device)
    for shared, members in groups:
        if shared:
            prefix = torch.tensor([records[members[0]][0][:shared]], device=device)
            past = model(input_ids=prefix, use_cache=True, logits_to_keep=no_logits).past_key_values
            layers = [(layer.keys, layer.values) for layer in past.layers]
            computed += shared
        for batch in remainder_batches([len(records[m][0]) - shared for m in members]):
            batch = [members[i] for i in batch]
            cache = None
            if shared:
                n = len(batch)
                cache = DynamicCache(ddp_cache_data=[(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in layers])
            remainders = [records[m][0][shared:] for m in batch]
            width = max(len(r) for r in remainders)
            ids = torch.tensor([r + [pad] * (width - len(r)) for r in remainders], device=device)
            # (row, column) of every position whose logits predict a loss-carrying token: the labels shifted by one
            at = [(row, col, label, weights[m][shared + 1 + col] if weights else 1.0) for row, m in enumerate(batch)
                  for col, label in enumerate(records[m][1][shared + 1 :]) if label != -100]
            rows, cols, target, weight = (torch.tensor(v, device=device) for v in zip(*at))
            out = model(input_ids=ids, past_key_values=cache, use_cache=bool(shared), logits_to_keep=no_logits,
                        output_hidden_states=True)
            with trainer.accelerator.autocast():  # the precision the model's forward runs in (accelerate wraps it)
                logits = head(out.hidden_states[-1][rows, cols]).float()  # the final norm's output, gathered
            if weights:
                loss = loss + (F.cross_entropy(logits, target, reduction="none") * weight.to(logits.dtype)).sum()
            else:
                loss = loss + F.cross_entropy(logits, target, reduction="sum")
            with torch.no_grad():
                correct += (logits.argmax(-1) == target).sum()
                valid_total += target.numel()
            computed += len(batch) * width
    trainer._computed = computed
    loss = _normalized(trainer, model, loss, correct, valid_total, num_items_in_batch)
    return (loss, None) if return_outputs else loss


def remainder_batches(lengths: list[int], pass_cost: int = PASS_COST) -> list[list[int]]:
    """How `shared_prefix_loss` batches a group's remainders (their `lengths`, in tokens): indices cut into
    right-padded batches of similar lengths, minimising the positions computed (pads included) plus `pass_cost`
    positions per forward pass. Sorted by length, the best cut into runs (dynamic programming; a group holds a
    pass's few records)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = [0] + [None] * len(order)  # best[j]: cost of the first j (sorted) remainders
    cut = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):  # the last batch holds sorted remainders i .. j-1, padded to the longest (j-1)
            cost = best[i] + pass_cost + (j - i) * lengths[order[j - 1]]
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    batches, j = [], len(order)
    while j:
        batches.append(order[cut[j] : j])
        j = cut[j]
    return batches[::-1]


def output_head(model):
    """The LM head of a training model, through DDP's (`module`) and PEFT's (`get_base_model`) wrappers."""
    model = getattr(model, "module", model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_output_embeddings()


def pass_groups(rows, config, device: str) -> list[tuple[int, ...]] | None:
    """Each tokenized row's group for `GroupedPassSampler`, the first `config.group_prefix_tokens` tokens of its
    prompt (the positions whose label is -100); None (a uniform shuffle) where the option is off or no pass runs
    a shared prefix (GPUs, one record per pass, packing)."""
    n = config.group_prefix_tokens
    if not (n and config.share_prefixes and not config.packing and device == "cpu" and config.per_device_batch_size > 1):
        return None
    keys = []
    for row in rows:
        prompt = next((i for i, label in enumerate(row["labels"]) if label != -100), len(row["labels"]))
        keys.append(tuple(row["input_ids"][: min(n, prompt)]))
    return keys


def grouped_pass_order(groups, per_pass: int, seed: int) -> list[int]:
    """A permutation of range(len(groups)) cut into passes of `per_pass` consecutive indices, each pass's rows
    from one group where the group has `per_pass` rows left: every group shuffled and chunked, the leftovers of
    all groups shuffled together and chunked, then the full passes shuffled, a short one last (as the data loader
    cuts the order). The same seed gives the same order."""
    import random

    rng = random.Random(seed)
    by_key: dict = {}
    for i, key in enumerate(groups):
        by_key.setdefault(key, []).append(i)
    passes, leftovers = [], []
    for members in by_key.values():  # insertion order: deterministic for a given row order
        rng.shuffle(members)
        full = len(members) - len(members) % per_pass
        passes += [members[i : i + per_pass] for i in range(0, full, per_pass)]
        leftovers += members[full:]
    rng.shuffle(leftovers)
    passes += [leftovers[i : i + per_pass] for i in range(0, len(leftovers), per_pass)]
    short = passes.pop() if passes and len(passes[-1]) < per_pass else []
    rng.shuffle(passes)  # the short pass stays last: the data loader cuts the order every per_pass indices
    return [i for p in passes for i in p] + short


class GroupedPassSampler:
    """The training sampler of grouped passes (`grouped_pass_order`): a new order each epoch (seed + epoch)."""

    def __init__(self, groups, per_pass: int, seed: int):
        self.groups, self.per_pass, self.seed = list(groups), per_pass, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self):
        order = grouped_pass_order(self.groups, self.per_pass, self.seed + self.epoch)
        self.epoch += 1
        return iter(order)


def rows_trainer_class():
    """TRL's GRPOTrainer fed with given rows (train/grpo.py's docstring says why), counting the tokens it trains on."""
    import torch
    from trl import GRPOTrainer

    class RowsGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, rows: list[dict[str, Any]], **kwargs):
            self.rows = rows
            super().__init__(*args, **kwargs)
            self.seen_tokens = 0
            self.seen_completion_tokens = 0

        def training_step(self, *args, **kwargs):
            follow_threads()  # the threads an evaluation beside this training has given back (threads.py)
            return super().training_step(*args, **kwargs)

        def get_train_dataloader(self):
            """Every batch is all the rows, in one seeded order; TRL's `_prepare_inputs` keeps the first and
            cuts it into `steps_per_generation` steps, reused for `num_iterations` passes."""
            from torch.utils.data import DataLoader

            order = torch.randperm(len(self.rows), generator=torch.Generator().manual_seed(self.args.seed)).tolist()
            batches = [order] * (self.args.steps_per_generation * self.num_iterations)
            return DataLoader(self.rows, batch_sampler=batches, collate_fn=list)

        def _prepare_inputs(self, generation_batch):
            steps = self.args.steps_per_generation  # forward passes per pass over the rows
            if self._step % (steps * self.num_iterations) == 0 or self._buffered_inputs is None:
                self._buffered_inputs = self._score_rows(generation_batch, steps)
            step = self._buffered_inputs[self._step % steps]
            self.seen_tokens += int(step["prompt_mask"].sum() + step["completion_mask"].sum())
            self.seen_completion_tokens += int(step["completion_mask"].sum())
            return step

        def _score_rows(self, rows: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
            """The rows as TRL's loss reads them, cut into `steps` near-equal steps: left-padded prompts,
            right-padded completions, the advantages, and (no gradient) the behaviour policy's and M0's
            per-token log probabilities."""
            device = self.accelerator.device
            pad = self.processing_class.pad_token_id
            p_len = max(len(r["prompt_ids"]) for r in rows)
            c_len = max(len(r["completion_ids"]) for r in rows)

            def padded(seqs, width, left):
                ids = torch.full((len(seqs), width), pad, dtype=torch.long)
                mask = torch.zeros((len(seqs), width), dtype=torch.long)
                for i, s in enumerate(seqs):
                    sl = slice(width - len(s), width) if left else slice(0, len(s))
                    ids[i, sl] = torch.tensor(s, dtype=torch.long)
                    mask[i, sl] = 1
                return ids.to(device), mask.to(device)

            prompt_ids, prompt_mask = padded([r["prompt_ids"] for r in rows], p_len, True)
            completion_ids, completion_mask = padded([r["completion_ids"] for r in rows], c_len, False)
            advantages = torch.tensor([r["advantage"] for r in rows], dtype=torch.float32, device=device)
            ids = torch.cat([prompt_ids, completion_ids], 1)
            attn = torch.cat([prompt_mask, completion_mask], 1)
            batch = self.args.per_device_train_batch_size
            old = ref = None
            with torch.no_grad():
                # the policy moves within the rows' passes (TRL's rule): keep the behaviour policy's
                if self.args.gradient_accumulation_steps % (steps * self.num_iterations):
                    old, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, c_len, batch_size=batch)
                if self.beta != 0.0:
                    with self.accelerator.unwrap_model(self.model).disable_adapter():
                        ref, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, c_len, batch_size=batch)
            total = completion_mask.sum()
            out = []
            for part in torch.tensor_split(torch.arange(len(rows), device=device), steps):
                step = {"prompt_ids": prompt_ids[part], "prompt_mask": prompt_mask[part],
                        "completion_ids": completion_ids[part], "completion_mask": completion_mask[part],
                        "advantages": advantages[part], "num_items_in_batch": total}
                if old is not None:
                    step["old_per_token_logps"] = old[part]
                if ref is not None:
                    step["ref_per_token_logps"] = ref[part]
                out.append(step)
            return out

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False, **kwargs):
            """On CPUs, the LM head on the completion positions only (TRL's fused head scores every position
            where Triton does not run: 10x the work for a ~500-token prompt and a ~40-token call); the same
            log probabilities and entropies (tests/test_grpo.py compares them). Elsewhere TRL's own."""
            if self.accelerator.device.type != "cpu" or compute_aux_loss or any(v is not None for v in kwargs.values()):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
                with self.accelerator.autocast():
                    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1,
                                   use_cache=False).logits
                logp = torch.log_softmax(logits[:, :-1].float() / self.temperature, dim=-1)
                logps.append(logp.gather(-1, ids[:, -logits_to_keep:, None]).squeeze(-1))
                if compute_entropy:
                    entropies.append(-(logp.exp() * logp).sum(-1))
            return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

        def global_counts(self) -> tuple[int, int, int]:
            """(tokens, completion tokens, positions computed) summed over all processes."""
            counts = torch.tensor([self.seen_tokens, self.seen_completion_tokens, self.seen_tokens],
                                  device=self.accelerator.device)
            counts = self.accelerator.reduce(counts, reduction="sum")
            return int(counts[0]), int(counts[1]), int(counts[2])

    return RowsGRPOTrainer
