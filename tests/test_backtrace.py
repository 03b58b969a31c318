"""Knowledge backtracing pinned on the paper's Appendix F example, plus the bad inputs."""

from __future__ import annotations

import pytest

from backtrace_fixtures import (ANSWER, PAIR_SCHOOL, PAIR_WHERE, PAIR_WHO, QUESTION, RIOTING, T_EDUCATED,
                                T_INDUSTRIALIST, T_LOCATED, T_WROTE, THOUGHT, Engine, appendix_f, words)
from knowtrace_train.methods.knowtrace import outputs
from knowtrace_train.methods.knowtrace.backtrace import (
    PATH_RULES, backtrace, backtrace_trajectories, evidence_subgraph, filter_trajectory,
    find_target_entities, initial_entity_keys,
)
from knowtrace_train.kg import GuidancePair, KnowledgeGraph, TracedTriplet, Triplet, entity_key


def test_target_entities_longest_first():
    traj = appendix_f()
    t = find_target_entities(traj.graph, THOUGHT, [ANSWER])
    # "Birmingham" sits inside the longer name and is not a target of its own
    assert set(t.thought) == {entity_key(RIOTING), "james watt", "university of glasgow"}
    assert t.answer == ("university of glasgow",)


def test_target_entity_containing_the_gold_answer():
    traj = appendix_f()
    t = find_target_entities(traj.graph, "He studied there.", ["Glasgow"])
    assert t.answer == ("university of glasgow",)


def test_initial_entities_are_the_recorded_expansion_points():
    traj = appendix_f()
    assert [e.name for e in traj.graph.initial_entities] == [RIOTING, "Birmingham"]  # James Watt is not initial
    assert initial_entity_keys(traj.graph) == [entity_key(RIOTING), "birmingham"]


@pytest.mark.parametrize("rule", PATH_RULES)
def test_appendix_f_evidence_subgraph(rule):
    bt = backtrace(appendix_f(), rule)
    assert bt.ok
    traj = appendix_f()
    assert [traj.graph.triplets[i].triplet for i in bt.evidence] == [T_WROTE, T_EDUCATED]


@pytest.mark.parametrize("rule", PATH_RULES)
def test_appendix_f_filters_exactly(rule):
    traj = appendix_f()
    res = backtrace_trajectories([traj], count_tokens=words, path_rule=rule, iteration=1)
    explore = res.records_by_role["explore"]
    complete = res.records_by_role["complete"]
    # the Birmingham-location pair is an unavailing exploration
    assert [r["completion"] for r in explore] == [
        outputs.exploration_guidance([PAIR_WHO]),
        outputs.exploration_guidance([PAIR_SCHOOL]),
        outputs.exploration_answer(THOUGHT, ANSWER),
    ]
    # "James Watt is an industrialist" is an extraneous completion; the Birmingham completion is dropped whole
    assert [r["completion"] for r in complete] == [outputs.completion([T_WROTE]), outputs.completion([T_EDUCATED])]
    assert [r["prompt"] for r in explore] == ["<explore prompt 0>", "<explore prompt 3>", "<explore prompt 5>"]
    assert [r["prompt"] for r in complete] == ["<complete prompt 1>", "<complete prompt 4>"]
    for r in explore + complete:
        assert set(r) - {"decision"} == {"prompt", "prefix", "completion", "role", "trajectory_id", "iteration"}
        assert r["trajectory_id"] == "t1" and r["iteration"] == 1 and r["prefix"] == ""  # no prefix was fed here
    # each exploration's judgement is its decision, at the characters after the judgement words
    assert [r["decision"]["label"] for r in explore] == ["No", "No", "Yes"] and all("decision" not in r for r in complete)
    assert all(r["completion"][r["decision"]["start"]:r["decision"]["end"]] == " " + r["decision"]["label"] for r in explore)
    s = res.stats
    assert s["correct"] == 1 and s["backtraced"] == 1 and s["evidence_triplets"] == 2 and s["graph_triplets"] == 4
    assert s["roles"]["explore"]["records_kept"] == 3 and s["roles"]["explore"]["records_dropped"] == 0
    assert s["roles"]["complete"]["records_kept"] == 2 and s["roles"]["complete"]["records_dropped"] == 1
    assert s["roles"]["complete"]["items_all"] == 4 and s["roles"]["complete"]["items_kept"] == 2


def test_appendix_f_fa_ratio_by_hand():
    traj = appendix_f()
    res = backtrace_trajectories([traj], count_tokens=words)
    all_tokens = sum(words(c.output) for c in traj.calls)
    filtered = words(PAIR_WHERE.render()) + words(T_INDUSTRIALIST.render()) + words(T_LOCATED.render())
    assert res.stats["tokens_all"] == all_tokens
    assert res.stats["tokens_filtered"] == filtered
    assert res.stats["fa_ratio"] == pytest.approx(filtered / all_tokens)
    assert res.stats["roles"]["explore"]["tokens_filtered"] == words(PAIR_WHERE.render())


