"""DoG (Debating over Graphs) on a tiny graph with scripted model outputs, hop by hop; its parsing, graphs and configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knowtrace_train.config import load_config
from knowtrace_train.data.schema import GoldEvidence, QAItem
from knowtrace_train.generation.base import GenerationError
from knowtrace_train.kg_store import GraphStore, KGStoreError
from knowtrace_train.methods import get_method
from knowtrace_train.methods.dog import DoG, DoGConfig
from knowtrace_train.methods.dog.graph import build_store, graph_triples, topic_entity
from knowtrace_train.methods.dog.parsing import match_relation, parse_answer, parse_answer_try, parse_relation, parse_turn
from knowtrace_train.trajectory import Trajectory

from scripted import Scripted

REPO = Path(__file__).resolve().parents[1]

TRIPLES = [
    ("Jaws", "directed by", "Steven Spielberg"),
    ("Jaws", "release year", "1975"),
    ("Steven Spielberg", "born in", "Cincinnati"),
    ("Cincinnati", "country", "United States"),
    ("Duel", "directed by", "Steven Spielberg"),
]


def item(i, question, answer, triples, hops=2) -> QAItem:
    return QAItem(id=f"q{i}", question=question, answers=(answer,), dataset="toy", type="bridge", hops=hops,
                  evidence=GoldEvidence(triples=tuple(triples)))


JAWS = item(0, "In which country was the director of Jaws born?", "United States", TRIPLES[:1] + TRIPLES[2:4], hops=3)
DUEL = item(1, "Who directed Duel?", "Steven Spielberg", TRIPLES[4:5], hops=1)


def task(prompt: str) -> str:
    """The part of a prompt after its exemplars."""
    return prompt.rsplit("\n\n", 1)[-1]


def script(role, prompt):
    """The right moves on the tiny graph: pick the chain's relation, say Yes once the question is one hop."""
    t = task(prompt)
    if role == "relation":
        for topic, rel in (("Jaws", "directed by"), ("Steven Spielberg", "born in"), ("Cincinnati", "country"),
                           ("Duel", "directed by")):
            if f"Topic entity: {topic}\n" in t:
                return f" Who or what is the {rel} of {topic}?\nRelation: 9. {rel}"
    if role == "answer_try":
        return " Yes\nAnswer: the answer" if t.startswith(("Question: Who directed Duel", "Question: In which country is Cincinnati")) else " No"
    if role == "expert":
        return " In which country was Steven Spielberg born, the director of Jaws?" if "(Jaws;" in t else " In which country is Cincinnati?"
    if role == "critic":
        return " different. Simplified question: In which country was Steven Spielberg born, the director of Jaws?" if "(Jaws;" in t else " different"
    if role == "linguist":
        return " In which country was Steven Spielberg born?" if "(Jaws;" in t else " Simplified question: In which country is Cincinnati?"
    if role == "fallback":
        return " Ohio\nQuestion: more"
    raise AssertionError(role)


def run(config, items, fn=script, store=None):
    gen = Scripted(fn)
    done = []
    engine = DoG(config, store=store or GraphStore(TRIPLES))
    trajs = engine.run(items, gen, None, on_done=done.append)
    assert sorted(t.id for t in done) == sorted(t.id for t in trajs)
    return trajs, gen


# -- the loop ------------------------------------------------------------------------------------------


