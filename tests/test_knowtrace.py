"""The KnowTrace engine on scripted outputs (incl. the paper's Appendix F example) and on a tiny model."""

from __future__ import annotations

import re
import time
from typing import Callable, Sequence

import pytest

from knowtrace_train.data.schema import Passage, QAItem, passage_id
from knowtrace_train.generation.base import Completion, GenerationError, GenerationRequest
from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.methods.knowtrace.outputs import JUDGEMENT
from knowtrace_train.methods.knowtrace.prompts import KG_HEADER, TRIPLETS_HEADER, answer_prefix, render_passage
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage, check_search_args
from knowtrace_train.methods.base import Strategy, run_strategy
from knowtrace_train.methods.knowtrace import KnowTrace, KnowTraceConfig, outputs
from knowtrace_train.methods.knowtrace.backtrace import filter_trajectory
from knowtrace_train.trajectory import Trajectory

J = JUDGEMENT


# -- test doubles ---------------------------------------------------------------------


def prompt_parts(prompt: str) -> dict:
    """What a scripted model needs to know about a prompt: its kind, question, graph, pair."""
    prompt = prompt[: -len(JUDGEMENT)] if prompt.endswith(JUDGEMENT) else prompt
    if prompt.endswith(answer_prefix()):
        kind = "answer"
    elif prompt.endswith(TRIPLETS_HEADER + "\n"):
        kind = "complete"
    elif prompt.endswith("Text:"):
        kind = "kg_to_text"
    else:
        kind = "explore"
    parts = {"kind": kind}
    if kind in ("explore", "answer"):
        parts["question"] = re.findall(r"^Question: (.*)$", prompt, re.M)[-1]
        kg = prompt.rsplit(KG_HEADER + "\n", 1)[1]
        kg = kg[: -len(answer_prefix())] if kind == "answer" else kg
        parts["kg"] = [] if kg.strip() == "None" else kg.strip().split("\n")
    if kind == "complete":
        block = prompt.rsplit("Documents:\n", 1)[1]
        parts["pair"] = re.findall(r"^- (.*?): (.*)$", block, re.M)[-1]
        parts["docs"] = block.split("\nInput Entity")[0].split("\n")
    if kind == "kg_to_text":
        parts["kg"] = prompt.rsplit("Knowledge triplets:\n", 1)[1][: -len("\nText:")].split("\n")
    return parts


class ScriptedGenerator:
    """Answers each request with `respond(parts, request)`; logs every batch. Token counts are words."""

    def __init__(self, respond: Callable[[dict, GenerationRequest], str], refuse: str | None = None) -> None:
        self.respond = respond
        self.refuse = refuse
        self.batches: list[list[tuple[str, str]]] = []  # (role, kind) per request
        self.log: list[str] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if self.refuse and any(self.refuse in r.prompt for r in requests):
            raise GenerationError("prompt refused")
        out = []
        kinds = []
        for r in requests:
            parts = prompt_parts(r.prompt + r.prefix)  # the response prefix the engine sent
            kinds.append((r.role, parts["kind"]))
            text = self.respond(parts, r)
            if r.prefix.endswith(JUDGEMENT):  # the judgement words were sent: go on after them
                m = re.match(r"^Whether[^\n:]*:", text)
                text = text[m.end() :] if m else text
            n = len(text.split())
            if n > r.max_new_tokens:  # a word is a token here
                text, finish = " ".join(text.split(" ")[: r.max_new_tokens]), "length"
            else:
                finish = "stop"
            out.append(Completion(text=text, prompt_tokens=len(r.prompt.split()), output_tokens=min(n, r.max_new_tokens), finish_reason=finish))
        self.batches.append(kinds)
        self.log.append(f"generate {[k for _, k in kinds]}")
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def close(self) -> None:
        self.closed = True


class WordRetriever:
    """Scores passages by shared words with the query; a query sharing none gets nothing."""

    def __init__(self, passages: Sequence[Passage], fail_on: str | None = None) -> None:
        self.passages = list(passages)
        self.calls: list[list[str]] = []
        self.fail_on = fail_on

    @staticmethod
    def _words(s: str) -> set[str]:
        return set(re.findall(r"[a-z0-9]+", s.lower())) - {"the", "a", "of", "in", "out", "find", "where", "who", "what", "is", "about", "this"}

    def search(self, queries: Sequence[str], k: int) -> list[list[ScoredPassage]]:
        check_search_args(queries, k)
        self.calls.append(list(queries))
        if self.fail_on and any(self.fail_on in q for q in queries):
            raise RetrievalError("engine refused the query")
        out = []
        for q in queries:
            qw = self._words(q)
            scored = [(len(qw & self._words(p.title + " " + p.text)), i, p) for i, p in enumerate(self.passages)]
            scored = sorted((x for x in scored if x[0] > 0), key=lambda x: (-x[0], x[1]))[:k]
            out.append([ScoredPassage(p, float(s)) for s, _, p in scored])
        return out


