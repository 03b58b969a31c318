"""Decisions as calibrated thresholds: the threshold chosen on held-out gold prompts, KnowTrace's engine deciding by
it (scored before the exploration is written), and self-training calibrating each trained model."""

from __future__ import annotations

import json
import math

import pytest

from knowtrace_train.data.schema import QAItem
from knowtrace_train.decisions import DecisionPrompt, calibrate, choose_threshold, option_log_odds, thresholds_of
from knowtrace_train.generation.base import GenerationError, OptionScores
from knowtrace_train.methods.knowtrace import KnowTrace, KnowTraceConfig
from knowtrace_train.methods.knowtrace.outputs import JUDGEMENT, judgement_span
from test_knowtrace import F_COMPLETE, F_PASSAGES, F_QUESTION, ScriptedGenerator, WordRetriever, prompt_parts


# -- the threshold ---------------------------------------------------------------------------------------

def test_the_threshold_separates_the_labels_where_greedy_decoding_would_say_no_everywhere():
    # every log-odds below 0 (greedy: No everywhere), but the Yes prompts score higher
    yes, no = [-0.4, -0.6, -0.5, -1.5], [-1.0, -1.2, -2.0, -1.9, -1.1, -0.7]
    c = choose_threshold(yes + no, [True] * 4 + [False] * 6)
    assert c["greedy"] == {"balanced_accuracy": 0.5, "recall_yes": 0.0, "recall_no": 1.0}
    assert -0.7 < c["threshold"] < -0.6  # halfway between the last No above and the Yes below it
    assert (c["recall_yes"], c["recall_no"]) == (0.75, 1.0) and c["balanced_accuracy"] == 0.875
    assert (c["positives"], c["negatives"], c["unscored"]) == (4, 6, 0)


def test_among_equal_thresholds_the_one_nearest_the_greedy_point_wins_and_nan_is_left_out():
    # perfectly separated at any cut between 1 and 3: the nearest to 0 is 1's side (the midpoint 2.0 of the gap)
    c = choose_threshold([3.0, 4.0, 1.0, math.nan, 0.5], [True, True, False, True, False])
    assert c["threshold"] == 2.0 and c["balanced_accuracy"] == 1.0 and c["unscored"] == 1
    # separated around 0: 0 itself is a candidate and is kept
    assert choose_threshold([1.0, -1.0], [True, False])["threshold"] == 0.0


def test_one_label_only_cannot_be_calibrated():
    assert choose_threshold([1.0, 2.0], [False, False]) is None
    assert choose_threshold([math.nan], [True]) is None
    assert thresholds_of({"a": {"threshold": None}, "b": {"threshold": -0.5}}) == {"b": -0.5}


def test_option_log_odds_counts_a_missing_option_as_impossible():
    s = OptionScores({" Yes": math.log(0.2), " No": None}, prompt_tokens=1)
    assert option_log_odds(s, (" Yes", " No")) == math.inf
    assert math.isnan(option_log_odds(OptionScores({" Yes": None, " No": None}, 1), (" Yes", " No")))
    assert math.isnan(option_log_odds(GenerationError("refused"), (" Yes", " No")))


def test_calibrate_scores_each_prompt_after_its_prefix_under_its_role():
    seen = []

    class Scorer:
        def score_options(self, requests, options):
            seen.extend((r.prompt, r.prefix, r.role, tuple(o)) for r, o in zip(requests, options))
            return [OptionScores({" Yes": -0.5 if "answer here" in r.prompt else -2.0, " No": -1.0}, 1) for r in requests]

    prompts = [DecisionPrompt("sufficiency", f"q{i} {'answer here' if i % 3 == 0 else ''}", JUDGEMENT, "explore",
                              (" Yes", " No"), i % 3 == 0) for i in range(9)]
    out = calibrate(Scorer(), prompts)
    assert set(out) == {"sufficiency"} and out["sufficiency"]["prompts"] == 9
    assert out["sufficiency"]["balanced_accuracy"] == 1.0 and out["sufficiency"]["threshold"] == 0.0
    assert all(p == JUDGEMENT and r == "explore" and o == (" Yes", " No") for _, p, r, o in seen)


# -- the engine deciding by it ----------------------------------------------------------------------------