def test_full_run_walks_the_chain_and_questions_advance_together_one_batch_per_step():
    trajs, gen = run(DoGConfig(answer_from="tail"), [JAWS, DUEL])
    roles = [[r.role for r in b] for b in gen.batches]
    # hop 1: both questions choose a relation in one batch, then try to answer in one batch; Duel ends
    # there, Jaws debates (three turns, one batch each); hops 2 and 3 carry Jaws alone
    assert roles == [["relation", "relation"], ["answer_try", "answer_try"], ["expert"], ["critic"], ["linguist"],
                     ["relation"], ["answer_try"], ["expert"], ["critic"], ["linguist"],
                     ["relation"], ["answer_try"]]
    jaws, duel = trajs
    assert duel.prediction == "Steven Spielberg" and duel.stop_reason == "answered" and duel.rounds == 1
    assert jaws.prediction == "United States" and jaws.stop_reason == "answered" and jaws.rounds == 3
    assert [t.triplet.subject for t in jaws.graph.triplets] == ["Jaws", "Steven Spielberg", "Cincinnati"]
    hops = jaws.meta["hops"]
    assert [h["relation"] for h in hops] == ["directed by", "born in", "country"]
    assert [h["topic"] for h in hops] == ["Jaws", "Steven Spielberg", "Cincinnati"]
    assert hops[0]["triples"] == [["Jaws", "directed by", "Steven Spielberg"]]
    assert hops[0]["simplified"] == "In which country was Steven Spielberg born?" == hops[1]["question"]
    assert [(d["role"], d["verdict"]) for d in hops[0]["debate"]] == [("expert", None), ("critic", "different"),
                                                                      ("linguist", None)]
    assert hops[0]["answer_try"] == {"sufficient": False, "answer": None} and hops[2]["answer_try"]["sufficient"]
    # the critic and the linguist see the whole chat so far
    critic = next(c for c in jaws.calls if c.role == "critic")
    assert "Expert: Simplified question: In which country was Steven Spielberg born, the director of Jaws?" in critic.prompt
    linguist = next(c for c in jaws.calls if c.role == "linguist")
    assert "Critic: Verdict: different." in linguist.prompt and "Expert:" in linguist.prompt
    # the relation leading back is dropped, the calls carry their triples and pairs
    assert hops[1].get("dropped_back") == "~directed by" and "~directed by" not in hops[1]["relations"]
    rel_call = jaws.calls[0]
    assert rel_call.role == "relation" and rel_call.triplets == [0] and rel_call.pair.guidance == "directed by"
    assert rel_call.parsed == {"subquestion": "Who or what is the directed by of Jaws?", "relation": "directed by",
                               "by_number": False}
    assert jaws.meta["topic_entity"] == "Jaws" and jaws.meta["question_hops"] == 3 and jaws.meta["lookups"] > 0
    assert Trajectory.from_dict(json.loads(json.dumps(jaws.to_dict()))).meta == jaws.meta
    assert get_method("dog").evidence_supported(jaws, DoGConfig()) is True


def test_answer_from_model_takes_the_written_answer_and_the_tail_when_none():
    def fn(role, prompt):
        if role == "answer_try":
            return " Yes\nAnswer: Spielberg" if "Duel" in task(prompt) else " Yes"
        return script(role, prompt)

    trajs, _ = run(DoGConfig(), [DUEL, item(2, "Who directed Jaws?", "Steven Spielberg", TRIPLES[:1], 1)], fn)
    assert [t.prediction for t in trajs] == ["Spielberg", "Steven Spielberg"]


def test_max_hops_ends_with_the_fallback_from_own_knowledge():
    trajs, gen = run(DoGConfig(max_hops=1), [JAWS])
    t = trajs[0]
    assert t.stop_reason == "max_hops" and t.prediction == "Ohio" and [c.role for c in t.calls] == ["relation", "answer_try", "fallback"]
    assert "Question: In which country was the director of Jaws born?\nAnswer:" in t.calls[-1].prompt


def test_zero_hops_is_the_model_alone_and_zero_debate_rounds_is_the_expert_alone():
    trajs, gen = run(DoGConfig(max_hops=0), [JAWS, DUEL])
    assert [[r.role for r in b] for b in gen.batches] == [["fallback", "fallback"]]
    assert {t.stop_reason for t in trajs} == {"max_hops"} and trajs[0].graph.triplets == []
    trajs, gen = run(DoGConfig(debate_rounds=0, answer_from="tail"), [JAWS])
    assert [c.role for c in trajs[0].calls] == ["relation", "answer_try", "expert"] * 2 + ["relation", "answer_try"]
    # the expert's question becomes the next hop's question
    assert trajs[0].meta["hops"][1]["question"] == "In which country was Steven Spielberg born, the director of Jaws?"
    assert trajs[0].prediction == "United States"


