"""The paper's baselines on scripted model outputs: each loop followed step by step, bad outputs bounded and recorded."""

from __future__ import annotations

import pytest

from knowtrace_train.config import ConfigError, load_config
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.evaluate import EvalConfig
from knowtrace_train.generation.base import Completion, GenerationError
from knowtrace_train.methods import get_method
from knowtrace_train.methods.baselines import (
    IRCoTConfig,
    IterRetGenConfig,
    RACoTConfig,
    ReActConfig,
    SelfAskConfig,
)
from knowtrace_train.methods.baselines.common import extract_answer, first_sentence, last_sentence
from knowtrace_train.methods.baselines.react import parse_action
from knowtrace_train.methods.baselines.self_ask import parse_step
from knowtrace_train.methods.star import star_records
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage

P = {k: Passage(id=k, title=t, text=x) for k, t, x in [
    ("p-acme", "Acme Rails", "Acme Rails was founded by Lida Born."),
    ("p-lida", "Lida Born", "Lida Born was born in Quarrytown."),
    ("p-quarry", "Quarrytown", "Quarrytown is a city in Felland."),
    ("p-other", "Other", "Nothing of use."),
]}
A = QAItem(id="qa", question="Where was the founder of Acme Rails born?", answers=("Quarrytown",), type="bridge")
B = QAItem(id="qb", question="Which is older, Orb or Pell?", answers=("Orb",), type="comparison")


class Scripted:
    """A generator whose reply is `reply(question_id, request, n)` (n: that question's call count so far).
    It records every batch, so a test can check that the live questions advance together."""

    def __init__(self, reply) -> None:
        self.reply, self.batches, self.count = reply, [], {}

    def _qid(self, req) -> str:
        text = req.prompt + req.prefix
        tail = text.rsplit("Question:", 1)[-1]
        return next(it.id for it in (A, B) if it.question in tail)

    def generate(self, requests):
        self.batches.append(list(requests))
        out = []
        for req in requests:
            qid = self._qid(req)
            n = self.count.get(qid, 0)
            self.count[qid] = n + 1
            text = self.reply(qid, req, n)
            if isinstance(text, Exception):
                raise text
            out.append(Completion(text=text, prompt_tokens=self.count_tokens(req.prompt + req.prefix),
                                  output_tokens=self.count_tokens(text), finish_reason="stop"))
        return out

    def count_tokens(self, text):
        return len(text.split())

    def close(self):
        pass


class Retriever:
    """Passages per query word: a query finds every passage whose id's word (after `p-`) it contains."""

    def __init__(self, refuse: str | None = None) -> None:
        self.batches, self.refuse = [], refuse

    def search(self, queries, k):
        self.batches.append(list(queries))
        if self.refuse and any(self.refuse in q for q in queries):
            raise RetrievalError("refused")
        return [[ScoredPassage(p, 1.0) for key, p in P.items() if key[2:] in q.lower()][:k] for q in queries]


def run(strategy_name, config, reply, items=(A, B), retriever=None):
    gen, ret, done = Scripted(reply), retriever or Retriever(), []
    trajs = get_method(strategy_name).strategy(config).run(list(items), gen, ret, on_done=done.append)
    assert sorted(t.id for t in done) == sorted(t.id for t in trajs)  # each handed on exactly once
    return {t.question_id: t for t in trajs}, gen, ret


# -- parsers -----------------------------------------------------------------------------------------


def test_answer_and_sentence_parsers_never_raise():
    assert extract_answer(" X. So the answer is: Quarrytown.\nmore") == "Quarrytown"
    assert extract_answer("the final answer is \"Orb\"") == "Orb"
    assert extract_answer("no mark here") is None and extract_answer("") is None
    assert first_sentence(" Acme Rails was founded by Lida Born. Then more.") == "Acme Rails was founded by Lida Born."
    assert last_sentence("It is old. Orb.") == "Orb" and last_sentence("   ") is None
    assert parse_action(" t\nAction 1: search[Acme Rails founder") == {
        "thought": "t", "action": "search", "argument": "Acme Rails founder"}
    assert parse_action("gibberish")["action"] is None
    assert parse_step(" Lida Born.\nFollow up: Where was Lida Born born?") == {
        "intermediate": "Lida Born", "follow_up": "Where was Lida Born born?", "final": None}
    assert parse_step("x\nSo the final answer is: Orb.")["final"] == "Orb"


