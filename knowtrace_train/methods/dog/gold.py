"""Gold trajectories of DoG: its own loop walked along an item's gold evidence chain, with gold decisions in place of the model.

The chain is the shared one (methods/gold_chain.py): per hop its triplet and its sub-question (the
item's aligned sub-question, "#k" resolved, or "What is the <relation> of <entity>?"). `GoldDoG` is
DoG's engine (engine.py) whose `generate` writes each call's gold text instead of asking a model, so
the prompts, the relation lists, the filled triples and the parsing are the engine's own. Per hop k of
n (the topic entity first, then each hop's answer):

    relation     " <hop k's sub-question>\\nRelation: <i>. <gold relation>"   (i: its number in the list
                 get_relations offers; "~r" where the chain runs the triple backwards)
    answer_try   " No" for k < n; " Yes\\nAnswer: <answer>" at k = n
    expert       " <the question left>"                                      } each debate round,
    critic       " different. Simplified question: <the question left>"      } after a No
    linguist     " <the question left>"                                      }

The question left after hop k is hop k+1's sub-question: the whole rest of the question only where
k + 1 = n, so a chain of more than 2 hops has no gold rewrite for its earlier hops (the data's
sub-questions are one hop each, and DoG's parser reads one question) and is skipped (`no_rewrite`).
With `max_hops: 0` (the model alone) the gold trajectory is the fallback call " <answer>": nothing
retrieved states it, so `require_support` skips it (`unsupported_hop`). An item is skipped, counted
under its reason, never raised on, where:

    no_chain / no_chain_entity  the item has no gold chain (gold_chain.py)
    too_many_hops               the chain has more hops than `max_hops`
    not_a_walk                  the hops do not run from the topic entity each to the next, ending at
                                the answer (a comparison's parallel facts; a chain without triples has
                                no topic entity)
    no_rewrite                  more than 2 hops (above)
    chain_not_in_graph          the graph store lacks a hop's entity, its relation from that entity, or
                                the gold triple among those the relation fills
    relation_not_listed         the gold relation is in the store but not in the list the relation
                                prompt offers (cut at `max_relations`, or the relation straight back)
    off_the_walk                the relation fills several triples and the one DoG walks on (the first
                                shown) is not the gold one (at the last hop: the gold triple is not
                                shown, or, with `answer_from: tail`, not first)
    store_error                 a store lookup failed
    unreadable_step             DoG's parser did not read a gold output back as the intended step (a
                                relation name another listed name contains, a sub-question with a
                                question mark inside) or the walk did not end with the gold answer
    unsupported_hop             (`require_support`, `max_hops: 0` only) the fallback's answer

A walked hop needs no other support check: its triple is one the store filled and the prompts showed.
The records are the STaR records of these trajectories (methods/star.py), every call kept
(methods/gold_records.py). Each answer-try record marks its decision (knowtrace_train/decisions.py: kind
`answer_try`, label Yes or No, the span " Yes" / " No"), so that training with `decision_weight` weighs the
labels balanced (each label's records together as much as the other's): a walk of n hops gives n - 1 " No"
and one " Yes", and unweighted the merged M0 learned the labels' proportion, not the evidence. The statistics'
`decisions` count the records per label.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.decisions import DecisionPrompt, decision_counts, mark_decision
from knowtrace_train.kg_store import GraphStore, KGStoreError
from knowtrace_train.methods.dog.config import ANSWER_TRY, CRITIC, FALLBACK, RELATION, DoGConfig
from knowtrace_train.methods.dog.engine import DoG, _State
from knowtrace_train.methods.engine import Job
from knowtrace_train.methods.dog.graph import topic_entity
from knowtrace_train.methods.dog.parsing import parse_relation
from knowtrace_train.methods.dog.prompts import BLOCK_STOP
from knowtrace_train.methods.gold_chain import NO_CHAIN, NO_CHAIN_ENTITY, UNSUPPORTED_HOP, checked_chain
from knowtrace_train.methods.gold_records import TOO_MANY_HOPS, UNREADABLE_STEP, GoldRecords, GoldTally
from knowtrace_train.methods.gold_records import GoldTrajectories, gold_call, gold_records, one_line, read_back, words
from knowtrace_train.metrics import exact_match, question_kind
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import ModelCall

NOT_A_WALK = "not_a_walk"
NO_REWRITE = "no_rewrite"
CHAIN_NOT_IN_GRAPH = "chain_not_in_graph"
RELATION_NOT_LISTED = "relation_not_listed"
OFF_THE_WALK = "off_the_walk"
STORE_ERROR = "store_error"
#: every reason a DoG gold trajectory may be skipped for
SKIP_REASONS = (NO_CHAIN, NO_CHAIN_ENTITY, TOO_MANY_HOPS, NOT_A_WALK, NO_REWRITE, CHAIN_NOT_IN_GRAPH,
                RELATION_NOT_LISTED, OFF_THE_WALK, STORE_ERROR, UNREADABLE_STEP, UNSUPPORTED_HOP)
#: a call for which the gold walk has no output (the walk left the chain; the item is skipped)
OFF_SCRIPT = "the gold walk has no output for this call"
#: the engine's stop reasons that say the graph does not hold the chain
_NOT_IN_GRAPH_STOPS = ("entity_not_in_graph", "no_relations", "no_triples")


@dataclass(frozen=True)
class GoldHop:
    """One hop of the walk: where it stands, the relation it picks (as get_relations lists it), where it
    goes, and its sub-question."""

    topic: str
    relation: str
    far: str
    question: str


@dataclass(frozen=True)
class GoldWalk:
    """An item's gold walk: its hops and the answer."""

    hops: tuple[GoldHop, ...]
    answer: str


