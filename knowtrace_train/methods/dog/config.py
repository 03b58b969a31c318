"""DoG's settings and call kinds: the graph it answers over, debate rounds, the hop limit, tokens per call."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from knowtrace_train.methods.base import StrategyConfig

NAME = "dog"

#: Call kinds recorded in ModelCall.role (each trains the adapter of the same name under STaR):
#: RELATION the first-hop sub-question and the relation chosen from the list; ANSWER_TRY Yes/No (and the
#: answer) from the filled triples; EXPERT, CRITIC, LINGUIST the debate's three roles, each writing a
#: simplified question; FALLBACK the answer from the model's own knowledge when the loop ends unanswered.
RELATION, ANSWER_TRY, EXPERT, CRITIC, LINGUIST, FALLBACK = "relation", "answer_try", "expert", "critic", "linguist", "fallback"
CALL_KINDS = (RELATION, ANSWER_TRY, EXPERT, CRITIC, LINGUIST, FALLBACK)
#: one debate round: the three roles speak in this order, each seeing the whole chat so far
DEBATE_ORDER = (EXPERT, CRITIC, LINGUIST)

ANSWER_SOURCES = ("model", "tail")
#: a `graph` that starts so is a SPARQL endpoint; anything else is an embedded store
ENDPOINT_SCHEMES = ("http://", "https://")


@dataclass
class DoGConfig(StrategyConfig):
    """Debating over Graphs: per hop, relation filtering, triple filling, answer trying, and a
    three-role debate that rewrites the question one hop shorter (docs/dog.md)."""

    name: str = field(default=NAME, metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    graph: str = field(
        default="world",
        metadata={"help": "the knowledge graph: 'world' (the bundled world's facts, seed 0), 'items' (the gold triples of "
                          "the questions run: 2Wiki's evidences, MINTQA's triplets), a triples file (JSONL [s, r, o], "
                          ".tsv, or MetaQA's kb.txt 's|r|o'), or an http(s) SPARQL endpoint URL"},
    )
    debate_rounds: int = field(
        default=1,
        metadata={"help": "rounds of the expert -> critic -> linguist debate per hop (the paper's best: 1); 0: the expert "
                          "alone rewrites the question (no critic, no linguist)"},
    )
    max_hops: int = field(
        default=4,
        metadata={"help": "most hops (relation, triples, answer try) per question; then the fallback answers from the "
                          "model's own knowledge. 0: the fallback alone (the model without the graph)"},
    )
    max_relations: int = field(default=30, metadata={"help": "most candidate relations listed in a relation prompt"})
    max_triples: int = field(
        default=5, metadata={"help": "most filled triples shown in an answer try (the first one's tail is the next topic entity)"}
    )
    answer_from: str = field(
        default="model",
        metadata={"help": "the answer after a Yes: 'model' (the answer the answer try writes; the first tail when it writes "
                          "none) or 'tail' (the first filled triple's tail entity, the paper's MetaQA setting)"},
    )
    answer_try_threshold: float | None = field(
        default=None,
        metadata={"help": ("the answer try's Yes/No as a calibrated decision: Yes where log P(' Yes') - log P(' No') as "
                           "the answer try's first word exceeds this (scored before the rest of the call is written; with "
                           "a temperature, Yes is drawn with probability sigmoid((log-odds - threshold) / temperature)); "
                           "null: the greedy next token. Self-training sets it per trained model from held-out gold "
                           "prompts (calibration.questions), docs/decisions.md")},
    )
    fewshot: bool = field(default=True, metadata={"help": "prompts carry their exemplars (trained adapters run without them)"})
    relation_tokens: int = field(default=32, metadata={"help": "new tokens of a relation call (sub-question and relation lines)"})
    answer_tokens: int = field(default=16, metadata={"help": "new tokens of an answer try (verdict and answer lines)"})
    debate_tokens: int = field(default=32, metadata={"help": "new tokens of one debate turn (a simplified question)"})
    fallback_tokens: int = field(default=24, metadata={"help": "new tokens of the fallback answer"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature of every call (0: greedy)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.graph:
            raise ValueError("strategy.graph must name a graph: world, items, a triples file or an endpoint URL")
        if self.debate_rounds < 0:
            raise ValueError(f"strategy.debate_rounds must be >= 0, got {self.debate_rounds}")
        if self.max_hops < 0:
            raise ValueError(f"strategy.max_hops must be >= 0, got {self.max_hops}")
        if self.answer_from not in ANSWER_SOURCES:
            raise ValueError(f"strategy.answer_from must be one of {list(ANSWER_SOURCES)}, got {self.answer_from!r}")
        for key in ("max_relations", "max_triples", "relation_tokens", "answer_tokens", "debate_tokens", "fallback_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"strategy.{key} must be >= 1, got {getattr(self, key)}")
        if self.temperature < 0:
            raise ValueError(f"strategy.temperature must be >= 0, got {self.temperature}")
        t = self.answer_try_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
            raise ValueError(f"strategy.answer_try_threshold must be a finite number or null, got {t!r}")

    def check_installed(self) -> None:
        """An embedded graph (any `graph` but an endpoint URL) needs the kg extra's pyoxigraph."""
        if not self.graph.startswith(ENDPOINT_SCHEMES):
            from knowtrace_train.kg_store.store import oxigraph_module

            oxigraph_module()

    def debate_roles(self) -> tuple[str, ...]:
        """The roles that speak in a hop's debate, in order, over all rounds."""
        return (EXPERT,) if self.debate_rounds == 0 else DEBATE_ORDER * self.debate_rounds
