"""QLoRA on a GPU: train on the 4-bit NF4 base, merge onto the unquantized base, state how far the merged
model is from the model that was trained. Skipped without CUDA and bitsandbytes (the CPU error is tested in
test_train.py).

Tolerance. The adapter was trained on a 4-bit copy of the base, and is merged into the full-precision base, so
the merged model differs from the trained one by the base's NF4 quantization error: nothing merging itself can
remove. The test measures that error alone (plain 4-bit base vs plain bf16 base, no adapter) and requires the
trained-vs-merged gap to stay within 2x it plus 0.05 logits (the adapter changes the activations the
quantization error lands on, so the two are close but not equal), and the merged model to agree with the
unquantized base + adapter to float rounding (it is the same function, folded).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None,
    reason="QLoRA needs a CUDA GPU and bitsandbytes (pip install 'knowtrace-train[qlora]')",
)

RECORDS = [
    {"prompt": f"Question: Who founded the company Brand{i}?\nAnswer with a triplet.",
     "completion": f"(Brand{i}; was founded by; Person{i})"}
    for i in range(4)
]


def test_qlora_trains_and_its_merge_onto_the_unquantized_base_stays_within_the_quantization_error(
    tiny_model_dir, tmp_path, real_tokenizer
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from knowtrace_train.train.export import load_nf4_with_adapter, logit_gap, quantized_logit_gap
    from knowtrace_train.train.lora import LoraTrainConfig, read_training_info, render_prompt_ids, train_role
    from knowtrace_train.train.merge import merge_adapters_into_base

    adapter = tmp_path / "adapter"
    config = LoraTrainConfig(qlora=True, rank=8, alpha=16, dropout=0.0, epochs=6, learning_rate=2e-2,
                             per_device_batch_size=2, gradient_accumulation_steps=1, logging_steps=1, seed=3)
    result = train_role(tiny_model_dir, RECORDS, adapter, config, role="complete")
    assert result.steps == 12 and result.losses[-1] < result.losses[0] - 0.5, result.losses
    assert read_training_info(adapter)["config"]["qlora"] is True

    merged_dir = merge_adapters_into_base(tiny_model_dir, adapter, tmp_path / "merged")
    prompts = [render_prompt_ids(real_tokenizer, r["prompt"], "chat") for r in RECORDS[:3]]

    def bf16(path):
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).to("cuda").eval()

    def fp32(path):
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to("cuda").eval()

    quantization = logit_gap(load_nf4_with_adapter(tiny_model_dir), bf16(tiny_model_dir), prompts)
    trained_vs_merged = quantized_logit_gap(tiny_model_dir, adapter, merged_dir, prompts)
    folded = logit_gap(PeftModel.from_pretrained(fp32(tiny_model_dir), str(adapter)).eval(), fp32(merged_dir), prompts)
    learnt = logit_gap(fp32(tiny_model_dir), fp32(merged_dir), prompts)
    print(f"\nNF4 quantization alone: {quantization}\ntrained (4-bit + adapter) vs merged bf16: {trained_vs_merged}"
          f"\nunquantized base + adapter vs merged (fp32): {folded}\nbase vs merged: {learnt}")

    assert learnt["max_abs"] > 0.5  # the adapter learnt something: the comparison is not of two base models
    assert folded["max_abs"] < 1e-3  # merging is the same function, folded into the weights
    assert trained_vs_merged["max_abs"] <= 2 * quantization["max_abs"] + 0.05
    assert trained_vs_merged["mean_abs"] <= 2 * quantization["mean_abs"] + 0.05
