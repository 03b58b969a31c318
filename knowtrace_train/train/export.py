"""Export: merge each role's adapter into M0 as a ready-to-serve model, check it, and copy the adapters.

Reads (the run folder of DESIGN.md)::

    runs/<name>/m0.json                      {"path": "<M0 model folder>"} (relative to the run folder or absolute);
                                             without it, the base recorded in each adapter's knowtrace_training.json
    runs/<name>/iter_<z>/adapters/<role>/    PEFT adapters, one per role
    runs/<name>/iter_<z>/sft_<role>.jsonl    optional: its first prompts are the check's sample prompts

Writes::

    runs/<name>/export/iter_<z>/<role>/           merged model (safetensors) + tokenizer
    runs/<name>/export/iter_<z>/adapters/<role>/  the adapter as trained (multi-LoRA serving)
    runs/<name>/export/iter_<z>/export.json       per role: base, prompts checked, equal outputs, logit gap

The check: on each sample prompt, greedy decoding of the merged model must give the same tokens as M0 with
the adapter. Merging changes float rounding only, so a divergence is accepted only at a near tie (the
adapter model's top-two logits closer than `tie_tolerance`); any other divergence raises `ExportCheckError`.

An adapter trained with `qlora: true` learnt on the 4-bit NF4 base, but is merged, as PEFT users expect, onto
the unquantized M0 (no quantization is ever loaded here). The merged model therefore differs from the model
that was trained by the base's quantization error: export.json states it per role (`qlora_gap`: max and mean
|logit difference| and top-1 agreement, adapter on the 4-bit base vs merged model in bf16, on the sample
prompts), measured where CUDA and bitsandbytes are present and marked as not measured elsewhere.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from knowtrace_train.errors import UserError
from knowtrace_train.io import atomic_dir, iter_jsonl, read_json, write_json
from knowtrace_train.train.lora import TRAINING_INFO, read_training_info, render_prompt_ids
from knowtrace_train.train.merge import merge_adapters_into_base

logger = logging.getLogger(__name__)

M0_FILE = "m0.json"
#: Used where an iteration has no SFT records to take prompts from.
FALLBACK_PROMPTS = (
    "Question: Where was the founder of the company that makes the Zentor bicycle born?",
    "Extract the knowledge triplets about Harlow Press from: Harlow Press is a map publisher founded in 1821.",
    "What is the capital of France?",
)


class ExportError(UserError, RuntimeError):
    """A run folder that cannot be exported (no adapters, no M0 path)."""

    label = "export error"


class ExportCheckError(ExportError):
    """A merged model whose greedy outputs differ from the adapter model's."""


@dataclass
class PromptCheck:
    prompt_index: int
    adapter_tokens: list[int]
    merged_tokens: list[int]
    #: the first step where they differ, None where they agree
    diverged_at: int | None = None
    #: the adapter model's top-1 minus top-2 logit at that step
    margin_at_divergence: float | None = None
    #: largest |logit difference| over the steps both decoded alike
    max_logit_diff: float = 0.0


@dataclass
class RoleExport:
    role: str
    base_model: str
    adapter_dir: str
    merged_dir: str
    adapter_copy: str
    prompt_format: str
    checks: list[PromptCheck] = field(default_factory=list)
    #: for a QLoRA-trained adapter: the merged model against the adapter on the 4-bit base (`quantized_logit_gap`)
    qlora_gap: dict[str, Any] | None = None

    @property
    def identical(self) -> bool:
        return all(c.diverged_at is None for c in self.checks)


def iterations(run_dir: Path) -> list[int]:
    """The iterations of a run that have adapters, in order."""
    found = []
    for p in run_dir.glob("iter_*"):
        m = re.fullmatch(r"iter_(\d+)", p.name)
        if m and (p / "adapters").is_dir() and any((p / "adapters").iterdir()):
            found.append(int(m.group(1)))
    return sorted(found)


def find_m0(run_dir: Path, adapter_dir: Path) -> Path:
    """The base model an adapter merges into: m0.json of the run, else the adapter's training record."""
    m0_file = run_dir / M0_FILE
    trained_on = read_training_info(adapter_dir).get("base_model")
    if m0_file.is_file():
        try:
            data = read_json(m0_file)
        except json.JSONDecodeError as e:
            raise ExportError(f"{m0_file}: not valid JSON ({e.msg})") from e
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            raise ExportError(f'{m0_file}: expected {{"path": "<model folder>"}}')
        path = Path(data["path"])
        path = path if path.is_absolute() else (run_dir / path)
        if trained_on and Path(trained_on).resolve() != path.resolve():
            logger.warning("%s was trained on %s but %s names %s; merging into the latter",
                           adapter_dir, trained_on, m0_file, path)
    elif trained_on:
        path = Path(trained_on)
    else:
        raise ExportError(f"no M0 path: write {m0_file} as {{\"path\": ...}} (no {TRAINING_INFO} in {adapter_dir})")
    if not (path / "config.json").is_file():
        raise ExportError(f"M0 {path} is not a model folder (no config.json)")
    return path


