"""Shared-prefix attention: a batch attends to one copy of a cached prompt prefix plus its own suffixes.

KnowTrace prompts repeat a long instruction with few-shot exemplars and differ only at the end. The
prefix's keys and values are computed once (per adapter) and kept as a single [kv_heads, P, dim]
copy; each batch keeps only its suffix keys/values in preallocated buffers, and the attention
function registered here scores every query against the shared prefix (one matrix product for the
whole batch) and against its own suffix, under one softmax. Nothing of the prefix is copied per row.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

#: The attention implementation name registered with transformers.
ATTENTION_NAME = "knowtrace_shared_prefix"
_registered = False


@dataclass
class PrefixKV:
    """Keys and values of a prompt prefix, one [kv_heads, P, head_dim] tensor per layer."""

    token_ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return len(self.token_ids)


class KVBuffers:
    """A minimal transformers cache: preallocated key/value buffers for a batch's suffix tokens.

    `update` writes the new states in place and returns views of everything written so far, so a
    decoding step never copies the cache (DynamicCache concatenates on every step)."""

    def __init__(self, capacity: int, batch: int | None = None, filled: int = 0):
        """`capacity` positions per row; `batch` and `filled` for a cache assembled with `place`."""
        self.capacity = capacity
        self.batch = batch
        self.filled = filled
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []

    def _allocate(self, like: torch.Tensor, batch: int) -> None:
        # zeros, not empty: columns left unwritten (padding) must hold finite values, since a masked
        # position's probability 0 times a NaN value would still poison the output
        shape = (batch, like.shape[1], self.capacity, like.shape[3])
        self.keys.append(like.new_zeros(shape))
        self.values.append(like.new_zeros(shape))
        self.lengths.append(self.filled)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx == len(self.keys):
            self._allocate(key_states, key_states.shape[0])
        start = self.lengths[layer_idx]
        end = start + key_states.shape[2]
        if end > self.capacity:
            raise RuntimeError(f"KV buffer overflow: {end} > capacity {self.capacity}")
        self.keys[layer_idx][:, :, start:end] = key_states
        self.values[layer_idx][:, :, start:end] = value_states
        self.lengths[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def place(self, part: "KVBuffers", rows: slice, columns: slice) -> None:
        """Copy a prefilled part (a few rows) into rows/columns of this batch's buffers."""
        n = columns.stop - columns.start
        for layer, (k, v) in enumerate(zip(part.keys, part.values)):
            if layer == len(self.keys):
                self._allocate(k, self.batch)
            self.keys[layer][rows, :, columns] = k[:, :, :n]
            self.values[layer][rows, :, columns] = v[:, :, :n]

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (finished sequences leave the batch)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]

    def as_prefix(self, token_ids: Sequence[int]) -> PrefixKV:
        """The buffers of a one-row batch as a reusable prefix."""
        n = len(token_ids)
        return PrefixKV(
            tuple(token_ids),
            [k[0, :, :n].contiguous() for k in self.keys],
            [v[0, :, :n].contiguous() for v in self.values],
        )


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    knowtrace_prefix: PrefixKV | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over [shared prefix | own suffix]; plain SDPA when no prefix is given.

    query [B, H, q, d]; key/value [B, Hkv, S, d] (the suffix so far); attention_mask a boolean
    [B, 1, q, S] (True = may attend) over the suffix. Returns [B, q, H, d] like transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if knowtrace_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    pk = knowtrace_prefix.keys[module.layer_idx]
    pv = knowtrace_prefix.values[module.layer_idx]
    b, h, q, d = query.shape
    hkv, p = pk.shape[0], pk.shape[1]
    g = h // hkv
    scale = scaling if scaling is not None else d**-0.5
    qg = query.reshape(b, hkv, g * q, d)  # head i*g+j reads kv head i, as repeat_kv lays them out
    # prefix: every row of every batch member against the one prefix copy, a single matmul per kv head
    qp = qg.transpose(0, 1).reshape(hkv, b * g * q, d)
    sp = torch.bmm(qp, pk.transpose(1, 2)).view(hkv, b, g * q, p).transpose(0, 1)
    # the suffix keys are a view of the first S columns of KVBuffers' capacity: a bf16 product with that strided view
    # took 2.8x a copy and the product on it (0.244 against 0.088 ms at 32 rows and S = 100, 2 threads, the same
    # values); the values' product gained nothing from a copy
    ss = torch.matmul(qg, key.contiguous().transpose(-1, -2))  # [B, Hkv, g*q, S]
    if attention_mask is not None:
        s = key.shape[2]
        allowed = attention_mask.unsqueeze(2).expand(b, 1, g, q, s).reshape(b, 1, g * q, s)
        ss = ss.masked_fill(~allowed, float("-inf"))
    scores = torch.cat([sp, ss], dim=-1).mul_(scale)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    pp = probs[..., :p].transpose(0, 1).reshape(hkv, b * g * q, p)
    out = torch.bmm(pp, pv).view(hkv, b, g * q, d).transpose(0, 1)
    out = out + torch.matmul(probs[..., p:], value)
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


