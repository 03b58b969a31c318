"""Loss on generated tokens only, and decisions weighted as decisions.

Every method's records put the prefix the engine feeds (KnowTrace's judgement words, Self-Ask's transcript, ...)
on the prompt side: the token ids a record trains are exactly the ids the generator fed and the ids the model
wrote after them, per method, from the same trajectory. A decision's tokens (KnowTrace's " Yes"/" No") carry a
loss weight balanced over its labels."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from knowtrace_train.decisions import decision_counts, decision_weights, mark_decision
from knowtrace_train.generation.prepare import PromptPreparer, RoleAdapters
from knowtrace_train.methods import get_method
from knowtrace_train.methods.knowtrace.outputs import JUDGEMENT, SUFFICIENCY, judgement_span
from knowtrace_train.train.lora import LoraTrainConfig, encode_record, load_records, tokenize_records
from knowtrace_train.trajectory import ModelCall, Trajectory, generated_text, split_prefix

from gold_helpers import ITEM, Mapped, words

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "lab"))  # the lab's helper modules

PROMPT = "Question: Where was the founder of Zentor born?\nKnowledge triplets:\n(Zentor; was founded by; Odile Farrant)"
GENERATED = " No\nRetrieval Guidance:\n- Odile Farrant: the city where she was born"


@pytest.mark.parametrize("prompt_format", ["chat", "plain"])
def test_the_fed_prefix_is_prompt_side_and_the_completion_is_what_the_model_writes(real_tokenizer, prompt_format):
    prompt = PROMPT if prompt_format == "chat" else PROMPT + "\n"
    preparer = PromptPreparer(real_tokenizer, prompt_format, 8192, False, RoleAdapters({}))
    prompt_ids, completion_ids = encode_record(real_tokenizer, prompt, GENERATED, prompt_format, JUDGEMENT)
    assert prompt_ids == preparer.encode(prompt, prefix=JUDGEMENT)
    generated = list(real_tokenizer(GENERATED, add_special_tokens=False)["input_ids"])
    assert completion_ids == generated + [real_tokenizer.eos_token_id]
    # the same text without the split trains the judgement words too: more loss-carrying tokens, the same sequence
    whole = encode_record(real_tokenizer, prompt, JUDGEMENT + GENERATED, prompt_format)
    assert len(whole[1]) > len(completion_ids) and whole[0] + whole[1] == prompt_ids + completion_ids


def test_split_prefix_keeps_a_rewritten_text_whole():
    assert split_prefix(JUDGEMENT, JUDGEMENT + " Yes") == (JUDGEMENT, " Yes")
    assert split_prefix(JUDGEMENT, "Thought: x") == ("", "Thought: x")
    assert split_prefix("", "abc") == ("", "abc")
    call = ModelCall(index=0, role="explore", round=1, prompt="p", output=JUDGEMENT + " No", prompt_tokens=1,
                     output_tokens=1, prefix=JUDGEMENT)
    assert generated_text(call) == " No"
    assert ModelCall.from_dict(call.to_dict()).prefix == JUDGEMENT


def test_the_judgement_span_is_the_decision_after_the_judgement_words():
    assert judgement_span(JUDGEMENT, " Yes\nThought: t") == ("Yes", 0, 4)
    assert judgement_span(JUDGEMENT, " No\nRetrieval Guidance:") == ("No", 0, 3)
    assert judgement_span("", JUDGEMENT + " No\n") == ("No", len(JUDGEMENT), len(JUDGEMENT) + 3)
    assert judgement_span(JUDGEMENT + " Yes\nThought:", " t\nAnswer: a") is None  # the forced answer decides nothing
    assert judgement_span(JUDGEMENT, " Nothing") is None
    assert judgement_span("", "(a; b; c)") is None


def test_decision_weights_balance_the_labels_and_scale_by_the_weight():
    recs = [mark_decision({"completion": " Yes x"}, "k", "Yes", 0, 4) for _ in range(3)]
    recs.append(mark_decision({"completion": " No x"}, "k", "No", 0, 3))
    recs.append({"completion": "(a; b; c)"})
    assert decision_counts(recs) == {"k": {"No": 1, "Yes": 3}}
    w = decision_weights(recs, 2.0)
    assert w[:3] == [pytest.approx(2.0 * 4 / (2 * 3))] * 3 and w[3] == pytest.approx(2.0 * 4 / 2) and w[4] is None
    assert sum(w[:3]) == pytest.approx(w[3])  # each label weighs as much in all
    assert decision_weights(recs, None) == [None] * 5 and decision_weights(recs, 0) == [None] * 5
    # one label only: nothing to tell apart, so no weight (it would push that label harder)
    assert decision_weights(recs[:3] + recs[4:], 2.0) == [None] * 4
    with pytest.raises(ValueError, match="outside the completion"):
        mark_decision({"completion": "ab"}, "k", "Yes", 0, 4)


def test_a_malformed_decision_or_prefix_names_the_record():
    from knowtrace_train.train.lora import SFTRecordError

    with pytest.raises(SFTRecordError, match="record 0: field 'decision'"):
        load_records([{"prompt": "p", "completion": "c", "decision": {"kind": "k"}}], "r")
    with pytest.raises(SFTRecordError, match="record 0: field 'prefix'"):
        load_records([{"prompt": "p", "completion": "c", "prefix": 3}], "r")
    with pytest.raises(ValueError, match="decision_weight"):
        LoraTrainConfig(decision_weight=-1)
    with pytest.raises(ValueError, match="packing"):
        LoraTrainConfig(decision_weight=2.0, packing=True)


def _weighted_rows(real_tokenizer, weight):
    recs = [{"prompt": f"Question {i}: is it known?", "prefix": JUDGEMENT,
             "completion": " Yes\nThought: t\nAnswer: a" if i % 3 == 0 else " No\nRetrieval Guidance:\n- E: g"}
            for i in range(4)]
    for r in recs:
        mark_decision(r, SUFFICIENCY, *judgement_span(JUDGEMENT, r["completion"]))
    return tokenize_records(real_tokenizer, load_records(recs, "explore"), "chat", 512, weight)[0]


def test_rows_weigh_the_decision_token_and_nothing_of_the_prompt(real_tokenizer):
    rows = _weighted_rows(real_tokenizer, 3.0)
    yes_w, no_w = 3.0 * 4 / (2 * 2), 3.0 * 4 / (2 * 2)
    for row in rows:
        lw, labels = row["loss_weights"], row["labels"]
        first = next(i for i, t in enumerate(labels) if t != -100)
        assert all(w == 0.0 for w in lw[:first]) and lw[first] in (yes_w, no_w)
        assert real_tokenizer.decode([row["input_ids"][first]]).strip() in ("Yes", "No")
        assert all(w == 1.0 for w in lw[first + 1:])
    assert "loss_weights" not in _weighted_rows(real_tokenizer, None)[0]


@pytest.mark.parametrize("padding_free", [False, True])
def test_the_weighted_loss_is_each_tokens_loss_times_its_weight_in_every_loss_path(tiny_model_dir, real_tokenizer,
                                                                                   padding_free):
    """The collator carries the weights beside the labels; the completion loss and the shared-prefix loss give
    sum(weight x token loss) / tokens, with the same gradients; weights of 1 give the unweighted loss."""
    from datasets import Dataset

    from knowtrace_train.train.lora import _load_base, lora_config, sft_args
    from knowtrace_train.train.trainer import completion_loss, counting_trainer_class, shared_prefix_loss

    rows = _weighted_rows(real_tokenizer, 3.0)
    config = LoraTrainConfig(rank=4, per_device_batch_size=4, gradient_accumulation_steps=1, seed=1,
                             padding_free=padding_free)
    model = _load_base(tiny_model_dir, "fp32", config, "cpu")
    trainer = counting_trainer_class(share_prefixes=True)(
        model=model, args=sft_args(config, "fp32", "cpu", "/tmp/unused"), train_dataset=Dataset.from_list(rows),
        processing_class=real_tokenizer, peft_config=lora_config(config))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert "loss_weights" in batch and batch["loss_weights"].shape == batch["labels"].shape
    assert float(batch["loss_weights"].max()) == 3.0 and bool(((batch["loss_weights"] > 0) == (batch["labels"] != -100)).all())
    peft_model = trainer.model
    for p in peft_model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    with torch.no_grad():
        forward = {k: v for k, v in batch.items() if k not in ("labels", "loss_weights")}
        logits = peft_model(**forward, use_cache=False).logits.float()[:, :-1]
        target, w = batch["labels"][:, 1:], batch["loss_weights"][:, 1:]
        each = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                 ignore_index=-100, reduction="none")
        expected = (each * w.reshape(-1)).sum() / (target != -100).sum()
        plain = each.sum() / (target != -100).sum()
    results = []
    for compute in (completion_loss, shared_prefix_loss):
        peft_model.zero_grad()
        loss = compute(trainer, peft_model, dict(batch), num_items_in_batch=None)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in peft_model.parameters() if p.requires_grad]))
    torch.testing.assert_close(results[0][0], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[1][0], expected, rtol=1e-5, atol=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    ones = dict(batch, loss_weights=(batch["labels"] != -100).float())
    with torch.no_grad():
        torch.testing.assert_close(completion_loss(trainer, peft_model, ones), plain, rtol=1e-5, atol=1e-6)
    assert not math.isclose(float(expected), float(plain))


# -- every method: the trained tokens are the generated tokens -----------------------------------------------


def _gold_run(name):
    """(records by role, gold trajectories) of `name`'s gold bootstrap on the hand-built 2-hop item."""
    m = get_method(name)
    if name == "dog":
        from test_gold_dog import TRIPLES
        from knowtrace_train.methods.dog.gold import dog_gold_records
        from knowtrace_train.kg_store import GraphStore

        cfg = m.config_class()
        res = dog_gold_records(cfg, [ITEM], None, record_kinds=list(m.record_roles(cfg)), fewshot=True,
                               store=GraphStore(TRIPLES), count_tokens=words)
        return res.records_by_role, res.trajectories
    if name == "trace":
        from test_gold_trace import HITS, OTHER, toy_encoder  # noqa: F401
        from knowtrace_train.methods.trace import TraceConfig
        from knowtrace_train.methods.trace.gold import trace_gold_records

        cfg = TraceConfig(documents=4)
        res = trace_gold_records(cfg, [ITEM, OTHER], Mapped(HITS), record_kinds=list(m.record_roles(cfg)),
                                 fewshot=True, count_tokens=words)
        return res.records_by_role, res.trajectories
    if name.startswith("mintqa"):
        from test_gold_mintqa import HITS
    elif name == "knowtrace":
        HITS = {"Zentor: who founded it": ["zentor"]}
    else:
        from test_gold_baselines import HITS
    res = m.gold_records(m.config_class(), [ITEM], _AnyHits(HITS), fewshot=True, require_support=False,
                         count_tokens=words, iteration=0)
    return res.records_by_role, res.trajectories


