"""Request preparation shared by the backends: check, render, tokenize and (if allowed) truncate prompts,
and resolve each request's role to its adapter."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

from knowtrace_train.generation.base import BASE_ROLE, TOO_LONG, GenerationError, GenerationRequest

log = logging.getLogger(__name__)

PROMPT_FORMATS = ("chat", "plain")


@dataclass(frozen=True)
class PreparedRequest:
    """A checked request: its position in the call, prompt token ids, and the adapter it runs under."""

    index: int
    request: GenerationRequest
    input_ids: tuple[int, ...]
    #: adapter name (the role) or None for the plain model
    adapter: str | None
    truncated_tokens: int = 0


class RoleAdapters:
    """Which adapter serves a role.

    The base role and `base_roles` run on the plain model with every adapter disabled. With no
    adapters configured at all (an untrained model, iteration 0) every role runs on the plain model.
    Once any adapter is configured, a role with neither an adapter nor a place in `base_roles` is an
    error: a silently unadapted role is how a self-training run quietly stops training."""

    def __init__(self, adapters: Mapping[str, str], base_roles: Sequence[str] = ()):
        if BASE_ROLE in adapters:
            raise GenerationError(f"role {BASE_ROLE!r} always runs on the plain model; it cannot have an adapter")
        overlap = sorted(set(adapters) & set(base_roles))
        if overlap:
            raise GenerationError(f"roles {overlap} are given both an adapter and a place in base_roles")
        self.adapters = dict(adapters)
        self.base_roles = frozenset(base_roles) | {BASE_ROLE}

    def adapter_for(self, role: str, where: str = "") -> str | None:
        if role in self.base_roles:
            return None
        if role in self.adapters:
            return role
        if not self.adapters:
            return None
        raise GenerationError(
            f"{where}no adapter for role {role!r} (adapters: {', '.join(sorted(self.adapters))}; "
            f"plain-model roles: {', '.join(sorted(self.base_roles))}); "
            "add it to `adapters` or to `base_roles`"
        )


class PromptPreparer:
    """Render (chat template or plain text), tokenize and check prompts against the context length."""

    def __init__(
        self,
        tokenizer,
        prompt_format: str,
        max_context: int,
        truncate_prompts: bool,
        roles: RoleAdapters,
    ):
        if prompt_format not in PROMPT_FORMATS:
            raise GenerationError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        self.max_context = max_context
        self.truncate_prompts = truncate_prompts
        self.roles = roles

    def render(self, prompt: str | Sequence[Mapping[str, str]], where: str = "") -> tuple[str, bool]:
        """The prompt as text, and whether the text already holds the special tokens (chat template)."""
        if isinstance(prompt, str):
            if self.prompt_format == "plain":
                return prompt, False
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = [dict(m) for m in prompt]
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise GenerationError(
                f"{where}a chat prompt needs a tokenizer with a chat template and this one has none; "
                "use prompt_format 'plain' with text prompts"
            )
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, True

    def encode(self, prompt: str | Sequence[Mapping[str, str]], where: str = "", prefix: str = "") -> list[int]:
        """Token ids of the rendered prompt, then of `prefix` (the start of the answer, tokenized
        on its own as training tokenizes a completion after its prompt)."""
        text, templated = self.render(prompt, where)
        ids = list(self.tokenizer(text, add_special_tokens=not templated)["input_ids"])
        if prefix:
            ids += self.tokenizer(prefix, add_special_tokens=False)["input_ids"]
        return ids

    def prepare(self, requests: Sequence[GenerationRequest]) -> list[PreparedRequest]:
        return [self.prepare_one(i, r) for i, r in enumerate(requests)]

    def prepare_one(self, index: int, req: GenerationRequest) -> PreparedRequest:
        where = f"request {index} (role {req.role!r}): "
        check_request(req, where)
        adapter = self.roles.adapter_for(req.role, where)
        ids = self.encode(req.prompt, where, req.prefix)
        if not ids:
            raise GenerationError(f"{where}the prompt renders to no tokens")
        room = self.max_context - req.max_new_tokens
        if room < 1:
            raise GenerationError(
                f"{where}max_new_tokens {req.max_new_tokens} leaves no room for a prompt in the "
                f"model's context of {self.max_context} tokens"
            )
        truncated = 0
        if len(ids) > room:
            if not self.truncate_prompts:
                raise GenerationError(
                    f"{where}prompt of {len(ids)} tokens plus max_new_tokens {req.max_new_tokens} {TOO_LONG} "
                    f"of {self.max_context} tokens; shorten the prompt or set "
                    "truncate_prompts (which drops tokens from the prompt's start)"
                )
            truncated = len(ids) - room
            ids = ids[truncated:]
            log.warning("%struncated %d prompt tokens from the left to fit the context", where, truncated)
        return PreparedRequest(index, req, tuple(ids), adapter, truncated)


def check_request(req: GenerationRequest, where: str = "") -> None:
    """Reject requests no backend can serve, naming the request and the field."""
    prompt = req.prompt
    if isinstance(prompt, str):
        if not prompt.strip():
            raise GenerationError(f"{where}empty prompt")
    else:
        if not prompt:
            raise GenerationError(f"{where}empty prompt (no messages)")
        for j, m in enumerate(prompt):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
                m.get("content"), str
            ):
                raise GenerationError(f"{where}message {j} needs string fields 'role' and 'content'")
        if not any(m["content"].strip() for m in prompt):
            raise GenerationError(f"{where}empty prompt (every message is empty)")
    if not isinstance(req.max_new_tokens, int) or req.max_new_tokens < 1:
        raise GenerationError(f"{where}max_new_tokens must be a positive integer, got {req.max_new_tokens!r}")
    if req.temperature < 0:
        raise GenerationError(f"{where}temperature must be >= 0, got {req.temperature!r}")
    if not isinstance(req.prefix, str):
        raise GenerationError(f"{where}prefix must be a string, got {req.prefix!r}")
    if isinstance(req.stop, str) or any(not isinstance(s, str) or not s for s in req.stop):
        raise GenerationError(f"{where}stop must be a tuple of non-empty strings, got {req.stop!r}")


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def option_token_ids(tokenizer, options: Sequence[str], where: str = "") -> list[tuple[int, ...]]:
    """For each option string, the token ids that start it as the next text: the first token of
    the option on its own and of the option after a space (a letter after "Answer:" is " A", at the
    start of an assistant turn "A"). Options whose first tokens coincide cannot be told apart:
    a GenerationError."""
    out: list[tuple[int, ...]] = []
    owner: dict[int, str] = {}
    for opt in options:
        if not isinstance(opt, str) or not opt.strip():
            raise GenerationError(f"{where}options must be non-empty strings, got {opt!r}")
        if opt in options[: len(out)]:
            raise GenerationError(f"{where}option {opt!r} is given twice")
        ids: list[int] = []
        for text in (opt.strip(), " " + opt.strip()):
            toks = tokenizer(text, add_special_tokens=False)["input_ids"]
            if toks and toks[0] not in ids:
                ids.append(toks[0])
        for t in ids:
            if owner.setdefault(t, opt) != opt:
                raise GenerationError(f"{where}options {owner[t]!r} and {opt!r} start with the same token")
        out.append(tuple(ids))
    return out


def combine_option_logprobs(
    options: Sequence[str], token_ids: Sequence[tuple[int, ...]], logprob: Mapping[int, float]
) -> dict[str, float | None]:
    """Each option's log-probability: log of the summed probabilities of its starting tokens; None
    where none of them is in `logprob` (a backend that reports only its top tokens)."""
    import math

    out: dict[str, float | None] = {}
    for opt, ids in zip(options, token_ids):
        vals = [logprob[t] for t in ids if t in logprob]
        if not vals:
            out[opt] = None
            continue
        top = max(vals)
        out[opt] = top if top == -math.inf else top + math.log(sum(math.exp(v - top) for v in vals))
    return out
