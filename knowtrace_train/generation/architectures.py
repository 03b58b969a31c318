"""Random-weight models of a published architecture, for benchmarks: `model: random:<architecture>`.

Throughput and memory do not depend on the weights' values, so a model built from an architecture's published
config with random weights costs per token what the real one costs, with nothing to download. The configs live
here as transformers' `LlamaConfig` arguments; `generation.models.resolve_model` builds `random:<architecture>`
once into the cache home (`random_model`: random weights from the config's seed, the default model's tokenizer,
whose ids fit every vocabulary here). Such a model answers nothing: the self-training loop refuses it
(`selftrain.config`); the trainers, the transformers generator and the benchmarks take it.
"""

from __future__ import annotations

import os

from knowtrace_train.generation.base import GenerationError

#: how a config names one: `random:<architecture>`
RANDOM_PREFIX = "random:"

#: LlamaConfig arguments by architecture name (vocabulary None: the tokenizer's size); `seed` and `dtype` are ours
ARCHITECTURES: dict[str, dict] = {
    # Meta's Llama-3-8B(-Instruct) config.json: 8.03B parameters, untied head
    "llama3-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
        seed=0, dtype="bfloat16",
    ),
    # SmolLM2-135M(-Instruct), the default model's shapes: for GPU benchmarks where its weights are not at hand
    "smollm2-135m": dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True,
        seed=0, dtype="bfloat16",
    ),
    # two small layers, the tokenizer's whole vocabulary: the tests' and the CPU benchmarks' stand-in
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=None, max_position_embeddings=8192, tie_word_embeddings=True, seed=0, dtype="float32",
    ),
}


def is_random_model(name: str | os.PathLike) -> bool:
    """Whether a config's model names a random-weight architecture (`random:<architecture>`)."""
    return str(name).startswith(RANDOM_PREFIX)


def architecture_of(name: str) -> str:
    """The architecture that `random:<architecture>` names; an unknown one is an error naming the known ones."""
    arch = str(name)[len(RANDOM_PREFIX):]
    if arch not in ARCHITECTURES:
        raise GenerationError(f"unknown random architecture {arch!r} in {name!r}; known: "
                              f"{', '.join(RANDOM_PREFIX + a for a in sorted(ARCHITECTURES))}")
    return arch


def architecture_config(arch: str, tokenizer):
    """transformers' LlamaConfig of `arch` for `tokenizer` (its special tokens; its vocabulary where the
    architecture names none, which must not be smaller than the tokenizer's)."""
    from transformers import LlamaConfig

    spec = dict(ARCHITECTURES[arch])
    spec.pop("seed")
    dtype = spec.pop("dtype")
    vocab = spec.pop("vocab_size") or len(tokenizer)
    if vocab < len(tokenizer):
        raise GenerationError(f"random:{arch}'s vocabulary ({vocab}) is smaller than the tokenizer's ({len(tokenizer)})")
    return LlamaConfig(vocab_size=vocab, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, dtype=dtype, **spec)
