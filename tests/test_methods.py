"""The methods registry: a toy method registered here runs through evaluate and a STaR self-training iteration.

"Direct" answers each question in one call, without retrieval. It is the whole cost of adding a
method: a config class, a strategy, a Method entry and one `register` line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from knowtrace_train.config import ConfigError, dump_config, load_config
from knowtrace_train.data.loaders import load_items
from knowtrace_train.evaluate import EvalConfig, evaluate, load_eval_config
from knowtrace_train.generation.base import Completion, GenerationRequest, request_seed
from knowtrace_train.methods import METHODS, Method, StrategyConfig, get_method, register, unregister
from knowtrace_train.methods.knowtrace import KnowTraceConfig
from knowtrace_train.selftrain import SelfTrain, SelfTrainConfig
from knowtrace_train.selftrain.models import run_model
from knowtrace_train.trajectory import ModelCall, Trajectory

from selftrain_helpers import tiny_overrides

REPO = Path(__file__).resolve().parents[1]
DEV = REPO / "data" / "world" / "dev.jsonl"


# -- the toy method: the whole of it ---------------------------------------------------------------


@dataclass
class DirectConfig(StrategyConfig):
    name: str = "direct"
    max_new_tokens: int = 8


class Direct:
    name = "direct"

    def __init__(self, config: DirectConfig) -> None:
        self.config = config

    def run(self, items, generator, retriever, on_done=None):
        reqs = [GenerationRequest(prompt=f"Question: {it.question}\nAnswer:", role="answer", stop=("\n",),
                                  max_new_tokens=self.config.max_new_tokens, seed=request_seed(self.config.seed, it.id))
                for it in items]
        out = []
        for it, req, c in zip(items, reqs, generator.generate(reqs)):
            call = ModelCall(index=0, role="answer", round=1, prompt=req.prompt, output=c.text,
                             prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens, finish_reason=c.finish_reason)
            t = Trajectory(id=it.id, question_id=it.id, question=it.question, answers=list(it.answers),
                           dataset=it.dataset, strategy=self.name, calls=[call], prediction=c.text.strip() or None,
                           stop_reason="answered", rounds=1)
            if on_done is not None:
                on_done(t)
            out.append(t)
        return out


class DirectMethod(Method):
    name = "direct"
    config_class = DirectConfig

    def strategy(self, config):
        return Direct(config)

    def record_roles(self, config):
        return {"answer": "answer"}


@pytest.fixture
def direct():
    register(DirectMethod())
    yield
    unregister("direct")


# -- a generator that knows some answers -------------------------------------------------------------


class HalfOracle:
    """The gold answer for every other question (by position in the dev file), the tiny model for the rest."""

    def __init__(self, inner, items) -> None:
        self.inner = inner
        self.gold = {f"Question: {it.question}\nAnswer:": it.answer for i, it in enumerate(items) if i % 2 == 0}
        self.closed = False

    def generate(self, requests):
        out = []
        for r in requests:
            if r.prompt in self.gold:
                text = " " + self.gold[r.prompt]
                out.append(Completion(text=text, prompt_tokens=self.count_tokens(r.prompt),
                                      output_tokens=self.count_tokens(text), finish_reason="stop"))
            else:
                out.extend(self.inner.generate([r]))
        return out

    def count_tokens(self, text):
        return self.inner.count_tokens(text)

    def close(self):
        self.closed = True
        self.inner.close()


def _oracle_factory(items, made: list):
    """Builds a HalfOracle per stage, and checks that each stage starts after the last one's generator
    was closed (its model's memory returned before the next model loads)."""
    from knowtrace_train.generation import build_generator

    def make(gen_cfg):
        assert all(g.closed for g in made), "a stage built a generator while the previous one was still open"
        made.append(HalfOracle(build_generator(gen_cfg), items))
        return made[-1]

    return make


# -- tests -------------------------------------------------------------------------------------------


def test_knowtrace_is_registered_and_unknown_names_are_refused():
    assert get_method("knowtrace").config_class is KnowTraceConfig
    with pytest.raises(ValueError, match="unknown method 'nope'.*knowtrace"):
        get_method("nope")
    with pytest.raises(ConfigError, match="strategy.name.*unknown method 'nope'"):
        load_config(EvalConfig, None, ["--strategy.name", "nope"])


def test_a_config_file_names_the_method_and_gets_its_class(direct, tmp_path):
    f = tmp_path / "eval.yaml"
    f.write_text("strategy:\n  name: direct\n  max_new_tokens: 4\n")
    cfg = load_config(EvalConfig, f)
    assert type(cfg.strategy) is DirectConfig and cfg.strategy.max_new_tokens == 4
    # a key of another method's settings is a typo here
    f.write_text("strategy:\n  name: direct\n  max_rounds: 4\n")
    with pytest.raises(ConfigError, match="unknown key 'strategy.max_rounds' for DirectConfig"):
        load_config(EvalConfig, f)
    # the self-training default's KnowTrace section is not carried into another method's
    st = load_config(SelfTrainConfig, None, ["--strategy.name", "direct", "--mode", "star"])
    assert type(st.strategy) is DirectConfig and st.strategy.seed == 0


def test_evaluate_runs_the_toy_method(direct, tmp_path, tiny_model_dir):
    items = load_items(DEV)[:4]
    cfg = load_config(EvalConfig, None, ["--strategy.name", "direct", "--dataset.limit", "4",
                                         "--output", str(tmp_path / "out.jsonl"), "--generator.model", str(tiny_model_dir)])
    from knowtrace_train.generation import build_generator

    gen = HalfOracle(build_generator(cfg.generator), items)
    s = evaluate(cfg, generator=gen, progress=False)
    assert s.questions == 4 and s.em == 0.5 and s.rounds == 1.0
    # no graph to check an answer against: no evidence-supported EM; the kinds come from the world's items
    assert s.evidence_supported is None and s.evidence_supported_em is None
    assert {k: iv.n for k, iv in s.by_kind.items()} == {
        k: n for k in ("bridge", "comparison") if (n := sum(it.type == k for it in items))}
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["strategy"] for r in rows] == ["direct"] * 4 and rows[0]["calls"][0]["role"] == "answer"


