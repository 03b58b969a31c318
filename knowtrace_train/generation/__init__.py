"""Generation: the Generator protocol, its config, and the factory that builds a backend from it.

A generator holds a model (on the GPU where there is one) until it is closed: close it when a
stage is done with it, before training or building another one, e.g.

    with build_generator(config) as generator:
        completions = generator.generate(requests)
"""

from __future__ import annotations

from knowtrace_train.generation.base import (
    BASE_ROLE,
    Completion,
    GenerationError,
    GenerationRequest,
    Generator,
    GeneratorBase,
    GeneratorClosedError,
    OptionScorer,
    OptionScores,
)
from knowtrace_train.generation.config import GeneratorConfig
from knowtrace_train.generation.models import DEFAULT_ALIAS, resolve_model

__all__ = [
    "BASE_ROLE",
    "DEFAULT_ALIAS",
    "Completion",
    "GenerationError",
    "GenerationRequest",
    "Generator",
    "GeneratorBase",
    "GeneratorClosedError",
    "GeneratorConfig",
    "OptionScorer",
    "OptionScores",
    "build_generator",
    "check_generator_installed",
    "resolve_model",
]


def check_generator_installed(config: GeneratorConfig) -> None:
    """Import the backend's optional packages now: a missing extra is one clear error before any work."""
    if config.backend == "vllm":
        from knowtrace_train.generation.vllm_backend import vllm_modules

        vllm_modules()


def build_generator(config: GeneratorConfig) -> GeneratorBase:
    """The backend `config.backend` names, loaded with the config's model and adapters; a
    `Generator` and a context manager that closes it (see `Generator.close`)."""
    if config.backend == "vllm":
        from knowtrace_train.generation.vllm_backend import VLLMGenerator

        return VLLMGenerator(config)
    from knowtrace_train.generation.hf import TransformersGenerator

    return TransformersGenerator(config)