def test_star_keeps_every_generation_and_measures_the_same_fa():
    traj = appendix_f()
    bt = backtrace_trajectories([traj], count_tokens=words)
    star = backtrace_trajectories([traj], count_tokens=words, mode="star")
    assert [r["completion"] for r in star.records_by_role["complete"]] == [c.output for c in traj.calls if c.role == "complete"]
    assert [r["completion"] for r in star.records_by_role["explore"]] == [c.output for c in traj.calls if c.role == "explore"]
    assert star.stats["fa_ratio"] == bt.stats["fa_ratio"]
    assert star.stats["records"] == {"explore": 3, "complete": 3, "answer": 0}


def test_incorrect_trajectories_give_nothing():
    traj = appendix_f()
    traj.em = 0.0
    res = backtrace_trajectories([traj], count_tokens=words)
    assert res.stats["skipped"] == {"incorrect": 1} and res.stats["tokens_all"] == 0
    assert all(not v for v in res.records_by_role.values())


def test_correctness_from_the_prediction_when_unscored():
    traj = appendix_f()
    traj.em = None
    traj.prediction = "the University of Glasgow"
    assert backtrace_trajectories([traj], count_tokens=words).stats["backtraced"] == 1


def _empty_graph_trajectory():
    e = Engine("Is it?")
    e.answer(1, "Nothing was retrieved.", "yes")
    return e.trajectory(answers=("yes",), prediction="yes", thought="Nothing was retrieved.")


def _answer_not_in_graph():
    traj = appendix_f()
    traj.answers, traj.prediction, traj.thought = ["Oxford"], "Oxford", "He went to Oxford."
    traj.calls[-1].parsed["answer"] = "Oxford"
    return traj


def _no_path():
    e = Engine(QUESTION)
    e.explore(1, [PAIR_WHERE])
    e.complete(1, PAIR_WHERE, [T_LOCATED])
    # the answer entity is in the graph but not connected to the initial entity
    e.complete(1, PAIR_WHERE, [Triplet("James Watt", "was educated at", "University of Glasgow")])
    e.graph.triplets[1] = TracedTriplet(T_EDUCATED, 1, PAIR_SCHOOL, 2)  # produced for an unrelated pair
    e.answer(2, "So Glasgow.", ANSWER)
    return e.trajectory(prediction=ANSWER, thought="So University of Glasgow.")


@pytest.mark.parametrize("make,reason", [
    (_empty_graph_trajectory, "empty_graph"),
    (_answer_not_in_graph, "no_answer_entity"),
    (_no_path, "no_path"),
])
@pytest.mark.parametrize("rule", PATH_RULES)
def test_bad_inputs_give_no_records_and_are_counted(make, reason, rule):
    traj = make()
    res = backtrace_trajectories([traj], count_tokens=words, path_rule=rule)
    assert res.stats["skipped"] == {reason: 1}
    assert all(not v for v in res.records_by_role.values())
    # every output token of the correct trajectory counts as filtered
    assert res.stats["tokens_all"] > 0 and res.stats["fa_ratio"] == 1.0
    assert res.stats["fa_ratio_backtraced"] == 0.0  # nothing backtraced


def test_no_initial_entity():
    traj = appendix_f()
    traj.graph.initial_entities.clear()
    assert backtrace(traj).status == "no_initial_entity"


def test_yes_no_answer_uses_the_thought_entities():
    e = Engine("Were Alpha Press and Beta Press founded in the same year?")
    pa, pb = GuidancePair("Alpha Press", "founding year"), GuidancePair("Beta Press", "founding year")
    e.explore(1, [pa, pb])
    e.complete(1, pa, [Triplet("Alpha Press", "was founded in", "1821")])
    e.complete(1, pb, [Triplet("Beta Press", "was founded in", "1821"), Triplet("Beta Press", "prints", "maps")])
    thought = "Alpha Press was founded in 1821 and Beta Press in 1821."
    e.answer(2, thought, "yes")
    traj = e.trajectory(answers=("yes",), prediction="yes", thought=thought)
    for rule in PATH_RULES:
        bt = backtrace(traj, rule)
        assert bt.ok and [traj.graph.triplets[i].triplet.object for i in bt.evidence] == ["1821", "1821"]


