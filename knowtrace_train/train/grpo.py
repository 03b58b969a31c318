"""GRPO of one role on a method's rollouts (TRL's GRPOTrainer loss, M0 the reference): trajectory rewards,
group-relative advantages, the backtracing credit rule, and the per-call rows each role's adapter steps on.

A question's G samples form a group. A trajectory's reward is its answer score (F1, or EM) plus a format term
for parseable calls; its advantage is (reward - group mean) / (group std + 1e-4), TRL's rule (`scale_rewards:
none` drops the division). Every model call of the trajectory becomes a row carrying that advantage; with
`credit: backtrace` a call backtracing drops from a correct trajectory (or every call of a correct one that
cannot be backtraced) gets no positive advantage. A group whose rewards are all equal teaches nothing
(every advantage is 0): it is recorded and skipped, as is every row whose advantage is 0.

Why TRL's trainer is driven with rows rather than with its own generation (`rollout_func`): GRPOTrainer's
unit is one completion per prompt and generation, its advantages normalised over `num_generations`
consecutive completions. A KnowTrace trajectory is several calls with different prompts, through two
adapters (exploration and completion), and their number varies from trajectory to trajectory; the group is
the trajectories, not the calls. So generation and scoring happen in the method's engine (the same rollouts
every mode uses, `rollout.samples` per question), and `RowsGRPOTrainer` replaces only TRL's generate-and-score
step and its repeat sampler: it tensorises the given rows, computes the old (behaviour) and reference log
probabilities with TRL's own function, and hands them to TRL's `_compute_loss` (clipped importance ratio, KL
to M0 through the disabled adapter, TRL's loss normalisations), optimizer, scheduler and logging.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from knowtrace_train.errors import RunError
from knowtrace_train.train.config import (
    GRPOSettings,
    LoraTrainConfig,
    as_trained,
    common_args,
    launched_processes,
)
from knowtrace_train.threads import follow as follow_threads
from knowtrace_train.trajectory import Trajectory, is_correct, split_prefix

logger = logging.getLogger(__name__)

#: TRL's epsilon in the group normalisation: (r - mean) / (std + STD_EPS)
STD_EPS = 1e-4


# -- rewards and advantages ---------------------------------------------------------------------------------


def parsed_calls(traj: Trajectory) -> int:
    """The calls whose output the method could use (no `error`)."""
    return sum(1 for c in traj.calls if c.error is None)


def answer_reward(traj: Trajectory, grpo: GRPOSettings) -> float:
    """The answer part of the reward: the trajectory's F1 or EM (`grpo.reward`); unscored counts 0."""
    return float((traj.f1 if grpo.reward == "f1" else traj.em) or 0.0)


def trajectory_reward(traj: Trajectory, grpo: GRPOSettings) -> float:
    """`answer_reward` plus the format term format_weight x (2 x parsed / calls - 1): +weight when every call
    parsed, -weight when none did or there was no call at all."""
    n = len(traj.calls)
    fmt = (2.0 * parsed_calls(traj) / n - 1.0) if n else -1.0
    return answer_reward(traj, grpo) + grpo.format_weight * fmt


def group_advantages(rewards: Sequence[float], scale_rewards: str = "group") -> list[float] | None:
    """Group-relative advantages of one question's samples: r - mean, divided by (std + 1e-4) under "group" (the
    sample standard deviation, as torch.std and TRL take it). None where the group teaches nothing: fewer than 2
    samples, or every reward equal."""
    if len(rewards) < 2:
        return None
    mean = statistics.fmean(rewards)
    if max(rewards) - min(rewards) <= 1e-12:
        return None
    std = statistics.stdev(rewards)
    return [(r - mean) / (std + STD_EPS) if scale_rewards == "group" else r - mean for r in rewards]


