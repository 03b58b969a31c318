"""Training prompts of backtraced records: as seen, without exemplars, re-rendered with the
surviving triplets, un-hinted for rationalization; the forced-answer role."""

from __future__ import annotations

import pytest

from backtrace_fixtures import (ANSWER, PAIR_SCHOOL, PAIR_WHO, QUESTION, T_EDUCATED, T_INDUSTRIALIST, T_LOCATED,
                                T_WROTE, THOUGHT, appendix_f, passage, words)
from knowtrace_train.methods.knowtrace import prompts
from knowtrace_train.methods.knowtrace.backtrace import backtrace_trajectories
from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.knowtrace.parsing import parse_exploration
from knowtrace_train.methods.hints import hinted_items, hinted_question, is_hinted, mentions_hint, unhint_prompt

ALL_ROUND1 = [T_WROTE, T_INDUSTRIALIST, T_LOCATED]


def _records(traj, **kw):
    return backtrace_trajectories([traj], count_tokens=words, **kw).records_by_role


def test_default_prompts_are_the_prompts_seen_and_show_filtered_triplets():
    traj = appendix_f(real_prompts=True)
    rec = _records(traj)
    assert [r["prompt"] for r in rec["explore"]] == [c.prompt for c in traj.calls if c.role == "explore"]
    # the paper filters outputs, not inputs: the round-2 exploration still shows all round-1 triplets
    assert rec["explore"][1]["prompt"] == prompts.render_exploration_prompt(QUESTION, ALL_ROUND1)


def test_prompts_without_exemplars():
    traj = appendix_f(real_prompts=True)
    rec = _records(traj, fewshot=False)
    assert [r["prompt"] for r in rec["explore"]] == [
        prompts.render_exploration_prompt(QUESTION, [], fewshot=False),
        prompts.render_exploration_prompt(QUESTION, ALL_ROUND1, fewshot=False),
        prompts.render_exploration_prompt(QUESTION, ALL_ROUND1 + [T_EDUCATED], fewshot=False),
    ]
    # no passage lookup needed: the exemplar block is swapped out of the prompt seen
    assert [r["prompt"] for r in rec["complete"]] == [
        prompts.render_completion_prompt(PAIR_WHO, [passage("p1"), passage("p2")], fewshot=False),
        prompts.render_completion_prompt(PAIR_SCHOOL, [passage("p4"), passage("p1")], fewshot=False),
    ]
    assert all(len(r["prompt"]) < len(c.prompt) for r, c in zip(rec["complete"], traj.calls[1::3]))


def test_prompts_without_exemplars_keep_the_kg_format():
    traj = appendix_f(real_prompts=True, kg_format="paths")
    rec = _records(traj, fewshot=False)
    assert rec["explore"][1]["prompt"] == prompts.render_exploration_prompt(
        QUESTION, ALL_ROUND1, fewshot=False, kg_format="paths")


@pytest.mark.parametrize("fewshot", [True, False])
def test_rerendered_prompts_show_only_surviving_triplets(fewshot):
    traj = appendix_f(real_prompts=True)
    rec = _records(traj, rerender=True, fewshot=fewshot)
    assert [r["prompt"] for r in rec["explore"]] == [
        prompts.render_exploration_prompt(QUESTION, [], fewshot=fewshot),
        prompts.render_exploration_prompt(QUESTION, [T_WROTE], fewshot=fewshot),
        prompts.render_exploration_prompt(QUESTION, [T_WROTE, T_EDUCATED], fewshot=fewshot),
    ]
    # completion prompts do not show the graph
    assert [r["prompt"] for r in rec["complete"]] == [
        prompts.render_completion_prompt(PAIR_WHO, [passage("p1"), passage("p2")], fewshot=fewshot),
        prompts.render_completion_prompt(PAIR_SCHOOL, [passage("p4"), passage("p1")], fewshot=fewshot),
    ]


def test_star_ignores_rerender():
    traj = appendix_f(real_prompts=True)
    rec = _records(traj, rerender=True, mode="star")
    assert [r["prompt"] for r in rec["explore"]] == [c.prompt for c in traj.calls if c.role == "explore"]