# -- RA-CoT ------------------------------------------------------------------------------------------


def test_ra_cot_retrieves_once_with_the_question_and_reasons_once():
    def reply(qid, req, n):
        assert req.prefix == "Answer:" and "Documents:" in req.prompt
        return " Acme Rails was founded by Lida Born. So the answer is: Quarrytown." if qid == "qa" else " Orb is old."

    out, gen, ret = run("ra_cot", RACoTConfig(passages=2), reply)
    assert ret.batches == [[A.question, B.question]] and len(gen.batches) == 1
    a, b = out["qa"], out["qb"]
    assert a.prediction == "Quarrytown" and a.stop_reason == "answered" and a.rounds == 1
    assert a.calls[0].passage_ids == ["p-acme"] and a.calls[0].retrieved_tokens == len("[1] Acme Rails: Acme Rails was founded by Lida Born.".split())
    assert a.calls[0].output.startswith("Answer: Acme")
    # no "So the answer is": the last sentence, with the call's error saying so
    assert b.prediction == "Orb is old" and b.stop_reason == "no_answer_mark" and "last sentence" in b.calls[0].error
    # B's question words match no passage: an empty retrieval, recorded, the prompt says so
    assert "(no documents found)" in b.calls[0].prompt and b.meta["events"][0]["event"] == "empty retrieval"
    assert b.retrieved_tokens == 0 and a.wall_time > 0


# -- IRCoT -------------------------------------------------------------------------------------------


def test_ircot_interleaves_sentences_and_retrievals_and_forces_an_answer_at_the_end():
    def reply(qid, req, n):
        if qid == "qa":
            return [" Acme Rails was founded by Lida Born. Extra text.", " Lida Born was born in Quarrytown.",
                    " So the answer is: Quarrytown."][n]
        if req.prefix.endswith("So the answer is:"):
            return " Orb.\n"
        return f" Step {n} about something new."

    out, gen, ret = run("ircot", IRCoTConfig(max_rounds=3, passages=1), reply)
    a, b = out["qa"], out["qb"]
    # retrieval: the questions, then each question's last sentence (one batch per round across questions)
    assert ret.batches[0] == [A.question, B.question]
    assert ret.batches[1] == ["Acme Rails was founded by Lida Born.", "Step 0 about something new."]
    assert ret.batches[2] == ["Lida Born was born in Quarrytown.", "Step 1 about something new."]
    assert len(ret.batches) == 3  # no query after the last round
    assert [len(b_) for b_ in gen.batches] == [2, 2, 2, 1]  # rounds 1-3 together; B's forced answer
    assert a.prediction == "Quarrytown" and a.stop_reason == "answered" and a.rounds == 3
    # the prompt of round 3 carries the passages found so far; the prefix is the chain so far
    r3 = a.calls[2]
    assert r3.passage_ids == ["p-acme", "p-lida"] and r3.prompt.count("[2] Lida Born") == 1
    assert r3.output.startswith("Answer: Acme Rails was founded by Lida Born. Lida Born was born in Quarrytown.")
    assert a.calls[0].parsed == {"sentence": "Acme Rails was founded by Lida Born."}
    assert b.stop_reason == "max_rounds" and b.prediction == "Orb" and b.calls[-1].role == "answer"
    assert b.calls[-1].output.endswith("So the answer is: Orb.\n")
    assert a.retrieved_tokens == sum(c.retrieved_tokens for c in a.calls) > 0


def test_ircot_stops_on_an_empty_or_repeated_sentence():
    def reply(qid, req, n):
        if req.prefix.endswith("So the answer is:"):
            return ""
        return "" if qid == "qa" else " Same thing."

    out, gen, _ = run("ircot", IRCoTConfig(max_rounds=5), reply)
    a, b = out["qa"], out["qb"]
    assert a.stop_reason == "no_progress" and a.calls[0].error == "empty CoT sentence" and a.rounds == 1
    assert b.stop_reason == "no_progress" and b.rounds == 2 and b.meta["events"][-1]["event"] == "repeated sentence"
    # the forced answer wrote nothing: no prediction, the call's error says so, nothing crashed
    assert a.prediction is None and a.calls[-1].error == "empty forced answer"


# -- Self-Ask ----------------------------------------------------------------------------------------