class _AnyHits(Mapped):
    """The mapped passages, and for any other query every passage (so that KnowTrace's own guidance is served)."""

    def search(self, queries, k):
        from gold_helpers import P
        from knowtrace_train.retrieval.base import ScoredPassage

        return [[ScoredPassage(P[key], 1.0) for key in (self.hits.get(q) or list(P))[:k]] for q in queries]


GOLD_METHODS = ["knowtrace", "dog", "trace", "mintqa_decompose", "mintqa_dynamic", "self_ask", "ircot",
                "react", "iter_retgen", "ra_cot"]


@pytest.mark.parametrize("name", GOLD_METHODS)
def test_every_trained_token_is_one_the_model_generates_at_inference(name, real_tokenizer):
    """Per method, each record of its gold bootstrap is a call of the same trajectory: its prompt ids are the ids
    the generator feeds for that call (the prompt, then the fed prefix) and its completion ids are the ids the
    model writes (the generated text, then EOS). Where the engine feeds a prefix, none of it carries loss."""
    if name not in __import__("knowtrace_train.methods", fromlist=["METHODS"]).METHODS:
        pytest.skip(f"{name} is not registered")
    records, trajectories = _gold_run(name)
    assert trajectories, f"{name}: no gold trajectory of the test item"
    preparer = PromptPreparer(real_tokenizer, "chat", 1 << 16, False, RoleAdapters({}))
    calls = {}
    for t in trajectories:
        for c in t.calls:
            calls.setdefault((t.id, c.prompt, c.prefix), []).append(c)
    fed_prefixes = 0
    checked = 0
    for role, recs in records.items():
        for rec in recs:
            key = (rec["trajectory_id"], rec["prompt"], rec.get("prefix", ""))
            if "added" in rec:  # a record beside the engine's run (TRACE's stop where the chain ends, reader without
                # context: test_gold_trace.py), its prompt rendered by the engine's own renderer, fed as it is
                prompt_ids, _ = encode_record(real_tokenizer, rec["prompt"], rec["completion"], "chat", rec["prefix"])
                assert name == "trace" and rec["prefix"] == "" and prompt_ids == preparer.encode(rec["prompt"], prefix="")
                continue
            assert key in calls, f"{name}: a {role} record matches no call of its trajectory"
            call = next(c for c in calls[key] if generated_text(c) == rec["completion"])
            prompt_ids, completion_ids = encode_record(real_tokenizer, rec["prompt"], rec["completion"], "chat",
                                                       rec.get("prefix", ""))
            assert prompt_ids == preparer.encode(call.prompt, prefix=call.prefix)
            written = list(real_tokenizer(generated_text(call), add_special_tokens=False)["input_ids"])
            assert completion_ids == written + [real_tokenizer.eos_token_id]
            fed_prefixes += bool(call.prefix)
            checked += 1
    assert checked > 0
    if name in ("knowtrace", "self_ask", "ircot", "react", "ra_cot", "iter_retgen"):
        assert fed_prefixes > 0, f"{name} feeds a response prefix: some record must have it prompt-side"


