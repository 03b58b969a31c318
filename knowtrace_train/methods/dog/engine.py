"""The batched DoG loop: relation filtering, triple filling, answer trying and a three-role debate, hop by hop.

All unfinished questions advance together. A hop costs one batched `generator.generate` call per
call kind: the relation calls of every live question, then their answer tries, then each debate
turn (expert, critic, linguist, for `debate_rounds` rounds; the expert alone for 0), then one batch
of fallback answers for the questions that stopped in this hop.

Per question and hop: `get_relations(topic)` lists the candidates (the relation leading straight
back to the previous topic is dropped while others remain); the model states the first-hop
sub-question and picks one; `triple_filling(topic, relation)` completes the triples (at most
`max_triples` shown); the answer try says Yes (the question ends "answered") or No; after No the
debate rewrites the question one hop shorter and the first triple's far entity becomes the next
topic. A question that cannot go on (no topic entity, an entity not in the graph, no relations, a
relation not in the list, no triples, a store error) or reaches `max_hops` gets the fallback
answer from the model's own knowledge, with that reason as `stop_reason`.

With `answer_try_threshold` the answer try's Yes/No is a calibrated decision (knowtrace_train/decisions.py):
P(" Yes") and P(" No") as its first word are scored in one batch before it is written, Yes where the log-odds
exceed the threshold; the decided word is fed and recorded as the model's output, which writes the rest of the
call (the answer after Yes) from there, and the call's `parsed` keeps `answer_try_log_odds` and
`answer_try_threshold`.

Recorded: `Trajectory.graph` holds the filled triples (in the graph's direction; each traced to its
hop, its (entity, relation) pair and its relation call), `meta["hops"]` one entry per hop (question,
topic, relations, sub-question, relation, triples, answer try, the debate's turns, the simplified
question), `meta["topic_entity"]`, `meta["question_hops"]`, `meta["lookups"]` and `meta["events"]`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.decisions import require_scorer
from knowtrace_train.generation.base import Generator
from knowtrace_train.kg import GuidancePair, Triplet, TracedTriplet
from knowtrace_train.kg_store import GraphStore, KGStoreError
from knowtrace_train.methods.engine import Engine, InFlight, Job, new_trajectory
import knowtrace_train.methods.dog.prompts as prompts
from knowtrace_train.methods.dog.config import ANSWER_TRY, CRITIC, FALLBACK, RELATION, DoGConfig
from knowtrace_train.methods.dog.graph import build_store, is_endpoint, topic_entity
from knowtrace_train.methods.dog.parsing import parse_answer, parse_answer_try, parse_relation, parse_turn
from knowtrace_train.metrics import normalize_answer
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)


@dataclass
class _State(InFlight):
    question: str
    topic: str | None
    #: the relation that leads from `topic` straight back to the previous topic
    back: str | None = None
    relations: list[str] = field(default_factory=list)
    relation: str | None = None
    #: filled triples as shown (topic first) and the entity each reaches
    shown: list[tuple[str, str, str]] = field(default_factory=list)
    entry: dict = field(default_factory=dict)
    chat: list[str] = field(default_factory=list)


def _inverse(relation: str) -> str:
    return relation[1:] if relation.startswith("~") else "~" + relation


class DoG(Engine):
    """Debating over Graphs over many questions at once (its plumbing methods/engine.py's), on the Generator
    protocol and a graph store (the Retriever `run` is handed is not used)."""

    name = "dog"

    def __init__(self, config: DoGConfig, store: GraphStore | None = None) -> None:
        self.config = config
        self.name = config.name
        self._store = store

    def store_for(self, items: Sequence[QAItem]) -> GraphStore:
        """The configured store: built once and kept, except 'items', whose graph is the run's items'."""
        if self._store is not None:
            return self._store
        store = build_store(self.config.graph, items)
        if self.config.graph != "items":
            self._store = store
        return store

    def run(self, items: Sequence[QAItem], generator: Generator, retriever=None,
            on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        if self.config.answer_try_threshold is not None:
            require_scorer(generator, "strategy dog with answer_try_threshold")
        self.bind(generator, None, on_done)
        self._kg = self.store_for(items)
        states = []
        for it in items:
            topic = topic_entity(it)
            traj = new_trajectory(it, self.name, {"topic_entity": topic, "question_hops": it.hops, "graph": self.config.graph,
                                                  "debate_rounds": self.config.debate_rounds, "hops": [], "events": [],
                                                  "lookups": 0})
            states.append(_State(item=it, traj=traj, question=it.question, topic=topic))
        active = list(states)
        if self.config.max_hops == 0:
            self._fallback([(s, "max_hops") for s in active])
            active = []
        for hop in range(1, self.config.max_hops + 1):
            if not active:
                break
            active = self._hop(active, hop)
        assert all(s.done for s in states)
        return [s.traj for s in states]

    # -- one hop ---------------------------------------------------------------------------------------
    def _hop(self, active: list[_State], hop: int) -> list[_State]:
        cfg = self.config
        stopped: list[tuple[_State, str]] = []
        choosing = []
        for s in active:
            s.traj.rounds = hop
            s.entry = {"hop": hop, "question": s.question, "topic": s.topic}
            s.traj.meta["hops"].append(s.entry)
            reason = self._candidates(s)
            (stopped.append((s, reason)) if reason else choosing.append(s))
        jobs = [Job(s, RELATION, hop, prompts.relation_prompt(s.question, s.topic or "", s.relations, cfg.fewshot),
                     cfg.relation_tokens, prompts.BLOCK_STOP) for s in choosing]
        trying = []
        for job, call in zip(jobs, self.generate(jobs)):
            s = job.state
            choice = parse_relation(call.output, s.relations) if call.error is None else None
            if choice is None:
                stopped.append((s, "error: generation"))
                continue
            call.parsed, call.error = choice.to_dict(), choice.error
            s.entry.update(subquestion=choice.subquestion, relation=choice.relation)
            if choice.relation is None:
                s.entry["relation_output"] = call.output.strip()[:200]
                stopped.append((s, "relation_not_in_list"))
                continue
            reason = self._fill(s, choice.relation, hop, call)
            (stopped.append((s, reason)) if reason else trying.append(s))
        debating = self._answer_try(trying, hop, stopped)
        if hop == cfg.max_hops:
            stopped.extend((s, "max_hops") for s in debating)
            debating = []
        self._debate(debating, hop)
        self._fallback(stopped)
        return debating

    def _lookup(self, s: _State, what: str, fn, *args):
        """A store call, timed onto the trajectory; a KGStoreError comes back as an error string."""
        t0 = time.perf_counter()
        try:
            return fn(*args), None
        except KGStoreError as e:
            s.traj.meta["events"].append({"hop": s.entry.get("hop"), "event": f"store error in {what}: {e}"})
            return None, f"store_error: {e}"
        finally:
            s.traj.wall_time += time.perf_counter() - t0
            s.traj.meta["lookups"] += 1

    def _candidates(self, s: _State) -> str | None:
        """Fill s.relations; a stop reason where there are none to choose from."""
        if s.topic is None:
            return "no_topic_entity"
        if not is_endpoint(self.config.graph):
            known, err = self._lookup(s, "has_entity", self._kg.has_entity, s.topic)
            if err:
                return err
            if not known:
                return "entity_not_in_graph"
        relations, err = self._lookup(s, "get_relations", self._kg.get_relations, s.topic)
        if err:
            return err
        if not relations:
            return "no_relations"
        if s.back in relations and len(relations) > 1:
            relations = [r for r in relations if r != s.back]
            s.entry["dropped_back"] = s.back
        s.entry["relations_total"] = len(relations)
        s.relations = relations[: self.config.max_relations]
        s.entry["relations"] = list(s.relations)
        return None

    def _fill(self, s: _State, relation: str, hop: int, call: ModelCall) -> str | None:
        triples, err = self._lookup(s, "triple_filling", self._kg.triple_filling, s.topic, relation)
        if err:
            return err
        if not triples:
            return "no_triples"
        inverse = relation.startswith("~")
        s.relation = relation
        s.shown = [(s.topic, relation, t[0] if inverse else t[2]) for t in triples[: self.config.max_triples]]
        s.entry["triples"] = [list(t) for t in s.shown]
        s.entry["triples_total"] = len(triples)
        pair = GuidancePair(s.topic or "", relation)
        for t in triples[: self.config.max_triples]:
            if s.traj.graph.add(TracedTriplet(Triplet(*t), round=hop, pair=pair, call=call.index)):
                call.triplets.append(len(s.traj.graph.triplets) - 1)
        call.pair = pair
        return None

    def _answer_try(self, trying: list[_State], hop: int, stopped: list) -> list[_State]:
        """Answer tries; concludes the Yes ones and returns the others (a call error stops its question)."""
        cfg = self.config
        jobs = [Job(s, ANSWER_TRY, hop, prompts.answer_try_prompt(s.question, s.shown, cfg.fewshot), cfg.answer_tokens,
                     prompts.BLOCK_STOP) for s in trying]
        if cfg.answer_try_threshold is not None:
            self._decide(jobs)
        rest = []
        for job, call in zip(jobs, self.generate(jobs)):
            s = job.state
            if call.error is not None:
                stopped.append((s, "error: generation"))
                continue
            res = parse_answer_try(call.output)
            call.parsed, call.error = res.to_dict(), res.error
            if job.log_odds is not None:
                call.parsed.update(answer_try_log_odds=round(job.log_odds, 4), answer_try_threshold=cfg.answer_try_threshold)
            s.entry["answer_try"] = dict(call.parsed)
            if res.sufficient:
                tail = s.shown[0][2]
                answer = res.answer if cfg.answer_from == "model" and res.answer else tail
                self.finish(s, answer, "answered")
            else:
                rest.append(s)
        return rest

    def _decide(self, jobs: list[Job]) -> None:
        """The answer tries' Yes/No as a calibrated decision (`decisions.decide_jobs`, on each call's own seeded
        stream): the decided word is fed and recorded as the model's output; a request the scorer refuses is left
        to greedy decoding. The scoring's seconds are shared among the jobs' questions."""
        self.decide(jobs, prefix="", role=ANSWER_TRY, threshold=self.config.answer_try_threshold, stream=ANSWER_TRY)

    def _debate(self, debating: list[_State], hop: int) -> None:
        """The debate's turns, one batch per turn; then each question becomes its simplified one and
        the first triple's far entity its topic."""
        cfg = self.config
        for s in debating:
            s.chat, s.entry["debate"] = [], []
        for turn, role in enumerate(cfg.debate_roles()):
            rnd = turn // 3 + 1
            jobs = [Job(s, role, hop, prompts.debate_prompt(role, s.question, s.shown[0], s.chat, cfg.fewshot),
                         cfg.debate_tokens, prompts.BLOCK_STOP) for s in debating]
            for job, call in zip(jobs, self.generate(jobs)):
                s = job.state
                res = parse_turn(call.output, critic=role == CRITIC) if call.error is None else None
                if res is not None:
                    call.parsed, call.error = res.to_dict(), res.error
                question = res.question if res else None
                verdict = res.verdict if res else None
                s.chat.append(prompts.render_turn(role, question, verdict))
                s.entry["debate"].append({"round": rnd, "role": role, "question": question, "verdict": verdict})
        for s in debating:
            said = [t["question"] for t in s.entry["debate"] if t["question"]]
            new = said[-1] if said else s.question
            if not said:
                s.traj.meta["events"].append({"hop": hop, "event": "no simplified question written: question kept"})
            elif normalize_answer(new) == normalize_answer(s.question):
                s.traj.meta["events"].append({"hop": hop, "event": "simplification failed: same question"})
            s.entry["simplified"] = new
            s.question = new
            s.back = _inverse(s.relation or "")
            s.topic = s.shown[0][2]

    def _fallback(self, stopped: list[tuple[_State, str]]) -> None:
        cfg = self.config
        jobs = [Job(s, FALLBACK, max(s.traj.rounds, 1), prompts.fallback_prompt(s.item.question, cfg.fewshot),
                     cfg.fallback_tokens, prompts.LINE_STOP) for s, _ in stopped]
        for (s, reason), call in zip(stopped, self.generate(jobs)):
            answer, err = parse_answer(call.output) if call.error is None else (None, call.error)
            call.parsed, call.error = {"answer": answer}, err
            self.finish(s, answer, reason)


__all__ = ["DoG"]
