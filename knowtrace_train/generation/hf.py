"""The transformers backend: batched decoding across questions, one LoRA adapter per role, shared prefixes.

Requests are grouped by adapter (the role's LoRA, or the plain model with every adapter disabled),
then by a shared prompt prefix (the instruction and few-shot exemplars), then by suffix length into
batches. A shared prefix is computed once per adapter and kept (see `prefix.py`); each batch
prefills only its suffixes, left-padded, and decodes greedily (or samples, per request seed) with
its own stop strings and token limits. Finished sequences leave the batch at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from pathlib import Path
from typing import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from knowtrace_train.generation.base import Completion, GenerationError, GenerationRequest
from knowtrace_train.generation.config import GeneratorConfig
from knowtrace_train.generation.models import resolve_model
from knowtrace_train.generation.prefix import (
    KVBuffers,
    PrefixKV,
    PrefixStore,
    plan_prefix_groups,
    register_attention,
)
from knowtrace_train.generation.prepare import PreparedRequest, PromptPreparer, RoleAdapters, cut_at_stop

log = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # bf16 is emulated (slow) on most CPUs


def check_adapter_dir(role: str, path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not (p / "adapter_config.json").is_file():
        raise GenerationError(f"adapter for role {role!r}: {p} is not a PEFT adapter folder (no adapter_config.json)")
    return p


def load_with_adapters(model, adapters: dict[str, str]):
    """Wrap `model` in one PeftModel holding every role's LoRA adapter, each named after its role."""
    if not adapters:
        return model
    from peft import PeftModel

    items = [(role, check_adapter_dir(role, path)) for role, path in adapters.items()]
    role, path = items[0]
    peft_model = PeftModel.from_pretrained(model, str(path), adapter_name=role, is_trainable=False)
    for role, path in items[1:]:
        peft_model.load_adapter(str(path), adapter_name=role, is_trainable=False)
    return peft_model