def gold_walk(item: QAItem, max_hops: int) -> GoldWalk | str:
    """The walk DoG should make over `item`'s gold chain, or the reason it has none."""
    chain = checked_chain(item, need=("question", "object", "subject"))
    if isinstance(chain, str):
        return chain
    if max_hops == 0:
        return GoldWalk((), item.answer)
    if len(chain) > max_hops:
        return TOO_MANY_HOPS
    topic = topic_entity(item)
    if topic is None:
        return NOT_A_WALK
    hops = []
    for h in chain:
        t = h.triplet
        if t.subject == topic:
            relation, far = t.relation, t.object
        elif t.object == topic:
            relation, far = "~" + t.relation, t.subject
        else:
            return NOT_A_WALK
        hops.append(GoldHop(topic, relation, far, one_line(h.question)))
        topic = far
    if not any(exact_match(topic, a) for a in item.answers):  # a comparison whose facts share an entity
        return NOT_A_WALK
    if len(hops) > 2:
        return NO_REWRITE
    return GoldWalk(tuple(hops), item.answer)


# -- each call's gold text, and what DoG's parser must read from it -------------------------------------


def relation_text(hop: GoldHop, relations: Sequence[str]) -> str:
    """The relation call: the hop's sub-question, then `Relation: <i>. <name>` (i: its place in the list)."""
    return f" {hop.question}\nRelation: {relations.index(hop.relation) + 1}. {hop.relation}"


def answer_try_text(last: bool, answer: str) -> str:
    return f" Yes\nAnswer: {one_line(answer)}" if last else " No"


def turn_text(role: str, question: str) -> str:
    """A debate turn writing `question` (the critic first says the expert's rewrite is different)."""
    return f" different. Simplified question: {question}" if role == CRITIC else f" {question}"


def fallback_text(answer: str) -> str:
    return f" {one_line(answer)}"


