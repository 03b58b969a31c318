"""`train.top_layers`: LoRA on the top N decoder layers only, so the backward pass stops below them."""

from __future__ import annotations

import json

import pytest
import torch

from knowtrace_train.train.lora import (
    LoraTrainConfig,
    _load_base,
    load_records,
    lora_config,
    tokenize_records,
    train_role,
)

PROMPT = "Passages:\nAcme was founded by Ada Stone.\nGuidance: (Acme; founder)"
COMPLETION = "(Acme; founder; Ada Stone)"


def _rows(tokenizer, n: int = 4):
    records = [{"prompt": f"{PROMPT} {i}", "completion": COMPLETION} for i in range(n)]
    rows, _ = tokenize_records(tokenizer, load_records(records, "complete"), "chat", 512)
    return records, rows


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_top_layers_must_be_a_count(bad):
    with pytest.raises(ValueError, match="top_layers"):
        LoraTrainConfig(top_layers=bad)


def test_lora_sits_on_the_top_layers_only(tiny_model_dir):
    from peft import get_peft_model

    config = LoraTrainConfig(rank=4, top_layers=1)
    base = _load_base(tiny_model_dir, "fp32", config, "cpu")
    model = get_peft_model(base, lora_config(config, base))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(".layers.1." in n for n in names)
    every = get_peft_model(_load_base(tiny_model_dir, "fp32", config, "cpu"),
                           lora_config(LoraTrainConfig(rank=4)))
    all_names = [n for n, p in every.named_parameters() if p.requires_grad]
    # every linear layer of the top layer gets LoRA, as "all-linear" gives it on every layer
    assert sorted(names) == sorted(n for n in all_names if ".layers.1." in n)
    assert len(all_names) == 2 * len(names)


def test_more_top_layers_than_the_model_has_is_refused(tiny_model_dir):
    config = LoraTrainConfig(rank=4, top_layers=3)
    with pytest.raises(ValueError, match="top_layers 3: the model has 2 decoder layers"):
        lora_config(config, _load_base(tiny_model_dir, "fp32", config, "cpu"))
    with pytest.raises(ValueError, match="top_layers"):
        lora_config(config)  # no model: no layer count


def test_the_backward_pass_stops_below_the_top_layers(tiny_model_dir, real_tokenizer):
    """The layers below the adapted ones build no graph: their outputs need no gradient, those of the top do."""
    from peft import get_peft_model

    config = LoraTrainConfig(rank=4, top_layers=1)
    base = _load_base(tiny_model_dir, "fp32", config, "cpu")
    model = get_peft_model(base, lora_config(config, base))
    needs_grad = {}
    for i, layer in enumerate(base.model.layers):
        layer.register_forward_hook(lambda m, a, out, i=i: needs_grad.__setitem__(
            i, (out[0] if isinstance(out, tuple) else out).requires_grad))
    _, rows = _rows(real_tokenizer, 1)
    loss = model(input_ids=torch.tensor([rows[0]["input_ids"]]), labels=torch.tensor([rows[0]["labels"]])).loss
    assert needs_grad == {0: False, 1: True}
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_top_layers_adapter_trains_saves_and_merges(tiny_model_dir, real_tokenizer, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from knowtrace_train.train.merge import merge_adapters_into_base

    records, rows = _rows(real_tokenizer)
    config = LoraTrainConfig(rank=4, top_layers=1, max_steps=2, per_device_batch_size=4, effective_batch_size=4,
                             learning_rate=1e-2)
    result = train_role(tiny_model_dir, records, tmp_path / "adapter", config, role="complete")
    assert result.steps == 2
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["layers_to_transform"] == [1]
    merged = merge_adapters_into_base(tiny_model_dir, tmp_path / "adapter", tmp_path / "merged")
    ids = torch.tensor([rows[0]["input_ids"]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
        plain = base(ids).logits
        adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))(ids).logits
        folded = AutoModelForCausalLM.from_pretrained(str(merged))(ids).logits
    assert not torch.allclose(adapted, plain)  # the adapter trained
    torch.testing.assert_close(folded, adapted, rtol=1e-4, atol=1e-4)
