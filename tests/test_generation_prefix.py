"""Shared-prefix attention, prefix grouping and the prefix store, checked against plain computations."""

from __future__ import annotations

import types

import pytest
import torch

from knowtrace_train.generation.prefix import (
    KVBuffers,
    PrefixKV,
    PrefixStore,
    common_prefix_length,
    plan_prefix_groups,
    shared_prefix_attention,
)


def reference_attention(q, k, v, allowed, scale):
    """Plain attention with repeated kv heads: q [B,H,q,d], k/v [B,Hkv,S,d], allowed [B,1,q,S]."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("q_len", [1, 5])
def test_shared_prefix_attention_equals_attention_over_the_concatenation(q_len):
    torch.manual_seed(0)
    b, h, hkv, d, p, s = 3, 6, 2, 8, 7, 9
    q = torch.randn(b, h, q_len, d, dtype=torch.float64)
    pk, pv = torch.randn(hkv, p, d, dtype=torch.float64), torch.randn(hkv, p, d, dtype=torch.float64)
    sk, sv = torch.randn(b, hkv, s, d, dtype=torch.float64), torch.randn(b, hkv, s, d, dtype=torch.float64)
    allowed = torch.rand(b, 1, q_len, s) > 0.4
    prefix = PrefixKV(tuple(range(p)), [pk], [pv])
    module = types.SimpleNamespace(layer_idx=0)
    out, _ = shared_prefix_attention(module, q, sk, sv, allowed, scaling=0.3, knowtrace_prefix=prefix)
    full_k = torch.cat([pk.expand(b, -1, -1, -1), sk], dim=2)
    full_v = torch.cat([pv.expand(b, -1, -1, -1), sv], dim=2)
    full_allowed = torch.cat([torch.ones(b, 1, q_len, p, dtype=torch.bool), allowed], dim=-1)
    expected = reference_attention(q, full_k, full_v, full_allowed, 0.3)
    assert out.shape == (b, q_len, h, d)
    torch.testing.assert_close(out, expected)


def test_kv_buffers_write_in_place_select_rows_and_export_a_prefix():
    cache = KVBuffers(capacity=5)
    k1, v1 = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)
    k, v = cache.update(k1, v1, 0)
    assert k.shape == (2, 1, 3, 4) and torch.equal(k, k1) and torch.equal(v, v1)
    k2 = torch.randn(2, 1, 1, 4)
    k, _ = cache.update(k2, k2, 0)
    assert k.shape == (2, 1, 4, 4) and torch.equal(k[:, :, 3:], k2)
    cache.select(torch.tensor([1]))
    assert cache.keys[0].shape[0] == 1 and torch.equal(cache.keys[0][0, :, :3], k1[1])
    prefix = cache.as_prefix([7, 8, 9])
    assert prefix.length == 3 and prefix.keys[0].shape == (1, 3, 4)
    with pytest.raises(RuntimeError, match="overflow"):
        cache.update(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), 0)


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0


def test_plan_groups_prompts_by_shared_prefix_and_leaves_each_a_token():
    a = list(range(100))
    explore = [a + [500 + i, 600 + i] for i in range(4)]
    complete = [[9] * 80 + [700 + i] for i in range(3)]
    other = [[42, 43, 44]]
    seqs = explore + complete + other
    groups = {tuple(sorted(m)): n for n, m in plan_prefix_groups(seqs, min_prefix=16)}
    assert groups == {(0, 1, 2, 3): 100, (4, 5, 6): 80, (7,): 0}
    # identical prompts still keep one token of their own
    same = [a, list(a)]
    assert plan_prefix_groups(same, 16) == [(99, [0, 1])]


def test_plan_does_not_let_a_stray_prompt_shrink_a_long_shared_prefix():
    a = list(range(200))
    seqs = [a + [1000 + i] for i in range(5)] + [a[:40] + [7, 7, 7]]
    groups = sorted((sorted(m), n) for n, m in plan_prefix_groups(seqs, min_prefix=16))
    assert groups == [([0, 1, 2, 3, 4], 200), ([5], 0)]


def test_prefix_store_finds_the_longest_matching_prefix_per_adapter_and_evicts_lru():
    store = PrefixStore(capacity=2)
    short = PrefixKV((1, 2), [], [])
    long = PrefixKV((1, 2, 3, 4), [], [])
    store.put("explore", short)
    store.put("explore", long)
    assert store.longest_match("explore", [1, 2, 3, 4, 5], limit=10) is long
    assert store.longest_match("explore", [1, 2, 3, 4, 5], limit=3) is short
    assert store.longest_match("explore", [1, 9], limit=10) is None
    assert store.longest_match(None, [1, 2, 3, 4, 5], limit=10) is None
    store.put(None, PrefixKV((5,), [], []))  # evicts the least recently used: `long` (short was used last)
    assert len(store) == 2
    assert store.longest_match("explore", [1, 2, 3, 4, 5], limit=10) is short