ITEM = QAItem(id="f", question=F_QUESTION, answers=["University of Glasgow"], dataset="test")
GUIDANCE = {0: "\nRetrieval Guidance:\n- The rioting being a dividing factor in Birmingham: Find out who wrote about this topic."}
GUIDANCE.update({n: "\nRetrieval Guidance:\n- James Watt: Find out which school James Watt attended." for n in range(1, 9)})
THOUGHT = "\nThought: James Watt was educated at the University of Glasgow.\nAnswer: University of Glasgow"


class Deciding(ScriptedGenerator):
    """Appendix F's world; log-odds of Yes: -3 on an empty graph, -0.5 on one without the answer, 0.5 once the
    graph names it; writes on after the decided word."""

    def __init__(self):
        super().__init__(self.respond_)
        self.scored = []

    def score_options(self, requests, options):
        out = []
        for r, o in zip(requests, options):
            assert r.prefix == JUDGEMENT and list(o) == [" Yes", " No"] and r.role == "explore"
            kg = prompt_parts(r.prompt)["kg"]
            odds = 0.5 if any("University of Glasgow" in t for t in kg) else -0.5 if kg else -3.0
            self.scored.append(odds)
            out.append(OptionScores({" Yes": odds, " No": 0.0}, prompt_tokens=1))
        return out

    @staticmethod
    def respond_(parts, req):
        if parts["kind"] == "complete":
            return F_COMPLETE[parts["pair"][0]]
        if parts["kind"] == "answer":  # the forced answer, after "Yes\nThought:"
            return THOUGHT.split("Thought:", 1)[1]
        if req.prefix.endswith(" Yes"):
            return THOUGHT
        if req.prefix.endswith(" No"):
            return GUIDANCE[len(prompt_parts(req.prompt)["kg"])]
        raise AssertionError(f"an exploration generated without a decided judgement: {req.prefix!r}")


@pytest.mark.parametrize("threshold, rounds, said", [
    (0.0, 3, [False, False, True]),     # Yes once the graph names the answer: the trajectory of Appendix F
    (-1.0, 2, [False, True]),           # a lower threshold: Yes already on the first hop's graph (premature)
    (5.0, 3, [False, False, False]),    # above every score: No until max_rounds, then the forced answer
])
def test_the_engine_decides_by_the_log_odds_and_the_threshold(threshold, rounds, said):
    gen = Deciding()
    cfg = KnowTraceConfig(passages=2, max_rounds=3, judgement_threshold=threshold)
    [t] = KnowTrace(cfg).run([ITEM], gen, WordRetriever(F_PASSAGES))
    explores = [c for c in t.calls if c.role == "explore"]
    assert [c.parsed["sufficient"] for c in explores] == said and t.rounds == rounds
    for c in explores:
        word = " Yes" if c.parsed["sufficient"] else " No"
        # the judgement words are fed (prefix), the decided word is the model's output: trained, counted
        assert c.prefix == JUDGEMENT and c.output.startswith(JUDGEMENT + word)
        label, start, end = judgement_span(c.prefix, c.output[len(c.prefix):])
        assert label == word.strip() and c.output[len(c.prefix):][start:end] == word
        assert c.parsed["judgement_threshold"] == threshold and math.isfinite(c.parsed["judgement_log_odds"])
        assert c.output_tokens == len(c.output[len(c.prefix):].split())
    assert t.stop_reason == ("answered" if said[-1] else "no_progress")  # the third round repeats the second
    assert t.prediction == "University of Glasgow" or not said[-1]


def test_greedy_decoding_is_kept_where_no_threshold_is_set_and_a_generator_without_scores_is_refused():
    class NoScores(ScriptedGenerator):
        pass

    gen = NoScores(lambda parts, req: THOUGHT.lstrip("\n").join(["Yes\n", ""]) if parts["kind"] == "explore" else "")
    [t] = KnowTrace(KnowTraceConfig(passages=2)).run([ITEM], gen, WordRetriever(F_PASSAGES))
    assert t.calls[0].parsed.get("judgement_log_odds") is None
    with pytest.raises(GenerationError, match="score_options"):
        KnowTrace(KnowTraceConfig(judgement_threshold=0.0)).run([ITEM], NoScores(lambda p, r: ""), WordRetriever(F_PASSAGES))