class GoldDoG(DoG):
    """DoG's engine with the gold walks' texts in place of the model. A call off the walk (its gold
    relation not listed, the walk gone off the chain) gets an empty output and `OFF_SCRIPT`, and its
    item the reason."""

    def __init__(self, config: DoGConfig, walks: Mapping[str, GoldWalk], store: GraphStore | None,
                 count_tokens: Callable[[str], int]) -> None:
        super().__init__(config, store)
        self.walks = walks
        self.count = count_tokens
        #: item id -> why its walk left the chain (first reason only)
        self.failed: dict[str, str] = {}
        #: item id -> per call, the `parsed` DoG's parser must give
        self.expected: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def _fail(self, s: _State, reason: str) -> None:
        self.failed.setdefault(s.item.id, reason)

    def _quiet(self, fn, *args):
        try:
            return fn(*args)
        except KGStoreError:
            return None

    def _gold(self, job: Job) -> str | None:
        s, walk = job.state, self.walks[job.state.item.id]
        if s.item.id in self.failed:
            return None
        if job.kind == FALLBACK:
            if walk.hops:  # the engine stopped the walk: the stop reason says why
                return None
            self.expected[s.item.id].append({"answer": one_line(walk.answer).rstrip(".").strip()})
            return fallback_text(walk.answer)
        hop = walk.hops[job.round - 1] if job.round <= len(walk.hops) else None
        if hop is None or s.topic != hop.topic:
            self._fail(s, UNREADABLE_STEP)
            return None
        last = job.round == len(walk.hops)
        if job.kind == RELATION:
            if hop.relation not in s.relations:
                every = self._quiet(self._kg.get_relations, hop.topic)
                self._fail(s, STORE_ERROR if every is None else
                           RELATION_NOT_LISTED if hop.relation in every else CHAIN_NOT_IN_GRAPH)
                return None
            self.expected[s.item.id].append({"subquestion": hop.question, "relation": hop.relation, "by_number": False})
            return relation_text(hop, s.relations)
        if job.kind == ANSWER_TRY:
            tails = [t[2] for t in s.shown]
            need_first = not last or self.config.answer_from == "tail"
            if not (tails[:1] == [hop.far] if need_first else hop.far in tails):
                filled = self._quiet(self._kg.triple_filling, hop.topic, hop.relation)
                far_of = (lambda t: t[0]) if hop.relation.startswith("~") else (lambda t: t[2])
                self._fail(s, STORE_ERROR if filled is None else
                           OFF_THE_WALK if hop.far in {far_of(t) for t in filled} else CHAIN_NOT_IN_GRAPH)
                return None
            self.expected[s.item.id].append({"sufficient": last,
                                             "answer": one_line(walk.answer).rstrip(".").strip() if last else None})
            return answer_try_text(last, walk.answer)
        # a debate turn after hop k's No: the question left is hop k+1's sub-question
        left = walk.hops[job.round].question
        self.expected[s.item.id].append({"question": left, "verdict": "different" if job.kind == CRITIC else None})
        return turn_text(job.kind, left)

    def generate(self, jobs: list[Job]) -> list[ModelCall]:
        return [gold_call(job.state.traj, job.kind, job.round, job.prompt, self._gold(job), self.count,
                          off_script=OFF_SCRIPT) for job in jobs]


def _reason_of_stop(stop: str | None) -> str | None:
    if stop in _NOT_IN_GRAPH_STOPS:
        return CHAIN_NOT_IN_GRAPH
    if stop and stop.startswith("store_error"):
        return STORE_ERROR
    if stop == "no_topic_entity":
        return NOT_A_WALK
    return None


def dog_gold_trajectories(config: DoGConfig, items: Iterable[QAItem], *, fewshot: bool = True,
                          require_support: bool = True, count_tokens: Callable[[str], int] | None = None,
                          store: GraphStore | None = None) -> GoldTrajectories:
    """The gold trajectories of DoG (settings `config`, prompts with exemplars as `fewshot` says) over the
    graph `config.graph` names (or `store`), and per-reason counts of the items that give none."""
    count = count_tokens or words
    # the gold walk writes every word itself: no answer try is decided from scores
    config = dataclasses.replace(config, fewshot=fewshot, answer_try_threshold=None)
    tally = GoldTally()
    todo: list[tuple[QAItem, GoldWalk]] = []
    for it in items:
        walk = gold_walk(it, config.max_hops)
        if isinstance(walk, str):
            tally.skip(walk)
        elif not walk.hops and require_support:
            tally.skip(UNSUPPORTED_HOP)
        else:
            todo.append((it, walk))
    if not todo:
        return tally.result()
    engine = GoldDoG(config, {it.id: w for it, w in todo}, store, count)
    trajs = engine.run([it for it, _ in todo], None)  # type: ignore[arg-type]  # generate writes the texts
    for (it, walk), traj in zip(todo, trajs):
        reason = engine.failed.get(it.id) or _reason_of_stop(traj.stop_reason)
        # the walk ends answered; the model alone (no hops) stops at max_hops after its fallback call
        if reason is None and not read_back(traj, engine.expected[it.id], it, "answered" if walk.hops else "max_hops"):
            reason = UNREADABLE_STEP
        tally.add(traj, it, reason)
    return tally.result()


