"""The one generation protocol: requests that name their role, completions with token counts."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from knowtrace_train.errors import UserError

log = logging.getLogger(__name__)

#: The role whose calls run on the plain model, every adapter disabled.
BASE_ROLE = "base"


@dataclass(frozen=True)
class GenerationRequest:
    """One model call. `prompt` is plain text, or a list of chat messages
    ({"role", "content"}) rendered with the tokenizer's chat template.
    `role` picks the adapter (explore, complete, answer, ... or `BASE_ROLE`).
    `prefix` is the start of the model's answer: it is fed after the rendered prompt (in the
    chat format, inside the opened assistant turn, where training puts a completion) and is not
    part of the returned text.
    `temperature` 0 is greedy decoding, which ignores every seed. Above 0 the request samples from
    its own random stream, seeded with `request_seed(GeneratorConfig.seed, seed)`: the same request
    gives the same text on a rerun, whatever else is in the batch, and requests that should differ
    need different seeds (derive them with `request_seed`, e.g. from a trajectory id and a call
    index)."""

    prompt: str | tuple[dict[str, str], ...]
    role: str = BASE_ROLE
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int = 0
    prefix: str = ""


def request_seed(base_seed: int, *keys: int | str) -> int:
    """A sampling seed in [0, 2**31) derived from `base_seed` and `keys` (e.g. a trajectory id and
    a call index): the first 4 bytes of the SHA-256 of the JSON list [base_seed, *keys], top bit
    cleared. Unlike Python's `hash` it is the same in every process and on every machine; any
    change of a key, its type ("1" vs 1) or the keys' order gives an unrelated seed. 31 bits fit
    every sampler's seed (torch, numpy, vLLM). Keys are ints or strings (floats and bools are
    refused: their text is not a stable identity)."""
    if isinstance(base_seed, bool) or not isinstance(base_seed, int):
        raise TypeError(f"request_seed: base_seed must be an int, got {base_seed!r}")
    for i, key in enumerate(keys):
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(f"request_seed: key {i} must be an int or a string, got {key!r}")
    text = json.dumps([base_seed, *keys], ensure_ascii=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode("ascii")).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    output_tokens: int
    #: "stop" (a stop string), "eos", "length" (max_new_tokens reached)
    finish_reason: str
    #: prompt tokens cut from the left when the config allows truncation, else 0
    truncated_tokens: int = 0


#: the words of the error a prompt too long for the model's context gets (recorded on its call)
TOO_LONG = "exceeds the model's context"


class GenerationError(UserError, ValueError):
    """Bad generation input: unknown model, missing adapter, empty or too-long prompt."""

    label = "generator error"


class GeneratorClosedError(RuntimeError):
    """`generate` on a generator that was closed. Not a `GenerationError`: those are bad requests,
    which the strategy records call by call; a closed generator is a bug in the caller."""


@runtime_checkable
class Generator(Protocol):
    """Turn a batch of requests into completions, in order. Implementations batch internally."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` under this generator's tokenizer (used by FA ratio and cost reports)."""
        ...

    def close(self) -> None:
        """Let go of the model now and hand its memory back (GPU memory included), so that the
        next stage (training, another generator) has it. Closing twice is fine; `generate` after
        `close` raises `GeneratorClosedError`; `count_tokens` keeps working (the tokenizer stays)."""
        ...


def generate_each(generator: Generator, requests: Sequence[GenerationRequest]) -> list[Completion | GenerationError]:
    """`generator.generate(requests)` for a strategy that must not stop on one bad request: a batch
    the generator refuses (GenerationError) is retried request by request, and a request still
    refused comes back as its GenerationError, in its place, for the caller to record."""
    requests = list(requests)
    if not requests:
        return []
    try:
        out = generator.generate(requests)
    except GenerationError as e:
        if len(requests) == 1:
            return [e]
        log.warning("generation batch of %d refused (%s); retrying call by call", len(requests), e)
        return [r for req in requests for r in generate_each(generator, [req])]
    if len(out) != len(requests):
        raise RuntimeError(f"generator returned {len(out)} completions for {len(requests)} requests")
    return list(out)


@dataclass(frozen=True)
class OptionScores:
    """What `score_options` returns for one request: each option's log-probability of being what
    the model writes next (its first token; the variants with and without a leading space summed),
    under the full next-token distribution. None where the backend does not report that token
    (vLLM reports only its top `logprobs`); the caller decides what a missing option means."""

    logprobs: dict[str, float | None]
    prompt_tokens: int
    truncated_tokens: int = 0


@runtime_checkable
class OptionScorer(Protocol):
    """An optional capability beside `Generator`: score multiple-choice options from the next-token
    logits after a prompt (one batched prefill, no decoding), as a selector that "reads the option
    letter's probability" needs. Requests are prepared as `generate` prepares them (the role picks
    the adapter, `prompt_format` renders the prompt, `prefix` is fed after it); `max_new_tokens`,
    `stop`, `temperature` and `seed` are ignored. `options[i]` are request i's option strings
    (e.g. "A", "B", ...); two options whose first tokens coincide are an error (GenerationError).
    The transformers and vLLM backends implement it; a scripted test generator implements it by
    returning `OptionScores` of its own."""

    def score_options(
        self, requests: Sequence[GenerationRequest], options: Sequence[Sequence[str]]
    ) -> list[OptionScores]: ...


def score_each(scorer: OptionScorer, requests: Sequence[GenerationRequest], options: Sequence[Sequence[str]]
               ) -> list[OptionScores | GenerationError]:
    """`scorer.score_options(requests, options)` for a strategy that must not stop on one bad request: a
    batch the scorer refuses (GenerationError) is scored request by request, and a request still refused
    comes back as its GenerationError, in its place (as `generate_each` does for generation)."""
    requests = list(requests)
    if not requests:
        return []
    try:
        return list(scorer.score_options(requests, options))
    except GenerationError as e:
        if len(requests) == 1:
            return [e]
        log.warning("option scoring batch of %d refused (%s); scoring each alone", len(requests), e)
    out: list[OptionScores | GenerationError] = []
    for r, o in zip(requests, options):
        try:
            out.append(scorer.score_options([r], [o])[0])
        except GenerationError as one:
            out.append(one)
    return out


class GeneratorBase(Generator):
    """What the backends share: `close()` runs the backend's `_release()` once, the generator is a
    context manager (`with build_generator(cfg) as g:` closes it on the way out, error or not), and
    `_check_open()` is the first thing `generate` does."""

    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # first: a release that fails halfway is not retried by a second close
        self._release()

    def _release(self) -> None:
        """Drop every reference to the model and what was computed with it; free the memory."""
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise GeneratorClosedError(
                f"{type(self).__name__} was closed (its model is released); build a new generator "
                "(knowtrace_train.generation.build_generator) to generate again"
            )

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


def free_memory() -> None:
    """Collect garbage (a model in a reference cycle is freed only by the collector), then hand the
    CUDA caching allocator's unused blocks back to the driver, where CUDA was started: another
    process, or vLLM's memory profiling, sees only what the driver has free."""
    gc.collect()
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