def P(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


# -- the paper's Appendix F example ---------------------------------------------------------

F_QUESTION = "Where was the person who wrote about the rioting being a dividing factor in Birmingham educated?"
F_PASSAGES = [
    P("James Watt", "James Watt, an industrialist, wrote about the rioting being a dividing factor in Birmingham."),
    P("Birmingham", "Birmingham is located in the West Midlands region of England."),
    P("James Watt (education)", "James Watt was educated at the University of Glasgow."),
    P("Cotton", "Cotton is a soft fibre."),
]
F_EXPLORE = {
    0: "Whether the collected knowledge triplets are sufficient: No\n"
    "What entity-relation pairs to retrieve in the current step:\n"
    "- The rioting being a dividing factor in Birmingham: Find out who wrote about this topic.\n"
    "- Birmingham: Find out where Birmingham is located.",
    3: f"{J} No\nRetrieval Guidance:\n- James Watt: Find out which school James Watt attended.",
    4: f"{J} Yes\nThought: James Watt wrote about the rioting being a dividing factor in Birmingham. "
    "He was educated at the University of Glasgow.\nAnswer: University of Glasgow",
}
F_COMPLETE = {
    "The rioting being a dividing factor in Birmingham": "(James Watt, wrote, the rioting being a dividing factor in Birmingham);\n"
    "(James Watt, is, an industrialist);",
    "Birmingham": "(Birmingham, is located in, the West Midlands region of England)",
    "James Watt": "(James Watt, was educated at, University of Glasgow)",
}


def appendix_f(parts: dict, req: GenerationRequest) -> str:
    if parts["kind"] == "explore":
        return F_EXPLORE[len(parts["kg"])]
    if parts["kind"] == "complete":
        return F_COMPLETE[parts["pair"][0]]
    raise AssertionError(parts)


@pytest.mark.parametrize("prefill", [True, False])
def test_appendix_f_example(prefill):
    item = QAItem(id="f1", question=F_QUESTION, answers=("University of Glasgow",), dataset="musique")
    gen = ScriptedGenerator(appendix_f)
    ret = WordRetriever(F_PASSAGES)
    done: list[Trajectory] = []
    [traj] = KnowTrace(KnowTraceConfig(passages=2, prefill_judgement=prefill)).run([item], gen, ret, on_done=done.append)
    explore = traj.calls[0]
    if prefill:  # the judgement words were sent and are recorded as the start of the output
        assert explore.output.startswith(J + " No\nWhat entity-relation pairs") and not explore.prompt.endswith(J)
    else:
        assert explore.output == F_EXPLORE[0]
    assert done == [traj]
    assert traj.id == "f1" and traj.strategy == "knowtrace" and traj.dataset == "musique"
    assert (traj.prediction, traj.stop_reason, traj.rounds) == ("University of Glasgow", "answered", 3)
    assert traj.thought.startswith("James Watt wrote about the rioting")
    assert [c.role for c in traj.calls] == ["explore", "complete", "complete", "explore", "complete", "explore"]
    assert [c.round for c in traj.calls] == [1, 1, 1, 2, 2, 3]

    g = traj.graph
    assert [t.triplet for t in g.triplets] == [
        Triplet("James Watt", "wrote", "the rioting being a dividing factor in Birmingham"),
        Triplet("James Watt", "is", "an industrialist"),
        Triplet("Birmingham", "is located in", "the West Midlands region of England"),
        Triplet("James Watt", "was educated at", "University of Glasgow"),
    ]
    rioting = GuidancePair("The rioting being a dividing factor in Birmingham", "Find out who wrote about this topic.")
    watt = GuidancePair("James Watt", "Find out which school James Watt attended.")
    assert [t.round for t in g.triplets] == [1, 1, 1, 2]
    assert [t.pair for t in g.triplets] == [rioting, rioting, GuidancePair("Birmingham", "Find out where Birmingham is located."), watt]
    assert [t.call for t in g.triplets] == [1, 1, 2, 4]
    for t in g.triplets:  # the provenance points at the completion call that produced it
        call = traj.calls[t.call]
        assert call.role == "complete" and call.pair == t.pair and tuple(call.passage_ids) == t.passage_ids
    assert [c.triplets for c in traj.calls] == [[], [0, 1], [2], [], [3], []]
    # Initial entities: expansion points not yet in the graph (James Watt already was in round 2).
    assert [(e.name, e.round, e.call) for e in g.initial_entities] == [
        ("The rioting being a dividing factor in Birmingham", 1, 0),
        ("Birmingham", 1, 0),
    ]
    # Each completion read the passages retrieved for its pair, and its retrieved tokens count them.
    c = traj.calls[4]
    assert F_PASSAGES[2].id in c.passage_ids
    by_id = {p.id: p for p in F_PASSAGES}
    assert c.retrieved_tokens == sum(len(render_passage(by_id[i]).split()) for i in c.passage_ids)
    assert traj.retrieved_tokens == sum(x.retrieved_tokens for x in traj.calls) > 0
    assert traj.calls[0].parsed["pairs"][1] == ["Birmingham", "Find out where Birmingham is located."]
    assert traj.calls[1].parsed["triplets"][1] == ["James Watt", "is", "an industrialist"]
    assert traj.calls[0].prompt_tokens > 0 and traj.wall_time > 0
    # One retrieval per round, all pairs of the round in it.
    assert [len(q) for q in ret.calls] == [2, 1]
    assert Trajectory.from_dict(traj.to_dict()).to_dict() == traj.to_dict()


def test_engine_is_a_strategy():
    s: Strategy = KnowTrace()
    assert s.name == "knowtrace"


# -- batching ------------------------------------------------------------------------------

WORLD = [
    P("Alpha", "Alpha was written by Bern."),
    P("Bern", "Bern was born in Corla."),
    P("Delta", "Delta was written by Esk."),
    P("Esk", "Esk was born in Fenn."),
    P("Gant", "Gant was founded in 1900."),
    P("Hale", "Hale was founded in 1950."),
]
FACTS = {
    "Alpha": "(Alpha; was written by; Bern)",
    "Bern": "(Bern; was born in; Corla)",
    "Delta": "(Delta; was written by; Esk)",
    "Esk": "(Esk; was born in; Fenn)",
    "Gant": "(Gant; was founded in; 1900)",
    "Hale": "(Hale; was founded in; 1950)",
}
QUESTIONS = {
    "Where was the author of Alpha born?": (["Alpha", "Bern"], "Corla"),
    "Where was the author of Delta born?": (["Delta", "Esk"], "Fenn"),
    "Which was founded first, Gant or Hale?": (["Gant", "Hale"], "Gant"),
}
GUIDANCE = {"Alpha": "the author", "Delta": "the author", "Bern": "the birthplace", "Esk": "the birthplace",
            "Gant": "the year founded", "Hale": "the year founded"}


def known(kg: list[str]) -> set[str]:
    """Entities whose fact the graph holds, as triplets, paths or sentences."""
    text = "\n".join(kg)
    return {e for e in FACTS if f"({e};" in text or f"{e} was" in text or f"{e} -[" in text}


def chain_model(parts: dict, req: GenerationRequest) -> str:
    """Chains ask for one hop at a time; the comparison asks for both sides at once."""
    if parts["kind"] == "complete":
        return FACTS.get(parts["pair"][0], "")
    needed, ans = QUESTIONS[parts["question"]]
    have = known(parts["kg"])
    missing = [e for e in needed if e not in have]
    if parts["kind"] == "answer" or not missing:
        body = f" The graph says {ans}.\nAnswer: {ans}"
        return body if parts["kind"] == "answer" else f"{J} Yes\nThought:{body}"
    ask = missing if "first" in parts["question"] else missing[:1]
    return f"{J} No\nRetrieval Guidance:\n" + "\n".join(f"- {e}: {GUIDANCE[e]}" for e in ask)


def items() -> list[QAItem]:
    return [QAItem(id=f"q{i}", question=q, answers=(s[-1],)) for i, (q, s) in enumerate(QUESTIONS.items())]


def test_questions_advance_together_in_batches():
    gen = ScriptedGenerator(chain_model)
    ret = WordRetriever(WORLD)
    trajs = KnowTrace(KnowTraceConfig(passages=1)).run(items(), gen, ret)
    assert [t.prediction for t in trajs] == ["Corla", "Fenn", "Gant"]
    assert [t.rounds for t in trajs] == [3, 3, 2]
    assert [[k for _, k in b] for b in gen.batches] == [
        ["explore"] * 3,
        ["complete"] * 4,  # the comparison question asked for two pairs
        ["explore"] * 3,  # round 2: the comparison question answers here
        ["complete"] * 2,
        ["explore"] * 2,
    ]
    assert [len(q) for q in ret.calls] == [4, 2]  # one retrieval per round for all pairs
    roles = {k: r for b in gen.batches for r, k in b}
    assert roles == {"explore": "explore", "complete": "complete"}


def test_batched_engine_agrees_with_one_question_at_a_time():
    batched = KnowTrace(KnowTraceConfig(passages=2)).run(items(), ScriptedGenerator(chain_model), WordRetriever(WORLD))
    single = [KnowTrace(KnowTraceConfig(passages=2)).run([it], ScriptedGenerator(chain_model), WordRetriever(WORLD))[0] for it in items()]
    strip = lambda t: {k: v for k, v in t.to_dict().items() if k != "wall_time"}  # noqa: E731
    assert [strip(t) for t in batched] == [strip(t) for t in single]


def test_a_pipelined_run_admits_the_next_question_as_one_ends_and_gives_the_same_trajectories():
    """width 2 over three questions: when the comparison question answers (round 2), q1 takes its place in
    the next step beside q0's round 3, so one exploration batch mixes rounds; every trajectory (its calls'
    rounds included) equals the lockstep run's."""
    order = [items()[2], items()[0], items()[1]]
    gen = ScriptedGenerator(chain_model)
    done = []
    piped = KnowTrace(KnowTraceConfig(passages=1)).run(order, gen, WordRetriever(WORLD), width=2,
                                                       on_done=lambda t: done.append(t.id))
    assert [[k for _, k in b] for b in gen.batches] == [
        ["explore"] * 2, ["complete"] * 3,  # q2 (two pairs) and q0, round 1
        ["explore"] * 2, ["complete"],      # q2 answers; q0 asks for Bern
        ["explore"] * 2, ["complete"],      # q0's round 3 (answers) beside q1's round 1
        ["explore"], ["complete"], ["explore"],  # q1 alone: rounds 2 and 3
    ]
    assert done == ["q2", "q0", "q1"]
    assert [c.round for c in piped[2].calls] == [1, 1, 2, 2, 3]
    lockstep = KnowTrace(KnowTraceConfig(passages=1)).run(order, ScriptedGenerator(chain_model), WordRetriever(WORLD))
    strip = lambda t: {k: v for k, v in t.to_dict().items() if k != "wall_time"}  # noqa: E731
    assert [strip(t) for t in piped] == [strip(t) for t in lockstep]
    with pytest.raises(ValueError, match="width must be >= 1"):
        KnowTrace().run(order, gen, WordRetriever(WORLD), width=0)


def test_run_strategy_groups_a_strategy_that_does_not_pipeline():
    seen = []

    class Lockstep:
        name = "lockstep"

        def run(self, items, generator, retriever, on_done=None):
            seen.append([it.id for it in items])
            return [Trajectory(id=it.id, question_id=it.id, question=it.question, answers=list(it.answers), dataset="t",
                               strategy=self.name) for it in items]

    qs = [QAItem(id=f"x{i}", question="?", answers=("a",)) for i in range(5)]
    out = run_strategy(Lockstep(), qs, None, None, width=2)
    assert seen == [["x0", "x1"], ["x2", "x3"], ["x4"]] and [t.id for t in out] == [f"x{i}" for i in range(5)]
    seen.clear()
    run_strategy(Lockstep(), qs, None, None)
    assert seen == [[f"x{i}" for i in range(5)]]
    # KnowTrace pipelines: one run of every question, width passed on
    gen = ScriptedGenerator(chain_model)
    run_strategy(KnowTrace(KnowTraceConfig(passages=1)), items(), gen, WordRetriever(WORLD), width=1)
    assert max(len(b) for b in gen.batches if b[0][1] == "explore") == 1


def test_on_done_fires_when_a_question_finishes_not_at_the_end():
    gen = ScriptedGenerator(chain_model)
    events = gen.log
    KnowTrace(KnowTraceConfig(passages=1)).run(items(), gen, WordRetriever(WORLD), on_done=lambda t: events.append(f"done {t.id}"))
    assert events.index("done q2") < events.index("generate ['complete', 'complete']")
    assert events[-2:] == ["done q0", "done q1"]


def test_wall_time_shares_add_up():
    def slow(parts, req):
        time.sleep(0.002)
        return chain_model(parts, req)

    t0 = time.perf_counter()
    trajs = KnowTrace().run(items(), ScriptedGenerator(slow), WordRetriever(WORLD))
    elapsed = time.perf_counter() - t0
    total = sum(t.wall_time for t in trajs)
    assert all(t.wall_time > 0 for t in trajs)
    assert total <= elapsed + 1e-6
    # The batches and the rounds' bookkeeping are attributed (only setting up the run is not);
    # loose, because a busy machine can pause the process anywhere.
    assert total >= 0.5 * elapsed


# -- stopping and bad input -------------------------------------------------------------------


def never_sure_model():
    """Always asks for more; every completion adds a new triplet (so only max_rounds stops it)."""
    counter = iter(range(100))

    def never_sure(parts, req):
        if parts["kind"] == "explore":
            return f"{J} No\nRetrieval Guidance:\n- Alpha: more"
        if parts["kind"] == "complete":
            return f"(Alpha; fact; {next(counter)})"
        return " I must answer now.\nAnswer: Bern"

    return never_sure


def test_max_rounds_ends_with_a_forced_answer():
    gen = ScriptedGenerator(never_sure_model())
    [t] = KnowTrace(KnowTraceConfig(max_rounds=2)).run(items()[:1], gen, WordRetriever(WORLD))
    assert (t.stop_reason, t.rounds, t.prediction, t.thought) == ("max_rounds", 2, "Bern", "I must answer now.")
    assert [c.role for c in t.calls] == ["explore", "complete", "explore", "complete", "answer"]
    last = t.calls[-1]
    # the exploration prompt, answered after the prefix (judgement Yes, Thought:) that was sent
    assert last.output.startswith(answer_prefix()) and KG_HEADER in last.prompt and last.round == 2
    assert last.parsed["answer"] == "Bern" and last.error is None
    assert gen.batches[-1] == [("explore", "answer")]  # the forced answer runs on the exploration role
    assert len(t.graph.triplets) == 2


def test_no_progress_when_a_round_adds_nothing():
    def repeats(parts, req):
        if parts["kind"] == "explore":
            return f"{J} No\nRetrieval Guidance:\n- Alpha: the author"
        if parts["kind"] == "complete":
            return "(Alpha; was written by; Bern)"
        return " Bern wrote it.\nAnswer: Bern"

    [t] = KnowTrace().run(items()[:1], ScriptedGenerator(repeats), WordRetriever(WORLD))
    assert (t.stop_reason, t.rounds, t.prediction) == ("no_progress", 2, "Bern")
    assert [c.role for c in t.calls] == ["explore", "complete", "explore", "complete", "answer"]
    assert t.calls[3].triplets == [] and t.calls[3].parsed["triplets"] == [["Alpha", "was written by", "Bern"]]


@pytest.mark.parametrize(
    "explore_output",
    ["", "I think so.", f"{J} No\nI need more.", f"{J} Yes\nThought: hmm", "\x00\x01 ((((;;;;", f"{J} No\nRetrieval Guidance:\n- N/A: none"],
)
def test_garbage_exploration_ends_with_a_reason(explore_output):
    def garbage(parts, req):
        return explore_output if parts["kind"] == "explore" else "Answer: Corla"

    [t] = KnowTrace().run(items()[:1], ScriptedGenerator(garbage), WordRetriever(WORLD))
    assert t.stop_reason == "no_guidance" and t.rounds == 1
    assert t.calls[0].error  # recorded on the call
    assert [c.role for c in t.calls] == ["explore", "answer"]
    assert t.prediction == "Corla"


def test_garbage_everywhere_never_kills_the_run():
    outputs = ["", "((((", "Answer:", "- : \n- :", f"{J} No\nRetrieval Guidance:\n- Alpha: x", "(a; b; not found)", "nonsense"]
    state = iter(range(10_000))

    def chaos(parts, req):
        return outputs[next(state) % len(outputs)]

    trajs = KnowTrace(KnowTraceConfig(max_rounds=3)).run(items(), ScriptedGenerator(chaos), WordRetriever(WORLD))
    assert all(t.stop_reason in {"answered", "max_rounds", "no_progress", "no_guidance"} for t in trajs)
    assert all(Trajectory.from_dict(t.to_dict()).to_dict() == t.to_dict() for t in trajs)


def test_completion_without_triplets_is_recorded_and_the_question_goes_on():
    def model(parts, req):
        if parts["kind"] == "complete":
            return "The documents do not say." if parts["pair"][0] == "Gant" else FACTS[parts["pair"][0]]
        return chain_model(parts, req)

    trajs = KnowTrace().run(items()[2:], ScriptedGenerator(model), WordRetriever(WORLD))
    t = trajs[0]
    gant = next(c for c in t.calls if c.pair and c.pair.entity == "Gant")
    assert gant.error == "no usable triplet in the output" and gant.parsed["rejected"] == ["The documents do not say."]
    assert len(t.graph.triplets) == 1  # Hale's triplet: the round still made progress
    assert t.rounds >= 2


def test_empty_retrieval_is_recorded_and_skips_the_completion():
    def model(parts, req):
        if parts["kind"] == "explore":
            return f"{J} No\nRetrieval Guidance:\n- Zzyzx: qqq"
        return " Nothing known.\nAnswer: unknown"

    [t] = KnowTrace().run(items()[:1], ScriptedGenerator(model), WordRetriever(WORLD))
    assert t.meta["events"] == [{"round": 1, "pair": ["Zzyzx", "qqq"], "event": "empty retrieval"}]
    assert [c.role for c in t.calls] == ["explore", "answer"]
    assert t.stop_reason == "no_progress"


def test_refused_generation_is_retried_call_by_call():
    bad = QAItem(id="bad", question="POISON question?", answers=("x",))
    gen = ScriptedGenerator(chain_model, refuse="POISON")
    trajs = KnowTrace().run([bad] + items(), gen, WordRetriever(WORLD))
    assert trajs[0].stop_reason.startswith("error: generation error")
    assert trajs[0].calls[0].error.startswith("generation error") and trajs[0].calls[-1].role == "answer"
    assert trajs[0].prediction is None
    assert [t.prediction for t in trajs[1:]] == ["Corla", "Fenn", "Gant"]


def test_refused_retrieval_falls_back_query_by_query():
    ret = WordRetriever(WORLD, fail_on="Gant")
    trajs = KnowTrace().run(items(), ScriptedGenerator(chain_model), ret)
    gant = trajs[2]
    assert any(e["event"].startswith("retrieval error") for e in gant.meta["events"])
    assert [t.prediction for t in trajs[:2]] == ["Corla", "Fenn"]


def test_a_completion_cut_at_its_token_limit_loses_the_broken_triplet():
    def looping(parts, req):
        if parts["kind"] == "complete":
            return "(Alpha; was written by; Bern)\n" * 3 + "(Alpha; was first printed in; 1901)\n" * 10
        return chain_model(parts, req)

    cfg = KnowTraceConfig(max_rounds=1)
    cfg.max_new_tokens.complete = 23  # ends inside a triplet
    [t] = KnowTrace(cfg).run(items()[:1], ScriptedGenerator(looping), WordRetriever(WORLD))
    c = t.calls[1]
    assert c.finish_reason == "length" and c.output.endswith("\n(Alpha;")
    assert [x.triplet for x in t.graph.triplets] == [Triplet("Alpha", "was written by", "Bern"), Triplet("Alpha", "was first printed in", "1901")]


def test_max_pairs_caps_the_guidance():
    def many(parts, req):
        if parts["kind"] == "explore":
            return f"{J} No\nRetrieval Guidance:\n" + "\n".join(f"- {x}: facts" for x in ["Alpha", "Bern", "Delta", "Esk"])
        if parts["kind"] == "complete":
            return FACTS[parts["pair"][0]]
        return " x\nAnswer: y"

    [t] = KnowTrace(KnowTraceConfig(max_pairs=2, max_rounds=1)).run(items()[:1], ScriptedGenerator(many), WordRetriever(WORLD))
    assert [c.pair.entity for c in t.calls if c.role == "complete"] == ["Alpha", "Bern"]
    assert t.stop_reason == "max_rounds"


# -- KG renderings in the loop ------------------------------------------------------------------


def test_kg_to_text_runs_as_its_own_role():
    seen_prompts = []

    def model(parts, req):
        if parts["kind"] == "kg_to_text":
            return " " + " ".join(re.sub(r"[();]", "", line) + "." for line in parts["kg"]) + "\n\nKnowledge triplets:"
        if parts["kind"] == "explore":
            seen_prompts.append(req.prompt + req.prefix)
        return chain_model(parts, req)

    gen = ScriptedGenerator(model)
    trajs = KnowTrace(KnowTraceConfig(kg_format="text", passages=1)).run(items()[2:], gen, WordRetriever(WORLD))
    t = trajs[0]
    assert [c.role for c in t.calls] == ["explore", "complete", "complete", "kg_to_text", "explore"]
    assert t.prediction == "Gant"
    k = t.calls[3]
    assert k.parsed["text"] == "Gant was founded in 1900. Hale was founded in 1950."
    assert seen_prompts[1].endswith(f"{KG_HEADER}\nGant was founded in 1900. Hale was founded in 1950.\n{J}")
    assert ("kg_to_text", "kg_to_text") in gen.batches[2]


def test_paths_rendering_reaches_the_prompt():
    seen = []

    def model(parts, req):
        if parts["kind"] == "explore":
            seen.append(req.prompt + req.prefix)
        return chain_model(parts, req)

    KnowTrace(KnowTraceConfig(kg_format="paths", passages=1)).run(items()[:1], ScriptedGenerator(model), WordRetriever(WORLD))
    assert seen[2].endswith(f"{KG_HEADER}\nAlpha -[was written by]-> Bern -[was born in]-> Corla\n{J}")


def test_fewshot_off_and_token_budgets_reach_the_requests():
    reqs = []

    def model(parts, req):
        reqs.append(req)
        return chain_model(parts, req)

    cfg = KnowTraceConfig(passages=1)
    cfg.fewshot.explore = False
    cfg.max_new_tokens.complete = 33
    KnowTrace(cfg).run(items()[:1], ScriptedGenerator(model), WordRetriever(WORLD))
    explore = [r for r in reqs if r.role == "explore"]
    complete = [r for r in reqs if r.role == "complete"]
    assert all(r.prompt.count("Question:") == 1 for r in explore)
    assert all(r.prompt.count("Documents:") == 5 and r.max_new_tokens == 33 for r in complete)
    assert all("\nQuestion:" in r.stop for r in explore)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"max_rounds": 0}, "max_rounds"), ({"passages": 0}, "passages"), ({"kg_format": "graph"}, "kg_format"), ({"max_pairs": -1}, "max_pairs")],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KnowTraceConfig(**kwargs)