def test_knowtrace_explorations_mark_their_judgement_and_the_rollout_records_match_the_calls(real_tokenizer):
    """KnowTrace's gold explorations are records whose fed prefix is the judgement words and whose decision is
    the " Yes"/" No" after them; a rollout's records (backtracing and STaR) carry the engine's prefix likewise."""
    from knowtrace_train.methods.knowtrace.backtrace.records import backtrace_trajectories

    records, trajectories = _gold_run("knowtrace")
    explore = records["explore"]
    assert explore and all(r["prefix"] == JUDGEMENT for r in explore)
    assert sorted(r["decision"]["label"] for r in explore) == ["No", "No", "Yes"]
    assert all(not r["completion"].startswith(JUDGEMENT) for r in explore)
    assert all("decision" not in r for r in records["complete"])
    traj = trajectories[0]
    assert all(c.prefix == JUDGEMENT for c in traj.calls if c.role == "explore")
    for mode in ("backtrace", "star"):
        res = backtrace_trajectories(trajectories, {ITEM.id: ITEM}, count_tokens=words, mode=mode)
        assert [r["decision"]["label"] for r in res.records_by_role["explore"]] == ["No", "No", "Yes"]
        assert [r["completion"] for r in res.records_by_role["explore"]] == [
            generated_text(c) for c in traj.calls if c.role == "explore"]


