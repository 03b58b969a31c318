"""The synthetic world that ships inside the package (knowtrace_train/data/world_files/), found from anywhere.

The defaults of every config name the world as a checkout does, `data/world/<file>` (in a checkout `data/world` links
to the package's folder). Run outside a checkout, from an installed wheel, that relative path is not there:
`bundled_path` then gives the packaged copy, so `knowtrace-train selftrain` and `evaluate` run with their defaults
wherever they are installed. A path that exists as given, or that is not the world's, is left as it is.
`world_triples` reads the world's knowledge graph from the packaged facts.jsonl (its generator, scripts/world/,
stays outside the package).
"""

from __future__ import annotations

from pathlib import Path

#: the world's files in the installed package: train/dev/test.jsonl, corpus.jsonl, facts.jsonl, README.md
WORLD_DIR = Path(__file__).resolve().parent / "world_files"
#: how configs and the checkout name the world's folder
CHECKOUT_WORLD = ("data", "world")


def bundled_path(path: str | None) -> str | None:
    """`path`, or, where it is a relative `data/world/<file>` that does not exist from here, the packaged file."""
    if not path:
        return path
    p = Path(path)
    if p.is_absolute() or p.exists() or p.parts[:2] != CHECKOUT_WORLD or len(p.parts) != 3:
        return path
    packaged = WORLD_DIR / p.parts[2]
    return str(packaged) if packaged.is_file() else path


def world_triples() -> list[tuple[str, str, str]]:
    """The bundled world's knowledge graph: every fact of the packaged facts.jsonl as a (subject, relation, object)
    triple, in the file's order (what scripts/world/'s `world_facts` gives for seed 0), for the methods that answer
    over a graph (DoG) or turn one into text (a `kg` corpus of `triples: world`)."""
    from knowtrace_train.data.facts import FACTS_FILE, FactIndex

    return [(f.triplet.subject, f.triplet.relation, f.triplet.object)
            for f in FactIndex.from_file(WORLD_DIR / FACTS_FILE).facts]