def sample_prompts(iter_dir: Path, role: str, n: int) -> list[Any]:
    """The first `n` distinct prompts of the iteration's SFT records for `role`, else built-in prompts."""
    path = iter_dir / f"sft_{role}.jsonl"
    prompts: list[Any] = []
    if path.is_file():
        for lineno, rec in iter_jsonl(path):
            p = rec.get("prompt")
            if not (isinstance(p, str) and p) and not isinstance(p, list):
                raise ExportError(f"{path}:{lineno}: field 'prompt' is missing or empty")
            if p not in prompts:
                prompts.append(p)
            if len(prompts) == n:
                break
    return prompts or list(FALLBACK_PROMPTS[:n])


def _greedy(model, prompt_ids: list[int], max_new_tokens: int, pad_id: int | None):
    """Greedy tokens and the per-step logits (float32) of one prompt."""
    import torch

    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=pad_id,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    logits = [step[0].float().cpu() for step in out.logits]
    return tokens, logits


def _compare(adapter: tuple[list[int], list], merged: tuple[list[int], list], index: int) -> PromptCheck:
    a_tokens, a_logits = adapter
    m_tokens, m_logits = merged
    check = PromptCheck(index, a_tokens, m_tokens)
    for t in range(max(len(a_tokens), len(m_tokens))):
        if t < len(a_logits) and t < len(m_logits):
            check.max_logit_diff = max(check.max_logit_diff, float((a_logits[t] - m_logits[t]).abs().max()))
        if t >= len(a_tokens) or t >= len(m_tokens) or a_tokens[t] != m_tokens[t]:
            check.diverged_at = t
            if t < len(a_logits):
                top2 = a_logits[t].topk(2).values
                check.margin_at_divergence = float(top2[0] - top2[1])
            break
    return check