def test_the_engine_records_the_prefix_it_fed(tiny_model_dir):
    """KnowTrace's engine and the call helper every other method uses record each request's prefix on its call,
    and the output is the prefix followed by the generated text."""
    from knowtrace_train.methods.knowtrace import KnowTrace, KnowTraceConfig

    from scripted import Scripted

    sent = []

    def script(role, prompt):
        return " No\nRetrieval Guidance:\n- Zentor: who founded it" if role == "explore" else "(Zentor; founded by; Odile Farrant)"

    gen = Scripted(script)
    from gold_helpers import P
    from knowtrace_train.retrieval.base import ScoredPassage

    class All:
        def search(self, queries, k):
            return [[ScoredPassage(P["zentor"], 1.0)] for _ in queries]

    (traj,) = KnowTrace(KnowTraceConfig(max_rounds=2)).run([ITEM], gen, All())
    for batch in gen.batches:
        sent += batch
    explores = [c for c in traj.calls if c.role in ("explore", "answer")]
    assert explores and all(c.prefix for c in explores)
    by_prompt = {}
    for r in sent:
        by_prompt.setdefault(r.prompt, set()).add(r.prefix)
    for c in traj.calls:
        assert c.prefix in by_prompt[c.prompt]
        assert c.output.startswith(c.prefix)


# -- the judgement measured -----------------------------------------------------------------------------------


def test_gold_judgement_prompts_say_no_until_the_chain_is_in_the_graph():
    from knowtrace_train.methods.knowtrace.judgement import gold_judgement_prompts
    from gold_helpers import HOTPOT

    prompts, skipped = gold_judgement_prompts([ITEM, HOTPOT], fewshot=False)
    assert [(p.hop, p.label) for p in prompts] == [(0, "No"), (1, "No"), (2, "Yes")]
    assert skipped == {"no_chain": 1} and all(p.kind == "bridge" for p in prompts)
    assert "Odile Farrant" not in prompts[0].prompt and "(Zentor; founded by; Odile Farrant)" in prompts[1].prompt
    assert "Castelbrun" in prompts[2].prompt


