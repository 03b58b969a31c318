"""Property tests of knowledge backtracing on random well-formed and malformed trajectories."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from backtrace_fixtures import random_trajectory, words
from knowtrace_train.methods.knowtrace.backtrace import PATH_RULES, backtrace, backtrace_trajectories
from knowtrace_train.methods.knowtrace.parsing import parse_completion, parse_exploration
from knowtrace_train.trajectory import ModelCall

seeds = st.integers(min_value=0, max_value=10_000)
rules = st.sampled_from(PATH_RULES)


@settings(max_examples=150, deadline=None)
@given(seed=seeds, rule=rules)
def test_evidence_is_a_subgraph(seed, rule):
    traj = random_trajectory(seed)
    bt = backtrace(traj, rule)
    assert len(set(bt.evidence)) == len(bt.evidence)
    assert all(0 <= i < len(traj.graph.triplets) for i in bt.evidence)
    assert bt.ok == bool(bt.evidence)


@settings(max_examples=150, deadline=None)
@given(seed=seeds, rule=rules)
def test_filtering_never_adds_text(seed, rule):
    traj = random_trajectory(seed)
    bt = backtrace(traj, rule)
    s_keys = {traj.graph.triplets[i].triplet.key() for i in bt.evidence}
    res = backtrace_trajectories([traj], count_tokens=words, path_rule=rule)
    star = backtrace_trajectories([traj], count_tokens=words, path_rule=rule, mode="star")
    by_call = {c.prompt: c for c in traj.calls}
    for role, recs in res.records_by_role.items():
        for r in recs:
            original = by_call[r["prompt"]].output
            assert set(r["completion"].splitlines()) <= set(original.splitlines())
            assert words(r["completion"]) <= words(original)
            if role == "complete":
                got = parse_completion(r["completion"]).triplets
                assert got and all(t.key() in s_keys for t in got)
            if role == "explore" and not parse_exploration(r["completion"]).answered:
                assert parse_exploration(r["completion"]).pairs
    for role in res.records_by_role:
        assert len(res.records_by_role[role]) <= len(star.records_by_role[role])
    assert res.stats["fa_ratio"] == star.stats["fa_ratio"]


@settings(max_examples=150, deadline=None)
@given(seeds=st.lists(seeds, min_size=1, max_size=5), rule=rules, mode=st.sampled_from(("backtrace", "star")))
def test_fa_in_unit_interval_and_tokens_add_up(seeds, rule, mode):
    trajs = [random_trajectory(s) for s in seeds]
    res = backtrace_trajectories(trajs, count_tokens=words, path_rule=rule, mode=mode)
    s = res.stats
    assert 0.0 <= s["fa_ratio"] <= 1.0
    assert s["tokens_all"] == sum(words(c.output) for t in trajs for c in t.calls)
    assert s["tokens_kept"] + s["tokens_filtered"] == s["tokens_all"]
    assert sum(r["tokens_all"] for r in s["roles"].values()) == s["tokens_all"]
    assert sum(r["tokens_filtered"] for r in s["roles"].values()) == s["tokens_filtered"]
    for r in s["roles"].values():
        assert 0.0 <= r["fa_ratio"] <= 1.0
        assert r["tokens_kept"] + r["tokens_filtered"] == r["tokens_all"]
        assert r["records_kept"] + r["records_dropped"] == r["calls"]
    assert s["correct"] == s["backtraced"] + sum(s["skipped"].values())
    assert s["records"] == {k: len(v) for k, v in res.records_by_role.items()}


junk = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "Zs", "Cc")), max_size=80)


@settings(max_examples=100, deadline=None)
@given(seed=seeds, text=junk, rule=rules)
def test_malformed_calls_never_raise(seed, text, rule):
    traj = random_trajectory(seed)
    for c in traj.calls[::2]:
        c.output, c.parsed, c.error = text, None, "unparseable"
    traj.calls.append(ModelCall(index=99, role="complete", round=9, prompt="p", output=text, prompt_tokens=0,
                                output_tokens=0, pair=None, triplets=[999]))
    traj.thought = text
    res = backtrace_trajectories([traj], count_tokens=words, path_rule=rule)
    assert 0.0 <= res.stats["fa_ratio"] <= 1.0
