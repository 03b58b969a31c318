"""GRPO of one role on a method's rollouts (TRL's GRPOTrainer loss, M0 the reference; the mode whole, its settings beside its trainer): trajectory rewards,
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
every mode uses, `rollout.samples` per question), and `RowsGRPOTrainer` (train/trainer.py) replaces only TRL's generate-and-score
step and its repeat sampler: it tensorises the given rows, computes the old (behaviour) and reference log
probabilities with TRL's own function, and hands them to TRL's `_compute_loss` (clipped importance ratio, KL
to M0 through the disabled adapter, TRL's loss normalisations), optimizer, scheduler and logging.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from knowtrace_train.errors import RunError
from knowtrace_train.train.config import (
    LoraTrainConfig,
    as_trained,
    common_args,
    launched_processes,
)
from knowtrace_train.train.lora import (
    RoleTraining,
    SFTRecordError,
    _load_base,
    encode_record,
    load_records,
    lora_config,
    train_adapter,
)
from knowtrace_train.train.mode import TrainingMode, trained_info
from knowtrace_train.train.trainer import rows_trainer_class
from knowtrace_train.trajectory import Trajectory, is_correct, split_prefix

logger = logging.getLogger(__name__)


GRPO_CREDITS = ("backtrace", "outcome")
GRPO_REWARDS = ("f1", "em")
GRPO_LOSSES = ("dapo", "grpo", "dr_grpo", "bnpo")


@dataclass
class GRPOSettings:
    """`mode: grpo` (TRL's GRPO loss, DeepSeekMath's group-relative advantage): each iteration's G samples per question
    are scored, every model call of a trajectory is a training row carrying its trajectory's advantage, and each role's
    adapter takes policy-gradient steps on its rows, KL-anchored to M0 (the adapter disabled). Unlike the SFT modes the
    adapter is not re-made from M0 each iteration: iteration z continues iteration z-1's (the policy that rolled out).
    The LoRA shape (rank, alpha, targets) and the precision are the `train:` section's."""

    credit: str = field(default="backtrace", metadata={"help": (
        "'backtrace': the calls backtracing drops from a correct trajectory get no positive advantage (set to 0); "
        "'outcome': every call carries its trajectory's advantage (the outcome-reward anchors' way)")})
    reward: str = field(default="f1", metadata={"help": "answer reward: 'f1' (token F1 against the gold answers) or 'em'"})
    format_weight: float = field(default=0.1, metadata={"help": (
        "format term added to the answer reward: weight x (2 x parsed calls / calls - 1), so +weight when every call "
        "parsed and -weight when none did (a trajectory with no call gets -weight)")})
    scale_rewards: str = field(default="group", metadata={"help": (
        "'group': advantage = (reward - group mean) / (group std + 1e-4), TRL's default; 'none': reward - group mean "
        "(Dr. GRPO)")})
    beta: float = field(default=0.04, metadata={"help": "KL coefficient against M0 (the adapter disabled); 0 drops the KL term"})
    epsilon: float = field(default=0.2, metadata={"help": "clipping range of the importance ratio (TRL's epsilon)"})
    loss_type: str = field(default="dapo", metadata={"help": (
        "TRL's loss normalisation: 'dapo' (every completion token of a step weighs the same; TRL's default), 'grpo', "
        "'dr_grpo' or 'bnpo'")})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW rate of the policy steps (the adapter's)"})
    batch_size: int = field(default=8, metadata={"help": "rows (model calls) per optimizer step"})
    per_device_batch_size: int | None = field(default=None, metadata={"help": (
        "rows per forward pass (None: batch_size); must divide batch_size, the accumulation making up the rest")})
    epochs: int = field(default=1, metadata={"help": (
        "passes over an iteration's rows (TRL's num_iterations, mu); > 1 reuses the rows with the clipped importance ratio")})

    def __post_init__(self) -> None:
        for name, allowed in (("credit", GRPO_CREDITS), ("reward", GRPO_REWARDS), ("loss_type", GRPO_LOSSES),
                              ("scale_rewards", ("group", "none"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"grpo.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        for name, low in (("format_weight", 0.0), ("beta", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low:
                raise ValueError(f"grpo.{name} must be a number >= {low:g}, got {v!r}")
        for name in ("epsilon", "learning_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"grpo.{name} must be a positive number, got {v!r}")
        for name in ("batch_size", "epochs", "per_device_batch_size"):
            v = getattr(self, name)
            if v is None and name == "per_device_batch_size":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"grpo.{name} must be an integer >= 1{' or null' if name.startswith('per') else ''}, got {v!r}")
        if self.per_device_batch_size is not None and self.batch_size % self.per_device_batch_size:
            raise ValueError(f"grpo.batch_size {self.batch_size} is not a multiple of grpo.per_device_batch_size "
                             f"{self.per_device_batch_size}")

    @property
    def rows_per_pass(self) -> int:
        return self.per_device_batch_size or self.batch_size

    @property
    def accumulation(self) -> int:
        return self.batch_size // self.rows_per_pass

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
    if launched_processes() > 1:
        raise RunError("mode: grpo trains in one process (its rows are not sharded among processes yet); "
                         "launch without torchrun / accelerate's num_processes")
    return train_adapter(base_model_path, output_dir,
                         GRPOTraining(as_trained(config, 1), role, rows, grpo, temperature, init_adapter))


@dataclass
class GRPOTraining(RoleTraining):
    """GRPO's parts of `train_adapter`: the rows encoded with their advantages, policy steps from `init_adapter`."""

    key, scratch = "grpo", "knowtrace_grpo"
    temperature: float = 1.0
    init_adapter: str | Path | None = None

    @property
    def recorded(self) -> LoraTrainConfig:
        """The training record's batch: the policy steps' (grpo.batch_size rows per step, grpo's rate)."""
        grpo = self.settings
        return dataclasses.replace(self.config, per_device_batch_size=grpo.rows_per_pass, learning_rate=grpo.learning_rate,
                                   gradient_accumulation_steps=grpo.accumulation, effective_batch_size=grpo.batch_size)

    def rows(self, tokenizer, device, precision, why):
        grpo = self.settings
        encoded, skipped = encode_rows(tokenizer, self.records, self.role, self.config.prompt_format,
                                       self.config.max_length)
        if not encoded:
            raise RunError(f"role {self.role}: no GRPO row can be trained on ({skipped} longer than max_length)")
        self.steps = math.ceil(len(encoded) / grpo.batch_size)
        self.positive = sum(1 for r in encoded if r["advantage"] > 0)
        logger.info("role %s: GRPO on %d rows (%d positive, %d negative advantages), %d steps x %d passes, from %s",
                    self.role, len(encoded), self.positive, len(encoded) - self.positive, self.steps, grpo.epochs,
                    self.init_adapter or "a new adapter on M0")
        return encoded, skipped

    def trainer(self, base_model_path, rows, device, precision, tokenizer, scratch):
        from datasets import Dataset
        from peft import PeftModel

        model = _load_base(base_model_path, precision, self.config, device)
        # a continued adapter comes in as a PEFT model; a new one is made by TRL after its set_seed (the same
        # initialisation whatever ran before in this process: a resumed run trains what the whole run trained)
        peft_config = None
        if self.init_adapter is not None:
            model = PeftModel.from_pretrained(model, str(self.init_adapter), is_trainable=True)
        else:
            peft_config = lora_config(self.config)
        args = grpo_args(self.config, self.settings, self.steps, self.temperature, precision, device, scratch)
        # TRL reads the dataset's length and columns; the rows themselves come from `rows`
        return rows_trainer_class()(model=model, reward_funcs=[row_rewards], args=args, processing_class=tokenizer,
                                    rows=rows, peft_config=peft_config,
                                    train_dataset=Dataset.from_list([{"prompt": "", "reward": r["reward"]} for r in rows]))

    def figures(self, trainer, result):
        logged = [h for h in trainer.state.log_history if "loss" in h]
        last = logged[-1] if logged else {}
        figures = {
            "rows": result.records,
            "positive": self.positive,
            "negative": result.records - self.positive,
            "steps_per_pass": self.steps,
            "from": "previous adapter" if self.init_adapter is not None else "new adapter on M0",
            "log": [{k: h[k] for k in ("step", "loss", "kl", "clip_ratio/region_mean", "entropy", "grad_norm") if k in h}
                    for h in logged],
            "kl": last.get("kl"),
        }
        logger.info("role %s: GRPO loss %.4f over %d steps in %.1f s, last KL %s", self.role, result.train_loss,
                    result.steps, result.seconds, figures["kl"])
        return figures


class GRPOMode(TrainingMode):
    """`mode: grpo`: every call of a step's rollouts is a row with its trajectory's group-relative advantage (masked
    by the method's credit rule under `credit: backtrace`), and each role's adapter takes policy steps from M(z-1)'s
    (the policy goes on; a role without rows keeps it). The rationalizer's statistics, the FA ratio among them, are
    kept beside the GRPO ones so the modes' tables compare."""

    name = "grpo"
    rationalizers = ("backtrace", "star")
    continues_policy = True
    rationale_keys = ("grpo",)

    def check(self, config, rationalizers) -> None:
        """Groups (rollout.samples >= 2, sampled), one process, and for `credit: backtrace` a method whose calls
        backtracing can credit."""
        from knowtrace_train.methods import METHODS, Method, get_method

        if config.rollout.samples < 2:
            raise ValueError(f"mode: grpo compares a question's samples: set rollout.samples >= 2 (and "
                             f"rollout.temperature), got {config.rollout.samples}")
        method = get_method(config.strategy.name)
        if config.grpo.credit == "backtrace" and type(method).credited_calls is Method.credited_calls:
            have = sorted(n for n, m in METHODS.items() if type(m).credited_calls is not Method.credited_calls)
            raise ValueError(f"grpo.credit: backtrace needs a method whose calls backtracing credits ({', '.join(have)}); "
                             f"method {config.strategy.name!r} has none: set grpo.credit: outcome")
        if launched_processes() > 1:
            raise ValueError("mode: grpo trains in one process (its rows are not sharded among processes yet): launch "
                             "it without torchrun / accelerate --num_processes")

    def records(self, records, stats, *, trajectories, iteration, config, method, kinds, count_tokens):
        """The rows per record kind and the rationalizer's statistics with the GRPO ones (rewards, groups, masked
        calls) under "grpo"."""
        credited = (method.credited_calls(trajectories, strategy=config.strategy, count_tokens=count_tokens)
                    if config.grpo.credit == "backtrace" else None)
        rows, gstats = grpo_records(trajectories, config.grpo, kinds=kinds, credited=credited, iteration=iteration)
        logger.info("iteration %d GRPO: mean reward %.3f over %d trajectories; %d of %d groups trained (%d with equal "
                    "rewards skipped); %d positive and %d negative rows, %d calls masked by the credit rule", iteration,
                    gstats["reward_mean"] or 0.0, gstats["trajectories"], gstats["groups_trained"], gstats["groups"],
                    gstats["groups_skipped_equal_rewards"], gstats["rows_positive"], gstats["rows_negative"],
                    gstats["masked_by_credit"])
        return rows, {**stats, "records": gstats["records"], "grpo": gstats}

    def train(self, records, *, base, output_dir, train, seed, config, role, where, init_adapter):
        """One role's GRPO steps on its rows (every call as the policy made it, an empty output included), from
        M(z-1)'s adapter where it has one."""
        if not records:
            logger.warning("%s: no GRPO row for the %s adapter (every advantage 0); the role keeps %s", where, role,
                           init_adapter or "M0")
            return {"records": 0}
        # a kind may train another role's adapter (KnowTrace's forced answer trains exploration's)
        rows = [{k: r[k] for k in ("prompt", "prefix", "completion", "advantage", "reward") if k in r} for r in records]
        res, figures = train_role_grpo(base, rows, output_dir, dataclasses.replace(train, seed=seed), config.grpo,
                                       role=role, temperature=config.rollout_temperature, init_adapter=init_adapter)
        return {"grpo": figures, **trained_info(res, seed)}
