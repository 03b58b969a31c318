"""The synthetic multi-hop world: the toolkit's bundled default data, generated from a seed.

The generator of the files the package ships (knowtrace_train/data/world_files/), run by scripts/make_world.py;
no user's run calls it (the package reads the shipped files, facts.jsonl included: data/bundled.py).

`make_world(seed, scale)` builds fictional entities (countries, cities, universities, people,
companies, films, novels, bands) with coined names, their facts, short passages stating them
among distractors, and 1-4 hop questions with gold answers and gold evidence (the chain of
triples, one sub-question per hop, the passages stating each hop). `write_world` writes the
splits and the corpus as JSON Lines. Everything random comes from `random.Random(seed)`.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from knowtrace_train.data.facts import FACTS_FILE, Fact, write_facts
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.io import write_jsonl
from knowtrace_train.kg import Triplet

from .kb import RELATIONS, KnowledgeBase, build_kb, object_name
from .passages import write_passages
from .questions import QuestionMaker

SPLITS = ("train", "dev", "test")
DEFAULT_SIZES = {"train": 1000, "dev": 200, "test": 200}


@dataclass
class World:
    """A generated world: the shared corpus and the question splits ("train", "dev", "test")."""

    corpus: list[Passage]
    splits: dict[str, list[QAItem]]
    seed: int = 0
    scale: float = 1.0
    #: the knowledge base behind it (entities and facts), for inspection and tests
    kb: KnowledgeBase | None = field(default=None, repr=False)
    #: every fact a passage states, with that passage's id (facts.jsonl: what gold completions write)
    facts: list[Fact] = field(default_factory=list, repr=False)

    def stats(self) -> dict:
        """Sizes and the (type, hops) distribution per split."""
        out: dict = {"corpus": len(self.corpus), "entities": len(self.kb.entities) if self.kb else None}
        for name, items in self.splits.items():
            dist = Counter(f"{it.type}/{it.hops}" for it in items)
            out[name] = {
                "questions": len(items),
                "by_type_hops": dict(sorted(dist.items())),
                "by_hops": dict(sorted(Counter(it.hops for it in items).items())),
                "by_type": dict(sorted(Counter(it.type for it in items).items())),
            }
        return out


def world_facts(kb: KnowledgeBase) -> list[tuple[str, str, str]]:
    """Every fact of the world as a (subject, relation, object) triple, named as gold triples name
    them (canonical names; years as digits), in entity order: the world's knowledge graph, for
    methods that answer over a graph (DoG) or turn one into text (MINTQA)."""
    out = []
    for e in kb.entities:
        for name, value in e.facts.items():
            out.append((e.name, name, object_name(kb, RELATIONS[(e.kind, name)], value)))
    return out


def stated_facts(kb: KnowledgeBase, corpus: list[Passage], fact_passage: dict[tuple[int, str], int]) -> list[Fact]:
    """Every fact of the world that a passage states, with that passage's id, in entity order."""
    out = []
    for e in kb.entities:
        for name, value in e.facts.items():
            i = fact_passage.get((e.index, name))
            if i is not None:
                out.append(Fact(Triplet(e.name, name, object_name(kb, RELATIONS[(e.kind, name)], value)), corpus[i].id))
    return out


def make_world(
    seed: int = 0,
    scale: float = 1.0,
    *,
    n_train: int = DEFAULT_SIZES["train"],
    n_dev: int = DEFAULT_SIZES["dev"],
    n_test: int = DEFAULT_SIZES["test"],
) -> World:
    """Generate the world for `seed`; `scale` multiplies the entities and passages (about
    2,400 passages at 1.0). The numbers of questions do not grow with `scale`."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    rng = random.Random(seed)
    kb = build_kb(rng, scale)
    corpus, fact_passage = write_passages(kb, rng)
    maker = QuestionMaker(kb, corpus, fact_passage, rng, {"train": n_train, "dev": n_dev, "test": n_test})
    splits = {name: maker.make_split(name) for name in SPLITS}
    return World(corpus=corpus, splits=splits, seed=seed, scale=scale, kb=kb,
                 facts=stated_facts(kb, corpus, fact_passage))


def write_world(world: World, out_dir: Path | str) -> None:
    """Write out_dir/{train,dev,test}.jsonl (one QAItem per line), out_dir/corpus.jsonl and out_dir/facts.jsonl."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, items in world.splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", (it.to_dict() for it in items))
    write_jsonl(out_dir / "corpus.jsonl", (p.to_dict() for p in world.corpus))
    write_facts(out_dir / FACTS_FILE, world.facts)
