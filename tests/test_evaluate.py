"""Evaluation: trajectories appended as they finish, resume after a kill, the summary, the recipe."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from knowtrace_train.evaluate import (
    EvalConfig,
    evaluate,
    evidence_check,
    format_summary,
    load_eval_config,
    summarize,
)
from knowtrace_train.io import DataFileError, write_jsonl
from knowtrace_train.methods import Method
from knowtrace_train.methods.knowtrace import KnowTraceConfig, KnowTraceMethod
from knowtrace_train.metrics import bootstrap_interval, em_by_kind, paired_test
from knowtrace_train.pairing import compare_evals, compare_scores, read_question_scores
from knowtrace_train.trajectory import Trajectory, read_trajectories

from backtrace_fixtures import ANSWER, PAIR_SCHOOL, PAIR_WHERE, QUESTION, T_EDUCATED, T_LOCATED, Engine, appendix_f
from test_knowtrace import QUESTIONS, WORLD, ScriptedGenerator, WordRetriever, chain_model

HEADLINE_KEYS = {"em", "f1", "em_interval", "f1_interval", "interval_note", "em_by_kind", "evidence_supported_em",
                 "rounds", "retrieved_tokens", "sec_per_question", "questions"}

REPO = Path(__file__).resolve().parents[1]


def dataset(tmp_path: Path) -> Path:
    rows = [
        {"id": f"q{i}", "question": q, "answers": [a], "type": "bridge", "context": [p.to_dict() for p in WORLD]}
        for i, (q, (_, a)) in enumerate(QUESTIONS.items())
    ]
    rows.append({"id": "q3", "question": "Where was the author of Alpha born?", "answers": ["Somewhere"],
                 "type": "comparison", "context": []})
    path = tmp_path / "dev.jsonl"
    write_jsonl(path, rows)
    return path


def config(tmp_path: Path, *extra: str) -> EvalConfig:
    return load_eval_config(
        None,
        ["--dataset.path", str(dataset(tmp_path)), "--corpus.source", "contexts", "--output", str(tmp_path / "out.jsonl"), *extra],
    )


def test_evaluate_writes_scored_trajectories_and_summary(tmp_path):
    gen = ScriptedGenerator(chain_model)
    s = evaluate(config(tmp_path), generator=gen, retriever=WordRetriever(WORLD), progress=False)
    trajs = read_trajectories(tmp_path / "out.jsonl")
    assert sorted(t.id for t in trajs) == ["q0", "q1", "q2", "q3"]
    by_id = {t.id: t for t in trajs}
    assert by_id["q0"].prediction == "Corla" and by_id["q0"].em == 1.0 and by_id["q3"].em == 0.0
    assert (s.questions, s.new) == (4, 4)
    assert s.em == pytest.approx(0.75) and s.f1 == pytest.approx(0.75)
    assert s.rounds == pytest.approx((3 + 3 + 2 + 3) / 4)
    assert s.retrieved_tokens == pytest.approx(sum(t.retrieved_tokens for t in trajs) / 4) and s.retrieved_tokens > 0
    assert s.sec_per_question > 0
    assert s.stop_reasons == {"answered": 4}
    assert set(s.headline()) == HEADLINE_KEYS
    # four questions: the means, no interval; the kinds come from the items' types
    assert s.em_interval.mean == pytest.approx(0.75) and s.em_interval.low is None and s.em_interval.note
    assert {k: (iv.n, iv.mean) for k, iv in s.by_kind.items()} == {"bridge": (3, 1.0), "comparison": (1, 0.0)}
    # KnowTrace can tell: each right answer of the scripted chains is traced in its own graph
    assert s.evidence_supported == sum(KnowTraceMethod().evidence_supported(t, KnowTraceConfig()) for t in trajs)
    assert s.evidence_supported_em == pytest.approx(s.evidence_supported / 4)


def test_limit_and_resume_skip_finished_questions(tmp_path):
    cfg = config(tmp_path, "--limit", "2")
    gen = ScriptedGenerator(chain_model)
    first = evaluate(cfg, generator=gen, retriever=WordRetriever(WORLD), progress=False)
    assert (first.questions, first.new) == (2, 2)
    calls = len(gen.batches)
    again = evaluate(cfg, generator=gen, retriever=WordRetriever(WORLD), progress=False)
    assert (again.questions, again.new) == (2, 0) and len(gen.batches) == calls  # nothing rerun
    assert again.em == first.em
    more = evaluate(config(tmp_path), generator=gen, retriever=WordRetriever(WORLD), progress=False)
    assert (more.questions, more.new) == (4, 2)
    assert sorted(t.id for t in read_trajectories(tmp_path / "out.jsonl")) == ["q0", "q1", "q2", "q3"]


def test_interrupt_loses_no_finished_question(tmp_path):
    """A kill in the middle of a run: what finished is on disk, a rerun does only the rest."""
    cfg = config(tmp_path)
    seen = []

    def boom(t):
        seen.append(t.id)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate(cfg, generator=ScriptedGenerator(chain_model), retriever=WordRetriever(WORLD), progress=False, on_done=boom)
    assert [t.id for t in read_trajectories(tmp_path / "out.jsonl")] == seen
    s = evaluate(cfg, generator=ScriptedGenerator(chain_model), retriever=WordRetriever(WORLD), progress=False)
    assert (s.questions, s.new) == (4, 2)


def test_truncated_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    cfg = config(tmp_path, "--limit", "2")
    evaluate(cfg, generator=ScriptedGenerator(chain_model), retriever=WordRetriever(WORLD), progress=False)
    out = tmp_path / "out.jsonl"
    lines = out.read_text().splitlines()
    out.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed mid-write
    assert [t.id for t in read_trajectories(out)] == [json.loads(lines[0])["id"]]
    assert "truncated last line" in caplog.text
    assert out.read_text() == lines[0] + "\n"  # cut, so the next append starts a fresh line
    s = evaluate(cfg, generator=ScriptedGenerator(chain_model), retriever=WordRetriever(WORLD), progress=False)
    assert (s.questions, s.new) == (2, 1)
    assert len(read_trajectories(out)) == 2


def test_bad_line_in_the_middle_is_an_error(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "x"\n{"also": "bad"}\n')
    with pytest.raises(DataFileError, match=r"out\.jsonl:1"):
        read_trajectories(out)


def test_summary_of_nothing_is_zero():
    s = summarize([])
    assert s.headline() == {"em": 0.0, "f1": 0.0, "em_interval": None, "f1_interval": None, "interval_note": None,
                            "em_by_kind": None, "evidence_supported_em": None, "rounds": 0.0,
                            "retrieved_tokens": 0.0, "sec_per_question": 0.0, "questions": 0}
    assert summarize([], kinds=[]).by_kind == {}


# -- intervals, kinds, evidence support -------------------------------------------------------------


def _scored(i: int, prediction: str | None, answer: str = "Paris") -> Trajectory:
    return Trajectory(id=f"q{i}", question_id=f"q{i}", question=f"Question {i}?", answers=[answer],
                      dataset="world", strategy="knowtrace", prediction=prediction, stop_reason="answered", rounds=1)


def _dev(n: int) -> tuple[list[Trajectory], list[str]]:
    """n questions, every fourth a comparison (i % 4 == 3); bridge questions right when i % 3 == 0,
    comparisons when i % 8 == 3 (half of them, a guess's rate); a wrong prediction at every fifth
    question is half right ("Paris France": F1 2/3, EM 0)."""
    trajs, kinds = [], []
    for i in range(n):
        kind = "comparison" if i % 4 == 3 else "bridge"
        right = i % 8 == 3 if kind == "comparison" else i % 3 == 0
        trajs.append(_scored(i, "Paris" if right else ("Paris France" if i % 5 == 0 else "Lyon")))
        kinds.append(kind)
    return trajs, kinds


def test_summary_gives_the_bootstrap_interval_and_the_kind_split():
    trajs, kinds = _dev(32)
    em = [1.0 if t.prediction == "Paris" else 0.0 for t in trajs]
    f1 = [1.0 if t.prediction == "Paris" else (2 / 3 if t.prediction == "Paris France" else 0.0) for t in trajs]
    s = summarize(trajs, kinds=kinds)
    assert s.em == pytest.approx(12 / 32) and s.f1 == pytest.approx(sum(f1) / 32)
    assert s.em_interval == bootstrap_interval(em) and s.f1_interval == bootstrap_interval(f1)
    assert s.em_interval.low < s.em < s.em_interval.high
    # 24 bridge questions, right at i = 0, 6, 9, 12, 18, 21, 24, 30 (i % 3 == 0, i % 4 != 3);
    # 8 comparisons (i = 3, 7, ..., 31), right at 3, 11, 19, 27
    assert {k: (iv.n, iv.mean) for k, iv in s.by_kind.items()} == {"bridge": (24, 8 / 24), "comparison": (8, 0.5)}
    assert s.by_kind == em_by_kind(em, kinds)
    assert summarize(trajs, kinds=kinds, seed=3).em_interval == bootstrap_interval(em, seed=3)
    # the JSON figures and the last line
    fig = json.loads(json.dumps(s.figures()))
    assert fig["em_interval"]["low"] == s.em_interval.low and fig["em_interval"]["n"] == 32
    assert fig["by_kind"]["bridge"] == {"n": 24, "em": 8 / 24, "interval": {
        "mean": 8 / 24, "low": s.by_kind["bridge"].low, "high": s.by_kind["bridge"].high, "n": 24,
        "confidence": 0.95, "note": None}}
    assert s.by_kind["bridge"].low is not None
    assert fig["by_kind"]["comparison"]["interval"]["low"] is None  # 8 comparisons: too few
    line = s.headline()
    assert line["em_interval"] == [round(s.em_interval.low, 4), round(s.em_interval.high, 4)]
    assert line["interval_note"] is None and line["em_by_kind"]["comparison"] == {"n": 8, "em": 0.5, "em_interval": None}
    assert line["em_by_kind"]["bridge"]["em_interval"] == [round(s.by_kind["bridge"].low, 4), round(s.by_kind["bridge"].high, 4)]
    text = format_summary(s)
    assert f"EM                 {s.em:.4f} [{s.em_interval.low:.4f}, {s.em_interval.high:.4f}] (n=32, 95% bootstrap)" in text
    assert "EM bridge" in text and "EM comparison" in text and "a guess scores about 0.5" in text
    assert "too few" not in text.splitlines()[1]


def test_a_dev_set_of_12_questions_gives_no_interval_and_says_so():
    trajs, kinds = _dev(12)
    s = summarize(trajs, kinds=kinds)
    assert s.em_interval.low is None and s.f1_interval.high is None and s.em_interval.n == 12
    line = s.headline()
    assert line["em_interval"] is None and line["f1_interval"] is None and "too few" in line["interval_note"]
    em_line = next(x for x in format_summary(s).splitlines() if x.startswith("EM "))
    assert em_line == f"EM                 {s.em:.4f} (n=12: too few questions for an interval, under 20)"


def _traced_but_unconnected() -> Trajectory:
    """Right answer, in the graph, but on no path back to the initial entity (the pair it came from
    was never explored)."""
    from knowtrace_train.kg import TracedTriplet

    e = Engine(QUESTION)
    e.explore(1, [PAIR_WHERE])
    e.complete(1, PAIR_WHERE, [T_LOCATED])
    e.complete(1, PAIR_WHERE, [T_EDUCATED])
    e.graph.triplets[1] = TracedTriplet(T_EDUCATED, 1, PAIR_SCHOOL, 2)
    e.answer(2, "So University of Glasgow.", ANSWER)
    return e.trajectory(tid="t2", prediction=ANSWER, thought="So University of Glasgow.")


def test_evidence_supported_em_counts_right_answers_the_own_graph_backs():
    cfg = KnowTraceConfig()
    method = KnowTraceMethod()
    traced = appendix_f()
    unconnected = _traced_but_unconnected()
    wrong = appendix_f()
    wrong.id = wrong.question_id = "t3"
    wrong.prediction, wrong.em = "Oxford", 0.0
    assert method.evidence_supported(traced, cfg) is True
    assert method.evidence_supported(unconnected, cfg) is False  # right, but a guess as far as the graph goes
    assert method.evidence_supported(wrong, cfg) is False
    for rule in ("backward", "shortest"):
        assert method.evidence_supported(traced, KnowTraceConfig(path_rule=rule))
    s = summarize([traced, unconnected, wrong], evidence=evidence_check(cfg))
    assert s.em == pytest.approx(2 / 3)
    assert s.evidence_supported == 1 and s.evidence_supported_em == pytest.approx(1 / 3)
    assert "0.3333 (1 of 3 questions answered right" in format_summary(s) and "2 answered right" in format_summary(s)
    # a method that cannot tell (the default hook) gives no figure, and the printout says so
    s = summarize([traced, unconnected], evidence=lambda t: Method().evidence_supported(t, cfg))
    assert s.evidence_supported is None and s.evidence_supported_em is None
    assert "cannot tell" in format_summary(s)


# -- paired comparisons from trajectory files --------------------------------------------------------


def _write_scored(path: Path, trajs: list[Trajectory]) -> Path:
    for t in trajs:
        sc = 1.0 if t.prediction == t.answers[0] else 0.0
        t.em, t.f1 = sc, sc
    write_jsonl(path, [t.to_dict() for t in trajs])
    return path


def test_compare_evals_is_the_paired_test_of_the_two_files(tmp_path):
    a_trajs, _ = _dev(24)
    b_trajs = [_scored(i, "Paris" if i % 2 == 0 else "Lyon") for i in range(24)]
    a = _write_scored(tmp_path / "a.jsonl", a_trajs)
    b = _write_scored(tmp_path / "b.jsonl", b_trajs)
    cmp = compare_evals(a, b, seed=5)
    em_a, em_b = [t.em for t in a_trajs], [t.em for t in b_trajs]
    assert cmp["n"] == 24
    import dataclasses

    assert cmp["em"] == dataclasses.asdict(paired_test(em_a, em_b, seed=5)) and cmp["em"]["test"] == "mcnemar"
    assert cmp["em"]["diff"] == pytest.approx(sum(em_b) / 24 - sum(em_a) / 24)
    # an unscored trajectory is scored from its prediction
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    rows[0]["em"] = rows[0]["f1"] = None
    write_jsonl(tmp_path / "a2.jsonl", rows)
    assert read_question_scores(tmp_path / "a2.jsonl").em == em_a


def test_files_of_the_same_questions_pair_by_id_and_others_are_refused(tmp_path):
    trajs, _ = _dev(24)
    a = read_question_scores(_write_scored(tmp_path / "a.jsonl", trajs))
    shuffled = read_question_scores(_write_scored(tmp_path / "b.jsonl", trajs[1:] + trajs[:1]))
    # the same questions in another order: matched by id, so a file paired with itself reordered differs by nothing
    same = compare_scores(a, shuffled)
    assert same["n"] == 24 and same["em"]["diff"] == 0 and same["only_a"] == same["only_b"] == 0
    assert trajs[0].prediction == "Paris"  # q0 is right in a; wrong in d, whose questions come in reverse order
    wrong_q0 = [dataclasses.replace(trajs[0], prediction="Lyon"), *trajs[1:]]
    diff = compare_scores(a, read_question_scores(_write_scored(tmp_path / "d.jsonl", wrong_q0[::-1])))
    assert (diff["only_a"], diff["only_b"]) == (1, 0) and diff["em"]["diff"] == pytest.approx(-1 / 24)
    twice = read_question_scores(_write_scored(tmp_path / "e.jsonl", trajs + trajs[:1]))
    with pytest.raises(ValueError, match="appear more than once"):
        compare_scores(a, twice)
    other = read_question_scores(_write_scored(tmp_path / "c.jsonl", trajs[:-1] + [_scored(99, "Paris")]))
    with pytest.raises(ValueError, match=r"other questions \(2 ids"):
        compare_scores(a, other)
    (tmp_path / "bad.jsonl").write_text('{"question_id": "q0", "em": 1.0, "f1": 1.0}\n{"em": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        read_question_scores(tmp_path / "bad.jsonl")


@pytest.mark.parametrize("name", ["world", "hotpotqa", "2wiki", "musique"])
def test_shipped_configs_load(name):
    cfg = load_eval_config(REPO / "recipes" / "configs" / f"eval_{name}.yaml", ["--limit", "3"])
    assert isinstance(cfg, EvalConfig) and cfg.generator.prompt_format == "plain"
    assert cfg.dataset.limit == 3 and cfg.strategy.max_rounds == 5 and cfg.output


def test_recipe_end_to_end_on_a_tiny_model(tmp_path, tiny_model_dir):
    """The real generator and BM25 over a random 2-layer model: garbage text, a run that finishes,
    a JSONL of trajectories, the JSON last line, and a rerun that skips everything."""
    data = dataset(tmp_path)
    out = tmp_path / "tiny.jsonl"
    cmd = [
        sys.executable, str(REPO / "recipes" / "evaluate.py"), "--config", str(REPO / "recipes" / "configs" / "eval_world.yaml"),
        "--dataset.path", str(data), "--corpus.source", "contexts", "--limit", "2", "--output", str(out),
        "--generator.model", str(tiny_model_dir), "--generator.progress", "false", "--retriever.cache_dir", "null",
        "--strategy.max_rounds", "2", "--strategy.passages", "2",
        "--strategy.max_new_tokens.explore", "24", "--strategy.max_new_tokens.complete", "16",
        "--strategy.max_new_tokens.answer", "8", "--quiet",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["questions"] == 2 and set(last) == HEADLINE_KEYS
    assert last["em_interval"] is None and "too few" in last["interval_note"]  # 2 questions
    assert "too few questions for an interval" in r.stdout and "EM bridge" in r.stdout
    trajs = read_trajectories(out)
    assert len(trajs) == 2 and all(t.calls and t.stop_reason for t in trajs)
    assert all(c.prompt_tokens > 0 for t in trajs for c in t.calls)
    r2 = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r2.returncode == 0 and "(0 run now)" in r2.stdout
    assert len(read_trajectories(out)) == 2


def test_recipe_reports_config_errors(tmp_path):
    r = subprocess.run(
        [sys.executable, str(REPO / "recipes" / "evaluate.py"), "--config", str(REPO / "recipes" / "configs" / "eval_world.yaml"), "--strategy.max_round", "3"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert r.returncode == 2 and "unknown key 'strategy.max_round'" in r.stderr and "did you mean 'strategy.max_rounds'" in r.stderr
