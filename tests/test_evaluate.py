"""Evaluation: trajectories appended as they finish, resume after a kill, the summary, the recipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from knowtrace_train.evaluate import EvalConfig, evaluate, load_eval_config, summarize
from knowtrace_train.io import DataFileError, write_jsonl
from knowtrace_train.trajectory import read_trajectories

from test_knowtrace import FACTS, QUESTIONS, WORLD, ScriptedGenerator, WordRetriever, chain_model

REPO = Path(__file__).resolve().parents[1]


def dataset(tmp_path: Path) -> Path:
    rows = [
        {"id": f"q{i}", "question": q, "answers": [a], "context": [p.to_dict() for p in WORLD]}
        for i, (q, (_, a)) in enumerate(QUESTIONS.items())
    ]
    rows.append({"id": "q3", "question": "Where was the author of Alpha born?", "answers": ["Somewhere"], "context": []})
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
    assert set(s.headline()) == {"em", "f1", "rounds", "retrieved_tokens", "sec_per_question", "questions"}


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
    assert s.headline() == {"em": 0.0, "f1": 0.0, "rounds": 0.0, "retrieved_tokens": 0.0, "sec_per_question": 0.0, "questions": 0}


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
    assert last["questions"] == 2 and set(last) == {"em", "f1", "rounds", "retrieved_tokens", "sec_per_question", "questions"}
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
