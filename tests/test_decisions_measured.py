"""Each method's decisions measured (scripts/lab/decisions.py): the held-out gold prompts of TRACE's selector stop,
MINTQA-dynamic's certainty and Self-Ask's two decisions, each on a hand-built item; the figures on a scripted
scorer; the calibration left to the decisions an engine takes by threshold; and the script on a tiny run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "lab"))  # the lab's helper modules

from decision_figures import choice_figures, decision_figures, label_figures  # noqa: E402
from knowtrace_train.decisions import DecisionPrompt, option_log_odds, score_decisions
from knowtrace_train.generation.base import OptionScores
from knowtrace_train.methods import get_method

from gold_helpers import ITEM, Mapped, words


def test_a_decision_among_several_options_is_the_first_against_the_best_of_the_others():
    s = OptionScores({"A": -1.0, "B": -2.0, "C": -0.5, "D": None}, prompt_tokens=1)
    assert option_log_odds(s, ("A", "B", "C", "D")) == pytest.approx(-0.5)
    assert option_log_odds(s, ("A", "B")) == pytest.approx(1.0)  # two options: the log-odds, as before
    assert option_log_odds(OptionScores({"A": None, "B": -1.0}, 1), ("A", "B", "C")) == -math.inf
    assert option_log_odds(OptionScores({"A": -1.0, "B": None}, 1), ("A", "B")) == math.inf
    assert math.isnan(option_log_odds(OptionScores({"A": None, "B": None}, 1), ("A", "B")))


# -- each method's held-out gold prompts ---------------------------------------------------------------------


def test_trace_s_selector_prompts_stop_where_the_gold_chain_ends_and_name_the_gold_triple_before():
    from knowtrace_train.methods.trace import TraceConfig
    from knowtrace_train.methods.trace.gold import SELECTOR_STOP, selector_prompts
    from knowtrace_train.methods.trace.prompts import render_triple
    from test_gold_trace import HITS, OTHER, T1, T2, T3, toy_encoder

    prompts = selector_prompts(TraceConfig(documents=4), [ITEM, OTHER], Mapped(HITS), encoder=toy_encoder)
    # ITEM: its two triples in order, then A (the chain complete); OTHER: its one triple, then A
    assert [(p.item_id, p.label) for p in prompts] == [("w2", False), ("w2", False), ("w2", True), ("w3", False),
                                                       ("w3", True)]
    gold = {0: T1, 1: T2, 3: T3}
    for i, p in enumerate(prompts):
        assert (p.kind, p.prefix, p.role, p.options[0]) == (SELECTOR_STOP, "", "select", "A")
        assert list(p.options) == [chr(ord("A") + j) for j in range(len(p.options))] and len(p.options) >= 2
        if p.label:
            assert p.choice is None and render_triple(gold[i - 1]) in p.prompt.split("Options:")[0]
        else:  # the choice is the letter the prompt shows the gold triple under
            assert f"\n{p.choice}. {render_triple(gold[i])}\n" in p.prompt
    # the method needs the retriever (the documents); no chains, nothing to decide
    m = get_method("trace")
    with pytest.raises(ValueError, match="retriever"):
        m.decision_prompts(TraceConfig(), [ITEM])
    assert m.decision_prompts(TraceConfig(reader="no_docs"), [ITEM], retriever=Mapped(HITS)) == []
    assert m.threshold_decisions(TraceConfig()) == frozenset()


def test_mintqa_dynamic_s_certainty_prompts_feed_the_raw_model_s_answer_and_label_it_by_whether_it_is_right():
    from knowtrace_train.methods.mintqa import MintQADecomposeConfig, MintQADynamicConfig
    import knowtrace_train.methods.mintqa.prompts as prompts
    from test_gold_mintqa import S1, S2, RawModel

    raw = RawModel({S1: " odile farrant\nConfidence: uncertain", S2: " Paris\nConfidence: certain"})
    m = get_method("mintqa_dynamic")
    out = m.decision_prompts(MintQADynamicConfig(passages=2, fewshot=False), [ITEM], make_generator=lambda: raw)
    # hop 1 answered right (whatever the model's own rating): certain; hop 2 wrong: uncertain
    assert [(p.prompt, p.prefix, p.label) for p in out] == [
        (prompts.selfanswer_prompt(S1, False), " odile farrant\nConfidence:", True),
        (prompts.selfanswer_prompt(S2, False), " Paris\nConfidence:", False)]
    assert all((p.kind, p.role, p.options) == ("certainty", "selfanswer", (" certain", " uncertain")) for p in out)
    # measured with the raw base's exemplars, once, and closed
    assert [r.prompt for r in raw.batches[0]] == [prompts.selfanswer_prompt(S1, True), prompts.selfanswer_prompt(S2, True)]
    assert raw.closed == 1
    with pytest.raises(ValueError, match="raw base"):
        m.decision_prompts(MintQADynamicConfig(), [ITEM])
    assert get_method("mintqa_decompose").decision_prompts(MintQADecomposeConfig(), [ITEM]) == []


def test_self_ask_s_prompts_ask_whether_follow_ups_are_needed_and_after_each_answer_whether_the_final_one_comes():
    from knowtrace_train.methods.baselines import self_ask
    from knowtrace_train.methods.baselines.config import SelfAskConfig
    from test_gold_baselines import HITS

    m = get_method("self_ask")
    out = m.decision_prompts(SelfAskConfig(passages=2, fewshot=False), [ITEM], retriever=Mapped(HITS))
    assert [(p.kind, p.options, p.label) for p in out] == [
        ("follow_up_needed", (" Yes", " No"), True), ("final_answer", ("So", "Follow"), False),
        ("final_answer", ("So", "Follow"), True)]
    assert all(p.prompt == self_ask.prompt(False) and p.role == "reason" for p in out)
    assert out[0].prefix == f"Question: {ITEM.question}\n{self_ask.NEEDED}"
    # each later prompt: the transcript so far, then the gold intermediate answer and its line's end
    assert out[1].prefix.endswith("Intermediate answer: Odile Farrant.\n") and "Follow up: Who founded Zentor?" in out[1].prefix
    assert out[2].prefix.endswith("Intermediate answer: Castelbrun.\n") and out[2].prefix.startswith(out[1].prefix)
    with pytest.raises(ValueError, match="retriever"):
        m.decision_prompts(SelfAskConfig(), [ITEM])



def test_ircot_s_stop_is_read_from_what_the_model_writes_as_its_loop_reads_it():
    from knowtrace_train.decisions import score_prompts
    from knowtrace_train.generation.base import Completion, GenerationError
    from knowtrace_train.methods.baselines.common import COT_STOP
    from knowtrace_train.methods.baselines.config import IRCoTConfig
    from knowtrace_train.methods.baselines.gold import IRCOT_STOP, ircot_says_answer
    from test_gold_baselines import HITS

    out = get_method("ircot").decision_prompts(IRCoTConfig(passages=2, fewshot=False, max_new_tokens=12), [ITEM],
                                               retriever=Mapped(HITS))
    # ITEM's two hops: a sentence per hop (go on), then "So the answer is" (stop); each fed the gold chain so far
    assert [(p.kind, p.label) for p in out] == [(IRCOT_STOP, False), (IRCOT_STOP, False), (IRCOT_STOP, True)]
    assert [p.prefix.count(".") for p in out] == [0, 1, 2] and all(p.prefix.startswith("Answer:") for p in out)
    assert all((p.max_new_tokens, p.stop, p.role) == (12, COT_STOP, "reason") for p in out)
    assert ircot_says_answer(" So the answer is: Castelbrun. Then more.") and not ircot_says_answer(" Zentor was founded.")
    assert not ircot_says_answer(" Zentor was founded. So the answer is X.")  # only the first sentence counts

    class Writer:  # writes the answer sentence on the second prompt only; refuses the third
        def __init__(self):
            self.requests = []

        def generate(self, requests):
            self.requests += list(requests)
            if len(requests) > 1:
                raise GenerationError("one at a time")
            r = requests[0]
            if r.prefix == out[2].prefix:
                raise GenerationError("refused")
            text = " So the answer is: Odile." if r.prefix == out[1].prefix else " Zentor was founded by Odile."
            return [Completion(text, 5, 3, "stop")]

    w = Writer()
    scores = score_prompts(w, out)
    assert [option_log_odds(s, p.options) for s, p in zip(scores[:2], out)] == [-math.inf, math.inf]
    assert isinstance(scores[2], Exception)  # refused: unscored, in its place
    assert all((r.max_new_tokens, r.stop) == (12, COT_STOP) for r in w.requests)
    f = decision_figures(out, scores)[IRCOT_STOP]
    assert (f["gold_positive"], f["gold_negative"], f["greedy"]["unscored"]) == (1, 2, 1)
    assert f["greedy"]["confusion"] == {"gold_pos_said_pos": 0, "gold_pos_said_neg": 0, "gold_neg_said_pos": 1,
                                        "gold_neg_said_neg": 1}


def test_only_the_decisions_an_engine_takes_by_threshold_are_calibrated():
    from knowtrace_train.methods.baselines.config import SelfAskConfig
    from knowtrace_train.methods.dog import DoGConfig
    from knowtrace_train.methods.knowtrace import KnowTraceConfig

    assert get_method("knowtrace").threshold_decisions(KnowTraceConfig()) == {"sufficiency"}
    assert get_method("knowtrace").threshold_decisions(KnowTraceConfig(prefill_judgement=False)) == frozenset()
    assert get_method("dog").threshold_decisions(DoGConfig()) == {"answer_try"}
    assert get_method("dog").threshold_decisions(DoGConfig(max_hops=0)) == frozenset()
    assert get_method("self_ask").threshold_decisions(SelfAskConfig()) == frozenset()


# -- the figures ---------------------------------------------------------------------------------------------


def test_label_figures_count_each_label_s_recall_at_the_greedy_point_and_at_a_threshold():
    labels = [True] * 4 + [False] * 6
    odds = [2.0, 1.0, -0.5, math.nan, -1.0, -2.0, 0.5, -3.0, -0.1, -0.2]
    f = label_figures(labels, odds)
    assert (f["prompts"], f["unscored"]) == (10, 1)
    assert f["recall_positive"]["mean"] == pytest.approx(2 / 3) and f["recall_positive"]["n"] == 3
    assert f["recall_negative"]["mean"] == pytest.approx(5 / 6) and f["accuracy"]["mean"] == pytest.approx(7 / 9)
    assert f["balanced_accuracy"]["mean"] == pytest.approx((2 / 3 + 5 / 6) / 2)
    assert f["confusion"] == {"gold_pos_said_pos": 2, "gold_pos_said_neg": 1, "gold_neg_said_pos": 1,
                              "gold_neg_said_neg": 5}
    assert f["p_positive_when_gold_positive"]["mean"] == pytest.approx(
        sum(1 / (1 + math.exp(-d)) for d in (2.0, 1.0, -0.5)) / 3)
    t = label_figures(labels, odds, threshold=-0.6)
    assert t["recall_positive"]["mean"] == 1.0 and t["recall_negative"]["mean"] == pytest.approx(3 / 6)
    # a label with no prompt: no balanced accuracy; enough of each: an interval around it
    assert label_figures([True, True], [1.0, -1.0])["balanced_accuracy"]["mean"] is None
    many = label_figures([True] * 20 + [False] * 20, [1.0] * 15 + [-1.0] * 5 + [-1.0] * 18 + [1.0] * 2)
    b = many["balanced_accuracy"]
    assert b["mean"] == pytest.approx((0.75 + 0.9) / 2) and b["low"] < b["mean"] < b["high"]


def test_the_gold_triple_s_rank_among_the_candidates_and_the_per_kind_figures():
    def prompt(label, choice=None, options=("A", "B", "C", "D")):
        return DecisionPrompt("selector_stop", "p", "", "select", options, label, "q", None, choice)

    prompts = [prompt(False, "C"), prompt(False, "B"), prompt(False, "D"), prompt(True)]
    scores = [OptionScores({"A": -3.0, "B": -1.0, "C": -0.5, "D": -2.0}, 1),  # C first of the triples, best of all
              OptionScores({"A": -0.1, "B": -1.0, "C": -1.0, "D": -2.0}, 1),  # B first (the tie to the earlier), A best
              OptionScores({"A": -3.0, "B": -1.0, "C": -1.0, "D": None}, 1),  # D unreported: last
              OptionScores({"A": -0.2, "B": -1.0, "C": -3.0, "D": -2.0}, 1)]
    c = choice_figures(prompts, scores)
    assert (c["prompts"], c["scored"]) == (3, 3)
    assert c["rank"]["mean"] == pytest.approx((1 + 1 + 3) / 3) and c["top1"]["mean"] == pytest.approx(2 / 3)
    assert c["best_of_all"]["mean"] == pytest.approx(1 / 3) and c["options"]["mean"] == 3.0
    f = decision_figures(prompts, scores, {"selector_stop": 0.95, "other": 1.0})["selector_stop"]
    assert (f["positive"], f["negative"], f["prompts"], f["gold_positive"], f["gold_negative"]) == (
        "A", "the best other option", 4, 1, 3)
    # greedy: A said on prompts 2 and 4 (the best option there, log-odds 0.9 and 0.8); at 0.95 on none
    assert f["greedy"]["confusion"] == {"gold_pos_said_pos": 1, "gold_pos_said_neg": 0, "gold_neg_said_pos": 1,
                                        "gold_neg_said_neg": 2}
    assert f["calibrated"]["threshold"] == 0.95 and f["calibrated"]["recall_negative"]["mean"] == 1.0
    assert f["calibrated"]["recall_positive"]["mean"] == 0.0 and "calibrated" not in decision_figures(prompts, scores)["selector_stop"]
    assert f["choice"] == c
    assert choice_figures([prompt(True)], scores[:1]) is None


def test_score_decisions_scores_each_prompt_after_its_prefix_among_all_its_options():
    seen = []

    class Scorer:
        def score_options(self, requests, options):
            seen.extend(zip(requests, options))
            return [OptionScores({o: -float(i) for i, o in enumerate(opts)}, 1) for opts in options]

    prompts = [DecisionPrompt("final_answer", "p", "pre\n", "reason", ("So", "Follow"), True),
               DecisionPrompt("selector_stop", "q", "", "select", ("A", "B", "C"), False, choice="C")]
    assert score_decisions(Scorer(), prompts) == [1.0, 1.0]
    assert [(r.prompt, r.prefix, r.role, o) for r, o in seen] == [("p", "pre\n", "reason", ["So", "Follow"]),
                                                                  ("q", "", "select", ["A", "B", "C"])]


# -- the script on a tiny run --------------------------------------------------------------------------------


def test_the_script_measures_the_raw_base_and_m0_of_a_self_ask_run(tmp_path, tiny_model_dir, capsys):
    """A tiny Self-Ask run (its bootstrap trains M0 on gold records); the script scores the held-out gold prompts of
    its dev questions with the raw base and M0, each as the loop would run it: the figures are the ones computed
    here from the same prompts and the same models."""
    import importlib.util

    from knowtrace_train.config import load_config
    from knowtrace_train.decisions import score_prompts
    from knowtrace_train.generation import build_generator
    from knowtrace_train.selftrain import SelfTrain, SelfTrainConfig
    from knowtrace_train.selftrain.models import run_model
    from selftrain_helpers import REPO, tiny_overrides

    args = tiny_overrides(tmp_path, tiny_model_dir, iterations=0, eval_base=False, mode="star",
                          **{"strategy.name": "self_ask", "data.dev_questions": 3})
    keep = [a for k, v in zip(args[::2], args[1::2]) if not k.startswith("--strategy.") or k == "--strategy.name"
            for a in (k, v)]
    cfg = load_config(SelfTrainConfig, None, [*keep, "--strategy.max_new_tokens", "6", "--strategy.answer_tokens", "4",
                                              "--strategy.passages", "2"])
    run = SelfTrain(cfg, progress=False)
    run.run()
    d = run.run_dir
    assert json.loads((d / "m0.json").read_text())["bootstrapped"]
    assert not (d / "iter_0" / "calibration.json").exists()  # Self-Ask decides nothing by threshold

    spec = importlib.util.spec_from_file_location("decisions_script", REPO / "scripts" / "lab" / "decisions.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(d), "--base", "--json", str(tmp_path / "d.json")]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    out = json.loads(printed[-1])
    assert out == json.loads((tmp_path / "d.json").read_text())
    assert out["method"] == "self_ask" and out["questions"] == 3 and list(out["models"]) == ["base", "M0"]
    for name, which in (("base", "base"), ("M0", "0")):
        rm = run_model(d, which)
        strategy = get_method("self_ask").for_model(cfg.strategy, rm.state.trained, cfg.fewshot_trained)
        prompts = get_method("self_ask").decision_prompts(strategy, run.questions.dev, retriever=run.retriever)
        gen = build_generator(rm.generator)
        try:
            want = decision_figures(prompts, score_prompts(gen, prompts))
        finally:
            gen.close()
        assert out["models"][name]["decisions"] == json.loads(json.dumps(want))
        assert set(want) <= {"follow_up_needed", "final_answer"} and want
        assert sum(f["prompts"] for f in want.values()) == len(prompts)
        # M0 runs its prompts without exemplars (trained without them), the base with them
        assert prompts and all(("Tessa Marrow" in p.prompt) == (name == "base") for p in prompts)
        assert any(line.startswith(f"{d} {name} final_answer") for line in printed)
    # the table of the written figures: a row per kind and model (the raw base once), greedy (none calibrated)
    assert script.main(["--table", str(tmp_path / "d.json"), str(tmp_path / "d.json")]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    kinds = out["models"]["M0"]["decisions"]
    assert len(rows) == 3 * len(kinds) and sum("| raw base | greedy |" in r for r in rows) == len(kinds)
    f = kinds["final_answer"]["greedy"]["accuracy"]
    assert any("`final_answer`" in r and "M0 (run)" in r and f"| {f['mean']:.2f}" in r for r in rows)
