"""TRACE's prompts: the KG generator's instruction and labelled documents, the triple selector, the reader.

The labelled documents are written for this project (fictional people, places and works); none comes
from an evaluation set. The KG generator shows the `demonstrations` most similar of them (the paper
retrieves its demonstrations the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from knowtrace_train.kg import Triplet
from knowtrace_train.methods.trace.config import OPTION_LETTERS

#: Part of every document's cache key: bump it when a prompt below changes.
PROMPT_VERSION = "trace-kg-1"


@dataclass(frozen=True)
class LabelledDocument:
    title: str
    text: str
    triples: tuple[tuple[str, str], ...]  # (relation, tail); the head is the title


LABELLED_DOCUMENTS: tuple[LabelledDocument, ...] = (
    LabelledDocument(
        "Orla Vennick",
        "Orla Vennick (born 14 March 1961) is a Danish-born architect who designed the Halvard Concert Hall. "
        "She studied at the Royal Academy of Fine Arts and later taught in Rotterdam.",
        (("date of birth", "14 March 1961"), ("occupation", "architect"), ("designed", "Halvard Concert Hall"),
         ("educated at", "Royal Academy of Fine Arts"), ("taught in", "Rotterdam")),
    ),
    LabelledDocument(
        "The Salt Orchard",
        "The Salt Orchard is a 1987 drama film directed by Piet Ambrose and starring Lena Cordova. "
        "It was shot on the coast of Brittany and won the jury prize at the Tessaly Film Festival.",
        (("genre", "drama film"), ("release year", "1987"), ("director", "Piet Ambrose"), ("cast member", "Lena Cordova"),
         ("filming location", "Brittany"), ("award", "jury prize at the Tessaly Film Festival")),
    ),
    LabelledDocument(
        "Kestrel Bay",
        "Kestrel Bay is a port town in the county of Marrowshire, with a population of 18,400 at the 2011 census. "
        "The River Dane flows into the sea there.",
        (("instance of", "port town"), ("located in", "Marrowshire"), ("population", "18,400"),
         ("river", "River Dane")),
    ),
    LabelledDocument(
        "Brannock Motors",
        "Brannock Motors is a car manufacturer founded in 1923 by Edwin Brannock in Leeds. "
        "Its headquarters moved to Sheffield in 1960, and it is now owned by the Tovar Group.",
        (("instance of", "car manufacturer"), ("founded in", "1923"), ("founder", "Edwin Brannock"),
         ("founded at", "Leeds"), ("headquarters", "Sheffield"), ("owned by", "Tovar Group")),
    ),
    LabelledDocument(
        "The Lamplight Choir",
        "The Lamplight Choir were an indie rock band formed in Glasgow in 1994. Their second album, "
        "Paper Harbours, was produced by Mina Solberg. Singer Callum Reid later went solo.",
        (("genre", "indie rock"), ("formed in", "Glasgow"), ("formation year", "1994"), ("album", "Paper Harbours"),
         ("producer", "Mina Solberg"), ("member", "Callum Reid")),
    ),
    LabelledDocument(
        "Isidore Quell",
        "Isidore Quell (1902-1978) was a Belgian novelist and the author of The Glass Meridian. "
        "He was married to the painter Agathe Moreau and died in Ghent.",
        (("lifespan", "1902-1978"), ("nationality", "Belgian"), ("occupation", "novelist"),
         ("author of", "The Glass Meridian"), ("spouse", "Agathe Moreau"), ("place of death", "Ghent")),
    ),
)

KG_INSTRUCTION = (
    "Turn the document into knowledge triples. Each triple is <head; relation; tail>: the head is the "
    "document's title, the relation is a short phrase, and the tail is a short phrase taken from the text. "
    "Write one triple per line and nothing else."
)
KG_STOP = ("\n\n", "Title:")


def render_triple(t: Triplet) -> str:
    """The form the KG generator writes and the other prompts show: `<head; relation; tail>`."""
    return f"<{t.subject}; {t.relation}; {t.object}>"


def render_document(title: str, text: str) -> str:
    return f"Title: {title}\nText: {text}"


def render_kg_prompt(title: str, text: str, demos: Sequence[LabelledDocument]) -> str:
    blocks = [KG_INSTRUCTION]
    for d in demos:
        triples = "\n".join(f"<{d.title}; {r}; {t}>" for r, t in d.triples)
        blocks.append(f"{render_document(d.title, d.text)}\nTriples:\n{triples}")
    blocks.append(f"{render_document(title, text)}\nTriples:")
    return "\n\n".join(blocks)


SELECT_INSTRUCTION = (
    "Build a chain of knowledge triples that answers the question. Given the triples chosen so far, "
    "pick the one option that adds the most useful next triple. Reply with the option's letter only."
)
STOP_OPTION = "no need for additional knowledge triples"


def option_letters(n_candidates: int) -> list[str]:
    """Letters of option A (stop) and of `n_candidates` triples."""
    return list(OPTION_LETTERS[: n_candidates + 1])


def render_select_prompt(question: str, chain: Sequence[Triplet], candidates: Sequence[Triplet]) -> str:
    chosen = "\n".join(render_triple(t) for t in chain) if chain else "None"
    letters = option_letters(len(candidates))
    options = [f"A. {STOP_OPTION}"] + [f"{letter}. {render_triple(t)}" for letter, t in zip(letters[1:], candidates)]
    return (f"{SELECT_INSTRUCTION}\n\nQuestion: {question}\nChosen triples:\n{chosen}\nOptions:\n"
            + "\n".join(options) + "\nAnswer:")


READER_INSTRUCTION = (
    "Answer the question with a short phrase (a name, a place, a date, a number, or yes or no). "
    "Use the context where it helps."
)
READER_STOP = ("\n",)


def render_reader_prompt(question: str, context: str | None) -> str:
    """The reader's prompt; `context` None is the no-documents reader (no context block at all)."""
    if context is None:
        return f"{READER_INSTRUCTION}\n\nQuestion: {question}\nAnswer:"
    return f"{READER_INSTRUCTION}\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:"