def test_a_sampled_decision_follows_its_probability_and_its_seed():
    gen = Deciding()
    items = [QAItem(id=f"f{i}", question=F_QUESTION, answers=["University of Glasgow"], dataset="test")
             for i in range(60)]
    # at 3 triplets the log-odds are -0.5: at threshold -0.5 and temperature 1, Yes with probability 1/2
    cfg = KnowTraceConfig(passages=2, max_rounds=2, judgement_threshold=-0.5, temperature=1.0)
    runs = [KnowTrace(cfg).run(items, Deciding(), WordRetriever(F_PASSAGES)) for _ in range(2)]
    said = [[c.parsed["sufficient"] for t in ts for c in t.calls if c.role == "explore" and c.round == 2] for ts in runs]
    assert said[0] == said[1]  # the same seeds, the same draws
    assert 15 <= sum(said[0]) <= 45
    del gen


# -- self-training calibrates every trained model ---------------------------------------------------------

class ScoringOracle:
    """The tests' oracle (gold outputs for gold prompts) that also scores options: on a gold exploration prompt it
    favours the gold judgement by 5 nats, elsewhere (the calibration's held-out prompts) the tiny model scores."""

    def __init__(self, oracle):
        self.oracle = oracle

    def generate(self, requests):
        return self.oracle.generate(requests)

    def score_options(self, requests, options):
        out = self.oracle.inner.score_options(requests, options)
        for i, r in enumerate(requests):
            gold = self.oracle.answers.get(r.prompt)
            if gold is not None and gold.startswith(r.prefix + " "):
                yes = gold[len(r.prefix):].startswith(" Yes")
                out[i] = OptionScores({" Yes": 0.0 if yes else -5.0, " No": -5.0 if yes else 0.0}, out[i].prompt_tokens)
        return out

    def count_tokens(self, text):
        return self.oracle.count_tokens(text)

    def close(self):
        self.oracle.close()


def scoring_oracle_run(tmp_path, tiny_model_dir, **values):
    """A tiny-model self-training run whose models answer gold prompts as the oracle does and score options
    (`ScoringOracle`), run to its end; returns the SelfTrain."""
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain import SelfTrain, SelfTrainConfig
    from selftrain_helpers import oracle_factory, tiny_overrides

    run = SelfTrain(load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, eval_base=False,
                                                                      **values)), progress=False)
    oracle = oracle_factory(run)
    run.make_generator = lambda gen_cfg: ScoringOracle(oracle(gen_cfg))
    run.run()
    return run


def test_self_training_calibrates_m0_and_each_trained_iteration_and_evaluates_with_it(tmp_path, tiny_model_dir):
    from knowtrace_train.selftrain.models import run_model
    from knowtrace_train.trajectory import read_trajectories

    run = scoring_oracle_run(tmp_path, tiny_model_dir, iterations=1,
                             **{"calibration.questions": 5, "calibration.source": "gold"})
    d = run.run_dir
    ids = json.loads((d / "questions.json").read_text())
    assert len(ids["calibration"]) == 5 and not set(ids["calibration"]) & set(ids["rollout"] + ids["bootstrap"])
    thresholds = {}
    for z in (0, 1):
        cal = json.loads((d / f"iter_{z}" / "calibration.json").read_text())
        s = cal["decisions"]["sufficiency"]
        assert cal["questions"] == 5 and s["prompts"] == cal["prompts"] > 5 and s["positives"] + s["negatives"] == s["prompts"]
        assert isinstance(s["threshold"], float) and -5.0 < s["threshold"] < 5.0 and (d / f"iter_{z}" / "DONE.calibrate").is_file()
        thresholds[z] = s["threshold"]
        # the model's evaluation decided every exploration by that threshold
        explores = [c for t in read_trajectories(d / f"iter_{z}" / "eval.jsonl") for c in t.calls
                    if c.role == "explore" and c.parsed]
        assert explores and all(c.parsed["judgement_threshold"] == s["threshold"] for c in explores)
        assert run_model(d, z).strategy.judgement_threshold == s["threshold"]
    # iteration 1's rollouts ran M0 with M0's threshold
    rolled = [c for t in read_trajectories(d / "iter_1" / "rollouts.jsonl") for c in t.calls if c.role == "explore" and c.parsed]
    assert rolled and all(c.parsed["judgement_threshold"] == thresholds[0] for c in rolled)
    assert run_model(d, "base").strategy.judgement_threshold is None


def test_no_calibration_questions_keep_greedy_decisions(tmp_path, tiny_model_dir):
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain import SelfTrain, SelfTrainConfig
    from knowtrace_train.trajectory import read_trajectories
    from selftrain_helpers import tiny_overrides

    cfg = load_config(SelfTrainConfig, None, tiny_overrides(tmp_path, tiny_model_dir, iterations=0, eval_base=False,
                                                            **{"calibration.questions": 0}))
    run = SelfTrain(cfg, progress=False)
    run.run()
    assert not (run.run_dir / "iter_0" / "calibration.json").exists()
    explores = [c for t in read_trajectories(run.run_dir / "iter_0" / "eval.jsonl") for c in t.calls if c.role == "explore"]
    assert explores and not any((c.parsed or {}).get("judgement_log_odds") is not None for c in explores)


