"""Pipelined, resumable rollouts (knowtrace_train.selftrain.rollout) on scripted outputs: no model needed."""

from __future__ import annotations

import json
import re

import pytest

from knowtrace_train.data.schema import QAItem
from knowtrace_train.selftrain.rollout import pass_at_samples, parts_dir, run_rollouts, sample_seed
from knowtrace_train.stages import StageRunner, is_done, read_done
from knowtrace_train.methods.knowtrace import KnowTraceConfig

from test_knowtrace import QUESTIONS, WORLD, ScriptedGenerator, WordRetriever, chain_model


def items() -> list[QAItem]:
    out = [QAItem(id=f"q{i}", question=q, answers=[a]) for i, (q, (_, a)) in enumerate(QUESTIONS.items())]
    out.append(QAItem(id="q9", question="Where was the author of Alpha born?", answers=["Nowhere"]))
    return out


def test_rollouts_are_scored_in_order_and_written_once(tmp_path):
    gen = ScriptedGenerator(chain_model)
    out = tmp_path / "rollouts.jsonl"
    trajs = run_rollouts(items(), out, KnowTraceConfig(), lambda: gen, WordRetriever(WORLD), chunk_size=2,
                         iteration=3, progress=False)
    assert [t.question_id for t in trajs] == ["q0", "q1", "q2", "q9"]
    assert [t.em for t in trajs] == [1.0, 1.0, 1.0, 0.0] and all(t.iteration == 3 for t in trajs)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question_id"] for r in rows] == ["q0", "q1", "q2", "q9"]
    assert not parts_dir(out).exists()
    # a finished file is read back, nothing runs again
    again = run_rollouts(items(), out, KnowTraceConfig(), lambda: pytest.fail("no generator needed"),
                         WordRetriever(WORLD), chunk_size=2, progress=False)
    assert [t.to_dict() for t in again] == [t.to_dict() for t in trajs]


def test_g_samples_are_g_seeded_trajectories_and_the_same_on_a_rerun(tmp_path):
    """samples=3: three trajectories per question in question, then sample order; every call of every sample
    draws from its own seed; a sample answers right only where its seed says so (the scripted model reads
    the request's seed), and a rerun into another file gives the same trajectories."""
    seeds: dict[str, list[int]] = {}

    def seeded(parts, req):
        seeds.setdefault(parts.get("question") or "", []).append(req.seed)
        assert req.temperature == 0.7
        out = chain_model(parts, req)
        return out if req.seed % 2 == 0 else re.sub(r"Answer: .*", "Answer: Wrong", out)

    cfg = KnowTraceConfig(temperature=0.7, seed=5)

    def run(name):
        return run_rollouts(items(), tmp_path / name, cfg, lambda: ScriptedGenerator(seeded), WordRetriever(WORLD),
                            chunk_size=2, iteration=1, progress=False, samples=3)

    trajs = run("a.jsonl")
    assert [(t.question_id, t.meta["sample"]) for t in trajs] == [(q, k) for q in ("q0", "q1", "q2", "q9") for k in range(3)]
    assert [t.id for t in trajs[:3]] == ["q0#s0", "q0#s1", "q0#s2"] and len({t.id for t in trajs}) == 12
    # the seeds of one question's calls differ between its samples
    by_sample = {}
    for t in trajs:
        by_sample.setdefault(t.question_id, []).append(t)
    assert sample_seed(5, 0) == 5 and len({sample_seed(5, k) for k in range(3)}) == 3
    assert any(len({t.em for t in ts}) > 1 for ts in by_sample.values())  # samples of one question disagree
    again = run("b.jsonl")
    fields = lambda ts: [(t.id, t.prediction, t.em, [c.output for c in t.calls]) for t in ts]  # noqa: E731
    assert fields(again) == fields(trajs)
    solved = pass_at_samples(trajs)
    assert solved["questions"] == 4 and solved["solved"] == sum(any(t.em == 1.0 for t in ts) for ts in by_sample.values())
    # the file of 3 samples is not the stage of 1 sample, nor of 2
    with pytest.raises(ValueError, match="another number of samples"):
        run_rollouts(items(), tmp_path / "a.jsonl", cfg, lambda: pytest.fail("no run"), WordRetriever(WORLD),
                     progress=False, samples=2)


