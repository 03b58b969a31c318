"""Generation: the Generator protocol, its config, and the factory that builds a backend from it."""

from __future__ import annotations

from knowtrace_train.generation.base import (
    BASE_ROLE,
    Completion,
    GenerationError,
    GenerationRequest,
    Generator,
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
    "GeneratorConfig",
    "build_generator",
    "resolve_model",
]


def build_generator(config: GeneratorConfig) -> Generator:
    """The backend `config.backend` names, loaded with the config's model and adapters."""
    if config.backend == "vllm":
        from knowtrace_train.generation.vllm_backend import VLLMGenerator

        return VLLMGenerator(config)
    from knowtrace_train.generation.hf import TransformersGenerator

    return TransformersGenerator(config)