def test_calibration_on_the_models_own_explorations_scores_every_judgement_and_takes_none(tmp_path, tiny_model_dir):
    from knowtrace_train.methods.knowtrace.judgement import graph_names_answer
    from knowtrace_train.trajectory import read_trajectories

    run = scoring_oracle_run(tmp_path, tiny_model_dir, iterations=0,
                             **{"calibration.questions": 4, "calibration.source": "explorations"})
    d = run.run_dir / "iter_0"
    probe = read_trajectories(d / "calibration_rollouts.jsonl")
    ids = json.loads((run.run_dir / "questions.json").read_text())["calibration"]
    assert [t.question_id for t in probe] == ids
    scored = [(c.parsed["judgement_log_odds"], graph_names_answer(t, c)) for t in probe for c in t.calls
              if c.role == "explore" and c.parsed]
    # the probe never says Yes: each question explores until it stops, then the forced answer
    assert scored and all(not c.parsed["sufficient"] for t in probe for c in t.calls if c.role == "explore" and c.parsed)
    assert all(t.stop_reason != "answered" for t in probe)
    cal = json.loads((d / "calibration.json").read_text())
    s = cal["decisions"]["sufficiency"]
    assert cal["source"] == "explorations" and cal["prompts"] == s["prompts"] == len(scored)
    labels = {y for _, y in scored}
    if len(labels) == 2:
        assert s == {**choose_threshold([x for x, _ in scored], [y for _, y in scored]), "prompts": len(scored)}
    else:  # the tiny model's graphs name no answer: nothing to tell apart, greedy decisions
        assert s["threshold"] is None and "one outcome" in s["why"]


# -- DoG's answer try -------------------------------------------------------------------------------------

def test_dog_s_held_out_answer_try_prompts_are_its_gold_walk_s_answer_tries():
    from knowtrace_train.methods import get_method
    from knowtrace_train.methods.dog import DoGConfig
    import knowtrace_train.methods.dog.prompts as dog_prompts
    from gold_helpers import ITEM, Q
    from test_gold_dog import one_hop

    born = one_hop(1, "Where was Odile Farrant born?", ("Odile Farrant", "born in", "Castelbrun"))
    m, cfg = get_method("dog"), DoGConfig(graph="items", fewshot=False)
    every = m.decision_prompts(cfg, [ITEM, born])
    prompts = [p for p in every if p.kind == "answer_try"]
    hop1, hop2 = ("Zentor", "founded by", "Odile Farrant"), ("Odile Farrant", "born in", "Castelbrun")
    # the 2-hop walk: No after its first hop, Yes after its last; the 1-hop walk: Yes
    assert [(p.item_id, p.prompt, p.label) for p in prompts] == [
        ("w2", dog_prompts.answer_try_prompt(Q, [hop1], False), False),
        ("w2", dog_prompts.answer_try_prompt("Where was Odile Farrant born?", [hop2], False), True),
        ("h1", dog_prompts.answer_try_prompt("Where was Odile Farrant born?", [hop2], False), True)]
    assert all((p.kind, p.prefix, p.role, p.options, p.question_kind) == ("answer_try", "", "answer_try", (" Yes", " No"),
                                                                         "bridge") for p in prompts)
    # rendered as the config renders them; none for the model alone; the threshold set from a calibration
    assert all("Enough: No" in p.prompt for p in m.decision_prompts(DoGConfig(graph="items"), [ITEM])
               if p.kind == "answer_try")
    # the relation choice: one prompt per hop, fed the gold sub-question up to "Relation:", read from what is written
    rel = [p for p in every if p.kind == "relation_choice"]
    assert [(p.item_id, p.label, p.role) for p in rel] == [("w2", True, "relation"), ("w2", True, "relation"),
                                                          ("h1", True, "relation")]
    assert rel[2].prefix == " Where was Odile Farrant born?\nRelation:" and rel[2].stop == dog_prompts.BLOCK_STOP
    assert all(p.reads is not None and p.max_new_tokens == cfg.relation_tokens for p in rel)
    listed = [r.strip() for r in rel[2].prompt.rsplit("Relations:", 1)[1].split("\n", 1)[0].split(";")]
    number = next(x.split(".", 1)[0] for x in listed if x.endswith("born in"))
    assert rel[2].reads(f" {number}. born in") and rel[2].reads(" born in") and rel[2].reads(f" {number}.")
    assert not rel[2].reads(" 99. nowhere") and not rel[2].reads("")
    assert m.decision_prompts(DoGConfig(graph="items", max_hops=0), [ITEM]) == []
    assert m.with_thresholds(cfg, {"answer_try": -0.25}).answer_try_threshold == -0.25
    assert m.with_thresholds(cfg, {"sufficiency": 1.0}) is cfg
    with pytest.raises(ValueError, match="answer_try_threshold"):
        DoGConfig(answer_try_threshold=math.inf)


