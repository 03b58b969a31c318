"""Gold trajectories from gold evidence chains: chains per dataset shape, the records they give."""

from __future__ import annotations

from knowtrace_train.methods.knowtrace import prompts
from knowtrace_train.data.schema import GoldEvidence, Passage, QAItem, SubQuestion, passage_id
from knowtrace_train.methods.knowtrace.gold import (NO_CHAIN, UNSUPPORTED_HOP, gold_chain, gold_thought,
                                               gold_trajectory_records)
from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.methods.knowtrace.parsing import parse_completion, parse_exploration
from knowtrace_train.retrieval.base import ScoredPassage, check_search_args


def _p(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


CORPUS = [
    _p("Odile Farrant", "Odile Farrant (born 1902 in Castelbrun) was an engineer."),
    _p("Castelbrun", "Castelbrun is a river port in Doravia."),
    _p("Harlow Press", "Harlow Press is a publisher of maps founded in 1821."),
    _p("Zentor", "Zentor is a bicycle company founded by Odile Farrant."),
]


class WordOverlap:
    """A tiny retriever: passages ranked by shared lower-cased words with the query."""

    def __init__(self, passages):
        self.passages = list(passages)

    def search(self, queries, k):
        check_search_args(queries, k)
        out = []
        for q in queries:
            qw = set(q.lower().replace("?", " ").replace(":", " ").split())
            scored = [(len(qw & set((p.title + " " + p.text).lower().split())), i, p) for i, p in enumerate(self.passages)]
            scored = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[:k]
            out.append([ScoredPassage(p, float(s)) for s, _, p in scored])
        return out


WORLD_ITEM = QAItem(
    id="w1", question="In which country is the birthplace of the founder of Zentor?", answers=("Doravia",),
    dataset="world",
    evidence=GoldEvidence(
        triples=(("Zentor", "founded by", "Odile Farrant"), ("Odile Farrant", "born in", "Castelbrun"),
                 ("Castelbrun", "country", "Doravia")),
        sub_questions=(SubQuestion("Who founded Zentor?", "Odile Farrant"),
                       SubQuestion("Where was Odile Farrant born?", "Castelbrun"),
                       SubQuestion("In which country is Castelbrun?", "Doravia")),
    ),
)


def test_chain_from_triples_with_sub_questions():
    hops = gold_chain(WORLD_ITEM)
    assert [h.pair for h in hops] == [GuidancePair("Zentor", "Who founded Zentor?"),
                                      GuidancePair("Odile Farrant", "Where was Odile Farrant born?"),
                                      GuidancePair("Castelbrun", "In which country is Castelbrun?")]
    assert [h.triplet for h in hops] == [Triplet(*t) for t in WORLD_ITEM.evidence.triples]


def test_chain_from_2wiki_triples_without_sub_questions():
    item = QAItem(id="x", question="Who is the mother of the director of film Q?", answers=("M",),
                  evidence=GoldEvidence(triples=(("Q", "director", "D"), ("D", "mother", "M"))))
    hops = gold_chain(item)
    assert [h.pair for h in hops] == [GuidancePair("Q", "find the director of Q"), GuidancePair("D", "find the mother of D")]
    assert gold_thought(hops, "M") == "The director of Q is D. The mother of D is M. So the answer is M."


def test_chain_from_musique_decomposition():
    ctx = (_p("Hello Love (song)", "..."), _p("Hank Snow", "..."), _p("Journal X", "..."))
    item = QAItem(id="m", question="q?", answers=("North Carolina",), dataset="musique", context=ctx,
                  evidence=GoldEvidence(sub_questions=(
                      SubQuestion("Hello Love >> performer", "Hank Snow"),
                      SubQuestion("What state did #1 live when he died?", "Tennessee"),
                      SubQuestion("Which state borders #2 to the east?", "North Carolina"))))
    hops = gold_chain(item)
    assert [h.triplet for h in hops] == [Triplet("Hello Love", "performer", "Hank Snow"),
                                         Triplet("Hank Snow", "live when he died", "Tennessee"),
                                         Triplet("Tennessee", "borders to the east", "North Carolina")]
    assert hops[1].pair == GuidancePair("Hank Snow", "What state did Hank Snow live when he died?")
    # a first natural-language hop takes its entity from the supporting paragraph's title
    item2 = QAItem(id="m2", question="q?", answers=("APA",), context=ctx, evidence=GoldEvidence(sub_questions=(
        SubQuestion("What company published Journal X?", "APA", paragraph_ids=(ctx[2].id,)),)))
    assert gold_chain(item2)[0].triplet == Triplet("Journal X", "published", "APA")


def test_no_chain_is_a_reason():
    item = QAItem(id="h", question="q?", answers=("a",), evidence=GoldEvidence(titles=("A", "B")))
    assert gold_chain(item) == NO_CHAIN


def test_gold_records_parse_back_to_the_chain():
    res = gold_trajectory_records([WORLD_ITEM], WordOverlap(CORPUS), k=2)
    assert res.stats["trajectories"] == 1 and res.stats["skipped"] == {}
    assert res.stats["backtrace_check"] == {"fa_ratio": 0.0, "backtraced": 1, "skipped": {}, "fa_decomposed": {
        "untraceable": 0.0, "unneeded_pairs": 0.0, "extraneous_triplets": 0.0, "dropped_by_both": 0.0}}
    explore, complete = res.records_by_role["explore"], res.records_by_role["complete"]
    assert len(explore) == 4 and len(complete) == 3 and not res.records_by_role["answer"]
    assert [parse_exploration(r["completion"]).pairs for r in explore[:3]] == [[h.pair] for h in gold_chain(WORLD_ITEM)]
    final = parse_exploration(explore[3]["completion"])
    assert final.answered and final.answer == "Doravia"
    assert [parse_completion(r["completion"]).triplets for r in complete] == \
        [[Triplet(*t)] for t in WORLD_ITEM.evidence.triples]
    # the completion prompts show what the retriever returned for each pair; the graph grows per round
    traj = res.trajectories[0]
    assert explore[1]["prompt"] == prompts.render_exploration_prompt(WORLD_ITEM.question, [Triplet(*WORLD_ITEM.evidence.triples[0])])
    assert all(r["iteration"] == 0 and r["trajectory_id"] == "w1#gold" for r in explore + complete)
    assert [e.name for e in traj.graph.initial_entities] == ["Zentor"]


def test_gold_records_without_exemplars_are_shorter():
    a = gold_trajectory_records([WORLD_ITEM], WordOverlap(CORPUS), k=2)
    b = gold_trajectory_records([WORLD_ITEM], WordOverlap(CORPUS), k=2, fewshot=False)
    assert [r["completion"] for r in a.records_by_role["explore"]] == [r["completion"] for r in b.records_by_role["explore"]]
    assert all(len(x["prompt"]) > len(y["prompt"]) for x, y in zip(a.records_by_role["complete"], b.records_by_role["complete"]))


def test_unsupported_hop_skips_the_item():
    res = gold_trajectory_records([WORLD_ITEM], WordOverlap(CORPUS[2:]), k=2)
    assert res.stats["skipped"] == {UNSUPPORTED_HOP: 1} and res.stats["trajectories"] == 0
    res = gold_trajectory_records([WORLD_ITEM], WordOverlap(CORPUS[2:]), k=2, require_support=False)
    assert res.stats["trajectories"] == 1