def test_self_ask_follows_up_retrieves_and_finishes():
    def reply(qid, req, n):
        if qid == "qa":
            return [" Yes.\n\nFollow up: Who founded Acme Rails?\n", " Lida Born.\nFollow up: Where was Lida Born born?\n",
                    " Quarrytown.\nSo the final answer is: Quarrytown.\n"][n]
        return " No.\nSo the final answer is: Orb."

    out, gen, ret = run("self_ask", SelfAskConfig(passages=1), reply)
    a, b = out["qa"], out["qb"]
    assert [len(x) for x in gen.batches] == [2, 1, 1]
    assert ret.batches == [["Who founded Acme Rails?"], ["Where was Lida Born born?"]]  # a blank line is no stop
    assert all("\n\n" not in req.stop for batch in gen.batches for req in batch)
    assert a.prediction == "Quarrytown" and a.stop_reason == "answered" and a.rounds == 2
    # each call continues the transcript: the follow-up, its context, "Intermediate answer:"
    last = a.calls[2]
    assert "Follow up: Who founded Acme Rails?\nContext: [1] Acme Rails: Acme Rails was founded by Lida Born.\nIntermediate answer: Lida Born." in last.output
    assert last.output.rstrip().endswith("So the final answer is: Quarrytown.")
    assert last.passage_ids == ["p-acme", "p-lida"] and a.calls[0].passage_ids == []
    assert b.prediction == "Orb" and b.rounds == 1 and b.calls[0].parsed["final"] == "Orb"


def test_a_self_ask_loop_that_never_finishes_is_bounded_and_recorded():
    def reply(qid, req, n):
        if req.prefix.endswith("So the final answer is:"):
            return " Orb." if qid == "qb" else " ???"
        if qid == "qa":
            return f"\nFollow up: New question number {n}?\n"  # a new sub-question forever
        return [" Yes.\nFollow up: How old is Orb?\n", " 5.\nFollow up: how old is orb\n"][n]

    out, gen, _ = run("self_ask", SelfAskConfig(max_rounds=3), reply)
    a, b = out["qa"], out["qb"]
    assert a.stop_reason == "max_rounds" and a.rounds == 3 and len(a.calls) == 5 and a.calls[-1].role == "answer"
    assert a.prediction == "???"
    assert b.stop_reason == "repeated_follow_up" and b.prediction == "Orb"
    assert b.meta["events"][-1]["event"] == "follow up asked again"
    # a reply with neither a follow-up nor a final answer: recorded, forced, no crash
    out, _, _ = run("self_ask", SelfAskConfig(), lambda q, r, n: " ..." if not r.prefix.endswith("is:") else " Orb",
                    items=[B])
    assert out["qb"].stop_reason == "no_guidance" and out["qb"].calls[0].error.startswith("neither")


# -- ReAct -------------------------------------------------------------------------------------------


def test_react_searches_observes_and_finishes():
    def reply(qid, req, n):
        if qid == "qa":
            return [" I need the founder.\nAction 1: Search[Acme Rails founder]\n",
                    " Lida Born founded it.\nAction 2: Search[Lida Born birthplace]",
                    " Found it.\nAction 3: Finish[Quarrytown]"][n]
        # B never writes an action with its thought: ReAct asks for the action on its own line
        return [" Hmm.\nI will look around.", " nothing", " Orb is older.", " Finish[Orb]"][n]

    out, gen, ret = run("react", ReActConfig(passages=1), reply)
    a, b = out["qa"], out["qb"]
    assert ret.batches == [["Acme Rails founder"], ["Lida Born birthplace"]]
    assert [len(x) for x in gen.batches] == [2, 1, 2, 1, 1]
    asked = gen.batches[1][0]
    assert asked.prefix.endswith("Thought 1: Hmm.\nAction 1:") and asked.stop == ("\n",)
    assert a.prediction == "Quarrytown" and a.rounds == 3 and a.stop_reason == "answered"
    third = a.calls[2].output
    assert "Action 1: Search[Acme Rails founder]\nObservation 1: [1] Acme Rails: Acme Rails was founded by Lida Born.\nThought 2:" in third
    assert a.calls[2].passage_ids == ["p-acme", "p-lida"]
    # the action asked for is unreadable too: ReAct's invalid-action observation, recorded, and the loop goes on
    assert b.calls[1].error == "no Search[query] or Finish[answer] action" and b.calls[0].error is None
    assert "Action 1: nothing\nObservation 1: Invalid action." in b.calls[2].output
    assert b.prediction == "Orb" and b.stop_reason == "answered" and b.rounds == 2
    assert b.calls[3].output.endswith("Thought 2: Orb is older.\nAction 2: Finish[Orb]")