def check_merged_matches_adapter(
    base_path: Path,
    adapter_dir: Path,
    merged_dir: Path,
    prompts: Sequence[Any],
    prompt_format: str,
    *,
    max_new_tokens: int = 32,
    tie_tolerance: float | None = None,
) -> list[PromptCheck]:
    """Greedy-decode each prompt with M0+adapter, then with the merged model; raise where they differ
    other than at a near tie. `tie_tolerance` defaults to 1e-3 logits for fp32 weights, 5e-2 for 16-bit."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompt_ids = [render_prompt_ids(tokenizer, p, prompt_format) for p in prompts]

    base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype="auto")
    adapter_model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    if tie_tolerance is None:
        tie_tolerance = 1e-3 if base.dtype == torch.float32 else 5e-2
    adapter_out = [_greedy(adapter_model, ids, max_new_tokens, pad_id) for ids in prompt_ids]
    del adapter_model, base

    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype="auto").eval()
    checks = []
    for i, ids in enumerate(prompt_ids):
        check = _compare(adapter_out[i], _greedy(merged, ids, max_new_tokens, pad_id), i)
        if check.diverged_at is not None:
            margin = check.margin_at_divergence
            detail = (
                f"prompt {i}: greedy outputs differ at step {check.diverged_at} "
                f"(adapter {tokenizer.decode(check.adapter_tokens)!r} vs merged {tokenizer.decode(check.merged_tokens)!r}; "
                f"adapter top-2 margin there {margin}, max logit difference before it {check.max_logit_diff:.2e})"
            )
            if margin is None or margin > tie_tolerance:
                raise ExportCheckError(f"{merged_dir}: merged model disagrees with {adapter_dir}: {detail}")
            logger.warning("%s: near tie accepted (margin %.2e <= %.2e): %s", merged_dir, margin, tie_tolerance, detail)
        checks.append(check)
    return checks


def load_nf4_with_adapter(base_path: Path, adapter_dir: Path | None = None):
    """The base in 4-bit NF4 with bf16 compute, as `train.qlora` trains on it, with the adapter on top where given
    (CUDA and bitsandbytes only)."""
    import torch
    from transformers import AutoModelForCausalLM

    from knowtrace_train.train.lora import check_qlora, nf4_config

    check_qlora("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(
        str(base_path), quantization_config=nf4_config(torch.bfloat16), dtype=torch.bfloat16, device_map={"": 0}
    )
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    return model.eval()


def logit_gap(model_a, model_b, prompt_ids: Sequence[list[int]]) -> dict[str, float]:
    """Teacher-forced on every position of each prompt: max and mean |logit difference| (float32) and the
    fraction of positions whose top-1 token is the same in both models."""
    import torch

    worst, total, count, agree = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for ids in prompt_ids:
            a = model_a(input_ids=torch.tensor([ids], device=model_a.device)).logits[0].float().cpu()
            b = model_b(input_ids=torch.tensor([ids], device=model_b.device)).logits[0].float().cpu()
            diff = (a - b).abs()
            worst = max(worst, float(diff.max()))
            total += float(diff.mean(dim=-1).sum())
            count += len(ids)
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
    return {"max_abs": worst, "mean_abs": total / count if count else 0.0,
            "top1_agreement": agree / count if count else 1.0, "positions": count}


def quantized_logit_gap(base_path: Path, adapter_dir: Path, merged_dir: Path, prompt_ids: Sequence[list[int]]):
    """How far the merged model (unquantized base + adapter, loaded in bf16) is from the model QLoRA trained
    (the adapter on the 4-bit NF4 base): `logit_gap` of the two. CUDA and bitsandbytes only."""
    import torch
    from transformers import AutoModelForCausalLM

    trained = load_nf4_with_adapter(base_path, adapter_dir)
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.bfloat16).to("cuda").eval()
    try:
        return logit_gap(trained, merged, prompt_ids)
    finally:
        del trained, merged
        torch.cuda.empty_cache()


def _qlora_gap(base: Path, adapter_dir: Path, merged_dir: Path, prompts: Sequence[Any], prompt_format: str):
    """`quantized_logit_gap` for export.json where it can be measured, else why it was not."""
    import importlib.util

    import torch
    from transformers import AutoTokenizer

    if not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        logger.warning("%s was trained with qlora; its gap to the merged model needs CUDA and bitsandbytes "
                       "to measure: not measured", adapter_dir)
        return {"measured": False, "why": "needs CUDA and bitsandbytes"}
    tokenizer = AutoTokenizer.from_pretrained(str(merged_dir))
    ids = [render_prompt_ids(tokenizer, p, prompt_format) for p in prompts]
    gap = quantized_logit_gap(base, adapter_dir, merged_dir, ids)
    logger.info("%s: merged (bf16) vs adapter on the 4-bit base: max |logit diff| %.3g, mean %.3g, top-1 agreement %.3f",
                merged_dir, gap["max_abs"], gap["mean_abs"], gap["top1_agreement"])
    return {"measured": True, **gap}


def _copy_dir(src: Path, dst: Path) -> None:
    with atomic_dir(dst, what=f"a copy of {src.name}") as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)


def export_run(
    run_dir: str | Path,
    iteration: int | None = None,
    *,
    n_prompts: int = 3,
    max_new_tokens: int = 32,
    tie_tolerance: float | None = None,
) -> list[RoleExport]:
    """Export every role of one iteration (the latest with adapters by default); see the module docstring."""
    run_dir = Path(run_dir)
    found = iterations(run_dir)
    if not found:
        raise ExportError(f"{run_dir}: no iter_<z>/adapters/<role>/ folder with adapters")
    if iteration is None:
        iteration = found[-1]
    elif iteration not in found:
        raise ExportError(f"{run_dir}: iteration {iteration} has no adapters (iterations with adapters: {found})")
    iter_dir = run_dir / f"iter_{iteration}"
    out_dir = run_dir / "export" / f"iter_{iteration}"
    roles = sorted(p.name for p in (iter_dir / "adapters").iterdir() if (p / "adapter_config.json").is_file())
    if not roles:
        raise ExportError(f"{iter_dir / 'adapters'}: no PEFT adapter folder (with adapter_config.json)")
    if "adapters" in roles:
        raise ExportError(f"{iter_dir / 'adapters'}: a role may not be named 'adapters' (the copies' folder)")

    exports = []
    for role in roles:
        adapter_dir = iter_dir / "adapters" / role
        base = find_m0(run_dir, adapter_dir)
        prompt_format = read_training_info(adapter_dir).get("prompt_format", "chat")
        merged_dir = out_dir / role
        logger.info("iteration %d, role %s: merging %s into %s", iteration, role, adapter_dir, base)
        merge_adapters_into_base(base, adapter_dir, merged_dir)
        prompts = sample_prompts(iter_dir, role, n_prompts)
        checks = check_merged_matches_adapter(
            base, adapter_dir, merged_dir, prompts, prompt_format,
            max_new_tokens=max_new_tokens, tie_tolerance=tie_tolerance,
        )
        qlora = (read_training_info(adapter_dir).get("config") or {}).get("qlora", False)
        gap = _qlora_gap(base, adapter_dir, merged_dir, prompts, prompt_format) if qlora else None
        copy = out_dir / "adapters" / role
        _copy_dir(adapter_dir, copy)
        exports.append(
            RoleExport(role, str(base), str(adapter_dir), str(merged_dir), str(copy), prompt_format, checks, gap)
        )
    write_json(
        out_dir / "export.json",
        {"iteration": iteration, "roles": [dict(asdict(e), identical=e.identical) for e in exports]},
    )
    return exports
