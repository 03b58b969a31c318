"""Prompt rendering: templates, exemplars, the three KG renderings, and prompt lengths."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from knowtrace_train.methods.knowtrace import outputs
from knowtrace_train.data.schema import Passage
from knowtrace_train.kg import GuidancePair, Triplet, kg_paths, render_paths, render_triplets
from knowtrace_train.methods.knowtrace.parsing import parse_completion, parse_exploration
from knowtrace_train.methods.knowtrace.prompts import (
    COMPLETE_STOP,
    EXPLORE_STOP,
    KG_HEADER,
    TRIPLETS_HEADER,
    answer_prefix,
    exemplar_names,
    render_completion_prompt,
    render_exploration_prompt,
    render_kg,
    render_kg_to_text_prompt,
    templates,
)

REPO = Path(__file__).resolve().parents[1]
Q = "Which river runs through the home town of the inventor of the Pelmark loom?"
KG = [Triplet("Pelmark loom", "was invented by", "Ada Quist"), Triplet("Ada Quist", "was born in", "Sorrow Bay")]


def test_exploration_prompt_layout():
    p = render_exploration_prompt(Q, KG)
    assert p.startswith(templates().explore["instruction"])
    assert p.count("Question:") == 5  # 4 exemplars + the question
    assert p.endswith(f"Question: {Q}\n{KG_HEADER}\n(Pelmark loom; was invented by; Ada Quist)\n(Ada Quist; was born in; Sorrow Bay)\n")
    assert outputs.JUDGEMENT in p
    # No exemplar output contains a stop string, so the model can write one in full.
    for ex in templates().explore["exemplars"]:
        assert f"Question: {ex['question']}" in p


def test_exploration_prompt_empty_graph_and_no_fewshot():
    p = render_exploration_prompt(Q, [], fewshot=False)
    assert p.count("Question:") == 1
    assert p.endswith(f"{KG_HEADER}\nNone\n")
    assert "Harlow Press" not in p
    assert p.startswith(templates().explore["instruction"])


def test_exemplar_outputs_are_canonical_and_parse_back():
    for ex in templates().explore["exemplars"]:
        out = ex["output"]
        if "answer" in out:
            text = outputs.exploration_answer(out["thought"], out["answer"])
            r = parse_exploration(text)
            assert r.answered and r.answer == out["answer"] and r.thought == out["thought"]
        else:
            text = outputs.exploration_guidance(GuidancePair(*p) for p in out["pairs"])
            r = parse_exploration(text)
            assert r.error is None and [[p.entity, p.guidance] for p in r.pairs] == out["pairs"]
        assert not any(s in text for s in EXPLORE_STOP)
    for ex in templates().complete["exemplars"]:
        text = outputs.completion(Triplet(*map(str, t)) for t in ex["triplets"])
        assert [[t.subject, t.relation, t.object] for t in parse_completion(text).triplets] == [
            list(map(str, t)) for t in ex["triplets"]
        ]
        assert not any(s in text for s in COMPLETE_STOP)
        assert 1 <= len(ex["documents"]) <= 2


def test_kg_formats():
    assert render_kg(KG, "triplets") == render_triplets(KG)
    assert render_kg(KG, "paths") == "Pelmark loom -[was invented by]-> Ada Quist -[was born in]-> Sorrow Bay"
    assert render_kg(KG, "text", "Ada Quist invented\nthe loom.") == "Ada Quist invented the loom."
    assert render_kg([], "text") == "None"
    with pytest.raises(ValueError, match="kg_text"):
        render_kg(KG, "text")
    with pytest.raises(ValueError, match="kg_format"):
        render_kg(KG, "graph")
    p = render_exploration_prompt(Q, KG, kg_format="paths")
    assert "-[was invented by]->" in p and "Harlow Press -[" not in p  # exemplars with no graph stay "None"
    assert "Zentor -[was founded by]-> Odile Farrant" in p  # exemplar graphs use the same rendering
    t = render_exploration_prompt(Q, KG, kg_format="text", kg_text="Ada Quist invented the Pelmark loom.")
    assert t.endswith(f"{KG_HEADER}\nAda Quist invented the Pelmark loom.\n")
    assert "Zentor was founded by Odile Farrant." in t


def test_paths_cover_every_triplet_and_branch():
    ts = [
        Triplet("A", "r1", "B"),
        Triplet("B", "r2", "C"),
        Triplet("B", "r3", "D"),
        Triplet("E", "r4", "F"),
        Triplet("P", "q", "Q"),
        Triplet("Q", "q", "P"),
        Triplet("a", "r1", "b"),  # duplicate of the first after normalisation
    ]
    paths = kg_paths(ts)
    on_paths = {t.key() for p in paths for t in p}
    assert on_paths == {t.key() for t in ts}
    for p in paths:  # consecutive triplets chain
        for x, y in zip(p, p[1:]):
            assert x.key()[2] == y.key()[0]
    assert [len(p) for p in paths[:2]] == [2, 2]  # A-B-C and A-B-D: the branch repeats A-B
    assert render_paths([]) == "None"


def test_answer_prefix_forces_the_judgement():
    assert answer_prefix().startswith(outputs.JUDGEMENT) and answer_prefix().rstrip().endswith("Thought:")
    r = parse_exploration(answer_prefix() + " Ada Quist was born in Sorrow Bay.\nAnswer: Sorrow Bay")
    assert r.answered and r.answer == "Sorrow Bay" and r.thought == "Ada Quist was born in Sorrow Bay."


def test_completion_prompt_layout():
    pair = GuidancePair("Ada Quist", "the town where she was born")
    docs = [Passage("p1", "Ada Quist", "Ada Quist (born in Sorrow Bay)\ninvented looms."), Passage("p2", "Sorrow Bay", "A port.")]
    p = render_completion_prompt(pair, docs)
    assert p.count("Documents:") == 5
    assert p.endswith(
        "Documents:\nAda Quist: Ada Quist (born in Sorrow Bay) invented looms.\nSorrow Bay: A port.\n"
        f"Input Entity with Knowledge Guidance:\n- Ada Quist: the town where she was born\n{TRIPLETS_HEADER}\n"
    )
    bare = render_completion_prompt(pair, [], fewshot=False)
    assert bare.count("Documents:") == 1 and "Documents:\nNone\n" in bare
    assert bare.startswith(templates().complete["instruction"])


def test_kg_to_text_prompt():
    p = render_kg_to_text_prompt(KG)
    assert p.count("Knowledge triplets:") == 5
    assert p.endswith("(Ada Quist; was born in; Sorrow Bay)\nText:")
    assert render_kg_to_text_prompt(KG, fewshot=False).count("Knowledge triplets:") == 1


def test_prompt_lengths_fit_a_small_model(real_tokenizer):
    n = lambda s: len(real_tokenizer(s).input_ids)  # noqa: E731
    explore = n(render_exploration_prompt(Q, []))
    assert 350 <= explore <= 520, explore  # "around 450 tokens" with the 4 exemplars
    assert n(render_exploration_prompt(Q, [], fewshot=False)) < explore / 2.5
    assert n(render_completion_prompt(GuidancePair("Ada Quist", "birthplace"), [])) <= 480


def _words(text: str) -> str:
    return " " + re.sub(r"[^a-z0-9]+", " ", text.casefold()) + " "


def test_exemplar_names_stay_clear_of_the_world_data():
    world = REPO / "data" / "world"
    files = [f for f in (world / n for n in ("train.jsonl", "dev.jsonl", "test.jsonl", "corpus.jsonl")) if f.exists()]
    if not files:
        pytest.skip("data/world is not built in this checkout")
    text = _words("\n".join(f.read_text(encoding="utf-8") for f in files))
    clash = {n for n in exemplar_names() if _words(n) in text}
    assert not clash, f"exemplar names found in the world data: {sorted(clash)}"


def test_exemplar_names_stay_clear_of_the_benchmark_samples(shared_data):
    text = _words("\n".join(p.read_text(encoding="utf-8") for p in shared_data.rglob("*.json*")))
    clash = {n for n in exemplar_names() if _words(n) in text}
    assert not clash, f"exemplar names found in benchmark samples: {sorted(clash)}"
