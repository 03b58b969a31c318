"""scripts/bench/bench_paper_gpu.py on a CPU: the tiny random architecture through the LoRA step, QLoRA's path (skipped
with its reason without CUDA or bitsandbytes) and the transformers decoding, the last line JSON; and its computed
memory is docs/training.md's table for the 8B config."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))

from bench_paper_gpu import computed_decoding_gib, computed_training_gib, main  # noqa: E402


def test_the_computed_memory_is_docs_training_tables(real_tokenizer):
    from knowtrace_train.generation.architectures import architecture_config

    config = architecture_config("llama3-8b", real_tokenizer)
    assert round(computed_training_gib(config, 2 * 4096, qlora=False), 1) == 33.8
    assert round(computed_training_gib(config, 2 * 4096, qlora=True), 1) == 25.8
    assert round(computed_training_gib(config, 8 * 4096, qlora=False), 1) == 88.4
    # 14.96 GiB of bf16 weights and 128 KiB of KV cache per token
    assert computed_decoding_gib(config, 1, 8192) == pytest.approx(14.96 + 1.0, abs=0.01)


def test_the_bench_runs_the_tiny_architecture_through_every_path_on_a_cpu(tmp_path, real_tokenizer, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU the bench runs the 8B architecture (minutes): run the script itself there")
    real_tokenizer.save_pretrained(tmp_path / "tokenizer")
    summary = main(["--cache", str(tmp_path), "--tokenizer", str(tmp_path / "tokenizer"), "--length", "64",
                    "--completion-tokens", "8", "--decode-rows", "3", "--prompt-tokens", "16", "--new-tokens", "4",
                    "--json-out", str(tmp_path / "out.json")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == summary == json.loads((tmp_path / "out.json").read_text())
    assert summary["arch"] == "tiny" and summary["device"] == "cpu"
    lora = summary["lora"]
    assert lora["tokens_per_step"] == 2 * 64 and lora["tok_s"] > 0 and lora["peak_gib"] is None
    assert lora["computed_gib"] > 0
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        assert "bitsandbytes" in summary["qlora"]["skipped"]
    else:
        assert "CUDA" in summary["qlora"]["skipped"]
    decode = summary["decode"]
    assert decode["rows"] == 3 and decode["prompt_tokens"] == 16 and 3 <= decode["output_tokens"] <= 12
