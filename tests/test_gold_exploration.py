"""KnowTrace's gold explores as the paper's model does: several pairs a round, every triplet the passages state,
unneeded pairs and extraneous triplets at the configured rates; backtracing's two filters drop exactly that noise
and STaR keeps it; FA decomposed; the exploration shape; the paper's prompt set word for word."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from knowtrace_train.data.facts import Fact, FactIndex, FactsFileError, load_facts
from knowtrace_train.data.schema import GoldEvidence, QAItem, SubQuestion
from knowtrace_train.evaluate import exploration_shape
from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.methods.gold_chain import chain_rounds, gold_chain
from knowtrace_train.methods.knowtrace import prompts
from knowtrace_train.methods.knowtrace.backtrace.records import FA_PARTS, backtrace_trajectories
from knowtrace_train.methods.knowtrace.config import GoldNoise, KnowTraceConfig
from knowtrace_train.methods.knowtrace.gold import GoldAsk, build_gold_trajectory, gold_trajectory_records
from knowtrace_train.methods.knowtrace.parsing import parse_completion, parse_exploration
from knowtrace_train.report import shape_table

from test_gold_trajectories import WordOverlap, _p

PAPER = Path(__file__).resolve().parents[2] / "shared" / "papers" / "004_abac3bc090c63046.txt"


CORPUS = [
    _p("Punore University", "Punore University is a university in Graekoport, founded in 1874."),
    _p("Baenith College", "Baenith College is a college in Remeth, founded in 1695."),
    _p("Graekoport", "Graekoport is a port city in Shemovia. It has a population of 2 million."),
    _p("Remeth", "Remeth is a city in Shemovia on the river Ulde."),
]
FACTS = FactIndex([
    Fact(Triplet("Punore University", "located in", "Graekoport"), CORPUS[0].id),
    Fact(Triplet("Punore University", "founding year", "1874"), CORPUS[0].id),
    Fact(Triplet("Baenith College", "located in", "Remeth"), CORPUS[1].id),
    Fact(Triplet("Baenith College", "founding year", "1695"), CORPUS[1].id),
    Fact(Triplet("Graekoport", "country", "Shemovia"), CORPUS[2].id),
    Fact(Triplet("Graekoport", "population", "2 million"), CORPUS[2].id),
    Fact(Triplet("Remeth", "country", "Shemovia"), CORPUS[3].id),
])
COMPARISON = QAItem(
    id="c1", question="Are Punore University and Baenith College located in the same country?", answers=("yes",),
    dataset="world", type="comparison",
    evidence=GoldEvidence(
        triples=(("Punore University", "located in", "Graekoport"), ("Graekoport", "country", "Shemovia"),
                 ("Baenith College", "located in", "Remeth"), ("Remeth", "country", "Shemovia")),
        sub_questions=(SubQuestion("In which city is Punore University?", "Graekoport"),
                       SubQuestion("In what country is Graekoport?", "Shemovia"),
                       SubQuestion("In which city is Baenith College?", "Remeth"),
                       SubQuestion("In what country is Remeth?", "Shemovia"))),
)

#: the gold without the default's noise (its shape alone)
NO_NOISE = GoldNoise(pairs=0.0, triplets=0.0)


def test_a_comparison_asks_both_entities_in_one_round():
    rounds = chain_rounds(gold_chain(COMPARISON))
    assert [[h.pair.entity for h in r] for r in rounds] == [["Punore University", "Baenith College"],
                                                            ["Graekoport", "Remeth"]]
    res = gold_trajectory_records([COMPARISON], WordOverlap(CORPUS), k=1, facts=FACTS, noise=NO_NOISE)
    t = res.trajectories[0]
    explores = [c for c in t.calls if c.role == "explore"]
    assert [len(parse_exploration(c.output).pairs) for c in explores] == [2, 2, 0]
    assert t.rounds == 3 and res.stats["shape"]["pairs_unneeded"] == 0
    # no noise: backtracing filters nothing of the gold
    assert res.stats["backtrace_check"]["fa_ratio"] == 0.0


def test_a_completion_writes_every_triplet_its_passages_state_about_its_pair():
    item = QAItem(id="b1", question="Which year was the university in Graekoport founded?", answers=("1874",),
                  evidence=GoldEvidence(triples=(("Punore University", "located in", "Graekoport"),)))
    facts = FactIndex([*FACTS.facts, Fact(Triplet("Punore University", "located in", "Punore Bay"), CORPUS[0].id)])
    res = gold_trajectory_records([item], WordOverlap(CORPUS), k=1, facts=facts, noise=NO_NOISE)
    comp = next(c for c in res.trajectories[0].calls if c.role == "complete")
    # the gold first, then the other fact of the same relation its passage states; no other relation (no noise)
    assert parse_completion(comp.output).triplets == [Triplet("Punore University", "located in", "Graekoport"),
                                                      Triplet("Punore University", "located in", "Punore Bay")]


def test_noise_adds_unneeded_pairs_and_extraneous_triplets_at_the_rates():
    noisy = gold_trajectory_records([COMPARISON], WordOverlap(CORPUS), k=1, facts=FACTS,
                                    noise=GoldNoise(pairs=1.0, triplets=1.0))
    shape = noisy.stats["shape"]
    assert shape["pairs_needed"] == 4 and shape["pairs_unneeded"] >= 1 and shape["triplets_extraneous"] >= 1
    parts = noisy.stats["backtrace_check"]["fa_decomposed"]
    assert parts["unneeded_pairs"] > 0 and parts["extraneous_triplets"] > 0
    assert parts["untraceable"] == 0 and parts["dropped_by_both"] == 0
    assert sum(parts.values()) == pytest.approx(noisy.stats["backtrace_check"]["fa_ratio"])
    # the same seed draws the same noise; another seed may draw other noise, never other needed pairs
    again = gold_trajectory_records([COMPARISON], WordOverlap(CORPUS), k=1, facts=FACTS,
                                    noise=GoldNoise(pairs=1.0, triplets=1.0))
    assert [c.output for c in again.trajectories[0].calls] == [c.output for c in noisy.trajectories[0].calls]


def _noisy_trajectory():
    """The comparison's gold with one unneeded pair (Graekoport's population) in round 2 and one extraneous
    triplet (Punore University's founding year) in a needed completion."""
    hops = gold_chain(COMPARISON)
    ask = lambda h, extra=(): GoldAsk(h.pair, (h.triplet, *extra), (CORPUS[0],))  # noqa: E731
    rounds = [
        [ask(hops[0], (Triplet("Punore University", "founding year", "1874"),)), ask(hops[2])],
        [ask(hops[1]), ask(hops[3]),
         GoldAsk(GuidancePair("Graekoport", "How many people live in Graekoport?"),
                 (Triplet("Graekoport", "population", "2 million"),), (CORPUS[2],), needed=False)],
    ]
    return build_gold_trajectory(COMPARISON, hops, rounds, count_tokens=lambda s: len(s.split()))


def test_backtracing_drops_exactly_the_unneeded_pair_and_the_extraneous_triplet_star_keeps_them():
    traj = _noisy_trajectory()
    items = {COMPARISON.id: COMPARISON}
    count = lambda s: len(s.split())  # noqa: E731
    bt = backtrace_trajectories([traj], items, count_tokens=count, mode="backtrace")
    star = backtrace_trajectories([traj], items, count_tokens=count, mode="star")
    pairs = lambda recs: [parse_exploration(r["prefix"] + r["completion"]).pairs for r in recs]  # noqa: E731
    trips = lambda recs: [parse_completion(r["completion"]).triplets for r in recs]  # noqa: E731
    # the pair filter: round 2's exploration loses the unneeded pair, the answer's record stays
    assert [[p.entity for p in ps] for ps in pairs(bt.records_by_role["explore"])] == [
        ["Punore University", "Baenith College"], ["Graekoport", "Remeth"], []]
    assert [[p.entity for p in ps] for ps in pairs(star.records_by_role["explore"])] == [
        ["Punore University", "Baenith College"], ["Graekoport", "Remeth", "Graekoport"], []]
    # the triplet filter: the extraneous triplet goes; the unneeded pair's completion goes whole
    ev = [Triplet(*t) for t in COMPARISON.evidence.triples]
    assert trips(bt.records_by_role["complete"]) == [[ev[0]], [ev[2]], [ev[1]], [ev[3]]]
    assert len(star.records_by_role["complete"]) == 5
    assert Triplet("Punore University", "founding year", "1874") in sum(trips(star.records_by_role["complete"]), [])
    assert Triplet("Graekoport", "population", "2 million") in sum(trips(star.records_by_role["complete"]), [])
    assert not any(t.relation in ("founding year", "population") for t in sum(trips(bt.records_by_role["complete"]), []))
    # FA decomposed: the same figures in both modes, all of it the paper's noise; two records changed in a call
    for res in (bt, star):
        parts = res.stats["fa_decomposed"]
        assert set(parts) == set(FA_PARTS)
        assert parts["unneeded_pairs"] > 0 and parts["extraneous_triplets"] > 0
        assert parts["untraceable"] == parts["dropped_by_both"] == 0
        assert sum(parts.values()) == pytest.approx(res.stats["fa_ratio"])
        assert res.stats["backtrace_records"] == {"whole": 5, "changed": 2}


def test_exploration_shape_and_its_table():
    traj = _noisy_trajectory()
    shape = exploration_shape([traj])
    assert shape["pairs_per_round"] == 2.5 and shape["rounds_per_question"] == 3
    assert shape["triplets_per_completion"] == pytest.approx(6 / 5)
    assert exploration_shape([]) is None
    m0 = {"iteration": 0, "eval": {"exploration": shape}}
    it1 = {"iteration": 1, "eval": {"exploration": shape},
           "rationale": {"fa_decomposed": dict.fromkeys(FA_PARTS, 0.1), "backtrace_records": {"whole": 3, "changed": 1}}}
    table = shape_table([it1, m0])
    lines = table.splitlines()
    assert "pairs/round" in lines[0] and lines[1].split()[0] == "0" and lines[2].split()[-1] == "1/4"
    assert shape_table([{"iteration": 0, "eval": {}}]) is None


def test_facts_file_rows_are_checked_and_found_beside_the_corpus(tmp_path):
    good = tmp_path / "facts.jsonl"
    good.write_text('{"subject": "A", "relation": "r", "object": "B", "passage_id": "p1"}\n', encoding="utf-8")
    (tmp_path / "corpus.jsonl").write_text("", encoding="utf-8")
    idx = load_facts(None, str(tmp_path / "corpus.jsonl"), [])
    assert len(idx) == 1 and idx.source == str(good)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"subject": "A", "relation": "", "object": "B"}\n', encoding="utf-8")
    with pytest.raises(FactsFileError, match=r"bad.jsonl, line 1: field 'relation'"):
        FactIndex.from_file(bad)
    # without a file: the items' own gold evidence, stated by a passage that names both entities
    idx = load_facts(None, None, [COMPARISON])
    assert idx.stated_about("Graekoport", [CORPUS[2]]) == [Triplet("Graekoport", "country", "Shemovia")]