def dog_gold_records(config: DoGConfig, items: Iterable[QAItem], retriever: Retriever | None = None, *,
                     store: GraphStore | None = None, **keywords: Any) -> GoldRecords:
    """The records of DoG's gold trajectories of `items` over the graph `config.graph` names (or `store`)
    (`keywords`: those of methods/gold_records.py's `gold_records`, `record_kinds` among them), each answer try's
    decision marked; the statistics' `decisions` count them per label. The retriever is not read (DoG answers
    over its graph)."""
    res = gold_records(config.name, functools.partial(dog_gold_trajectories, config, store=store), items, **keywords)
    for rec in res.records_by_role.get(ANSWER_TRY, []):
        span = answer_try_span(rec.get("prefix", ""), rec["completion"])
        if span is not None:
            mark_decision(rec, ANSWER_TRY, *span)
    res.stats["decisions"] = decision_counts([r for v in res.records_by_role.values() for r in v])
    return res


def answer_try_span(prefix: str, completion: str) -> tuple[str, int, int] | None:
    """(label, start, end) of the answer try's " Yes" or " No" at the start of its completion (characters of
    `completion`); None where it states neither, or a prefix was fed."""
    if prefix:  # DoG feeds no prefix to an answer try
        return None
    for label in ("Yes", "No"):
        word = " " + label
        if completion.startswith(word) and (len(completion) == len(word) or not completion[len(word)].isalnum()):
            return label, 0, len(word)
    return None


def decision_prompts(config: DoGConfig, items: Iterable[QAItem], *, store: GraphStore | None = None
                     ) -> list[DecisionPrompt]:
    """Every held-out gold prompt of DoG's decisions (`decisions.DecisionPrompt`) from one build of the items' gold
    trajectories (`dog_gold_trajectories`, prompts as `config` renders them, its `fewshot`): first every answer-try
    call (kind `answer_try`), labelled as `answer_try_span` reads the gold output (Yes at the gold chain's last
    hop, No at the hops before it), its options the words the engine decides between, scored as the call's first
    word; then every relation call (kind `relation_choice`, `_relation_prompts`)."""
    items = list(items)
    trajs, _ = dog_gold_trajectories(config, items, fewshot=config.fewshot, require_support=False, store=store)
    kinds = {it.id: question_kind(it) for it in items}
    out = []
    for traj in trajs:
        for call in traj.calls:
            span = answer_try_span(call.prefix, call.output[len(call.prefix):]) if call.role == ANSWER_TRY else None
            if span is not None:
                out.append(DecisionPrompt(ANSWER_TRY, call.prompt, "", ANSWER_TRY, (" Yes", " No"), span[0] == "Yes",
                                          traj.question_id, kinds.get(traj.question_id)))
    return out + [p for traj in trajs for p in _relation_prompts(config, traj, kinds)]


#: DoG's relation choice (`relation_prompts`): the gold relation against any other, read from what the model writes
RELATION_CHOICE = "relation_choice"


def _chooses(written: str, relations: tuple[str, ...], gold: str, text: str) -> bool:
    """Whether the engine reads the gold relation from a relation call whose output is `written` + `text`."""
    return parse_relation(written + text, relations).relation == gold


def _relation_prompts(config: DoGConfig, traj, kinds: Mapping[str, str | None]) -> list[DecisionPrompt]:
    """DoG's relation choice on a gold walk's held-out prompts (kind `relation_choice`): every relation call, fed
    the gold sub-question up to "Relation:", then decoded greedily (the call's `relation_tokens` and stop strings)
    and read by the engine's parser (`parse_relation`, a listed name or its number): right where it reads the gold
    relation. The relation is a number or a name after a free line, with no fixed words to score (a number's
    first digit is also the first token of the numbers it begins), so it is read, not scored. The label is always
    the positive: its recall is the share of hops where the gold relation is chosen."""
    out = []
    calls = [c for c in traj.calls if c.role == RELATION]
    for call, hop in zip(calls, traj.meta.get("hops", [])):
        written = call.output[len(call.prefix):]
        cut = written.find("\nRelation:")
        if cut < 0 or not hop.get("relation") or not hop.get("relations"):
            continue
        fed = written[: cut + len("\nRelation:")]
        reads = functools.partial(_chooses, fed, tuple(hop["relations"]), hop["relation"])
        out.append(DecisionPrompt(RELATION_CHOICE, call.prompt, call.prefix + fed, RELATION,
                                  ("the gold relation", "another relation"), True, traj.question_id,
                                  kinds.get(traj.question_id), reads=reads, max_new_tokens=config.relation_tokens,
                                  stop=BLOCK_STOP))
    return out