def test_two_debate_rounds_make_six_turns_each_seeing_the_earlier_ones():
    trajs, gen = run(DoGConfig(debate_rounds=2, max_hops=2), [JAWS])
    debate = trajs[0].meta["hops"][0]["debate"]
    assert [(d["round"], d["role"]) for d in debate] == [(1, "expert"), (1, "critic"), (1, "linguist"),
                                                         (2, "expert"), (2, "critic"), (2, "linguist")]
    second_expert = [c for c in trajs[0].calls if c.role == "expert"][1]
    assert second_expert.prompt.count("Linguist: Simplified question:") == 1


# -- bad input: recorded, never a crash ----------------------------------------------------------------


class Stub:
    """A store whose answers the test fixes; an entity in `fail` raises KGStoreError."""

    def __init__(self, relations, fail=()):
        self.relations, self.fail, self.lookups = relations, fail, 0

    def has_entity(self, e):
        return e in self.relations

    def get_relations(self, e):
        if e in self.fail:
            raise KGStoreError("down")
        return self.relations.get(e, [])

    def triple_filling(self, e, r):
        return []


def test_missing_entity_no_relations_bad_choice_no_triples_and_store_errors_are_stop_reasons():
    items = [item(0, "Who?", "x", [("Nowhere", "r", "y")]), item(1, "Who?", "x", [("Lonely", "r", "y")]),
             item(2, "Who?", "x", [("Jaws", "r", "y")]), item(3, "Who?", "x", [("Down", "r", "y")]),
             QAItem(id="q4", question="No triples?", answers=("x",)), item(5, "Who?", "x", [("Empty", "r", "y")])]
    store = Stub({"Lonely": [], "Jaws": ["directed by"], "Down": ["a"], "Empty": ["directed by"]}, fail=("Down",))

    def fn(role, prompt):
        if role == "relation":
            return " Who?\nRelation: 7. starred in" if "Jaws" in task(prompt) else " Who?\nRelation: directed by"
        return " Ohio"

    trajs, gen = run(DoGConfig(), items, fn, store=store)
    assert [t.stop_reason for t in trajs] == ["entity_not_in_graph", "no_relations", "relation_not_in_list",
                                             "store_error: down", "no_topic_entity", "no_triples"]
    assert all(t.prediction == "Ohio" and t.calls[-1].role == "fallback" for t in trajs)
    bad = trajs[2].calls[0]
    assert bad.error.startswith("relation not in the list") and bad.parsed["relation"] is None
    assert trajs[3].meta["events"][0]["event"].startswith("store error in get_relations")
    # one relation batch (Jaws and Empty), one fallback batch for all six
    assert [[r.role for r in b] for b in gen.batches] == [["relation", "relation"], ["fallback"] * 6]


def test_an_unreachable_endpoint_is_a_recorded_store_error():
    cfg = DoGConfig(graph="http://127.0.0.1:9/sparql")
    engine = DoG(cfg)
    trajs = engine.run([JAWS], Scripted(lambda role, p: " Ohio"), None)
    assert trajs[0].stop_reason.startswith("store_error: SPARQL endpoint http://127.0.0.1:9/sparql did not answer")
    assert trajs[0].prediction == "Ohio"


def test_generation_errors_and_garbage_outputs_never_crash():
    def fn(role, prompt):
        if role == "relation" and "Duel" in task(prompt):
            return GenerationError("too long")
        return {"relation": "\x00}{ Relation:", "fallback": ""}.get(role, "???")

    trajs, _ = run(DoGConfig(), [JAWS, DUEL], fn)
    assert trajs[0].stop_reason == "relation_not_in_list" and trajs[0].prediction is None
    assert trajs[1].stop_reason == "error: generation" and trajs[1].calls[0].error.startswith("generation error")
    assert trajs[1].calls[-1].error == "empty answer"


# -- parsing --------------------------------------------------------------------------------------------

RELS = ["born in", "directed by", "~directed by", "release year"]