# -- the engine on a real (tiny, random) model ------------------------------------------------


def test_engine_on_a_tiny_model(tiny_model_dir):
    """Random weights write garbage: every question still ends with a recorded reason, every call
    has real token counts, and the batched run matches the one-question-at-a-time run."""
    from knowtrace_train.generation import GeneratorConfig, build_generator

    # float32 on every device ('auto' is bf16 on GPUs, whose rounding would let the batched and the
    # single run part at a random model's near-ties)
    gen = build_generator(GeneratorConfig(model=str(tiny_model_dir), progress=False, dtype="float32"))
    cfg = KnowTraceConfig(max_rounds=2, passages=2)
    cfg.max_new_tokens.explore = cfg.max_new_tokens.complete = 12
    cfg.max_new_tokens.answer = 6
    ret = WordRetriever(WORLD)
    trajs = KnowTrace(cfg).run(items(), gen, ret)
    assert [t.id for t in trajs] == ["q0", "q1", "q2"]
    for t in trajs:
        assert t.stop_reason in {"answered", "max_rounds", "no_progress", "no_guidance"}
        assert t.calls and all(c.prompt_tokens > 0 and c.output_tokens >= 0 for c in t.calls)
        assert t.calls[0].role == "explore" and t.calls[-1].role in {"explore", "answer"}
        assert Trajectory.from_dict(t.to_dict()).to_dict() == t.to_dict()
    single = KnowTrace(cfg).run(items()[:1], gen, ret)[0]
    assert [c.output for c in single.calls] == [c.output for c in trajs[0].calls]