def test_react_forces_finish_after_max_rounds_and_survives_a_refused_search():
    def reply(qid, req, n):
        if req.prefix.endswith("Finish["):
            return "Orb"
        return " Look.\nAction: Search[acme refused]" if qid == "qa" else " Look.\nAction: Search[]"

    out, gen, ret = run("react", ReActConfig(max_rounds=2), reply, retriever=Retriever(refuse="refused"))
    a, b = out["qa"], out["qb"]
    assert a.stop_reason == "max_rounds" and a.rounds == 2 and a.calls[-1].role == "answer" and a.prediction == "Orb"
    assert a.calls[-1].output.endswith("Action 3: Finish[Orb")
    assert any(e["event"].startswith("retrieval error") for e in a.meta["events"])
    assert b.calls[0].error == "no Search[query] or Finish[answer] action"  # Search[] has no query


# -- Iter-RetGen -------------------------------------------------------------------------------------


def test_iter_retgen_appends_the_previous_generation_to_the_query_for_t_iterations():
    def reply(qid, req, n):
        return [" Acme Rails was founded by Lida Born. So the answer is: Lida Born.",
                " Lida Born was born in Quarrytown. So the answer is: Quarrytown."][n] if qid == "qa" else " Orb."

    out, gen, ret = run("iter_retgen", IterRetGenConfig(max_rounds=2, passages=1), reply)
    a, b = out["qa"], out["qb"]
    assert ret.batches[0] == [A.question, B.question]
    assert ret.batches[1][0] == A.question + " Acme Rails was founded by Lida Born. So the answer is: Lida Born."
    assert [len(x) for x in gen.batches] == [2, 2]
    assert a.prediction == "Quarrytown" and a.rounds == 2 and a.stop_reason == "answered"
    assert [c.parsed["answer"] for c in a.calls] == ["Lida Born", "Quarrytown"]
    assert b.stop_reason == "no_answer_mark" and b.prediction == "Orb"


# -- failures of the generator, registry, config, training records -------------------------------------


def test_a_refused_generation_is_recorded_per_call_and_the_others_go_on():
    def reply(qid, req, n):
        if len(req.prompt) > 0 and qid == "qb":
            return GenerationError("prompt too long")
        return " So the answer is: Quarrytown."

    class OneByOne(Scripted):
        def generate(self, requests):
            if len(requests) > 1 and any(self._qid(r) == "qb" for r in requests):
                raise GenerationError("batch refused")
            return super().generate(requests)

    gen = OneByOne(reply)
    trajs = get_method("ra_cot").strategy(RACoTConfig()).run([A, B], gen, Retriever())
    a, b = trajs
    assert a.prediction == "Quarrytown" and b.prediction is None
    assert b.calls[0].error == "generation error: prompt too long" and b.calls[0].finish_reason == "error"


@pytest.mark.parametrize("name", ["ra_cot", "react", "ircot", "self_ask", "iter_retgen"])
def test_each_baseline_is_registered_and_read_from_a_config(name, tmp_path):
    method = get_method(name)
    f = tmp_path / "eval.yaml"
    f.write_text(f"strategy:\n  name: {name}\n  passages: 3\n")
    cfg = load_config(EvalConfig, f)
    assert type(cfg.strategy) is method.config_class and cfg.strategy.passages == 3
    assert method.record_roles(cfg.strategy) == {"reason": "reason", "answer": "reason"}
    assert method.for_model(cfg.strategy, frozenset({"reason"}), False).fewshot is False
    assert method.for_model(cfg.strategy, frozenset(), False).fewshot is True
    f.write_text(f"strategy:\n  name: {name}\n  passages: 0\n")
    with pytest.raises(ConfigError, match="passages must be >= 1"):
        load_config(EvalConfig, f)


def test_star_records_of_a_correct_baseline_trajectory():
    out, _, _ = run("ircot", IRCoTConfig(max_rounds=2), lambda q, r, n: " So the answer is: Quarrytown.", items=[A])
    t = out["qa"]
    t.em = 1.0
    res = star_records([t], {A.id: A}, count_tokens=lambda s: len(s.split()))
    # the response prefix the engine fed ("Answer:") is prompt-side; the completion is what the model wrote
    assert [(r["prefix"], r["completion"]) for r in res.records_by_role["reason"]] == [
        ("Answer:", " So the answer is: Quarrytown.")]
