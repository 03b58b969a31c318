"""Gold evidence chains: the hops an item's gold evidence implies, shared by every method's gold trajectories.

A chain is a list of `Hop`s, one per step from the question's entity to the answer. It comes from
`evidence.triples` (the synthetic world, 2WikiMultihopQA, MINTQA; the aligned sub-questions, where
present, phrase each hop's question) or from MuSiQue's decomposition (`evidence.sub_questions` with
"#k" references and "entity >> relation" steps). An item without a chain (HotpotQA) gives the reason
instead (`NO_CHAIN`, `NO_CHAIN_ENTITY`), never an exception. KnowTrace's gold trajectories
(knowtrace/gold.py) and the baselines' (baselines/gold.py) both read chains from here, and both skip
an item whose hop answer the retrieved passages do not state (`supported`, reason `UNSUPPORTED_HOP`).
TRACE's gold trajectories (trace/gold.py) write a gold triple for each document that names both its
entities (`states`). Every method checks an item's chain with `checked_chain` (the reason where it has
none, or a hop lacks a part the method writes); the rest the gold modules share is methods/gold_records.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.data.facts import mentions, passage_words, states  # noqa: F401  (shared with data/facts.py)
from knowtrace_train.metrics import normalize_answer

#: skip reasons: the item has no gold chain; a MuSiQue step names no entity; a hop's answer is not in
#: the passages retrieved for it
NO_CHAIN = "no_chain"
NO_CHAIN_ENTITY = "no_chain_entity"
UNSUPPORTED_HOP = "unsupported_hop"

_REF = re.compile(r"#(\d+)")
_AUX = r"(?:is|are|was|were|did|does|do|has|have|had)"
#: a leading wh-phrase: "who was", "where did", "which state", "what city did", "how many stores are"
_WH = re.compile(
    rf"^\s*(?:(?:what|which|whose|how\s+(?:many|much))(?:\s+(?!{_AUX}\b)\w+)?|who|whom|where|when|why|how)\b"
    rf"(?:\s+{_AUX}\b)?\s*",
    re.IGNORECASE,
)
_PARTICIPLE = {"born", "educated", "founded", "located", "married", "directed", "written", "painted",
               "published", "employed", "based", "buried", "named", "owned", "produced", "composed",
               "headquartered", "formed", "released", "created", "designed", "built"}


@dataclass(frozen=True)
class Hop:
    """One step of a gold chain: the pair KnowTrace's exploration asks, the triplet its completion
    finds, and the hop as a natural-language sub-question (the baselines ask it)."""

    pair: GuidancePair
    triplet: Triplet
    #: the hop's sentence in the final thought, where the relation does not make one
    sentence: str | None = None
    #: the hop as a question: the item's aligned sub-question (its "#k" references resolved), or one made
    #: from the relation ("What is the director of Q?") where the data has none
    question: str = ""


def _guidance(entity: str, relation: str) -> str:
    return f"find the {relation} of {entity}"


def _relation_question(entity: str, relation: str) -> str:
    return f"What is the {relation} of {entity}?"


def _sub_question_text(question: str, answers: Sequence[str]) -> str:
    def ref(m: re.Match) -> str:
        k = int(m.group(1)) - 1
        return answers[k] if 0 <= k < len(answers) else m.group(0)

    return " ".join(_REF.sub(ref, question).split())


def _triples_chain(item: QAItem) -> list[Hop]:
    triples = [Triplet(*map(str, t)) for t in item.evidence.triples]
    subs = item.evidence.sub_questions
    aligned = len(subs) == len(triples)
    hops = []
    for i, t in enumerate(triples):
        sub = _sub_question_text(subs[i].question, [s.answer for s in subs]) if aligned else None
        guidance = sub if sub is not None else _guidance(t.subject, t.relation)
        hops.append(Hop(GuidancePair(t.subject, guidance), t,
                        question=sub if sub else _relation_question(t.subject, t.relation)))
    return hops


def _relation_from_question(question: str, entity: str) -> str:
    """A relation phrase from a natural-language sub-question: the question without its
    wh-phrase, the entity and the question mark ("Which state borders #2 to the east?" ->
    "borders to the east")."""
    q = question.replace("?", " ")
    q = _REF.sub(" ", q)
    if entity:
        q = re.sub(re.escape(entity), " ", q, flags=re.IGNORECASE)
    q = _WH.sub("", q.strip())
    return " ".join(q.split()).strip(" ,.") or "is related to"


def _musique_chain(item: QAItem) -> list[Hop] | str:
    subs = item.evidence.sub_questions
    answers = [s.answer for s in subs]
    titles = {p.id: p.title for p in item.context}
    hops = []
    for s in subs:
        q = s.question.strip()
        if ">>" in q:
            ent, rel = (x.strip() for x in q.split(">>", 1))
            entity = _sub_question_text(ent, answers)
            relation = rel
            guidance = _guidance(entity, relation)
            question = _relation_question(entity, relation)
        else:
            refs = [int(k) - 1 for k in _REF.findall(q)]
            if refs and 0 <= refs[0] < len(answers):
                entity = answers[refs[0]]
            else:
                cands = [titles[p] for p in s.paragraph_ids if p in titles]
                entity = next((t for t in cands if t and t.lower() in q.lower()), "")
                if not entity:
                    return NO_CHAIN_ENTITY
            relation = _relation_from_question(q, entity if not refs else "")
            guidance = _sub_question_text(q, answers).rstrip(" ?") + "?"
            question = guidance
        if not entity.strip() or not s.answer.strip():
            return NO_CHAIN_ENTITY
        sentence = None if ">>" in q else f"The answer to \"{guidance}\" is {s.answer}."
        hops.append(Hop(GuidancePair(entity, guidance), Triplet(entity, relation, s.answer), sentence, question))
    return hops


def gold_chain(item: QAItem) -> list[Hop] | str:
    """The hops of an item's gold evidence chain, or the reason it has none."""
    if item.evidence.triples:
        return _triples_chain(item)
    if item.evidence.sub_questions:
        return _musique_chain(item)
    return NO_CHAIN


