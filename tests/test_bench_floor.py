"""scripts/bench/bench_floor.py: a run's model work counted from its files, on hand-computed figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))

import bench_floor  # noqa: E402
from bench_floor import Shape, floor, gemm_rate, machine_rates, report  # noqa: E402

from knowtrace_train.errors import UserError  # noqa: E402

#: the tiny model of conftest.tiny_model: hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 kv heads.
#: One layer's products (in x out): q 64x64, k 64x32, v 64x32, o 64x64, gate 64x128, up 64x128, down 128x64.
LINEAR = 2 * (4096 + 2048 + 2048 + 4096 + 8192 + 8192 + 8192)  # 73,728
LORA_IN_OUT = 2 * (128 + 96 + 96 + 128 + 192 + 192 + 192)  # 2,048


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, real_tokenizer) -> Path:
    run = tmp_path_factory.mktemp("run")
    (run / "iter_0").mkdir()
    (run / "iter_0" / "model").symlink_to(tiny_model_dir, target_is_directory=True)
    adapter = run / "iter_0" / "bootstrap_adapters" / "bootstrap"
    adapter.mkdir(parents=True)
    (adapter / "knowtrace_training.json").write_text(json.dumps({
        "role": "bootstrap", "config": {"rank": 4},
        "result": {"tokens": 100, "computed_tokens": 60, "completion_tokens": 10, "seconds": 2.0}}))
    calls = [
        [{"role": "explore", "prompt": "Question: who founded Acme?", "output_tokens": 5},
         {"role": "complete", "prompt": "Documents: Acme was founded by Bo.", "output_tokens": 1}],
        [{"role": "explore", "prompt": "Question: who founded Zeta?", "output_tokens": 3},
         {"role": "explore", "prompt": ""},  # a call without a prompt is no work
         "not a call"],
    ]
    with (run / "iter_0" / "eval.jsonl").open("w") as f:
        for i, c in enumerate(calls):
            f.write(json.dumps({"id": f"q{i}", "calls": c}) + "\n")
    (run / "iter_0" / "metrics.json").write_text(json.dumps({"eval": {"seconds": 4.0}}))
    return run


def _distinct_prefixes(tokenizer, prompts) -> int:
    """Positions of a prefix tree, counted another way: the distinct non-empty prefixes of the rendered prompts."""
    seen = set()
    for p in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        seen.update(tuple(ids[: i + 1]) for i in range(len(ids)))
    return len(seen)


def test_shape_of_the_tiny_model(tiny_model_dir):
    shape = Shape.of(tiny_model_dir)
    assert shape.linear == LINEAR
    assert shape.layer_products == ((64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64))
    assert shape.lora_params(4, "all-linear") == 4 * LORA_IN_OUT
    assert shape.lora_params(4, ["q_proj", "v_proj"]) == 4 * 2 * (128 + 96)  # only the named products
    assert shape.head == json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"] * 64


def test_floor_counts_the_work_by_hand(run, real_tokenizer):
    vocab = json.loads((run / "iter_0" / "model" / "config.json").read_text())["vocab_size"]
    head = vocab * 64
    r = floor(run, rate=10.0, cores=2, wall=100.0)
    by_name = {s["name"]: s for s in r["stages"]}
    train = by_name["iter_0/train bootstrap"]
    assert train["flop"] == 60 * (4 * LINEAR + 6 * 4 * LORA_IN_OUT) + 10 * 4 * head
    assert train["floor_share"] == pytest.approx(train["flop"] / 10e9 / 2.0)

    ev = by_name["iter_0/eval"]
    positions = _distinct_prefixes(real_tokenizer, ["Question: who founded Acme?", "Documents: Acme was founded by Bo.",
                                                    "Question: who founded Zeta?"])
    assert ev["counts"]["calls"] == 3
    assert ev["counts"]["prefill_positions"] == positions
    assert ev["counts"]["decode_rows"] == 4 + 0 + 2  # every output token after the first
    assert ev["flop"] == positions * 2 * LINEAR + 3 * 2 * head + 6 * 2 * (LINEAR + head)
    assert ev["seconds"] == 4.0

    total = train["flop"] + ev["flop"]
    assert r["floor_seconds"] == pytest.approx(total / (10e9 * 2))
    assert r["floor_share_of_wall"] == pytest.approx(r["floor_seconds"] / 100.0)
    assert r["training_tflop"] == pytest.approx(train["flop"] / 1e12)
    assert r["decoding_tflop"] == pytest.approx(ev["flop"] / 1e12)


def test_a_prefix_shared_by_two_prompts_counts_once(run, real_tokenizer):
    r = floor(run, rate=10.0, cores=1)
    ev = {s["name"]: s for s in r["stages"]}["iter_0/eval"]
    prompts = ("Question: who founded Acme?", "Documents: Acme was founded by Bo.", "Question: who founded Zeta?")
    alone = sum(_distinct_prefixes(real_tokenizer, [p]) for p in prompts)  # each prompt's own length
    # the chat header once for all three, and "Question: who founded" once for two
    assert ev["counts"]["prefill_positions"] < alone - 2 * 10


def test_bad_runs_are_named(tmp_path, tiny_model_dir):
    with pytest.raises(UserError, match="no such run folder"):
        floor(tmp_path / "missing", rate=1.0)
    (tmp_path / "bare").mkdir()
    with pytest.raises(UserError, match=r"config.json: no model config there; pass --model"):
        floor(tmp_path / "bare", rate=1.0)
    with pytest.raises(UserError, match="no trained adapter"):
        floor(tmp_path / "bare", model=str(tiny_model_dir), rate=1.0)


def test_rates_are_measured_alone_and_on_every_core_at_once():
    shape = Shape(linear=0, head=0, layer_products=((16, 32), (32, 16)))
    assert gemm_rate(shape, rows=8, seconds=0.01) > 0
    alone, together = machine_rates(shape, cores=2, seconds=0.2, delay=3.0)
    assert alone > 0 and len(together) == 2 and all(r > 0 for r in together)
    # and in bf16, the dtype of a run on a CPU with native bf16 (the workers get it too)
    assert gemm_rate(shape, rows=8, seconds=0.01, dtype="bfloat16") > 0
    alone, together = machine_rates(shape, cores=1, seconds=0.1, delay=3.0, dtype="bfloat16")
    assert alone > 0 and len(together) == 1


def test_the_floor_takes_what_the_cores_deliver_together(run):
    one = floor(run, rate=10.0, cores=1)
    two = floor(run, rate=10.0, cores=2)
    assert two["machine_gflops"] == 20.0 and one["machine_gflops"] == 10.0
    assert two["floor_seconds"] == pytest.approx(one["floor_seconds"] / 2)


def test_measured_rates_are_reported_as_measured(run, monkeypatch):
    asked = []
    monkeypatch.setattr(bench_floor, "machine_rates",
                        lambda shape, cores, dtype: asked.append(dtype) or (12.0, [11.0, 9.0]))
    monkeypatch.setattr(bench_floor.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    r = floor(run, cores=2)
    assert r["rates_given"] is False and r["rate_gflops_one_thread"] == 12.0
    assert r["machine_gflops"] == 20.0  # both cores together delivered more than one alone
    text = report(r)
    assert "float32 rate on the model's products (measured) 12.0 GFLOP/s alone; with 2 core(s) busy at once " \
           "11.0 + 9.0 = 20.0" in text
    assert "bfloat16 rate" in report(floor(run, cores=2, dtype="bfloat16")) and asked == ["float32", "bfloat16"]
    assert "load average 1.5 before measuring" in text
    given = floor(run, rate=10.0, cores=2)
    assert given["rates_given"] is True and given["load_average_before"] is None
    assert "(given)" in report(given) and "load average" not in report(given)
