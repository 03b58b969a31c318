"""TRACE's settings: the KG generator, the chain constructor (L, R, b, K), the reader, and the call kinds."""

from __future__ import annotations

import string
from dataclasses import dataclass, field

from knowtrace_train.methods.base import StrategyConfig

STRATEGY_NAME = "trace"

#: Call kinds recorded in ModelCall.role: a document's KG generation, a selector step, the reader.
KG, SELECT, ANSWER = "kg", "select", "answer"

#: The readers (one strategy, one key): the chains' triples, the chains' documents by votes, every
#: document of the question, no document.
READERS = ("triple", "doc", "all_docs", "no_docs")
#: Where a question's documents come from: the item's own contexts (the distractor setting), the
#: retriever's top `documents`, or the contexts where the item has them and the retriever otherwise.
DOCUMENT_SOURCES = ("auto", "contexts", "retrieve")
#: How the KG generator's demonstrations are chosen per document.
DEMO_SELECTIONS = ("similar", "fixed")
#: The option letters: option A ends the chain, so K <= 25.
OPTION_LETTERS = string.ascii_uppercase


@dataclass
class TraceRoleConfig:
    """The generator role (adapter) each call kind is sent with."""

    kg: str = field(default="kg", metadata={"help": "generator role (adapter) of the KG generator's calls"})
    select: str = field(default="select", metadata={"help": "generator role (adapter) of the triple selector (scored, not decoded)"})
    answer: str = field(default="answer", metadata={"help": "generator role (adapter) of the reader"})


@dataclass
class TraceConfig(StrategyConfig):
    """TRACE (the paper's defaults: L=4, R=5, b=5, K in {15, 20, 25, 30}; K is capped at 25 option letters)."""

    name: str = field(default=STRATEGY_NAME, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    reader: str = field(default="triple", metadata={"help": "triple (TRACE-Triple), doc (TRACE-Doc), all_docs or no_docs"})
    document_source: str = field(
        default="auto", metadata={"help": "auto (the item's contexts, else the retriever), contexts or retrieve"})
    documents: int = field(default=10, metadata={"help": "documents per question taken from the retriever (document_source retrieve)"})
    chain_length: int = field(default=4, metadata={"help": "L, the most triples per reasoning chain"})
    beams: int = field(default=5, metadata={"help": "R, reasoning chains kept by the beam search"})
    branch: int = field(default=5, metadata={"help": "b, options each chain expands per step"})
    candidates: int = field(default=15, metadata={"help": "K, triples the ranker offers the selector per step (at most 25)"})
    demonstrations: int = field(default=3, metadata={"help": "labelled documents shown to the KG generator (the most similar ones)"})
    demo_selection: str = field(
        default="similar", metadata={"help": "similar (the paper: the labelled documents nearest each document) or fixed "
                                             "(the first ones for every document: one shared prompt prefix, faster)"})
    max_triples: int = field(default=12, metadata={"help": "triples kept per document (the first ones)"})
    kg_max_new_tokens: int = field(default=96, metadata={"help": "new tokens of a KG generator call"})
    answer_max_new_tokens: int = field(default=32, metadata={"help": "new tokens of the reader call"})
    cache: bool = field(default=True, metadata={"help": "cache each document's triples by content under the cache home"})
    cache_dir: str | None = field(
        default=None, metadata={"help": "cache home for the document triples; None: $KNOWTRACE_CACHE or ~/.cache/knowtrace-train"})
    encoder: str = field(default="", metadata={"help": "bi-encoder of the ranker (sentence-transformers); empty: the offline all-MiniLM-L6-v2"})
    roles: TraceRoleConfig = field(default_factory=TraceRoleConfig, metadata={"help": "generator role (adapter) per call kind"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reader not in READERS:
            raise ValueError(f"strategy.reader must be one of {READERS}, got {self.reader!r}")
        if self.document_source not in DOCUMENT_SOURCES:
            raise ValueError(f"strategy.document_source must be one of {DOCUMENT_SOURCES}, got {self.document_source!r}")
        for key in ("documents", "chain_length", "beams", "branch", "candidates", "max_triples", "kg_max_new_tokens",
                    "answer_max_new_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"strategy.{key} must be a positive integer, got {value!r}")
        if self.candidates > len(OPTION_LETTERS) - 1:
            raise ValueError(f"strategy.candidates (K) must be at most {len(OPTION_LETTERS) - 1} (one option letter each), "
                             f"got {self.candidates}")
        if self.demo_selection not in DEMO_SELECTIONS:
            raise ValueError(f"strategy.demo_selection must be one of {DEMO_SELECTIONS}, got {self.demo_selection!r}")
        if isinstance(self.demonstrations, bool) or not isinstance(self.demonstrations, int) or self.demonstrations < 0:
            raise ValueError(f"strategy.demonstrations must be a non-negative integer, got {self.demonstrations!r}")

    @property
    def uses_chains(self) -> bool:
        """Whether the reader needs the graph and the chains (the two comparison readers do not)."""
        return self.reader in ("triple", "doc")