def test_one_star_iteration_of_the_toy_method(direct, tmp_path, tiny_model_dir):
    args = tiny_overrides(tmp_path, tiny_model_dir, iterations=1, eval_base=False, mode="star",
                          **{"strategy.name": "direct", "bootstrap.mode": "never", "data.train": str(DEV),
                             "data.train_questions": 6, "data.dev_questions": 4})
    # the KnowTrace keys of the tiny overrides do not exist for this method: drop them
    keep = []
    for k, v in zip(args[::2], args[1::2]):
        if not k.startswith("--strategy.") or k == "--strategy.name":
            keep += [k, v]
    cfg = load_config(SelfTrainConfig, None, keep)
    run = SelfTrain(cfg, progress=False)
    made: list[HalfOracle] = []
    run.make_generator = _oracle_factory(load_items(DEV), made)
    summary = run.run()
    # rollout and evaluation each built one generator and closed it when the stage ended
    assert len(made) == 2 and all(g.closed for g in made)
    it = run.run_dir / "iter_1"
    rationale = json.loads((it / "rationale.json").read_text())
    assert rationale["mode"] == "star" and rationale["fa_ratio"] is None and rationale["correct"] >= 1
    records = [json.loads(line) for line in (it / "sft_answer.jsonl").read_text().splitlines()]
    assert len(records) == rationale["correct"] and all(r["role"] == "answer" for r in records)
    assert all(r["prompt"].startswith("Question: ") and r["completion"].strip() for r in records)
    assert (it / "adapters" / "answer" / "adapter_config.json").is_file()
    m = json.loads((it / "metrics.json").read_text())
    assert m["status"] == "trained" and m["adapters"] == {"answer": "iter_1/adapters/answer"}
    assert m["eval"]["questions"] == 4 and summary["method"] == "direct" and summary["iterations"][0]["em"] is not None
    assert m["eval"]["evidence_supported_em"] is None and m["eval"]["em_interval"]["n"] == 4
    # M0 is the raw base and eval_base is off: M0 has no dev evaluation to pair with
    assert m["vs_m0"] is None and m["vs_previous"] is None

    # the trained model, evaluated by naming the run: its adapter, its method and settings
    rm = run_model(run.run_dir, 1)
    assert rm.state.name == "M1" and rm.generator.adapters == {"answer": str(run.run_dir / "iter_1/adapters/answer")}
    assert type(rm.strategy) is DirectConfig and rm.strategy.seed == cfg.strategy.seed + 1
    ev = load_eval_config(None, ["--run", str(run.run_dir), "--iteration", "1", "--limit", "2"])
    assert type(ev.strategy) is DirectConfig and ev.generator.adapters == rm.generator.adapters
    assert ev.output == str(run.run_dir / "eval" / "world_dev_M1.jsonl")


def test_backtracing_is_refused_for_a_method_without_it(direct):
    cfg = load_config(SelfTrainConfig, None, ["--strategy.name", "direct", "--mode", "star"])
    assert cfg.mode == "star"
    with pytest.raises(ConfigError, match=r"mode must be one of \['star', 'kto', 'grpo'\] for method 'direct'"):
        load_config(SelfTrainConfig, None, ["--strategy.name", "direct", "--mode", "backtrace"])