def test_each_call_samples_from_its_own_reproducible_stream():
    """Every request of a run carries its own seed (trajectory id and call index); a rerun sends the same ones."""
    def seeds_of_a_run(base_seed: int) -> list[tuple[str, int, int]]:
        sent: list[tuple[str, int]] = []

        def respond(parts, req):
            sent.append((req.seed, req.temperature))
            return chain_model(parts, req)

        trajs = KnowTrace(KnowTraceConfig(temperature=0.7, seed=base_seed)).run(
            items(), ScriptedGenerator(respond), WordRetriever(WORLD))
        assert all(t == 0.7 for _, t in sent)
        return [s for s, _ in sent], trajs

    first, trajs = seeds_of_a_run(0)
    assert len(set(first)) == len(first) == sum(len(t.calls) for t in trajs)
    again, _ = seeds_of_a_run(0)
    assert again == first
    other, _ = seeds_of_a_run(1)
    assert not set(other) & set(first)
    from knowtrace_train.generation.base import request_seed

    t = trajs[0]
    assert request_seed(0, t.id, 0) in first and request_seed(0, t.id, len(t.calls) - 1) in first


# -- the forced answer and the pairs that never ran, as training signals -------------------------------


def _repeats(parts, req):
    """Asks the same pair every round; the second completion adds nothing (a no-progress stop)."""
    if parts["kind"] == "explore":
        return f"{J} No\nRetrieval Guidance:\n- Alpha: the author"
    if parts["kind"] == "complete":
        return "(Alpha; was written by; Bern)"
    return " Bern wrote Alpha.\nAnswer: Bern"


