"""Export: merged models equal their adapter models under greedy decoding; adapters are copied as they are."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from knowtrace_train.train.export import (
    ExportCheckError,
    ExportError,
    _compare,
    check_merged_matches_adapter,
    export_run,
    find_m0,
    sample_prompts,
)
from knowtrace_train.io import write_jsonl
from knowtrace_train.train.lora import LoraTrainConfig, render_prompt_ids, train_role
from knowtrace_train.train.merge import merge_adapters_into_base

REPO = Path(__file__).resolve().parents[1]
SFT = [
    {"prompt": f"Question: Who founded the company Brand{i}?\nAnswer with a triplet.",
     "completion": f"(Brand{i}; was founded by; Person{i})", "role": "explore"}
    for i in range(4)
]


def _random_adapter(base_dir: Path, out: Path, seed: int = 0) -> None:
    """A LoRA adapter with random (non-zero) A and B: far from the base, as a trained one would be."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "demo"
    (run / "iter_1").mkdir(parents=True)
    (run / "m0.json").write_text(json.dumps({"path": str(tiny_model_dir)}))
    write_jsonl(run / "iter_1" / "sft_explore.jsonl", SFT)
    config = LoraTrainConfig(epochs=2, learning_rate=5e-2, per_device_batch_size=2, gradient_accumulation_steps=1, rank=4)
    train_role(tiny_model_dir, SFT, run / "iter_1" / "adapters" / "explore", config, role="explore")
    _random_adapter(tiny_model_dir, run / "iter_1" / "adapters" / "complete")
    return run


@pytest.fixture(scope="module")
def exported(run_dir):
    return export_run(run_dir, n_prompts=2, max_new_tokens=8)


def test_export_writes_merged_models_and_adapter_copies(run_dir, exported):
    out = run_dir / "export" / "iter_1"
    assert [e.role for e in exported] == ["complete", "explore"]
    for e in exported:
        merged = out / e.role
        assert (merged / "model.safetensors").is_file() and (merged / "config.json").is_file()
        assert (merged / "tokenizer.json").is_file()
        src = run_dir / "iter_1" / "adapters" / e.role
        copy = out / "adapters" / e.role
        assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in src.iterdir())
        for p in src.iterdir():
            assert (copy / p.name).read_bytes() == p.read_bytes()
    assert not [p for p in out.rglob(".*")]  # no temporary folders left
    report = json.loads((out / "export.json").read_text())
    assert report["iteration"] == 1 and all(r["identical"] for r in report["roles"])


def test_merged_greedy_outputs_equal_the_adapter_models(exported, run_dir, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for e in exported:
        assert e.identical and len(e.checks) == 2
        for c in e.checks:
            assert c.adapter_tokens == c.merged_tokens and len(c.adapter_tokens) > 0
            assert c.max_logit_diff < 1e-3
    # independently: the merged folder's logits are the adapter model's, and not the base model's
    complete = next(e for e in exported if e.role == "complete")
    tok = AutoTokenizer.from_pretrained(complete.merged_dir)
    ids = torch.tensor([render_prompt_ids(tok, "What is the capital of France?", "chat")])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        base_logits = base(input_ids=ids).logits
        adapter_logits = PeftModel.from_pretrained(base, complete.adapter_dir)(input_ids=ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(complete.merged_dir)(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, adapter_logits, rtol=1e-4, atol=1e-4)
    assert (merged_logits - base_logits).abs().max() > 0.1


def test_sample_prompts_come_from_the_iterations_sft_records(run_dir):
    assert sample_prompts(run_dir / "iter_1", "explore", 2) == [SFT[0]["prompt"], SFT[1]["prompt"]]
    assert len(sample_prompts(run_dir / "iter_1", "complete", 2)) == 2  # no sft_complete.jsonl: built-in prompts


def test_a_merged_model_that_differs_fails_loudly(run_dir, tiny_model_dir):
    adapter = run_dir / "iter_1" / "adapters" / "complete"
    with pytest.raises(ExportCheckError, match="greedy outputs differ at step"):
        # the base model stands in for a bad merge
        check_merged_matches_adapter(
            tiny_model_dir, adapter, tiny_model_dir, ["What is the capital of France?"], "chat",
            max_new_tokens=8, tie_tolerance=0.0,
        )


def test_divergence_at_a_near_tie_is_told_apart():
    logits = torch.tensor([[0.0, 1.0, 1.0005, -1.0], [2.0, 0.0, 0.0, 0.0]])
    check = _compare(([2, 0], list(logits)), ([1, 0], list(logits)), 0)
    assert check.diverged_at == 0 and check.margin_at_divergence == pytest.approx(5e-4, abs=1e-6)
    same = _compare(([2, 0], list(logits)), ([2, 0], list(logits)), 1)
    assert same.diverged_at is None and same.max_logit_diff == 0.0
    shorter = _compare(([2, 0], list(logits)), ([2], list(logits[:1])), 2)
    assert shorter.diverged_at == 1


def test_m0_is_read_from_m0_json_relative_to_the_run_or_from_the_adapter(tmp_path, tiny_model_dir, run_dir):
    run = tmp_path / "run"
    run.mkdir()
    adapter = run_dir / "iter_1" / "adapters" / "explore"
    # no m0.json: the base the adapter was trained on (its knowtrace_training.json)
    assert find_m0(run, adapter).resolve() == Path(tiny_model_dir).resolve()
    with pytest.raises(ExportError, match="no M0 path"):
        find_m0(run, run_dir / "iter_1" / "adapters" / "complete")
    (run / "models").mkdir()
    (run / "models" / "m0").symlink_to(tiny_model_dir)
    (run / "m0.json").write_text(json.dumps({"path": "models/m0"}))
    assert find_m0(run, adapter) == run / "models" / "m0"
    (run / "m0.json").write_text(json.dumps({"model": "x"}))
    with pytest.raises(ExportError, match="m0.json"):
        find_m0(run, adapter)


def test_merge_helper_writes_a_plain_model_folder(tiny_model_dir, run_dir, tmp_path):
    out = merge_adapters_into_base(tiny_model_dir, run_dir / "iter_1" / "adapters" / "complete", tmp_path / "merged")
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and not (out / "adapter_config.json").exists()
    with pytest.raises(FileNotFoundError, match="not a PEFT adapter"):
        merge_adapters_into_base(tiny_model_dir, tmp_path, tmp_path / "x")


def test_cli_exits_nonzero_naming_the_problem(run_dir, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("export_script", REPO / "scripts" / "export.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(run_dir), "--iteration", "7"]) == 2  # a user's error: one line, exit 2 (exit 1 is a merged model that fails its check)
    assert "iteration 7 has no adapters" in capsys.readouterr().err
    assert script.main([str(tmp_path)]) == 2
    assert "no iter_<z>/adapters/<role>/" in capsys.readouterr().err