def test_no_mode_named_is_the_methods_own_rationalizer(direct, caplog):
    """A run that names no mode learns with its method's first rationalizer (STaR, backtracing for KnowTrace), said in
    the log; the config written to the run folder holds the mode chosen."""
    with caplog.at_level(logging.INFO, logger="knowtrace_train.selftrain.config"):
        cfg = load_config(SelfTrainConfig, None, ["--strategy.name", "direct"])
    assert cfg.mode == "star" and "method 'direct' learns with its own rationalizer, mode 'star'" in caplog.text
    assert load_config(SelfTrainConfig, None, []).mode == "backtrace"
    for name in ("trace", "dog", "mintqa_dynamic", "self_ask"):
        assert load_config(SelfTrainConfig, None, ["--strategy.name", name]).mode == "star"
    assert "mode: star" in dump_config(cfg)


def test_register_refuses_a_second_method_of_the_same_name(direct):
    class Other(DirectMethod):
        pass

    with pytest.raises(ValueError, match="registered already"):
        register(Other())
    assert type(METHODS["direct"]) is DirectMethod


def test_run_model_reads_a_knowtrace_run_folder(tmp_path):
    """M0, an iteration's adapters, an empty iteration and the prompts of trained roles, from the files alone."""
    from knowtrace_train.config import dump_config

    run = tmp_path / "run"
    (run / "iter_1").mkdir(parents=True)
    (run / "iter_2").mkdir()
    cfg = load_config(SelfTrainConfig, None, ["--generator.model", "some/base", "--strategy.kg_format", "text"])
    (run / "config.yaml").write_text(dump_config(cfg))
    (run / "m0.json").write_text(json.dumps({"path": "iter_0/model", "bootstrapped": True}))
    (run / "iter_1" / "metrics.json").write_text(json.dumps(
        {"status": "trained", "adapters": {"explore": "iter_1/adapters/explore", "complete": "iter_1/adapters/complete"}}))
    (run / "iter_2" / "metrics.json").write_text(json.dumps({"status": "empty", "adapters": {}}))

    base = run_model(run, "base")
    assert base.state.model == "some/base" and base.strategy.fewshot.explore and not base.generator.adapters
    m0 = run_model(run, 0)
    assert m0.state.model == str(run / "iter_0/model") and not m0.generator.adapters
    # trained roles run without exemplars (fewshot_trained false); the KG-to-Text role keeps them
    assert not m0.strategy.fewshot.explore and not m0.strategy.fewshot.complete and m0.strategy.fewshot.kg_to_text
    m1 = run_model(run, 1)
    assert m1.generator.adapters == {"explore": str(run / "iter_1/adapters/explore"),
                                     "complete": str(run / "iter_1/adapters/complete")}
    assert m1.generator.base_roles == ("kg_to_text",) and m1.seed == cfg.strategy.seed + 1
    # an iteration that trained nothing is the model before it
    m2 = run_model(run, "last")
    assert m2.state.name == "M2" and m2.generator.adapters == m1.generator.adapters and m2.seed == cfg.strategy.seed + 2
    with pytest.raises(ValueError, match=r"the run has 2 iteration\(s\) \(config.yaml\), so iteration 3 does not exist"):
        run_model(run, 3)
    with pytest.raises(ValueError, match="not a self-training run folder"):
        run_model(tmp_path, 1)
    with pytest.raises(ConfigError, match="--run"):
        load_eval_config(None, ["--run", str(tmp_path), "--iteration", "1"])


def test_generate_calls_numbers_one_trajectorys_calls_on_and_counts_truncation():
    """Several calls of one trajectory in a batch each sample from the stream of the index it gets (KnowTrace's
    completion calls, one per guidance pair); a prompt the generator cut is counted on the trajectory; the
    spec's adapter is asked for; a decided word's tokens move from the prompt's count to the output's."""
    from knowtrace_train.kg import GuidancePair
    from knowtrace_train.methods.calls import CallSpec, generate_calls

    class Cutting:
        def __init__(self):
            self.requests = []

        def count_tokens(self, text):
            return len(text.split())

        def generate(self, requests):
            self.requests += requests
            return [Completion(text=" x", prompt_tokens=3, output_tokens=1, finish_reason="stop", truncated_tokens=2)
                    for _ in requests]

    traj = Trajectory(id="q1", question_id="q1", question="?", answers=["a"], dataset="d", strategy="s")
    traj.calls.append(ModelCall(index=0, role="explore", round=1, prompt="p", output="o", prompt_tokens=1, output_tokens=1))
    pair = GuidancePair("E", "g")
    gen = Cutting()
    specs = [CallSpec(traj, "complete", 1, "p1", 8, pair=pair, adapter="explore"),
             CallSpec(traj, "complete", 1, "p2", 8, decided="yes no maybe four")]
    calls, _ = generate_calls(gen, specs, temperature=1.0, seed=7)
    assert [r.seed for r in gen.requests] == [request_seed(7, "q1", 1), request_seed(7, "q1", 2)]
    assert [c.index for c in calls] == [1, 2] and [r.role for r in gen.requests] == ["explore", "complete"]
    assert calls[0].pair == pair and traj.meta["truncated_prompt_tokens"] == 4
    assert calls[1].prompt_tokens == 0 and calls[1].output_tokens == 5  # 3 prompt tokens, 4 of them the fed word