@pytest.mark.parametrize("text,want", [
    ("2. directed by", "directed by"), ("1. directed by", "directed by"), ("relation_4: release_year", "release year"),
    ("~ directed by", "~directed by"), ("3", "~directed by"), ("Directed By.", "directed by"),
    ("the film was directed by him", "directed by"), ("starred in", None), ("9", None), ("", None),
    ("4. founded by", "release year"), ("9. founded by", None),
])
def test_match_relation(text, want):
    assert match_relation(text, RELS) == want


def test_parse_relation():
    c = parse_relation(" Who directed Jaws? More\nRelation: 2. directed by", RELS)
    assert c.subquestion == "Who directed Jaws?" and c.relation == "directed by" and c.error is None
    c = parse_relation("Sub-question: Who?\nborn in", RELS)
    assert c.relation == "born in"
    assert parse_relation("", RELS).error == "empty output"
    assert parse_relation("Who?", RELS).error == "no relation written"
    c = parse_relation("Who?\nRelation: spouse", RELS)
    assert c.relation is None and "spouse" in c.error
    c = parse_relation("Who?\nRelation: 1. spouse", RELS)
    assert c.relation == "born in" and c.by_number and c.error is None
    assert not parse_relation("Who?\nRelation: 1. directed by", RELS).by_number


@pytest.mark.parametrize("text,sufficient,answer", [
    (" Yes\nAnswer: Steven Spielberg", True, "Steven Spielberg"), (" No", False, None), ("{No}. Not enough.", False, None),
    ("yes, Cincinnati.", True, "Cincinnati"), (" Yes", True, None), ("Maybe", None, None), ("", None, None),
])
def test_parse_answer_try(text, sufficient, answer):
    res = parse_answer_try(text)
    assert (res.sufficient, res.answer) == (sufficient, answer)
    assert (res.error is None) == (sufficient is not None)


def test_parse_turns_of_the_three_roles():
    assert parse_turn(" Where was Bob born? Because.\nCritic: x").question == "Where was Bob born?"
    assert parse_turn("Simplified question: one\nSimplified_question: Where was Bob born").question == "Where was Bob born"
    t = parse_turn(" same. Simplified question: Where was Bob born?", critic=True)
    assert (t.question, t.verdict) == ("Where was Bob born?", "same")
    t = parse_turn(" Different\nWhere was Bob born?", critic=True)
    assert (t.question, t.verdict) == ("Where was Bob born?", "different")
    assert parse_turn(" different", critic=True).question is None
    assert parse_turn("").error == "no simplified question written"
    assert parse_turn("Linguist: Where is X?").question == "Where is X?"


def test_parse_answer():
    assert parse_answer(" Answer: Ohio.\nmore") == ("Ohio", None)
    assert parse_answer("  \n") == (None, "empty answer")


# -- graphs, configs, registry ------------------------------------------------------------------------------


def test_graph_sources(tmp_path):
    kb = tmp_path / "kb.txt"
    kb.write_text("Jaws|directed_by|Steven Spielberg\n", encoding="utf-8")
    assert graph_triples(str(kb), []) == [("Jaws", "directed_by", "Steven Spielberg")]
    tsv = tmp_path / "g.tsv"
    tsv.write_text("Jaws\tdirected by\tSteven Spielberg\n", encoding="utf-8")
    assert build_store(str(tsv), []).triple_filling("Steven Spielberg", "~directed by") == [("Jaws", "directed by", "Steven Spielberg")]
    assert graph_triples("items", [JAWS, DUEL]) == list(JAWS.evidence.triples) + list(DUEL.evidence.triples)
    world = build_store("world", [])
    assert world.has_entity("Giridge Publishing") and "founded by" in world.get_relations("Giridge Publishing")
    with pytest.raises(FileNotFoundError, match="neither world, items"):
        graph_triples(str(tmp_path / "missing.jsonl"), [])
    assert topic_entity(JAWS) == "Jaws" and topic_entity(QAItem(id="x", question="q?", answers=("a",))) is None