def test_completion_prompt_rendered_from_passages_when_the_head_is_unknown():
    traj = appendix_f()  # placeholder prompts match no template head
    items = {"t1": QAItem(id="t1", question=QUESTION, answers=(ANSWER,),
                          context=tuple(passage(p) for p in ("p1", "p2", "p4")))}
    res = backtrace_trajectories([traj], items, count_tokens=words, fewshot=False)
    assert [r["prompt"] for r in res.records_by_role["complete"]] == [
        prompts.render_completion_prompt(PAIR_WHO, [passage("p1"), passage("p2")], fewshot=False),
        prompts.render_completion_prompt(PAIR_SCHOOL, [passage("p4"), passage("p1")], fewshot=False),
    ]
    # without the passages the record cannot be made and is counted
    res = backtrace_trajectories([traj], count_tokens=words, fewshot=False)
    assert res.stats["prompt_unavailable"] == 2 and not res.records_by_role["complete"]


def test_forced_answer_role():
    traj = appendix_f(real_prompts=True, answer_role="answer")
    rec = _records(traj)
    assert len(rec["answer"]) == 1 and len(rec["explore"]) == 2
    r = rec["answer"][0]
    # the forced answer sees the exploration prompt; its output starts with the answer prefix it was sent
    assert r["prompt"] == prompts.render_exploration_prompt(QUESTION, ALL_ROUND1 + [T_EDUCATED])
    assert r["completion"].startswith(prompts.answer_prefix())
    parsed = parse_exploration(r["completion"])
    assert parsed.answered and parsed.answer == ANSWER and parsed.thought == THOUGHT
    rer = _records(traj, rerender=True, fewshot=False)["answer"][0]
    assert rer["prompt"] == prompts.render_exploration_prompt(QUESTION, [T_WROTE, T_EDUCATED], fewshot=False)


# -- rationalization ---------------------------------------------------------------------

ITEM = QAItem(id="t1", question=QUESTION, answers=(ANSWER,))


def test_hint_round_trip():
    (h,) = hinted_items([ITEM])
    assert h.id == ITEM.id and h.answers == ITEM.answers and ANSWER in h.question
    assert is_hinted(h.question, ITEM.question) and not is_hinted(ITEM.question, ITEM.question)
    prompt = prompts.render_exploration_prompt(h.question, [T_WROTE])
    assert unhint_prompt(prompt, h.question, ITEM.question) == prompts.render_exploration_prompt(QUESTION, [T_WROTE])
    assert unhint_prompt("no question here", h.question, ITEM.question) is None
    assert mentions_hint("The hint says Glasgow.") and not mentions_hint("He studied in Glasgow.")


def test_trajectory_id_tells_a_hinted_rerun():
    from knowtrace_train.methods.hints import trajectory_id

    (h,) = hinted_items([ITEM])
    assert trajectory_id(ITEM) == "t1" and trajectory_id(h) == "t1#hint"
    # a question that merely mentions a hint (not the item's own answer as one) is a plain question
    odd = QAItem(id="t3", question="Which clue is the hint? (Hint: the answer is Paris.)", answers=("Rome",))
    assert trajectory_id(odd) == "t3"


@pytest.mark.parametrize("fewshot", [True, False])
def test_hinted_rollouts_train_without_the_hint(fewshot):
    hq = hinted_question(QUESTION, ANSWER)
    traj = appendix_f(real_prompts=True, question=hq)
    assert "Hint" in traj.calls[0].prompt
    res = backtrace_trajectories([traj], {"t1": ITEM}, count_tokens=words, fewshot=fewshot)
    assert res.stats["hinted"] == 1 and res.stats["backtraced"] == 1
    recs = [r for v in res.records_by_role.values() for r in v]
    assert recs and all("Hint" not in r["prompt"] for r in recs)
    assert res.records_by_role["explore"][1]["prompt"] == prompts.render_exploration_prompt(
        QUESTION, ALL_ROUND1, fewshot=fewshot)


@pytest.mark.parametrize("mode", ["backtrace", "star"])
def test_a_thought_leaning_on_the_hint_is_not_trained(mode):
    traj = appendix_f(real_prompts=True, question=hinted_question(QUESTION, ANSWER))
    traj.thought = "The hint says University of Glasgow."
    res = backtrace_trajectories([traj], {"t1": ITEM}, count_tokens=words, mode=mode)
    assert res.stats["skipped"] == {"hint_leak": 1}
    assert all(not v for v in res.records_by_role.values())


def test_items_to_rationalize_are_the_unsolved_ones_hinted():
    from knowtrace_train.methods.hints import items_to_rationalize

    right, wrong = appendix_f(), appendix_f()
    wrong.question_id, wrong.em = "t2", 0.0
    item2 = QAItem(id="t2", question="Who?", answers=("Nobody",))
    [h] = items_to_rationalize([right, wrong], {"t1": ITEM, "t2": item2})
    assert h.id == "t2" and is_hinted(h.question, item2.question) and "Nobody" in h.question