def _records(traj, mode):
    from knowtrace_train.methods.knowtrace.backtrace import backtrace_trajectories

    traj.em = 1.0  # scored right, whatever the item's gold answer
    return backtrace_trajectories([traj], count_tokens=lambda s: len(s.split()), mode=mode)


def test_without_the_forced_answer_a_stop_has_no_prediction():
    [t] = KnowTrace(KnowTraceConfig(forced_answer=False)).run(items()[:1], ScriptedGenerator(_repeats), WordRetriever(WORLD))
    assert (t.stop_reason, t.rounds, t.prediction, t.thought) == ("no_progress", 2, None, None)
    assert [c.role for c in t.calls] == ["explore", "complete", "explore", "complete"]


@pytest.mark.parametrize("mode", ["backtrace", "star"])
def test_a_forced_answer_on_the_prompt_judged_no_is_not_trained(mode):
    [t] = KnowTrace().run(items()[:1], ScriptedGenerator(_repeats), WordRetriever(WORLD))
    forced, last_explore = t.calls[-1], t.calls[2]
    assert forced.role == "answer" and forced.prompt == last_explore.prompt  # the graph did not change
    res = _records(t, mode)
    assert res.records_by_role["answer"] == []
    a = res.stats["roles"]["answer"]
    assert a["tokens_all"] == a["tokens_filtered"] > 0
    if mode == "star":  # the model's own "No" on that prompt is what STaR keeps
        assert [(r["prefix"] + r["completion"]).split("\n")[0] for r in res.records_by_role["explore"]] == [f"{J} No"] * 2