def test_config_checks_and_record_roles():
    for bad in ({"debate_rounds": -1}, {"max_hops": -1}, {"answer_from": "guess"}, {"graph": ""}, {"max_triples": 0}):
        with pytest.raises(ValueError):
            DoGConfig(**bad)
    m = get_method("dog")
    assert set(m.record_roles(DoGConfig())) == {"relation", "answer_try", "expert", "critic", "linguist", "fallback"}
    assert set(m.record_roles(DoGConfig(debate_rounds=0))) == {"relation", "answer_try", "expert", "fallback"}
    assert set(m.record_roles(DoGConfig(max_hops=0))) == {"fallback"}
    assert m.for_model(DoGConfig(), frozenset({"relation"}), False).fewshot is False


def test_world_config_runs_through_evaluate_with_a_scripted_model(tmp_path):
    from knowtrace_train.evaluate import EvalConfig, evaluate

    cfg = load_config(EvalConfig, REPO / "recipes/configs/eval_dog_world.yaml",
                      ["--dataset.limit", "3", "--output", str(tmp_path / "e.jsonl")])
    assert cfg.strategy.name == "dog" and cfg.strategy.answer_from == "tail"
    gen = Scripted(lambda role, p: " No" if role == "answer_try" else " Who?\nRelation: 1")
    summary = evaluate(cfg, generator=gen, retriever=object(), progress=False)
    assert summary.questions == 3 and set(summary.stop_reasons) <= {"max_hops", "relation_not_in_list"}
    rows = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert all(r["meta"]["topic_entity"] and r["strategy"] == "dog" for r in rows)
    # questions advance together: every batch holds the live questions of one call kind
    assert all(len({r.role for r in b}) == 1 for b in gen.batches) and len(gen.batches[0]) == 3


def test_2wiki_config_walks_the_evidence_graph(shared_data, tmp_path):
    from knowtrace_train.evaluate import EvalConfig, load_eval_items

    cfg = load_config(EvalConfig, REPO / "recipes/configs/eval_dog_2wiki.yaml", ["--dataset.limit", "4"])
    cfg.dataset.path = str(shared_data / "2wikimultihopqa" / "dev.json")
    items, _ = load_eval_items(cfg)
    assert cfg.strategy.graph == "items" and all(it.evidence.triples for it in items)
    trajs = DoG(cfg.strategy).run(items, Scripted(lambda role, p: " Yes" if role == "answer_try" else " Who?\nRelation: 1"), None)
    for it, t in zip(items, trajs):
        assert t.meta["topic_entity"] == it.evidence.triples[0][0]
        assert t.stop_reason == "answered" and t.graph.triplets