def checked_chain(item: QAItem, need: Sequence[str] = ()) -> list[Hop] | str:
    """The item's gold chain, or the reason it has none: `gold_chain`'s (`NO_CHAIN` for an empty one too),
    or `NO_CHAIN_ENTITY` where a hop has a blank one of the parts `need` names ("question", or a part of
    its triplet: "subject", "relation", "object")."""
    chain = gold_chain(item)
    if isinstance(chain, str) or not chain:
        return chain if isinstance(chain, str) else NO_CHAIN

    def blank(h: Hop, part: str) -> bool:
        return not (h.question if part == "question" else getattr(h.triplet, part)).strip()

    if any(blank(h, part) for h in chain for part in need):
        return NO_CHAIN_ENTITY
    return chain


def chain_rounds(hops: Sequence[Hop]) -> list[list[Hop]]:
    """The hops grouped into the rounds a model exploring as the paper's does asks them in: a hop whose subject
    is the object of an earlier hop comes in the round after that hop's, every other hop in the first round (a
    comparison's two entities together; each branch of a chain one round deeper per hop). Within a round the
    hops keep the chain's order."""
    depth: list[int] = []
    for i, h in enumerate(hops):
        s = normalize_answer(h.pair.entity)
        deps = [depth[j] for j in range(i) if normalize_answer(hops[j].triplet.object) == s]
        depth.append(1 + max(deps) if deps else 1)
    return [[h for h, d in zip(hops, depth) if d == r] for r in range(1, max(depth, default=0) + 1)]


def triplet_sentence(t: Triplet) -> str:
    """A triplet as one sentence ("Zentor was founded by Odile Farrant.", "The director of Q is D.")."""
    words = t.relation.split()
    if words and (words[0].lower() in _PARTICIPLE):
        return f"{t.subject} was {t.relation} {t.object}."
    if words and words[-1].lower() in {"in", "at", "by", "of", "to", "from", "for", "with", "on", "as"}:
        return f"{t.subject} {t.relation} {t.object}."
    if len(words) <= 4 and not re.search(r"\b(is|was|are|were|has|had)\b", t.relation):
        return f"The {t.relation} of {t.subject} is {t.object}."
    return f"{t.subject} {t.relation} {t.object}."


def hop_sentence(hop: Hop) -> str:
    """The sentence that states a hop's answer (its own where it has one, else its triplet's)."""
    return hop.sentence or triplet_sentence(hop.triplet)


def gold_thought(hops: Sequence[Hop], answer: str) -> str:
    """The final thought: one sentence per hop, then the answer."""
    return " ".join(hop_sentence(h) for h in hops) + f" So the answer is {answer}."


def supported(t: Triplet, passages: Sequence[Passage]) -> bool:
    """Whether one of `passages` states the triplet's object (normalized words, whole-word match)."""
    return any(mentions(t.object, p) for p in passages)


