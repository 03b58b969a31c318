"""`model: random:<architecture>`: a published architecture with random weights and the default tokenizer, built
once into the cache, for benchmarks; the generator and the trainers take it, the self-training loop refuses it."""

from __future__ import annotations

import pytest

from knowtrace_train.config import load_config
from knowtrace_train.generation import GenerationError, GenerationRequest, GeneratorConfig, resolve_model
from knowtrace_train.generation.architectures import ARCHITECTURES, architecture_config
from knowtrace_train.selftrain.config import SelfTrainConfig


@pytest.fixture(scope="module")
def cache(tmp_path_factory, real_tokenizer):
    folder = tmp_path_factory.mktemp("cache")
    real_tokenizer.save_pretrained(folder / "tokenizer")
    return folder


def test_random_tiny_is_built_once_with_the_default_tokenizer(cache, real_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model("random:tiny", cache, cache / "tokenizer")
    assert folder == cache / "models" / "random-tiny-seed0"
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("random:tiny", cache) == folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert model.config.vocab_size >= len(real_tokenizer)
    ids = real_tokenizer("Which city is the capital?")["input_ids"]
    assert AutoTokenizer.from_pretrained(str(folder))("Which city is the capital?")["input_ids"] == ids


def test_the_8b_architecture_is_llama3_8b(real_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    config = architecture_config("llama3-8b", real_tokenizer)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248  # Meta's Llama-3-8B
    assert config.num_key_value_heads == 8 and config.rope_parameters["rope_theta"] == 500000.0
    assert ARCHITECTURES["llama3-8b"]["vocab_size"] >= len(real_tokenizer)


def test_an_unknown_architecture_names_the_known_ones(cache):
    with pytest.raises(GenerationError, match=r"unknown random architecture 'gpt5' .*known: random:llama3-8b, "
                                              r"random:smollm2-135m, random:tiny"):
        resolve_model("random:gpt5", cache)


def test_the_transformers_generator_decodes_a_random_model(cache):
    from knowtrace_train.generation import build_generator

    resolve_model("random:tiny", cache, cache / "tokenizer")
    with build_generator(GeneratorConfig(model="random:tiny", cache_dir=str(cache), progress=False)) as g:
        out = g.generate([GenerationRequest(prompt="Hello", max_new_tokens=3)])
    assert 1 <= out[0].output_tokens <= 3


def test_the_self_training_loop_refuses_random_weights():
    config = load_config(SelfTrainConfig, None, ["--generator.model", "random:llama3-8b"])
    with pytest.raises(ValueError, match=r"^generator.model 'random:llama3-8b' has random weights, which answer "
                                         r"nothing: for benchmarks only") as e:
        config.validate()
    assert "\n" not in str(e.value)