def register_attention() -> str:
    """Register the shared-prefix attention (and SDPA's mask builder under its name) once."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ATTENTION_NAME, shared_prefix_attention)
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
        _registered = True
    return ATTENTION_NAME


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_prefix_groups(seqs: Sequence[Sequence[int]], min_prefix: int) -> list[tuple[int, list[int]]]:
    """Group sequences by a shared prefix of at least `min_prefix` tokens.

    Returns (prefix length, member indices) per group. Sequences are sorted, so a group is a run
    whose shared prefix is the smallest common prefix of neighbours inside it; a run is split at its
    weakest links when that saves at least half again the prefill its shared prefix already saves
    (a stray prompt does not shrink the exemplars' prefix for all the others, yet near-identical
    questions do not fragment a batch). A group's prefix always leaves each member one token of its
    own (the position whose logits start decoding). Sequences sharing nothing long enough come back
    as groups with prefix length 0."""
    n = len(seqs)
    order = sorted(range(n), key=lambda i: tuple(seqs[i]))
    links = [common_prefix_length(seqs[order[i]], seqs[order[i + 1]]) for i in range(n - 1)]

    def shared(lo: int, hi: int) -> int:
        if hi - lo < 2:
            return 0
        return min(min(links[lo : hi - 1]), min(len(seqs[order[i]]) for i in range(lo, hi)) - 1)

    groups: list[tuple[int, list[int]]] = []
    stack = [(0, n)] if n else []
    while stack:
        lo, hi = stack.pop()
        p = shared(lo, hi)
        if hi - lo < 2:
            groups.append((0, [order[lo]]))
            continue
        weakest = min(links[lo : hi - 1])
        cuts = [lo] + [i + 1 for i in range(lo, hi - 1) if links[i] == weakest] + [hi]
        parts = list(zip(cuts, cuts[1:]))
        saved_now = (hi - lo - 1) * p
        saved_split = sum((b - a - 1) * max(shared(a, b), 0) for a, b in parts)
        if p < min_prefix or (len(parts) > 1 and saved_split - saved_now > saved_now / 2):
            stack.extend(parts)
        else:
            groups.append((p, [order[i] for i in range(lo, hi)]))
    return [(p if p >= min_prefix else 0, m) for p, m in groups]


class PrefixStore:
    """A small LRU of computed prefixes per adapter, reused across calls (the exemplars repeat)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[tuple[str | None, tuple[int, ...]], PrefixKV] = OrderedDict()

    def longest_match(self, adapter: str | None, seq: Sequence[int], limit: int) -> PrefixKV | None:
        """The longest stored prefix of `seq` (at most `limit` tokens) for this adapter."""
        best = None
        for (a, ids), kv in self._items.items():
            if a == adapter and len(ids) <= limit and (best is None or len(ids) > best.length):
                if tuple(seq[: len(ids)]) == ids:
                    best = kv
        if best is not None:
            self._items.move_to_end((adapter, best.token_ids))
        return best

    def put(self, adapter: str | None, kv: PrefixKV) -> None:
        if self.capacity <= 0:
            return
        self._items[(adapter, kv.token_ids)] = kv
        self._items.move_to_end((adapter, kv.token_ids))
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