def grpo_records(
    trajectories: Iterable[Trajectory],
    grpo: GRPOSettings,
    *,
    kinds: Iterable[str],
    credited: Mapping[str, set[int]] | None,
    iteration: int | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Rows per record kind and the iteration's statistics.

    A row is one model call as the policy made it: {"prompt" (the call's prompt), "completion" (its output),
    "role", "trajectory_id", "question_id", "call", "reward", "advantage", "credit", "iteration"}. `credit` is
    "outcome" (the trajectory's advantage), or, where `credited` (the method's credit rule, needed by
    `credit: backtrace`) leaves a positive advantage's call out of a correct trajectory's credited calls,
    "masked" (advantage 0, not written). Calls of kinds outside `kinds` are not trained (counted)."""
    if grpo.credit == "backtrace" and credited is None:
        raise ValueError("grpo.credit: backtrace needs the method's credit rule (Method.credited_calls)")
    kinds = tuple(kinds)
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.question_id].append(t)
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    rewards_all: list[float] = []
    answers: list[float] = []
    skipped_groups: list[str] = []
    counts = defaultdict(int)
    for qid, trajs in groups.items():
        rewards = [trajectory_reward(t, grpo) for t in trajs]
        rewards_all += rewards
        answers += [answer_reward(t, grpo) for t in trajs]
        advantages = group_advantages(rewards, grpo.scale_rewards)
        if advantages is None:
            skipped_groups.append(qid)
            continue
        for t, r, a in zip(trajs, rewards, advantages):
            keep = credited.get(t.id, set()) if (grpo.credit == "backtrace" and is_correct(t)) else None
            for c in t.calls:
                counts["calls"] += 1
                if c.role not in rows:
                    counts["calls_untrained_kind"] += 1
                    continue
                adv, credit = a, "outcome"
                if keep is not None and adv > 0 and c.index not in keep:
                    counts["masked"] += 1
                    continue
                if adv == 0:
                    counts["zero_advantage"] += 1
                    continue
                counts["positive" if adv > 0 else "negative"] += 1
                prefix, completion = split_prefix(c.prefix, c.output)
                rows[c.role].append({
                    "prompt": c.prompt, "prefix": prefix, "completion": completion, "role": c.role, "trajectory_id": t.id,
                    "question_id": qid, "call": c.index, "reward": r, "advantage": adv, "credit": credit,
                    "iteration": iteration if iteration is not None else t.iteration,
                })
    n_groups = len(groups)
    stats = {
        "mode": "grpo",
        "credit": grpo.credit,
        "reward_kind": grpo.reward,
        "trajectories": len(rewards_all),
        "correct": sum(1 for g in groups.values() for t in g if is_correct(t)),
        "groups": n_groups,
        "groups_trained": n_groups - len(skipped_groups),
        # zero-variance groups: every sample scored the same, so every advantage is 0 (recorded, not divided by 0)
        "groups_skipped_equal_rewards": len(skipped_groups),
        "skipped_group_questions": skipped_groups[:20],
        # the reward curve: mean reward (and its answer part) of the iteration's samples
        "reward_mean": statistics.fmean(rewards_all) if rewards_all else None,
        "answer_reward_mean": statistics.fmean(answers) if answers else None,
        "calls": counts["calls"],
        "rows_positive": counts["positive"],
        "rows_negative": counts["negative"],
        "masked_by_credit": counts["masked"],
        "zero_advantage": counts["zero_advantage"],
        "calls_untrained_kind": counts["calls_untrained_kind"],
        "records": {k: len(v) for k, v in rows.items()},
    }
    return rows, stats


# -- the trainer --------------------------------------------------------------------------------------------


def encode_rows(tokenizer, rows: Sequence[Mapping[str, Any]], role: str, prompt_format: str, max_length: int
                ) -> tuple[list[dict[str, Any]], int]:
    """Rows -> {"prompt_ids", "completion_ids", "advantage"} as the SFT trainer encodes a record (the completion as
    the chat template closes the turn, through EOS); rows over `max_length` tokens are skipped, counted and
    logged. A row without a finite number "advantage" raises naming it."""
    from knowtrace_train.train.lora import SFTRecordError, encode_record, load_records

    out, too_long = [], []
    for where, rec in load_records(rows, role, allow_empty=True):  # an empty output is a policy's action too
        a = rec.get("advantage")
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a):
            raise SFTRecordError(f"{where}: field 'advantage' must be a finite number, got {a!r}")
        p, c = encode_record(tokenizer, rec["prompt"], rec["completion"], prompt_format, rec.get("prefix", ""))
        if len(p) + len(c) > max_length:
            too_long.append(where)
            continue
        out.append({"prompt_ids": p, "completion_ids": c, "advantage": float(a), "reward": float(rec.get("reward", a))})
    if too_long:
        logger.warning("skipped %d of %d GRPO rows longer than max_length=%d, e.g. %s", len(too_long), len(rows),
                       max_length, ", ".join(too_long[:3]))
    return out, len(too_long)


def row_rewards(prompts, completions, reward=None, **_):
    """TRL's reward-function signature over rows: each row's trajectory reward, as `grpo_records` scored it. TRL
    insists on a reward source; `RowsGRPOTrainer` gets its advantages from the rows and never calls it."""
    return [float(r) for r in reward]


def rows_trainer_class():
    """TRL's GRPOTrainer fed with given rows (see the module docstring), counting the tokens it trains on."""
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


def grpo_args(config: LoraTrainConfig, grpo: GRPOSettings, steps: int, temperature: float, precision: str,
              device: str, output_dir: str):
    """TRL's GRPOConfig: `steps` optimizer steps per pass over the rows, each of `grpo.accumulation` forward
    passes of up to `grpo.rows_per_pass` rows (TRL's steps_per_generation counts the passes), and `grpo.epochs`
    passes; the loss settings are `grpo`'s. `temperature`: the rollouts' (TRL divides the logits by it, as the
    sampler did)."""
    from trl import GRPOConfig

    base = common_args(config, precision, device, output_dir)
    base.update(learning_rate=grpo.learning_rate, per_device_train_batch_size=grpo.rows_per_pass,
                gradient_accumulation_steps=grpo.accumulation, num_train_epochs=1, max_steps=steps * grpo.epochs)
    return GRPOConfig(
        **base,
        steps_per_generation=steps * grpo.accumulation,
        num_iterations=grpo.epochs,
        num_generations=grpo.rows_per_pass,
        beta=grpo.beta,
        epsilon=grpo.epsilon,
        loss_type=grpo.loss_type,
        temperature=temperature,
    )


def train_role_grpo(
    base_model_path: str | Path,
    rows: Sequence[Mapping[str, Any]],
    output_dir: str | Path,
    config: LoraTrainConfig,
    grpo: GRPOSettings,
    *,
    role: str,
    temperature: float,
    init_adapter: str | Path | None = None,
):
    """Policy-gradient steps of one role's adapter on its rows and save it in PEFT's format (as `train_role`
    does): from `init_adapter` (the previous iteration's, the policy that rolled out) or a new one on M0. The
    reference is M0 (the adapter disabled). Returns the TrainResult and the GRPO figures (rows per sign, the last
    logged KL and clip ratio)."""
    import torch
    from datasets import Dataset
    from peft import PeftModel

    from knowtrace_train.train.lora import (
        _load_base,
        lora_config,
        save_trained_adapter,
        train_measured,
        training_setup,
    )

    if launched_processes() > 1:
        raise RunError("mode: grpo trains in one process (its rows are not sharded among processes yet); "
                         "launch without torchrun / accelerate's num_processes")
    trained = as_trained(config, 1)
    base_model_path, output_dir = Path(base_model_path), Path(output_dir)
    device, precision, why, tokenizer = training_setup(base_model_path, trained)
    encoded, skipped = encode_rows(tokenizer, rows, role, trained.prompt_format, trained.max_length)
    if not encoded:
        raise RunError(f"role {role}: no GRPO row can be trained on ({skipped} longer than max_length)")
    steps = math.ceil(len(encoded) / grpo.batch_size)
    # the training record's batch: the policy steps' (grpo.batch_size rows per step, grpo's rate)
    as_run = dataclasses.replace(trained, per_device_batch_size=grpo.rows_per_pass,
                                 gradient_accumulation_steps=grpo.accumulation, effective_batch_size=grpo.batch_size,
                                 learning_rate=grpo.learning_rate)
    positive = sum(1 for r in encoded if r["advantage"] > 0)
    logger.info("role %s: GRPO on %d rows (%d positive, %d negative advantages), %d steps x %d passes, from %s",
                role, len(encoded), positive, len(encoded) - positive, steps, grpo.epochs,
                init_adapter or "a new adapter on M0")
    model = _load_base(base_model_path, precision, trained, device)
    # a continued adapter comes in as a PEFT model; a new one is made by TRL after its set_seed (the same
    # initialisation whatever ran before in this process: a resumed run trains what the whole run trained)
    peft_config = None
    if init_adapter is not None:
        model = PeftModel.from_pretrained(model, str(init_adapter), is_trainable=True)
    else:
        peft_config = lora_config(trained)
    Trainer = rows_trainer_class()
    with tempfile.TemporaryDirectory(prefix=f"knowtrace_grpo_{role}_") as scratch:
        args = grpo_args(trained, grpo, steps, temperature, precision, device, scratch)
        # TRL reads the dataset's length and columns; the rows themselves come from `rows`
        trainer = Trainer(model=model, reward_funcs=[row_rewards], args=args, processing_class=tokenizer, rows=encoded,
                          peft_config=peft_config,
                          train_dataset=Dataset.from_list([{"prompt": "", "reward": r["reward"]} for r in encoded]))
        result = train_measured(trainer, as_run, output_dir, records=len(encoded), skipped=skipped,
                                precision=precision)
        logged = [h for h in trainer.state.log_history if "loss" in h]
        last = logged[-1] if logged else {}
        figures = {
            "rows": len(encoded),
            "positive": positive,
            "negative": len(encoded) - positive,
            "steps_per_pass": steps,
            "from": "previous adapter" if init_adapter is not None else "new adapter on M0",
            "log": [{k: h[k] for k in ("step", "loss", "kl", "clip_ratio/region_mean", "entropy", "grad_norm") if k in h}
                    for h in logged],
            "kl": last.get("kl"),
        }
        logger.info("role %s: GRPO loss %.4f over %d steps in %.1f s, last KL %s", role, result.train_loss,
                    result.steps, result.seconds, figures["kl"])
        save_trained_adapter(trainer, output_dir, role, base_model_path, as_run, precision, why, result,
                             extra={"grpo": {**dataclasses.asdict(grpo), **figures}})
    del trainer, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return result, figures