class DecidingDoG:
    """test_dog's tiny graph and moves; the answer try's log-odds of Yes: -3 on Jaws' triple, -0.5 on Spielberg's,
    0.5 on Cincinnati's; after the decided word it writes the answer (the shown triple's tail) or nothing."""

    ODDS = {"(Jaws;": -3.0, "(Steven Spielberg;": -0.5, "(Cincinnati;": 0.5}

    def __init__(self):
        self.scored = []

    def score_options(self, requests, options):
        from test_dog import task

        out = []
        for r, o in zip(requests, options):
            assert r.prefix == "" and list(o) == [" Yes", " No"] and r.role == "answer_try"
            odds = next(v for k, v in self.ODDS.items() if f"Triples: {k}" in task(r.prompt))
            self.scored.append(odds)
            out.append(OptionScores({" Yes": odds, " No": 0.0}, prompt_tokens=1))
        return out

    def generate(self, requests):
        from knowtrace_train.generation.base import Completion
        from test_dog import script, task

        out = []
        for r in requests:
            if r.role == "answer_try":
                assert r.prefix in (" Yes", " No"), f"an answer try generated without a decided word: {r.prefix!r}"
                tail = task(r.prompt).split("Triples: ", 1)[1].split(")")[0].split("; ")[-1]
                text = f"\nAnswer: {tail}" if r.prefix == " Yes" else ""
            else:
                assert r.prefix == ""
                text = script(r.role, r.prompt)
            out.append(Completion(text, len((r.prompt + r.prefix).split()), len(text.split()), "stop"))
        return out

    def count_tokens(self, text):
        return len(text.split())

    def close(self):
        pass


@pytest.mark.parametrize("threshold, said, prediction, stop", [
    (0.0, [False, False, True], "United States", "answered"),  # Yes on the last hop's triple: the whole chain walked
    (-1.0, [False, True], "Cincinnati", "answered"),           # a lower threshold: Yes a hop early (premature)
    (5.0, [False, False, False], "Ohio", "max_hops"),          # above every score: No until max_hops, the fallback
])
def test_dog_s_engine_decides_the_answer_try_by_the_log_odds_and_the_threshold(threshold, said, prediction, stop):
    from knowtrace_train.kg_store import GraphStore
    from knowtrace_train.methods.dog import DoG, DoGConfig
    from knowtrace_train.methods.dog.gold import answer_try_span
    from test_dog import JAWS, TRIPLES

    gen = DecidingDoG()
    [t] = DoG(DoGConfig(max_hops=3, answer_try_threshold=threshold), store=GraphStore(TRIPLES)).run([JAWS], gen)
    tries = [c for c in t.calls if c.role == "answer_try"]
    assert [c.parsed["sufficient"] for c in tries] == said and gen.scored == [-3.0, -0.5, 0.5][: len(said)]
    assert (t.prediction, t.stop_reason) == (prediction, stop)
    for c, hop in zip(tries, t.meta["hops"]):
        word = " Yes" if c.parsed["sufficient"] else " No"
        # nothing fed as a prefix: the decided word is the model's output (trained, counted among its tokens)
        assert c.prefix == "" and c.output.startswith(word) and answer_try_span(c.prefix, c.output)[0] == word.strip()
        assert c.output_tokens == len(c.output.split()) and c.prompt_tokens == len(c.prompt.split())
        assert c.parsed["answer_try_threshold"] == threshold and math.isfinite(c.parsed["answer_try_log_odds"])
        assert hop["answer_try"] == c.parsed