def test_dog_table_prints_hits_at_1_by_hop_count(tmp_path):
    import subprocess
    import sys

    trajs, _ = run(DoGConfig(answer_from="tail"), [JAWS, DUEL])
    path = tmp_path / "e.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajs), encoding="utf-8")
    out = subprocess.run([sys.executable, str(REPO / "scripts/lab/dog_table.py"), str(path)], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    last = json.loads(out.strip().splitlines()[-1])[str(path)]
    assert last["n"] == 2 and last["hits@1"] == 1.0 and set(last["by_hops"]) == {"1", "3"}
    assert last["gold_in_chain"] == 1.0 and "| e.jsonl | 2 | 1.000 |" in out


# -- mechanism statistics ---------------------------------------------------------------------------------


def _try(index: int, hop: int, parsed):
    from knowtrace_train.trajectory import ModelCall

    return ModelCall(index=index, role="answer_try", round=hop, prompt="", output="???", prompt_tokens=0, output_tokens=0,
                     parsed=parsed)


def test_mechanism_hop1_relation_and_the_answer_try_yes_rates_by_hand():
    from knowtrace_train.methods.dog.mechanism import NO_GOLD, gold_last_hop

    trajs, _ = run(DoGConfig(answer_from="tail"), [JAWS, DUEL])
    items = {it.id: it for it in (JAWS, DUEL)}
    stats = get_method("dog").mechanism(trajs, DoGConfig(), items)
    assert list(stats) == ["hop1_relation", "yes_at_gold_last_hop", "yes_elsewhere"]
    # both walks chose their first gold relation ("directed by") at hop 1
    assert stats["hop1_relation"].cell() == "2/2 = 1.000"
    # Jaws's tries: No (hop 1), No (hop 2), Yes at hop 3, its chain's last; Duel: Yes at hop 1, its last
    assert (gold_last_hop(JAWS), gold_last_hop(DUEL)) == (3, 1)
    assert stats["yes_at_gold_last_hop"].cell() == "2/2 = 1.000" and stats["yes_elsewhere"].cell() == "0/2 = 0.000"
    assert all(s.note is None for s in stats.values())

    # a comparison (parallel gold facts: no hop's triples answer it): its Yes and its unreadable try count
    # elsewhere, and a walk with an unreadable hop record chose no relation; a HotpotQA-like question
    # (no gold triples) is left out
    comp = item(2, "Which film is older, Jaws or Duel?", "Duel", [TRIPLES[1], ("Duel", "release year", "1971")])
    assert gold_last_hop(comp) is None
    c = Trajectory(id="q2", question_id="q2", question=comp.question, answers=["Duel"], dataset="toy", strategy="dog",
                   calls=[_try(0, 1, {"sufficient": True, "answer": None}), _try(1, 2, None)], meta={"hops": "garbage"})
    h = Trajectory(id="h", question_id="h", question="?", answers=["x"], dataset="hotpotqa", strategy="dog",
                   calls=[_try(0, 1, {"sufficient": True, "answer": "x"})], meta={"hops": []})
    hotpot = QAItem(id="h", question="?", answers=("x",), dataset="hotpotqa")
    stats = get_method("dog").mechanism(trajs + [c, h], DoGConfig(), {**items, "q2": comp, "h": hotpot})
    assert stats["hop1_relation"].cell() == "2/3 = 0.667" and stats["hop1_relation"].note == "1 of 4 questions without gold triples left out"
    assert stats["yes_at_gold_last_hop"].cell() == "2/2 = 1.000" and stats["yes_elsewhere"].cell() == "1/4 = 0.250"

    # no question with gold triples: no value, and why
    alone = get_method("dog").mechanism([h], DoGConfig(), {"h": hotpot})
    assert all(s.value is None and s.note == NO_GOLD for s in alone.values())
    # gold triples but no try at a last hop (the walk stopped at hop 1 of 3)
    first_only = Trajectory(id="q0", question_id="q0", question=JAWS.question, answers=["United States"], dataset="toy",
                            strategy="dog", calls=[_try(0, 1, {"sufficient": False, "answer": None})],
                            meta={"hops": [{"hop": 1, "relation": "directed by"}]})
    stats = get_method("dog").mechanism([first_only], DoGConfig(), items)
    assert stats["yes_at_gold_last_hop"].value is None and stats["yes_at_gold_last_hop"].note.startswith("no answer try")
    assert stats["yes_elsewhere"].cell() == "0/1 = 0.000" and stats["hop1_relation"].cell() == "1/1 = 1.000"
    # the model alone walks nothing
    assert get_method("dog").mechanism(trajs, DoGConfig(max_hops=0), items) == {}


def test_dog_table_hop1_relation_uses_the_method_s_helper(tmp_path):
    import subprocess
    import sys

    trajs, _ = run(DoGConfig(answer_from="tail"), [JAWS, DUEL])
    trajs[1].meta["hops"][0]["relation"] = "release year"  # Duel's first hop now chose the wrong relation
    path, data = tmp_path / "e.jsonl", tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajs), encoding="utf-8")
    data.write_text("".join(json.dumps(it.to_dict()) + "\n" for it in (JAWS, DUEL)), encoding="utf-8")
    out = subprocess.run([sys.executable, str(REPO / "scripts/lab/dog_table.py"), str(path), "--data", str(data)],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert json.loads(out.strip().splitlines()[-1])[str(path)]["first_relation_gold"] == 0.5