def test_the_judgement_is_read_from_the_two_options_after_the_judgement_words():
    from knowtrace_train.generation.base import OptionScores
    from judgement_figures import judgement_figures, score_judgements

    from knowtrace_train.methods.knowtrace.judgement import gold_judgement_prompts

    prompts, _ = gold_judgement_prompts([ITEM] * 12, fewshot=False)
    seen = []

    class Scorer:
        def score_options(self, requests, options):
            seen.extend(requests)
            # P(Yes) 0.8 once the answer is in the prompt, 0.3 before
            return [OptionScores({" Yes": math.log(0.8 if "Castelbrun" in r.prompt else 0.3),
                                  " No": math.log(0.2 if "Castelbrun" in r.prompt else 0.7)}, prompt_tokens=1)
                    for r in requests]

    odds = score_judgements(Scorer(), prompts, "explore", batch=5)
    assert len(seen) == len(prompts) and all(r.prefix == JUDGEMENT and r.role == "explore" for r in seen)
    assert odds[:3] == [pytest.approx(math.log(0.3 / 0.7)), pytest.approx(math.log(0.3 / 0.7)),
                        pytest.approx(math.log(4.0))]
    f = judgement_figures(prompts, odds)["all"]
    assert f["accuracy"]["mean"] == 1.0 and f["recall_yes"]["n"] == 12 and f["recall_no"]["n"] == 24
    assert f["confusion"] == {"gold_Yes_said_Yes": 12, "gold_Yes_said_No": 0, "gold_No_said_Yes": 0, "gold_No_said_No": 24}
    assert f["p_yes_when_gold_no"]["mean"] == pytest.approx(0.3) and f["balanced_accuracy"] == 1.0
    # at a threshold above every gold-Yes prompt's log-odds the model says No everywhere
    high = judgement_figures(prompts, odds, threshold=2.0)
    assert high["threshold"] == 2.0 and high["all"]["recall_yes"]["mean"] == 0.0 and high["all"]["recall_no"]["mean"] == 1.0


def test_exploration_confusion_counts_by_whether_the_graph_names_the_answer():
    """A bridge question explored twice (No on an empty graph, then Yes once the graph names the answer) and
    answered; another that said No with the answer in its graph and was right through the forced answer."""
    from knowtrace_train.kg import GuidancePair, KnowledgeGraph, TracedTriplet, Triplet
    from judgement_figures import exploration_confusion

    def traj(tid, said, stop):
        g = KnowledgeGraph()
        calls = [ModelCall(index=0, role="explore", round=1, prompt="p0", output="", prompt_tokens=1, output_tokens=1,
                           parsed={"sufficient": False}),
                 ModelCall(index=1, role="complete", round=1, prompt="c", output="", prompt_tokens=1, output_tokens=1),
                 ModelCall(index=2, role="explore", round=2, prompt="p1", output="", prompt_tokens=1, output_tokens=1,
                           parsed={"sufficient": said})]
        g.add(TracedTriplet(Triplet("Odile Farrant", "born in", "Castelbrun"), 1, GuidancePair("O", "g"), 1, ()))
        if stop != "answered":
            calls.append(ModelCall(index=3, role="answer", round=2, prompt="p1", output="", prompt_tokens=1,
                                   output_tokens=1, parsed={"sufficient": True}))
        return Trajectory(id=tid, question_id=ITEM.id, question=ITEM.question, answers=list(ITEM.answers),
                          dataset="world", strategy="knowtrace", calls=calls, graph=g, stop_reason=stop, em=1.0)

    out = exploration_confusion([traj("a", True, "answered"), traj("b", False, "no_progress")], {ITEM.id: ITEM})
    b = out["bridge"]
    assert (b["lacks_no"], b["holds_yes"], b["holds_no"], b["lacks_yes"]) == (2, 1, 1, 0)
    assert b["yes_when_holds"] == 0.5 and b["no_when_lacks"] == 1.0
    assert (b["right_explored"], b["right_forced"]) == (1, 1) and out["comparison"]["holds_yes"] == 0