def test_a_forced_answer_on_a_grown_graph_is_trained():
    [t] = KnowTrace(KnowTraceConfig(max_rounds=2)).run(items()[:1], ScriptedGenerator(never_sure_model()), WordRetriever(WORLD))
    assert t.stop_reason == "max_rounds" and t.calls[-1].prompt not in {c.prompt for c in t.calls[:-1]}
    res = _records(t, "star")
    assert [r["prefix"] + r["completion"] for r in res.records_by_role["answer"]] == [
        outputs.exploration_answer("I must answer now.", "Bern")]


def test_pairs_beyond_max_pairs_are_neither_trained_nor_counted():
    def many(parts, req):
        if parts["kind"] == "explore" and not parts["kg"]:
            return f"{J} No\nRetrieval Guidance:\n" + "\n".join(f"- {x}: facts" for x in ["Alpha", "Bern", "Delta", "Esk"])
        if parts["kind"] == "complete":
            return FACTS[parts["pair"][0]]
        return f"{J} Yes\nThought: x\nAnswer: y" if parts["kind"] == "explore" else " x\nAnswer: y"

    [t] = KnowTrace(KnowTraceConfig(max_pairs=2, max_rounds=2)).run(items()[:1], ScriptedGenerator(many), WordRetriever(WORLD))
    first = t.calls[0]
    assert len(first.parsed["pairs"]) == 4 and first.parsed["pairs_run"] == 2
    star = _records(t, "star")
    rec = star.records_by_role["explore"][0]
    assert rec["prefix"] + rec["completion"] == outputs.exploration_guidance(
        [GuidancePair("Alpha", "facts"), GuidancePair("Bern", "facts")])
    unrun = len("- Delta: facts\n- Esk: facts".split())
    [e] = [fc for fc in filter_trajectory(t, None, lambda s: len(s.split())) if fc.call.index == 0]
    # output tokens: what the model wrote after the judgement words the engine fed
    assert e.tokens_all == len(first.output[len(J):].split()) - unrun
