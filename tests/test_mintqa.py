"""MINTQA's four strategies on scripted model outputs, step by step; their parsing, the KG-to-text corpus and the breakdowns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from knowtrace_train.config import load_config
from knowtrace_train.data.schema import GoldEvidence, Passage, QAItem, SubQuestion
from knowtrace_train.generation.base import GenerationError
from knowtrace_train.methods import get_method
from knowtrace_train.methods.mintqa import MintQADecomposeConfig, MintQADynamicConfig, MintQARagConfig, MintQAConfig
from knowtrace_train.methods.mintqa.parsing import parse_answer, parse_selfanswer, parse_step
from knowtrace_train.retrieval.base import RetrievalError, ScoredPassage

from scripted import Scripted

REPO = Path(__file__).resolve().parents[1]


# -- scripted parts ------------------------------------------------------------------------------------


class Library:
    """A retriever over fixed passages: a query gets the passages whose title it names (none: empty)."""

    def __init__(self, passages) -> None:
        self.passages = passages
        self.queries: list[list[str]] = []

    def search(self, queries, k):
        self.queries.append(list(queries))
        return [[ScoredPassage(p, 1.0) for p in self.passages if p.title.lower() in q.lower()][:k] for q in queries]


JAWS = Passage("p1", "Jaws", "Jaws is a 1975 film directed by Steven Spielberg.")
SPIELBERG = Passage("p2", "Steven Spielberg", "Steven Spielberg was born in Cincinnati.")
LIBRARY = [JAWS, SPIELBERG]


def item(i=0, question="Where was the director of Jaws born?", answer="Cincinnati", hops=2) -> QAItem:
    return QAItem(id=f"q{i}", question=question, answers=(answer,), dataset="toy", type="bridge", hops=hops)


def last_task(prompt: str) -> str:
    """The part of a prompt after its exemplars (the question being asked)."""
    return prompt.rsplit("\n\n", 1)[-1]


def run(config, items, script, library=LIBRARY):
    gen, lib = Scripted(script), Library(library)
    done = []
    trajs = get_method(config.name).strategy(config).run(items, gen, lib, on_done=done.append)
    assert [t.id for t in sorted(done, key=lambda t: t.id)] == sorted(t.id for t in trajs)
    return trajs, gen, lib


# -- parametric and direct RAG --------------------------------------------------------------------------


def test_parametric_answers_in_one_batch_without_retrieval():
    items = [item(0), item(1, "Which river flows through Rome?", "Tiber", hops=1)]
    trajs, gen, lib = run(MintQAConfig(), items, lambda role, p: " Tiber.\nQuestion: more" if "Rome" in last_task(p) else " Paris")
    assert len(gen.batches) == 1 and [r.role for r in gen.batches[0]] == ["answer", "answer"] and not lib.queries
    assert [t.prediction for t in trajs] == ["Paris", "Tiber"]
    t = trajs[1]
    assert t.strategy == "mintqa_parametric" and t.stop_reason == "answered" and t.rounds == 1
    assert t.meta["retrievals"] == 0 and t.meta["subquestions"] == [] and t.calls[0].parsed == {"answer": "Tiber"}
    assert last_task(t.calls[0].prompt) == "Question: Which river flows through Rome?\nAnswer:"


def test_direct_rag_retrieves_top_passages_for_the_whole_question_and_records_an_empty_retrieval():
    items = [item(0, "Who directed Jaws?", "Steven Spielberg", 1), item(1, "Who wrote Ulysses?", "James Joyce", 1)]
    trajs, gen, lib = run(MintQARagConfig(), items, lambda role, p: "Steven Spielberg" if "Jaws is" in p else "")
    assert lib.queries == [["Who directed Jaws?", "Who wrote Ulysses?"]] and len(gen.batches) == 1
    a, b = trajs
    assert a.prediction == "Steven Spielberg" and a.calls[0].passage_ids == ["p1"] and a.retrieved_tokens > 0
    assert a.meta["retrievals"] == 1 and a.em is None
    # nothing found: the question is answered over no passages, and the event recorded
    assert "(none found)" in b.calls[0].prompt and b.meta["events"][0]["event"] == "empty retrieval"
    assert b.prediction is None and b.calls[0].error == "empty answer" and b.stop_reason == "answered"


# -- decomposition-then-retrieval -------------------------------------------------------------------------


def jaws_script(role, prompt):
    task = last_task(prompt)
    if role == "decompose":
        if "Answer 2: Cincinnati" in task:
            return " finish"
        if "Answer 1: Steven Spielberg" in task:
            return " Where was Steven Spielberg born? Then we know."
        return "Next sub-question: Who directed the film Jaws?"
    if role == "subanswer":
        return "Steven Spielberg" if "directed" in task else "Cincinnati."
    if role == "answer":
        return "Final answer: Cincinnati" if "Answer 2: Cincinnati" in task else "no idea"
    raise AssertionError(role)


def test_decompose_follows_its_loop_step_by_step():
    cfg = MintQADecomposeConfig()
    assert (cfg.passages, cfg.max_steps) == (5, 5)
    (t,), gen, lib = run(cfg, [item()], jaws_script)
    assert [c.role for c in t.calls] == ["decompose", "subanswer", "decompose", "subanswer", "decompose", "answer"]
    assert [c.round for c in t.calls] == [1, 1, 2, 2, 3, 3]
    assert lib.queries == [["Who directed the film Jaws?"], ["Where was Steven Spielberg born?"]]
    assert t.calls[0].parsed == {"subquestion": "Who directed the film Jaws?", "finish": False}
    assert t.calls[2].parsed["subquestion"] == "Where was Steven Spielberg born?"  # cut at its question mark
    assert t.calls[4].parsed == {"subquestion": None, "finish": True}
    assert t.calls[1].passage_ids == ["p1"] and t.calls[3].passage_ids == ["p2"]
    assert t.meta["subquestions"] == [
        {"step": 1, "question": "Who directed the film Jaws?", "answer": "Steven Spielberg", "retrieved": True},
        {"step": 2, "question": "Where was Steven Spielberg born?", "answer": "Cincinnati", "retrieved": True},
    ]
    assert t.meta["retrievals"] == 2 and t.stop_reason == "finished" and t.rounds == 3
    assert last_task(t.calls[5].prompt).startswith("Main question: Where was the director of Jaws born?\nSub-question 1:")
    assert t.prediction == "Cincinnati"


def test_decompose_advances_questions_together_one_batch_per_kind_and_step():
    other = item(1, "What is the capital of Peru?", "Lima", 1)

    def script(role, prompt):
        if "Peru" in prompt and role == "decompose":
            return "finish"
        if "Peru" in prompt:
            return "Lima"
        return jaws_script(role, prompt)

    trajs, gen, _ = run(MintQADecomposeConfig(), [item(0), other], script)
    # step 1: both decompose; Peru finishes and gets its final answer; Jaws answers its sub-question
    assert [[r.role for r in b] for b in gen.batches] == [
        ["decompose", "decompose"], ["subanswer"], ["answer"], ["decompose"], ["subanswer"], ["decompose"], ["answer"]]
    assert trajs[1].prediction == "Lima" and trajs[1].meta["subquestions"] == [] and trajs[1].rounds == 1
    assert trajs[1].calls[1].prompt.endswith("Main question: What is the capital of Peru?\n(no sub-questions)\nFinal answer:")


def test_a_loop_that_never_finishes_is_bounded_and_a_repeated_subquestion_ends_it():
    counter = iter(range(100))
    endless = lambda role, p: f"Who is person {next(counter)}?" if role == "decompose" else "someone"  # noqa: E731
    (t,), _, lib = run(MintQADecomposeConfig(max_steps=3), [item()], endless)
    assert t.stop_reason == "max_steps" and len(t.meta["subquestions"]) == 3 and t.meta["retrievals"] == 3
    assert [c.role for c in t.calls][-1] == "answer" and len(t.calls) == 3 * 2 + 1
    assert t.meta["events"][0]["event"] == "empty retrieval"  # nobody's title matches: answered over no passages

    same = lambda role, p: "Who directed the film Jaws?" if role == "decompose" else "Steven Spielberg"  # noqa: E731
    (t,), _, _ = run(MintQADecomposeConfig(), [item()], same)
    assert t.stop_reason == "repeated_subquestion" and len(t.meta["subquestions"]) == 1 and t.rounds == 2
    assert t.meta["events"] == [{"step": 2, "event": "repeated sub-question", "subquestion": "Who directed the film Jaws?"}]

    (t,), _, _ = run(MintQADecomposeConfig(), [item()], lambda role, p: "" if role == "decompose" else "x")
    assert t.stop_reason == "no_subquestion" and t.calls[0].error.startswith("empty sub-question")


def test_a_refused_generation_is_recorded_and_the_run_goes_on():
    def script(role, prompt):
        if "Peru" in prompt and role == "decompose":
            return GenerationError("prompt too long")
        return jaws_script(role, prompt)

    trajs, gen, _ = run(MintQADecomposeConfig(), [item(0), item(1, "What is the capital of Peru?", "Lima", 1)], script)
    bad = trajs[1]
    assert bad.stop_reason.startswith("error: generation error: prompt too long") and bad.calls[0].finish_reason == "error"
    assert trajs[0].prediction == "Cincinnati"


def test_a_refused_retrieval_batch_is_retried_query_by_query():
    class Picky(Library):
        def search(self, queries, k):
            if any("Ulysses" in q for q in queries):
                raise RetrievalError("no")
            return super().search(queries, k)

    cfg = MintQARagConfig()
    items = [item(0, "Who directed Jaws?", "Steven Spielberg", 1), item(1, "Who wrote Ulysses?", "James Joyce", 1)]
    trajs = get_method(cfg.name).strategy(cfg).run(items, Scripted(lambda r, p: "x"), Picky(LIBRARY))
    assert trajs[0].calls[0].passage_ids == ["p1"] and trajs[1].meta["events"][0]["event"] == "retrieval error: no"


# -- dynamic retrieval ---------------------------------------------------------------------------------


def test_dynamic_retrieves_only_what_the_model_is_not_certain_of():
    def script(role, prompt):
        task = last_task(prompt)
        if role == "selfanswer":
            if "directed" in task:
                return " Steven Spielberg\nConfidence: certain"
            return " Paris (I think)"  # no confidence the parser can read: retrieve
        return jaws_script(role, prompt)

    (t,), gen, lib = run(MintQADynamicConfig(), [item()], script)
    assert [c.role for c in t.calls] == ["decompose", "selfanswer", "decompose", "selfanswer", "subanswer", "decompose",
                                         "answer"]
    assert lib.queries == [["Where was Steven Spielberg born?"]] and t.meta["retrievals"] == 1
    assert t.calls[1].parsed == {"answer": "Steven Spielberg", "confidence": "certain"} and t.calls[1].error is None
    assert t.calls[3].parsed == {"answer": "Paris (I think)", "confidence": None}
    assert t.calls[3].error == "no confidence (certain/uncertain) found: retrieving"
    assert t.meta["subquestions"] == [
        {"step": 1, "question": "Who directed the film Jaws?", "answer": "Steven Spielberg", "retrieved": False,
         "confidence": "certain", "self_answer": "Steven Spielberg"},
        {"step": 2, "question": "Where was Steven Spielberg born?", "answer": "Cincinnati", "retrieved": True,
         "confidence": None, "self_answer": "Paris (I think)"},
    ]
    assert t.prediction == "Cincinnati" and t.stop_reason == "finished"


def test_dynamic_uncertain_answers_retrieve():
    def script(role, prompt):
        if role == "selfanswer":
            return "Answer: Tom; Confidence: uncertain"
        return jaws_script(role, prompt)

    (t,), _, _ = run(MintQADynamicConfig(), [item()], script)
    assert [s["retrieved"] for s in t.meta["subquestions"]] == [True, True]
    assert [s["confidence"] for s in t.meta["subquestions"]] == ["uncertain", "uncertain"]
    assert t.meta["subquestions"][0]["self_answer"] == "Tom" and t.meta["retrievals"] == 2


# -- parsing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,want", [
    (" Paris.\nQuestion: x", ("Paris", None)), ("Answer: \"1583\"", ("1583", None)), ("\n\n", (None, "empty answer")),
    ("Final answer: Harvard University", ("Harvard University", None)),
])
def test_parse_answer(text, want):
    assert parse_answer(text) == want


@pytest.mark.parametrize("text,sub,finish", [
    ("finish", None, True), ('"Finish"', None, True), ("- finish.", None, True), ("Next sub-question: finish", None, True),
    ("Who founded X? And then", "Who founded X?", False), ("Sub-question 2: Where is Y", "Where is Y", False),
])
def test_parse_step(text, sub, finish):
    s = parse_step(text)
    assert (s.subquestion, s.finish, s.error) == (sub, finish, None)


@pytest.mark.parametrize("text,answer,conf,certain", [
    ("Tokyo\nConfidence: certain", "Tokyo", "certain", True), ("Tokyo\nConfidence: Uncertain", "Tokyo", "uncertain", False),
    ("Tokyo (confidence: sure)", "Tokyo", "certain", True), ("Confidence: certain", None, "certain", False),
    ("Tokyo", "Tokyo", None, False), ("", None, None, False),
])
def test_parse_selfanswer(text, answer, conf, certain):
    r = parse_selfanswer(text)
    assert (r.answer, r.confidence, r.certain) == (answer, conf, certain)
    assert (r.error is None) == (answer is not None and conf is not None)  # an uncertain answer is no error


# -- registry and configs ------------------------------------------------------------------------------


def test_the_four_strategies_are_registered_with_their_roles_and_configs():
    from knowtrace_train.evaluate import EvalConfig

    roles = {n: get_method(n).record_roles(get_method(n).config_class()) for n in
             ("mintqa_parametric", "mintqa_rag", "mintqa_decompose", "mintqa_dynamic")}
    assert roles["mintqa_parametric"] == roles["mintqa_rag"] == {"answer": "answer"}
    assert set(roles["mintqa_dynamic"]) == {"decompose", "selfanswer", "subanswer", "answer"}
    cfg = load_config(EvalConfig, None, ["--strategy.name", "mintqa_decompose", "--strategy.max_steps", "3"])
    assert type(cfg.strategy) is MintQADecomposeConfig and cfg.strategy.max_steps == 3
    m = get_method("mintqa_dynamic")
    assert not m.for_model(m.config_class(), frozenset({"decompose"}), False).fewshot
    assert m.for_model(m.config_class(), frozenset(), False).fewshot
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        MintQADecomposeConfig(max_steps=0)
    # self-training takes them with the generic STaR rationalizer
    from knowtrace_train.selftrain import SelfTrainConfig

    st = load_config(SelfTrainConfig, None, ["--strategy.name", "mintqa_dynamic", "--mode", "star"])
    assert type(st.strategy) is MintQADynamicConfig and set(get_method("mintqa_dynamic").rationalizers()) == {"star"}


@pytest.mark.parametrize("name", ["eval_mintqa_parametric", "eval_mintqa_rag", "eval_mintqa_decompose", "eval_mintqa_dynamic"])
def test_shipped_configs_load(name):
    from knowtrace_train.evaluate import load_eval_config

    cfg = load_eval_config(REPO / "recipes" / "configs" / f"{name}.yaml")
    assert cfg.strategy.name == name.removeprefix("eval_") and cfg.corpus.source == "kg"


# -- the KG-to-text corpus --------------------------------------------------------------------------------


def test_kg_corpus_one_passage_per_entity_neighbourhood():
    from knowtrace_train.data.corpus import CorpusError, kg_corpus

    triples = [("Jaws", "directed by", "Steven Spielberg"), ("Steven Spielberg", "born in", "Cincinnati"),
               ("Jaws", "release year", "1975"), ("Jaws", "directed by", "Steven Spielberg")]
    corpus = {p.title: p.text for p in kg_corpus(triples)}
    assert corpus == {
        "Jaws": "Jaws directed by Steven Spielberg. Jaws release year 1975.",
        "Steven Spielberg": "Steven Spielberg born in Cincinnati. Jaws directed by Steven Spielberg.",
        "Cincinnati": "Steven Spielberg born in Cincinnati.",
        "1975": "Jaws release year 1975.",
    }
    chunks = kg_corpus([("A", f"r{i}", f"B{i}") for i in range(5)], max_triples=2)
    assert [p.title for p in chunks[:3]] == ["A", "A", "A"] and chunks[2].text == "A r4 B4."
    assert len({p.id for p in chunks}) == len(chunks)
    with pytest.raises(CorpusError, match="empty"):
        kg_corpus([("", "r", "o")])


def test_read_triples_names_file_and_line(tmp_path):
    from knowtrace_train.data.corpus import CorpusError, read_triples

    f = tmp_path / "kg.jsonl"
    f.write_text('["A", "r", "B"]\n{"subject": "B", "relation": "s", "object": "C"}\n["A", "r"]\n')
    with pytest.raises(CorpusError, match=r"kg\.jsonl:3: expected \[subject, relation, object\]"):
        read_triples(f)
    f.write_text('["A", "r", "B"]\n\n{"subject": "B", "relation": "s", "object": "C"}\n')
    assert read_triples(f) == [("A", "r", "B"), ("B", "s", "C")]
    t = tmp_path / "kg.tsv"
    t.write_text("A\tr\tB\nA\tr\n")
    with pytest.raises(CorpusError, match=r"kg\.tsv:2: expected subject<TAB>relation<TAB>object"):
        read_triples(t)


def test_the_world_kg_corpus_states_every_gold_fact_of_the_dev_split():
    from knowtrace_train.data.loaders import load_items
    from knowtrace_train.evaluate import EvalConfig, load_corpus

    cfg = load_config(EvalConfig, None, ["--corpus.source", "kg"])
    corpus = load_corpus(cfg, [])
    text = {p.title: "" for p in corpus}
    for p in corpus:
        text[p.title] += " " + p.text
    for it in load_items(REPO / "data" / "world" / "dev.jsonl")[:50]:
        for s, r, o in it.evidence.triples:
            assert f"{s} {r} {o}." in text[s]


# -- MINTQA files: knowledge labels, the corpus of their triplets, the breakdown ---------------------------

MINTQA_ROWS = [
    {"id": "m1", "question": "In which country is Pigeon Bay Domain?", "answer": "New Zealand",
     "triplets": [["Pigeon Bay Domain", "country", "New Zealand"]], "type": "new"},
    {"id": "m2", "question": "Which industry does the publisher of Scram Kitty work in?", "answer": "video game industry",
     "triplets": [["Scram Kitty", "publisher", "Dakko Dakko"], ["Dakko Dakko", "industry", "video game industry"]],
     "sub_questions": [{"question": "Who published Scram Kitty?", "answer": "Dakko Dakko", "type": "new"},
                       {"question": "Which industry is Dakko Dakko in?", "answer": "video game industry", "type": "old"}]},
    {"id": "m3", "question": "What is the legislative body of the country of Horst?", "answer": "Volkskammer",
     "triplets": [["Horst", "citizenship", "GDR"], ["GDR", "legislative body", "Volkskammer"]],
     "sub_questions": [{"question": "Which country is Horst a citizen of?", "answer": "GDR", "type": "old"},
                       {"question": "What is the legislative body of GDR?", "answer": "Volkskammer", "type": "old"}]},
]


def test_familiarity_share_and_grouped_scores():
    from knowtrace_train.metrics import familiarity_share, scores_by_group

    subs = lambda *ts: QAItem(id="x", question="q", answers=("a",), evidence=GoldEvidence(sub_questions=tuple(  # noqa: E731
        SubQuestion("s", "a", knowledge_type=t) for t in ts)))
    assert familiarity_share(subs("new", "old", "new")) == "new 2/3"
    assert familiarity_share(subs("Popular", "unpopular")) == "popular 1/2"
    assert familiarity_share(subs("new", "popular")) is None and familiarity_share(subs(None, None)) is None
    g = scores_by_group([{"em": 1.0, "f1": 1.0, "acc": 1.0}, {"em": 0.0, "f1": 0.5, "acc": 1.0}], [2, None])
    assert g == {"2": {"n": 1, "em": 1.0, "f1": 1.0, "acc": 1.0, "em_interval": None},
                 "unknown": {"n": 1, "em": 0.0, "f1": 0.5, "acc": 1.0, "em_interval": None}}


def test_evaluate_on_a_mintqa_file_over_its_triplets_then_the_breakdown(tmp_path):
    from knowtrace_train.evaluate import EvalConfig, evaluate

    data = tmp_path / "mintqa_ti.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MINTQA_ROWS))
    out = tmp_path / "out.jsonl"
    cfg = load_config(EvalConfig, None, ["--dataset.path", str(data), "--corpus.source", "kg", "--corpus.triples", "items",
                                         "--strategy.name", "mintqa_rag", "--output", str(out)])
    answers = {"Pigeon Bay": "It is in New Zealand", "Scram Kitty": "video game industry", "Horst": "GDR"}

    def script(role, prompt):
        task = last_task(prompt)
        return next(a for k, a in answers.items() if k in task.split("Question:")[-1])

    gen = Scripted(script)
    s = evaluate(cfg, generator=gen, progress=False)
    assert s.questions == 3 and s.em == pytest.approx(1 / 3)
    # the corpus is the items' triplets as text: the first question retrieved its own fact
    first = json.loads(out.read_text().splitlines()[0])
    assert "Pigeon Bay Domain country New Zealand." in first["calls"][0]["prompt"]

    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "lab" / "mintqa_breakdown.py"), str(out)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    fig = json.loads(proc.stdout.strip().splitlines()[-1])[str(out)]
    assert fig["strategy"] == "mintqa_rag" and fig["questions"] == 3 and fig["retrievals"] == 1.0
    assert fig["all"]["acc"] == pytest.approx(2 / 3, abs=1e-4) and fig["all"]["em"] == pytest.approx(1 / 3, abs=1e-4)
    assert {k: v["n"] for k, v in fig["by_hops"].items()} == {"1": 1, "2": 2}
    assert fig["by_kind"].keys() == {"unknown"} and fig["by_kind_hops"] is None  # MINTQA's types are no kinds
    assert fig["by_familiarity"] == {
        "new 0/2": {"n": 1, "acc": 0.0, "em": 0.0, "f1": 0.0, "em_interval": None},
        "new 1/1": {"n": 1, "acc": 1.0, "em": 0.0, "f1": 0.5714, "em_interval": None},
        "new 1/2": {"n": 1, "acc": 1.0, "em": 1.0, "f1": 1.0, "em_interval": None},
    }
    assert "hops 2" in proc.stdout and "new 1/2" in proc.stdout


def test_each_strategy_runs_through_evaluate_on_the_tiny_model(tmp_path, tiny_model_dir):
    """Real (random) model text: whatever it writes, each strategy ends every question, bounded."""
    from knowtrace_train.evaluate import EvalConfig, evaluate

    for name in ("mintqa_parametric", "mintqa_rag", "mintqa_decompose", "mintqa_dynamic"):
        out = tmp_path / f"{name}.jsonl"
        cfg = load_config(EvalConfig, None, [
            "--strategy.name", name, "--dataset.limit", "2", "--corpus.source", "kg", "--output", str(out),
            "--generator.model", str(tiny_model_dir), "--generator.prompt_format", "plain", "--threads", "1",
            *([] if name in ("mintqa_parametric", "mintqa_rag") else ["--strategy.max_steps", "2"])])
        s = evaluate(cfg, progress=False)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert s.questions == 2 and all(r["strategy"] == name for r in rows)
        assert all(r["rounds"] <= 2 and "retrievals" in r["meta"] for r in rows)


# -- mechanism statistics ---------------------------------------------------------------------------------


def test_mechanism_subquestions_per_question_and_the_certain_share_by_hand():
    def script(role, prompt):
        task = last_task(prompt)
        if "Peru" in task:
            return " finish" if role == "decompose" else " Lima"
        if role == "selfanswer":  # certain of the first sub-question; no confidence the parser can read for the second
            return " Steven Spielberg\nConfidence: certain" if "directed" in task else " Paris (I think)"
        return jaws_script(role, prompt)

    items = [item(), item(1, "What is the capital of Peru?", "Lima", 1)]
    trajs, _, _ = run(MintQADynamicConfig(), items, script)
    stats = get_method("mintqa_dynamic").mechanism(trajs, MintQADynamicConfig(), {it.id: it for it in items})
    assert list(stats) == ["subquestions_per_question", "certain_share"]
    # Jaws: two sub-questions (certain, unreadable: not certain); Peru: finished at once, none
    assert stats["subquestions_per_question"].cell() == "2/2 = 1.000" and stats["certain_share"].cell() == "1/2 = 0.500"
    # a refused self-answer is recorded without a confidence: not certain; a garbage meta counts nothing
    junk = trajs[1]
    junk.meta["subquestions"] = [{"confidence": None}, "garbage", {"confidence": "uncertain"}]
    stats = get_method("mintqa_dynamic").mechanism(trajs, MintQADynamicConfig(), {})
    assert stats["subquestions_per_question"].cell() == "5/2 = 2.500" and stats["certain_share"].cell() == "1/5 = 0.200"
    # no sub-question asked: the certain share has no value, sub-questions per question is 0
    (peru,), _, _ = run(MintQADynamicConfig(), items[1:], script)
    stats = get_method("mintqa_dynamic").mechanism([peru], MintQADynamicConfig(), {})
    assert stats["subquestions_per_question"].cell() == "0/1 = 0.000"
    assert stats["certain_share"].value is None and stats["certain_share"].note == "no sub-question was asked"
    # decomposition-then-retrieval rates nothing; the one-call strategies neither decompose nor rate
    (t,), _, _ = run(MintQADecomposeConfig(), [item()], jaws_script)
    assert {k: s.cell() for k, s in get_method("mintqa_decompose").mechanism([t], MintQADecomposeConfig(), {}).items()} == {
        "subquestions_per_question": "2/1 = 2.000"}
    assert get_method("mintqa_rag").mechanism([t], MintQARagConfig(), {}) == {}
    assert get_method("mintqa_parametric").mechanism([t], MintQAConfig(), {}) == {}
