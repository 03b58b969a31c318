"""The transformers backend: batched decoding across questions, one LoRA adapter per role, shared prefixes.

Requests are grouped by adapter (the role's LoRA: on CPUs a copy of the weights with it merged in, elsewhere one
PeftModel switching adapters; or the plain model),
then by a shared prompt prefix (the instruction and few-shot exemplars). A shared prefix is computed
once per adapter and kept across calls (see `prefix.py`). Each group then decodes with continuous
batching: up to `batch_size` sequences step in lockstep; prompts are prefilled (only their own
suffixes, in chunks padded to their own longest) into a finished sequence's slot at once. Decoding
is greedy, or sampled (temperature > 0) from each row's own torch.Generator seeded with
`request_seed(config.seed, request.seed)`, with each request's stop strings and token limit. A
sampled row draws one token per step from its own stream, so its text does not depend on its
neighbours or the batch size (up to float rounding of the batched logits, which would have to
land on a near-tie to change a draw).
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from knowtrace_train.generation.adapters import load_with_adapters, merge_adapters_here, merged_copy
from knowtrace_train.generation.base import (
    Completion,
    GenerationError,
    GenerationRequest,
    GeneratorBase,
    OptionScores,
    free_memory,
    request_seed,
)
from knowtrace_train.generation.config import GeneratorConfig
from knowtrace_train.generation.devices import cpu_has_native_bf16, local_rank, process_device
from knowtrace_train.generation.layout import pack_here, pack_linears, transpose_here, transpose_linears
from knowtrace_train.generation.models import resolve_model
from knowtrace_train.generation.prefix import (
    KVBuffers,
    PrefixKV,
    PrefixStore,
    plan_prefix_groups,
    register_attention,
)
from knowtrace_train.generation.prepare import (
    PreparedRequest,
    PromptPreparer,
    RoleAdapters,
    combine_option_logprobs,
    cut_at_stop,
    option_token_ids,
)
from knowtrace_train.progress import stderr_is_terminal
from knowtrace_train.threads import follow as follow_threads

__all__ = ["TransformersGenerator"]

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    """One decoding sequence: its request, sampler and the tokens generated so far."""

    request: PreparedRequest
    sampler: torch.Generator | None
    generated: list[int] = field(default_factory=list)


@dataclass
class _Batch:
    """The rows decoding in lockstep: a slot per row (None when free) and per-row tensors."""

    slots: list[_Slot | None]
    valid: torch.Tensor  # [rows, capacity] which buffer columns each row may attend to
    positions: torch.Tensor  # [rows] position of the token each row feeds next
    tokens: torch.Tensor  # [rows] the token each row feeds next

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, device=self.valid.device)
        self.slots = [self.slots[i] for i in rows]
        self.valid, self.positions, self.tokens = self.valid[index], self.positions[index], self.tokens[index]


def pick_device(device: str) -> torch.device:
    """The configured device for this process: under a launcher each process gets its own GPU (`devices.py`)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return torch.device(process_device(device, count, local_rank()))


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The weights' dtype: as configured, or for 'auto' bf16 on GPUs (fp16 where they lack bf16) and on CPUs
    with native bf16 (decoding a few rows at a time reads every weight per step, so half the bytes is about
    twice the speed: `scripts/bench/bench_generation.py --phases batched,bf16`), fp32 on other CPUs, where bf16 is
    emulated and slow."""
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


class TransformersGenerator(GeneratorBase):
    """`Generator` over a transformers causal LM with optional per-role LoRA adapters.

    `close()` (or leaving a `with` block) drops the model, its adapters and the stored prefix
    keys/values, collects garbage and empties the CUDA cache where CUDA was started."""

    def __init__(self, config: GeneratorConfig | None = None, *, model=None, tokenizer=None):
        """Load `config.model` (resolved by `resolve_model`), or take a ready `model` and `tokenizer`
        (then `close()` drops only this generator's references: the caller's keep the model)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config = config or GeneratorConfig()
        self.device = pick_device(config.device)
        owned = model is None  # a caller's model is left as it is (no change of layout)
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
        #: the model each adapter decodes on (None: the plain model); `model` is the one active now
        self.merged = bool(config.adapters) and merge_adapters_here(config.merge_adapters, self.device)
        if self.merged:
            self.models = {None: model, **{role: merged_copy(model, role, path) for role, path in config.adapters.items()}}
        else:
            shared = load_with_adapters(model, config.adapters).eval()
            self.models = {None: shared, **{role: shared for role in config.adapters}}
        if owned and (self.merged or not config.adapters):  # a decoding layout for the generator's own models
            layout = (pack_linears if pack_here(config.pack_weights, self.device, model.dtype)
                      else transpose_linears if transpose_here(config.transpose_weights, self.device, model.dtype) else None)
            for m in set(self.models.values()) if layout else ():
                layout(m)
        self.model = self.models[None]
        self.roles = RoleAdapters(config.adapters, config.base_roles)
        max_context = config.max_context or getattr(model.config, "max_position_embeddings", None) or 2048
        self.preparer = PromptPreparer(tokenizer, config.prompt_format, max_context, config.truncate_prompts, self.roles)
        self.eos_ids = self._eos_ids(model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.prefixes = PrefixStore(config.prefix_cache_size)
        #: `logits_to_keep` as an index: the model then gathers each row's last hidden state into a contiguous
        #: tensor, where `logits_to_keep=1` hands the LM head a strided slice of the prefill's hidden states; on
        #: CPUs a bf16 product on such a slice took 1,000x the time (4.2 s against 4.4 ms for 32 rows, 2 threads;
        #: docs/generation.md), with the same values
        self._last = torch.tensor([-1], device=self.device)
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
        """Activate the role's adapter: its merged copy, or (switched) its PEFT adapter, every adapter
        disabled for the plain model."""
        self.model = self.models[adapter]
        if not self.config.adapters or self.merged:
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

    def _release(self) -> None:
        # the models (the plain one and each role's merged copy, or one PeftModel holding every adapter)
        # and the prefix keys/values computed with them; a round's KV buffers live only inside generate()
        self.model = None
        self.models = {}
        self.prefixes.clear()
        free_memory()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self._check_open()
        follow_threads()  # the threads an evaluation beside this call's stage has given back (threads.py)
        prepared = self.preparer.prepare(requests)
        results: list[Completion | None] = [None] * len(prepared)
        by_adapter: dict[str | None, list[PreparedRequest]] = defaultdict(list)
        for p in prepared:
            by_adapter[p.adapter].append(p)
        show = self.config.progress and len(prepared) > 1 and stderr_is_terminal()  # no redraws in a log file
        with torch.inference_mode(), tqdm(total=len(prepared), desc="generate", disable=not show) as bar:
            for adapter, items in by_adapter.items():
                with self._adapter(adapter):
                    for group, prefix in self._plan(adapter, items):
                        for p, c in self._run_group(group, prefix):
                            results[p.index] = c
                            bar.update(1)
        return [r for r in results if r is not None]

    def score_options(self, requests: Sequence[GenerationRequest], options: Sequence[Sequence[str]]) -> list[OptionScores]:
        """`OptionScorer`: one prefill per request (batched by adapter and shared prefix, in chunks of
        `prefill_chunk_tokens`), no decoding; the log-softmax of the last position's logits."""
        self._check_open()
        if len(options) != len(requests):
            raise GenerationError(f"score_options: {len(requests)} requests but {len(options)} option lists")
        prepared = self.preparer.prepare(requests)
        token_ids = [option_token_ids(self.tokenizer, o, f"request {i}: ") for i, o in enumerate(options)]
        results: list[OptionScores | None] = [None] * len(prepared)
        by_adapter: dict[str | None, list[PreparedRequest]] = defaultdict(list)
        for p in prepared:
            by_adapter[p.adapter].append(p)
        with torch.inference_mode():
            for adapter, items in by_adapter.items():
                with self._adapter(adapter):
                    for group, prefix in self._plan(adapter, items):
                        n = prefix.length if prefix else 0
                        group = sorted(group, key=lambda r: len(r.input_ids))
                        suffixes = [r.input_ids[n:] for r in group]
                        for lo, hi in self._chunks([len(x) for x in suffixes]):
                            logits, _, _ = self._prefill_part(suffixes[lo:hi], prefix)
                            logp = torch.log_softmax(logits, dim=-1)
                            self.stats["prompt_tokens_prefilled"] += sum(len(x) for x in suffixes[lo:hi])
                            for row, r in enumerate(group[lo:hi]):
                                wanted = {t: float(logp[row, t]) for t in set().union(*token_ids[r.index])}
                                results[r.index] = OptionScores(
                                    combine_option_logprobs(options[r.index], token_ids[r.index], wanted),
                                    prompt_tokens=len(r.input_ids), truncated_tokens=r.truncated_tokens)
        return [r for r in results if r is not None]

    # -- planning ----------------------------------------------------------------------------------

    def _plan(self, adapter: str | None, items: list[PreparedRequest]):
        """Yield (group, shared prefix or None): the requests that decode under one prefix."""
        cfg = self.config
        if not cfg.share_prefix:
            yield list(items), None
            return
        groups = plan_prefix_groups([p.input_ids for p in items], cfg.min_shared_prefix)
        loose: dict[tuple[int, ...] | None, list[PreparedRequest]] = defaultdict(list)
        stored: dict[tuple[int, ...] | None, PrefixKV | None] = {None: None}
        for shared, members in groups:
            group = [items[i] for i in members]
            if shared:
                yield group, self._prefix_for(adapter, group[0].input_ids, shared)
                continue
            # prompts sharing no long prefix with this call's others: batch them together, each
            # under the longest prefix stored by earlier calls (the exemplars repeat across calls)
            for r in group:
                found = self.prefixes.longest_match(adapter, r.input_ids, len(r.input_ids) - 1)
                key = found.token_ids if found and found.length >= cfg.min_shared_prefix else None
                stored[key] = found if key else None
                loose[key].append(r)
        for key, group in loose.items():
            yield group, stored[key]

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
            use_cache=True, logits_to_keep=self._last, knowtrace_prefix=base,
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

    # -- decoding ----------------------------------------------------------------------------------

    def _run_group(self, group: list[PreparedRequest], prefix: PrefixKV | None):
        """Yield (request, completion) as sequences finish. Rounds of continuous batching: up to
        `batch_size` sequences decode in lockstep, and a finished sequence's slot is refilled at once
        by the next waiting prompt (prefilled under the shared prefix), so the batch stays full until
        the queue runs dry; then finished rows simply leave."""
        p = prefix.length if prefix else 0
        # longest suffix first: every later prompt fits left of the column where decoding stands
        pending = deque(sorted(group, key=lambda r: len(r.input_ids) - p, reverse=True))
        while pending:
            yield from self._round(pending, prefix)

    def _round(self, pending: deque, prefix: PrefixKV | None):
        dev = self.device
        p = prefix.length if prefix else 0
        width = len(pending[0].input_ids) - p
        reach = max(r.request.max_new_tokens for r in pending)
        n = min(self.config.batch_size, len(pending))
        # room for a second generation of refills; a prompt that no longer fits waits for the next round
        capacity = width + (reach if len(pending) <= n else 2 * reach)
        cache = KVBuffers(capacity, batch=n, filled=width)
        batch = _Batch(
            slots=[None] * n,
            valid=torch.zeros((n, capacity), dtype=torch.bool, device=dev),
            positions=torch.zeros(n, dtype=torch.long, device=dev),
            tokens=torch.full((n,), self.pad_id, dtype=torch.long, device=dev),
        )
        column = width  # where the next fed token's keys/values go, for every row
        while True:
            yield from self._admit(batch, pending, cache, column, capacity, prefix)
            live = [i for i, s in enumerate(batch.slots) if s is not None]
            if not live:
                return
            if len(live) < len(batch.slots):  # nothing left to refill with: drop the empty rows
                batch.keep(live)
                cache.select(torch.tensor(live, device=dev))
            batch.valid[:, column] = True
            logits = self._forward(
                batch.tokens[:, None], batch.valid[:, None, None, : column + 1], batch.positions[:, None], cache, prefix
            )
            batch.positions += 1
            column += 1
            yield from self._step(batch, logits)

    def _admit(self, batch: "_Batch", pending: deque, cache: KVBuffers, column: int, capacity: int, prefix):
        """Prefill waiting prompts into free slots and choose their first tokens."""
        p = prefix.length if prefix else 0
        while True:
            free = [i for i, s in enumerate(batch.slots) if s is None]
            admitted: list[tuple[int, PreparedRequest]] = []
            while free and pending and column + pending[0].request.max_new_tokens <= capacity:
                admitted.append((free.pop(0), pending.popleft()))
            if not admitted:
                return
            rows = [i for i, _ in admitted]
            reqs = [r for _, r in admitted]
            suffixes = [r.input_ids[p:] for r in reqs]
            lengths = [len(s) for s in suffixes]
            index = torch.tensor(rows, device=self.device)
            batch.valid[index] = False
            for i, n in zip(rows, lengths):
                batch.valid[i, column - n : column] = True
            batch.positions[index] = torch.tensor([p + n for n in lengths], device=self.device)
            logits = torch.cat(
                [self._prefill(suffixes[lo:hi], rows[lo:hi], column, cache, prefix) for lo, hi in self._chunks(lengths)]
            )
            self.stats["prompt_tokens_prefilled"] += sum(lengths)
            self.stats["prompt_tokens_shared"] += p * len(reqs)
            for i, r in zip(rows, reqs):
                batch.slots[i] = _Slot(r, self._sampler(r))
            yield from self._step(batch, logits, rows)

    def _step(self, batch: "_Batch", logits: torch.Tensor, rows: list[int] | None = None):
        """Choose the next token of `rows` (default: every row) from their logits; finish sequences."""
        rows = list(range(len(batch.slots))) if rows is None else rows
        slots = [batch.slots[i] for i in rows]
        tokens = self._choose(logits, slots)
        batch.tokens[torch.tensor(rows, device=self.device)] = tokens
        for i, slot, tok in zip(rows, slots, tokens.tolist()):
            slot.generated.append(tok)
            done = self._finished(slot.request, slot.generated, tok)
            if done is not None:
                self.stats["output_tokens"] += len(slot.generated)
                batch.slots[i] = None
                yield slot.request, done

    def _chunks(self, lengths: list[int]) -> list[tuple[int, int]]:
        """Consecutive row ranges whose padded suffixes fit `prefill_chunk_tokens` (rows come sorted
        by length, so each chunk pads only to its own longest suffix)."""
        out, lo, longest = [], 0, 0
        for i, n in enumerate(lengths):
            longest = max(longest, n)
            if i > lo and (i - lo + 1) * longest > self.config.prefill_chunk_tokens:
                out.append((lo, i))
                lo, longest = i, n
        out.append((lo, len(lengths)))
        return out

    def _prefill(self, suffixes, rows: list[int], column: int, cache: KVBuffers, prefix) -> torch.Tensor:
        """Prefill `suffixes` (left-padded to their own longest) into cache rows `rows`, ending at
        `column`; the logits of each one's last token."""
        logits, part, w = self._prefill_part(suffixes, prefix)
        cache.place(part, rows=torch.tensor(rows, device=self.device), columns=slice(column - w, column))
        return logits

    def _prefill_part(self, suffixes, prefix) -> tuple[torch.Tensor, KVBuffers, int]:
        """Forward `suffixes` left-padded to their own longest (width w) under `prefix`: the logits of
        each one's last token, their keys/values and w."""
        dev = self.device
        p = prefix.length if prefix else 0
        w = max(len(s) for s in suffixes)
        ids = torch.full((len(suffixes), w), self.pad_id, dtype=torch.long, device=dev)
        for row, s in enumerate(suffixes):
            ids[row, w - len(s) :] = torch.tensor(s, device=dev)
        pads = torch.tensor([w - len(s) for s in suffixes], device=dev)
        cols = torch.arange(w, device=dev)
        real = cols[None] >= pads[:, None]
        positions = p + (cols[None] - pads[:, None]).clamp(min=0)
        causal = torch.ones(w, w, dtype=torch.bool, device=dev).tril()
        eye = torch.eye(w, dtype=torch.bool, device=dev)
        # a pad position sees only itself (never an empty softmax row); real tokens never see pads
        mask = (causal[None] & (real[:, None, :] | eye[None]))[:, None]
        part = KVBuffers(w)
        return self._forward(ids, mask, positions, part, prefix), part, w

    def _forward(self, ids, mask, positions, cache, prefix) -> torch.Tensor:
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
            use_cache=True, logits_to_keep=self._last, knowtrace_prefix=prefix,
        )
        return out.logits[:, -1].float()

    def _sampler(self, r: PreparedRequest) -> torch.Generator | None:
        """The row's own random stream (None for greedy), on the model's device and seeded with
        `request_seed(config.seed, request.seed)`: a row's samples depend on its request only,
        never on the rows decoding beside it or on the batch size."""
        if r.request.temperature <= 0:
            return None
        g = torch.Generator(device=self.device)
        g.manual_seed(request_seed(self.config.seed, r.request.seed))
        return g

    @staticmethod
    def _choose(logits: torch.Tensor, slots: list["_Slot"]) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        for row, slot in enumerate(slots):
            if slot.sampler is not None:
                probs = torch.softmax(logits[row] / slot.request.request.temperature, dim=-1)
                tokens[row] = torch.multinomial(probs, 1, generator=slot.sampler)[0]
        return tokens

    def _finished(self, r: PreparedRequest, gen: list[int], tok: int) -> Completion | None:
        """The completion if this sequence is finished (eos, a stop string, or the token limit)."""
        req = r.request
        reason = None
        text_ids = gen
        if tok in self.eos_ids:
            reason, text_ids = "eos", gen[:-1]
        if not (req.stop or reason or len(gen) >= req.max_new_tokens):
            return None  # nothing can have ended it: skip decoding the text
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
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