def test_a_killed_rollout_keeps_its_finished_questions(tmp_path):
    """Three questions in flight: the comparison question ends in round 2, before the kill (in q1's second
    hop); its trajectory is in the part file, and the resumed run asks only about the others."""
    out = tmp_path / "rollouts.jsonl"
    comparison = "Which was founded first, Gant or Hale?"

    def dying(parts, req):
        if parts.get("pair") and parts["pair"][0] == "Esk":
            raise KeyboardInterrupt  # the kill
        return chain_model(parts, req)

    with pytest.raises(KeyboardInterrupt):
        run_rollouts(items(), out, KnowTraceConfig(), lambda: ScriptedGenerator(dying), WordRetriever(WORLD),
                     chunk_size=3, progress=False)
    assert not out.exists() and sorted(p.name for p in parts_dir(out).iterdir()) == ["rank0.jsonl"]
    kept = [json.loads(line) for line in (parts_dir(out) / "rank0.jsonl").read_text().splitlines()]
    assert [(d["question_id"], d["em"]) for d in kept] == [("q2", 1.0)]
    asked = []

    def recording(parts, req):
        asked.append(parts.get("question"))
        return chain_model(parts, req)

    trajs = run_rollouts(items(), out, KnowTraceConfig(), lambda: ScriptedGenerator(recording), WordRetriever(WORLD),
                         chunk_size=3, progress=False)
    assert [t.question_id for t in trajs] == ["q0", "q1", "q2", "q9"] and [t.em for t in trajs] == [1, 1, 1, 0]
    assert comparison not in asked and "Where was the author of Delta born?" in asked
    assert not parts_dir(out).exists()
    # the same trajectories as a run never killed
    whole = run_rollouts(items(), tmp_path / "whole.jsonl", KnowTraceConfig(), lambda: ScriptedGenerator(chain_model),
                         WordRetriever(WORLD), chunk_size=3, progress=False)
    strip = lambda t: {k: v for k, v in t.to_dict().items() if k != "wall_time"}  # noqa: E731
    assert [strip(t) for t in trajs] == [strip(t) for t in whole]


def test_files_of_other_questions_are_refused(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    run_rollouts(items()[:2], out, KnowTraceConfig(), lambda: ScriptedGenerator(chain_model), WordRetriever(WORLD),
                 chunk_size=2, progress=False)
    with pytest.raises(ValueError, match="other questions"):
        run_rollouts(items(), out, KnowTraceConfig(), lambda: ScriptedGenerator(chain_model), WordRetriever(WORLD),
                     progress=False)


def test_stage_runner_marks_and_skips(tmp_path):
    runner = StageRunner()
    ran = []
    info = runner.run(tmp_path, "train_explore", lambda: ran.append(1) or {"loss": 0.5})
    assert ran == [1] and is_done(tmp_path, "train_explore") and info["loss"] == 0.5 and "seconds" in info
    again = runner.run(tmp_path, "train_explore", lambda: pytest.fail("a done stage is not redone"))
    assert again == read_done(tmp_path, "train_explore") == info
    with pytest.raises(RuntimeError):
        runner.run(tmp_path, "eval", lambda: (_ for _ in ()).throw(RuntimeError("killed")))
    assert not is_done(tmp_path, "eval")


def test_part_files_are_read_whatever_process_wrote_them_and_foreign_ones_refused(tmp_path):
    """A resumed run reads every process's part file (here rank 1's, from a run of two processes); a part
    holding a question this stage does not have is refused, naming the file."""
    out = tmp_path / "rollouts.jsonl"
    whole = run_rollouts(items(), tmp_path / "whole.jsonl", KnowTraceConfig(), lambda: ScriptedGenerator(chain_model),
                         WordRetriever(WORLD), progress=False)
    parts_dir(out).mkdir()
    (parts_dir(out) / "rank1.jsonl").write_text(json.dumps(whole[1].to_dict()) + "\n")
    asked = []

    def recording(parts, req):
        asked.append(parts.get("question"))
        return chain_model(parts, req)

    trajs = run_rollouts(items(), out, KnowTraceConfig(), lambda: ScriptedGenerator(recording), WordRetriever(WORLD),
                         progress=False)
    assert [t.question_id for t in trajs] == ["q0", "q1", "q2", "q9"]
    assert "Where was the author of Delta born?" not in asked  # q1 came from rank 1's file
    other = tmp_path / "other.jsonl"
    parts_dir(other).mkdir()
    stranger = {**whole[0].to_dict(), "question_id": "elsewhere"}
    (parts_dir(other) / "rank0.jsonl").write_text(json.dumps(stranger) + "\n")
    with pytest.raises(ValueError, match=r"rank0.jsonl holds other questions .*elsewhere"):
        run_rollouts(items(), other, KnowTraceConfig(), lambda: pytest.fail("no run"), WordRetriever(WORLD),
                     progress=False)