class TransformersGenerator:
    """`Generator` over a transformers causal LM with optional per-role LoRA adapters."""

    def __init__(self, config: GeneratorConfig | None = None, *, model=None, tokenizer=None):
        """Load `config.model` (resolved by `resolve_model`), or take a ready `model` and `tokenizer`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config = config or GeneratorConfig()
        self.device = pick_device(config.device)
        if model is None:
            path = resolve_model(config.model, config.cache_dir)
            dtype = pick_dtype(config.dtype, self.device)
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(path))
        elif tokenizer is None:
            raise GenerationError("TransformersGenerator(model=...) needs its tokenizer too")
        self.tokenizer = tokenizer
        model = model.to(self.device).eval()
        self._use_shared_attention(model)
        self.model = load_with_adapters(model, config.adapters).eval()
        self.roles = RoleAdapters(config.adapters, config.base_roles)
        max_context = config.max_context or getattr(model.config, "max_position_embeddings", None) or 2048
        self.preparer = PromptPreparer(tokenizer, config.prompt_format, max_context, config.truncate_prompts, self.roles)
        self.eos_ids = self._eos_ids(model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.prefixes = PrefixStore(config.prefix_cache_size)
        #: counters for benchmarks and logs: prompt tokens prefilled vs served from a shared prefix
        self.stats = defaultdict(int)

    # -- setup -------------------------------------------------------------------------------------

    @staticmethod
    def _use_shared_attention(model) -> None:
        cfg = model.config
        window = getattr(cfg, "sliding_window", None)
        uses_window = bool(window) and getattr(cfg, "use_sliding_window", True)
        if uses_window or getattr(cfg, "attn_logit_softcapping", None):
            raise GenerationError(
                f"model type {cfg.model_type!r} uses sliding-window or soft-capped attention, which the "
                "transformers backend does not serve; use backend 'vllm'"
            )
        try:
            model.set_attn_implementation(register_attention())
        except (ValueError, AttributeError) as e:
            raise GenerationError(
                f"model type {cfg.model_type!r} does not support custom attention functions: {e}"
            ) from e

    def _eos_ids(self, model) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(model, "generation_config", None), model.config):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    @contextlib.contextmanager
    def _adapter(self, adapter: str | None) -> Iterator[None]:
        """Activate the role's adapter; for the plain model disable every adapter."""
        if not self.config.adapters:
            yield
        elif adapter is None:
            with self.model.disable_adapter():
                yield
        else:
            self.model.set_adapter(adapter)
            yield

    # -- the protocol ------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        prepared = self.preparer.prepare(requests)
        results: list[Completion | None] = [None] * len(prepared)
        by_adapter: dict[str | None, list[PreparedRequest]] = defaultdict(list)
        for p in prepared:
            by_adapter[p.adapter].append(p)
        show = self.config.progress and len(prepared) > 1
        with torch.inference_mode(), tqdm(total=len(prepared), desc="generate", disable=not show) as bar:
            for adapter, items in by_adapter.items():
                with self._adapter(adapter):
                    for batch, prefix in self._plan(adapter, items):
                        for p, c in zip(batch, self._run_batch(batch, prefix)):
                            results[p.index] = c
                        bar.update(len(batch))
        return [r for r in results if r is not None]

    # -- planning ----------------------------------------------------------------------------------

    def _plan(self, adapter: str | None, items: list[PreparedRequest]):
        """Yield (batch, shared prefix or None): groups by shared prefix, batches by suffix length."""
        cfg = self.config
        if not cfg.share_prefix:
            yield from self._batches(list(items), None)
            return
        groups = plan_prefix_groups([p.input_ids for p in items], cfg.min_shared_prefix)
        loose: dict[tuple[int, ...] | None, list[PreparedRequest]] = defaultdict(list)
        stored: dict[tuple[int, ...] | None, PrefixKV | None] = {None: None}
        for shared, members in groups:
            group = [items[i] for i in members]
            if shared:
                yield from self._batches(group, self._prefix_for(adapter, group[0].input_ids, shared))
                continue
            # prompts sharing no long prefix with this call's others: batch them together, each
            # under the longest prefix stored by earlier calls (the exemplars repeat across calls)
            for r in group:
                found = self.prefixes.longest_match(adapter, r.input_ids, len(r.input_ids) - 1)
                key = found.token_ids if found and found.length >= cfg.min_shared_prefix else None
                stored[key] = found if key else None
                loose[key].append(r)
        for key, group in loose.items():
            yield from self._batches(group, stored[key])

    def _batches(self, group: list[PreparedRequest], prefix: PrefixKV | None):
        p = prefix.length if prefix else 0
        group.sort(key=lambda r: len(r.input_ids) - p)
        for start in range(0, len(group), self.config.batch_size):
            yield group[start : start + self.config.batch_size], prefix

    def _prefix_for(self, adapter: str | None, ids: Sequence[int], shared: int) -> PrefixKV:
        """The prefix ids[:shared], from the store or computed (extending the longest stored part)."""
        stored = self.prefixes.longest_match(adapter, ids, shared)
        if stored is not None and stored.length == shared:
            return stored
        prefix = self._extend_prefix(stored, ids[:shared])
        self.prefixes.put(adapter, prefix)
        return prefix

    def _extend_prefix(self, base: PrefixKV | None, token_ids: Sequence[int]) -> PrefixKV:
        """Keys/values of `token_ids`, computing only the part after the stored `base`."""
        start = base.length if base else 0
        new = torch.tensor([token_ids[start:]], device=self.device)
        n = new.shape[1]
        cache = KVBuffers(n)
        positions = torch.arange(start, start + n, device=self.device)[None]
        mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None, None]
        self.model(
            input_ids=new, attention_mask=mask, position_ids=positions, past_key_values=cache,
            use_cache=True, logits_to_keep=1, knowtrace_prefix=base,
        )
        self.stats["prefix_tokens_computed"] += n
        tail = cache.as_prefix(token_ids[start:])
        if base is None:
            return PrefixKV(tuple(token_ids), tail.keys, tail.values)
        return PrefixKV(
            tuple(token_ids),
            [torch.cat([a, b], dim=1) for a, b in zip(base.keys, tail.keys)],
            [torch.cat([a, b], dim=1) for a, b in zip(base.values, tail.values)],
        )

    # -- one batch ---------------------------------------------------------------------------------

    def _run_batch(self, batch: list[PreparedRequest], prefix: PrefixKV | None) -> list[Completion]:
        dev = self.device
        p = prefix.length if prefix else 0
        suffixes = [r.input_ids[p:] for r in batch]
        lengths = torch.tensor([len(s) for s in suffixes], device=dev)
        b, width = len(batch), int(lengths.max())
        budget = max(r.request.max_new_tokens for r in batch)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long, device=dev)
        valid = torch.zeros((b, width + budget), dtype=torch.bool, device=dev)
        for row, s in enumerate(suffixes):
            ids[row, width - len(s) :] = torch.tensor(s, device=dev)
            valid[row, width - len(s) : width] = True
        pads = width - lengths
        positions = p + (torch.arange(width, device=dev)[None] - pads[:, None]).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        eye = torch.eye(width, dtype=torch.bool, device=dev)
        # a pad position sees only itself (never an empty softmax row); real tokens never see pads
        mask = (causal[None] & (valid[:, None, :width] | eye[None]))[:, None]
        cache = KVBuffers(width + budget)
        logits = self._forward(ids, mask, positions, cache, prefix)
        self.stats["prompt_tokens_prefilled"] += int(lengths.sum())
        self.stats["prompt_tokens_shared"] += p * b

        rows = list(range(b))  # batch row -> index into `batch`
        next_pos = p + lengths
        generated: list[list[int]] = [[] for _ in batch]
        done: list[Completion | None] = [None] * b
        samplers = self._samplers(batch)
        for step in range(budget):
            tokens = self._choose(logits, [batch[i] for i in rows], [samplers[i] for i in rows])
            keep = []
            for row, (i, tok) in enumerate(zip(rows, tokens.tolist())):
                generated[i].append(tok)
                done[i] = self._finished(batch[i], generated[i], tok)
                if done[i] is None:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(rows):
                sel = torch.tensor(keep, device=dev)
                cache.select(sel)
                valid, next_pos, tokens = valid[sel], next_pos[sel], tokens[sel]
                rows = [rows[k] for k in keep]
            valid[:, width + step] = True
            logits = self._forward(
                tokens[:, None], valid[:, None, None, : width + step + 1], next_pos[:, None], cache, prefix
            )
            next_pos = next_pos + 1
        self.stats["output_tokens"] += sum(len(g) for g in generated)
        return [c for c in done if c is not None]

    def _forward(self, ids, mask, positions, cache, prefix) -> torch.Tensor:
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
            use_cache=True, logits_to_keep=1, knowtrace_prefix=prefix,
        )
        return out.logits[:, -1].float()

    def _samplers(self, batch: list[PreparedRequest]) -> list[torch.Generator | None]:
        out = []
        for r in batch:
            if r.request.temperature > 0:
                g = torch.Generator(device=self.device)
                g.manual_seed(r.request.seed)
                out.append(g)
            else:
                out.append(None)
        return out

    @staticmethod
    def _choose(logits: torch.Tensor, reqs: list[PreparedRequest], samplers: list) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        for row, (r, g) in enumerate(zip(reqs, samplers)):
            if g is not None:
                probs = torch.softmax(logits[row] / r.request.temperature, dim=-1)
                tokens[row] = torch.multinomial(probs, 1, generator=g)[0]
        return tokens

    def _finished(self, r: PreparedRequest, gen: list[int], tok: int) -> Completion | None:
        """The completion if this sequence is finished (eos, a stop string, or the token limit)."""
        req = r.request
        reason = None
        text_ids = gen
        if tok in self.eos_ids:
            reason, text_ids = "eos", gen[:-1]
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True) if (req.stop or reason or len(gen) >= req.max_new_tokens) else ""
        if req.stop:
            text, hit = cut_at_stop(text, req.stop)
            if hit:
                reason = "stop"
        if reason is None and len(gen) >= req.max_new_tokens:
            reason = "length"
        if reason is None:
            return None
        return Completion(
            text=text,
            prompt_tokens=len(r.input_ids),
            output_tokens=len(gen),
            finish_reason=reason,
            truncated_tokens=r.truncated_tokens,
        )