def test_backward_and_shortest_differ_on_a_detour():
    # A -> B -> C (answer) found by exploration, and a long detour A -> D -> E -> C
    g = KnowledgeGraph()
    rows = [("Aa", "r", "Bb", "Aa"), ("Bb", "r", "Cc", "Bb"), ("Aa", "r", "Dd", "Aa"), ("Dd", "r", "Ee", "Dd"),
            ("Ee", "r", "Cc", "Ee")]
    for i, (s, r, o, pe) in enumerate(rows):
        g.add(TracedTriplet(Triplet(s, r, o), 1, GuidancePair(pe, "g"), i))
    assert evidence_subgraph(g, ["cc"], ["aa"], "shortest") == [0, 1]
    assert evidence_subgraph(g, ["cc"], ["aa"], "backward") == [0, 1, 2, 3, 4]


def test_backward_follows_the_direction_exploration_found():
    # the pair on the target Bb found (Bb, r, Cc): that edge points Bb -> Cc, so the initial
    # entity Cc is not behind the target; the undirected rule takes it anyway
    g = KnowledgeGraph()
    g.add(TracedTriplet(Triplet("Aa", "r", "Xx"), 1, GuidancePair("Aa", "g"), 0))
    g.add(TracedTriplet(Triplet("Bb", "r", "Cc"), 2, GuidancePair("Bb", "g"), 1))
    g.add(TracedTriplet(Triplet("Xx", "r", "Bb"), 2, GuidancePair("Xx", "g"), 2))
    assert evidence_subgraph(g, ["bb"], ["aa", "cc"], "backward") == [0, 2]
    assert evidence_subgraph(g, ["bb"], ["aa", "cc"], "shortest") == [0, 1, 2]
    # a triplet whose pair named its object is followed object -> subject
    h = KnowledgeGraph()
    h.add(TracedTriplet(Triplet("Bb", "r", "Aa"), 1, GuidancePair("Aa", "who"), 0))
    assert evidence_subgraph(h, ["bb"], ["aa"], "backward") == [0]
    assert evidence_subgraph(h, ["aa"], ["bb"], "backward") == []


def test_filter_trajectory_without_evidence_drops_all():
    traj = appendix_f()
    fcs = filter_trajectory(traj, None, words)
    assert all(not fc.kept for fc in fcs) and all(fc.tokens_filtered == fc.tokens_all for fc in fcs)


def test_duplicate_triplet_generated_again_is_kept_where_it_supports():
    e = Engine(QUESTION)
    e.explore(1, [PAIR_WHO])
    e.complete(1, PAIR_WHO, [T_WROTE])
    e.explore(2, [PAIR_SCHOOL, GuidancePair("James Watt", "who is he")])
    e.complete(2, PAIR_SCHOOL, [T_EDUCATED])
    e.complete(2, GuidancePair("James Watt", "who is he"), [T_WROTE, T_INDUSTRIALIST])  # repeats T_WROTE
    e.answer(3, THOUGHT, ANSWER)
    traj = e.trajectory(prediction=ANSWER, thought=THOUGHT)
    res = backtrace_trajectories([traj], count_tokens=words)
    assert [r["completion"] for r in res.records_by_role["complete"]] == [
        outputs.completion([T_WROTE]), outputs.completion([T_EDUCATED]), outputs.completion([T_WROTE])]


def test_fa_with_the_real_tokenizer(real_tokenizer):
    def count(text: str) -> int:
        return len(real_tokenizer(text, add_special_tokens=False)["input_ids"])

    res = backtrace_trajectories([appendix_f()], count_tokens=count)
    s = res.stats
    assert s["tokens_all"] == sum(count(c.output) for c in appendix_f().calls)
    assert 0 < s["fa_ratio"] < 0.5
    assert s["tokens_kept"] + s["tokens_filtered"] == s["tokens_all"]


def test_fa_over_backtraced_trajectories_leaves_skipped_ones_out():
    good, bad = appendix_f(), _answer_not_in_graph()
    bad.id = "t2"
    res = backtrace_trajectories([good, bad], count_tokens=words)
    alone = backtrace_trajectories([good], count_tokens=words)
    assert res.stats["fa_ratio_backtraced"] == alone.stats["fa_ratio"]
    assert res.stats["fa_ratio"] > alone.stats["fa_ratio"]


def test_write_records_and_stats(tmp_path):
    import json

    from knowtrace_train.io import read_jsonl

    res = backtrace_trajectories([appendix_f()], count_tokens=words, iteration=2)
    paths = res.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backtrace_stats.json", "sft_answer.jsonl",
                                                         "sft_complete.jsonl", "sft_explore.jsonl"]
    assert read_jsonl(paths["explore"]) == res.records_by_role["explore"]
    assert read_jsonl(paths["answer"]) == []
    assert json.loads((tmp_path / "backtrace_stats.json").read_text()) == res.stats