def test_dog_keeps_greedy_decoding_without_a_threshold_and_refuses_a_generator_without_scores():
    from knowtrace_train.methods.dog import DoGConfig
    from test_dog import JAWS, run

    [t], _ = run(DoGConfig(), [JAWS])
    tries = [c for c in t.calls if c.role == "answer_try"]
    assert tries and all("answer_try_log_odds" not in c.parsed and c.output in (" No", " Yes\nAnswer: the answer")
                         for c in tries)
    with pytest.raises(GenerationError, match="score_options") as e:
        run(DoGConfig(answer_try_threshold=0.0), [JAWS])
    assert "\n" not in str(e.value) and "answer_try_threshold" in str(e.value)


def test_a_refused_score_leaves_that_answer_try_to_greedy_decoding():
    from knowtrace_train.kg_store import GraphStore
    from knowtrace_train.methods.dog import DoG, DoGConfig
    from test_dog import DUEL, JAWS, TRIPLES, script

    class Refusing(DecidingDoG):
        def score_options(self, requests, options):
            if any("Duel" in r.prompt for r in requests):
                raise GenerationError("refused")
            return super().score_options(requests, options)

        def generate(self, requests):
            greedy = [r for r in requests if r.role == "answer_try" and r.prefix == ""]
            rest = super().generate([r for r in requests if r not in greedy])
            by = {id(r): c for r, c in zip([r for r in requests if r not in greedy], rest)}
            from knowtrace_train.generation.base import Completion
            for r in greedy:
                text = script(r.role, r.prompt)
                by[id(r)] = Completion(text, 1, len(text.split()), "stop")
            return [by[id(r)] for r in requests]

    jaws, duel = DoG(DoGConfig(max_hops=3, answer_try_threshold=0.0), store=GraphStore(TRIPLES)).run([JAWS, DUEL], Refusing())
    assert all("answer_try_log_odds" in c.parsed for c in jaws.calls if c.role == "answer_try")
    [d] = [c for c in duel.calls if c.role == "answer_try"]
    assert "answer_try_log_odds" not in d.parsed and d.parsed["sufficient"] and duel.stop_reason == "answered"


def test_self_training_with_dog_calibrates_m0_s_answer_try(tmp_path, tiny_model_dir):
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain import SelfTrain, SelfTrainConfig
    from knowtrace_train.selftrain.models import run_model
    from knowtrace_train.trajectory import read_trajectories
    from selftrain_helpers import tiny_overrides

    args = tiny_overrides(tmp_path, tiny_model_dir, iterations=0, eval_base=False, mode="star",
                          **{"strategy.name": "dog", "calibration.questions": 5})
    keep = [a for k, v in zip(args[::2], args[1::2]) if not k.startswith("--strategy.") or k == "--strategy.name"
            for a in (k, v)]  # the tiny overrides' KnowTrace keys are not DoG's
    cfg = load_config(SelfTrainConfig, None, [*keep, "--strategy.max_hops", "2", "--strategy.relation_tokens", "8",
                                              "--strategy.answer_tokens", "6", "--strategy.debate_tokens", "6",
                                              "--strategy.fallback_tokens", "4"])
    run = SelfTrain(cfg, progress=False)

    def make(gen_cfg):  # the dev questions' gold calls are answered (their walks reach an answer try); the tiny
        # model scores the calibration's held-out prompts and writes what follows a decided " No"
        from knowtrace_train.generation import build_generator
        from knowtrace_train.methods.dog.gold import dog_gold_trajectories
        from gold_helpers import GoldOracle

        gold = dog_gold_trajectories(run.config.strategy, run.questions.dev, fewshot=run.config.fewshot_trained)[0]
        return GoldOracle(build_generator(gen_cfg), gold)

    run.make_generator = make
    run.run()
    d = run.run_dir
    cal = json.loads((d / "iter_0" / "calibration.json").read_text())
    a = cal["decisions"]["answer_try"]
    assert cal["questions"] == 5 and a["prompts"] == cal["prompts"] > 0
    assert a["positives"] + a["negatives"] == a["prompts"] and a["positives"] > 0
    if a["threshold"] is None:  # the 5 questions' walks said Yes only (each a single hop): nothing to tell apart
        assert a["negatives"] == 0
        return
    # M0's evaluation decided every answer try by that threshold
    tries = [c for t in read_trajectories(d / "iter_0" / "eval.jsonl") for c in t.calls if c.role == "answer_try" and c.parsed]
    assert tries and all(c.parsed["answer_try_threshold"] == a["threshold"] for c in tries)
    assert run_model(d, 0).strategy.answer_try_threshold == a["threshold"]