def test_noise_rates_are_checked():
    with pytest.raises(ValueError, match="gold_noise.pairs"):
        GoldNoise(pairs=-1)
    with pytest.raises(ValueError, match="prompts must be one of"):
        KnowTraceConfig(prompts="long")


def _paper_template(start: str, end: str) -> str:
    """A template of the paper's Appendix D as its text file holds it: the lines from `start` up to `end`, the
    wrapped lines (marked "↳") joined to the line before."""
    text = PAPER.read_text(encoding="utf-8")
    block = text[text.index(start): text.index(end, text.index(start))]
    lines: list[str] = []
    for line in block.splitlines():
        line = line.rstrip()
        if line.startswith("↳"):
            lines[-1] += " " + line[1:].strip()
        else:
            lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


@pytest.mark.skipif(not PAPER.is_file(), reason="the paper's text (../shared/papers) is not beside this checkout")
def test_the_paper_prompt_set_is_the_papers_text_word_for_word():
    t = prompts.templates("paper")
    assert t.explore["instruction"] == _paper_template("Given a question that requires", "{4-Shot Examples}")
    assert t.complete["instruction"] == _paper_template("Given a set of documents and a specified", "{4-Shot Examples}")
    # the rendered prompt ends as the paper's templates do
    p = prompts.render_exploration_prompt("Q?", [], prompt_set="paper")
    assert p.startswith(t.explore["instruction"] + "\n\nQuestion: ")
    assert p.endswith("\n\nQuestion: Q?\nKnowledge triplets collected in previous steps:\n" + prompts.render_kg([]) + "\n")
    c = prompts.render_completion_prompt(GuidancePair("E", "g"), [], prompt_set="paper")
    assert c.endswith("Input Entity with Knowledge Guidance:\n- E: g\nStructured Knowledge Triple(s):\n")


def test_the_paper_set_s_exemplars_ask_several_pairs_and_carry_distractors():
    t = prompts.templates("paper")
    assert max(len(ex["output"].get("pairs", ())) for ex in t.explore["exemplars"]) >= 2
    assert all(len(ex["documents"]) >= 2 for ex in t.complete["exemplars"])
    assert prompts.templates("short").explore["instruction"] != t.explore["instruction"]
