"""Hand-built trajectories for the backtracing tests: the paper's Appendix F example, and a
tiny engine that builds random but well-formed KnowTrace trajectories."""

from __future__ import annotations

import random

from knowtrace_train.methods.knowtrace import outputs
from knowtrace_train.data.schema import Passage
from knowtrace_train.kg import GuidancePair, KnowledgeGraph, TracedTriplet, Triplet
from knowtrace_train.trajectory import ModelCall, Trajectory

QUESTION = "Where was the person who wrote about the rioting being a dividing factor in Birmingham educated?"
RIOTING = "The rioting being a dividing factor in Birmingham"
PAIR_WHO = GuidancePair(RIOTING, "Find out who wrote about this topic.")
PAIR_WHERE = GuidancePair("Birmingham", "Find out where Birmingham is located.")
PAIR_SCHOOL = GuidancePair("James Watt", "Find out which school James Watt attended.")
T_WROTE = Triplet("James Watt", "wrote", "the rioting being a dividing factor in Birmingham")
T_INDUSTRIALIST = Triplet("James Watt", "is", "an industrialist")
T_LOCATED = Triplet("Birmingham", "is located in", "the West Midlands region of England")
T_EDUCATED = Triplet("James Watt", "was educated at", "University of Glasgow")
THOUGHT = ("James Watt wrote about the rioting being a dividing factor in Birmingham. "
           "He was educated at the University of Glasgow.")
ANSWER = "University of Glasgow"


def words(text: str) -> int:
    """A stand-in tokenizer: whitespace words."""
    return len(text.split())


class Engine:
    """Records calls and graph the way the KnowTrace engine does."""

    def __init__(self, question: str, real_prompts: bool = False, kg_format: str = "triplets"):
        self.calls: list[ModelCall] = []
        self.graph = KnowledgeGraph()
        self.question = question
        self.real_prompts = real_prompts
        self.kg_format = kg_format

    def prompt(self, role, pair=None, passage_ids=()) -> str:
        if not self.real_prompts:
            return f"<{role} prompt {len(self.calls)}>"
        from knowtrace_train.methods.knowtrace import prompts

        shown = [t.triplet for t in self.graph.triplets]
        if role in ("explore", "answer"):  # the forced answer sees the exploration prompt
            return prompts.render_exploration_prompt(self.question, shown, kg_format=self.kg_format)
        return prompts.render_completion_prompt(pair, [passage(p) for p in passage_ids])

    def _call(self, role, rnd, output, **kw) -> ModelCall:
        prompt = self.prompt(role, kw.get("pair"), kw.get("passage_ids", ()))
        c = ModelCall(index=len(self.calls), role=role, round=rnd, prompt=prompt,
                      output=output, prompt_tokens=10, output_tokens=words(output), **kw)
        self.calls.append(c)
        return c

    def explore(self, rnd, pairs):
        c = self._call("explore", rnd, outputs.exploration_guidance(pairs),
                       parsed={"sufficient": False, "thought": None, "answer": None,
                               "pairs": [[p.entity, p.guidance] for p in pairs], "rejected": [], "error": None})
        for p in pairs:
            self.graph.note_expansion_point(p.entity, rnd, c.index)
        return c

    def complete(self, rnd, pair, triplets, passage_ids=("p1", "p2")):
        c = self._call("complete", rnd, outputs.completion(triplets), pair=pair, passage_ids=list(passage_ids),
                       parsed={"triplets": [[t.subject, t.relation, t.object] for t in triplets],
                               "rejected": [], "error": None})
        for t in triplets:
            if self.graph.add(TracedTriplet(t, rnd, pair, c.index, tuple(passage_ids))):
                c.triplets.append(len(self.graph.triplets) - 1)
        return c

    def answer(self, rnd, thought, answer, role="explore"):
        # the forced answer (role "answer") was sent the answer prefix; its output starts with it
        out = outputs.exploration_answer(thought, answer)
        return self._call(role, rnd, out, parsed={"sufficient": True, "thought": thought, "answer": answer,
                                                  "pairs": [], "rejected": [], "error": None})

    def trajectory(self, tid="t1", answers=(ANSWER,), prediction=None, thought=None, em=1.0, dataset="musique"):
        return Trajectory(id=tid, question_id=tid.split("#")[0], question=self.question, answers=list(answers),
                          dataset=dataset, strategy="knowtrace", calls=self.calls, graph=self.graph,
                          prediction=prediction, thought=thought, stop_reason="answered",
                          rounds=max((c.round for c in self.calls), default=0), em=em)


def passage(pid: str) -> Passage:
    return Passage(pid, f"Title {pid}", f"Some text of passage {pid}.")


def appendix_f(real_prompts: bool = False, question: str = QUESTION, answer_role: str = "explore",
               kg_format: str = "triplets") -> Trajectory:
    """Table 6 of the paper: three iterations, four triplets, two initial entities."""
    e = Engine(question, real_prompts, kg_format)
    e.explore(1, [PAIR_WHO, PAIR_WHERE])
    e.complete(1, PAIR_WHO, [T_WROTE, T_INDUSTRIALIST], passage_ids=("p1", "p2"))
    e.complete(1, PAIR_WHERE, [T_LOCATED], passage_ids=("p3",))
    e.explore(2, [PAIR_SCHOOL])
    e.complete(2, PAIR_SCHOOL, [T_EDUCATED], passage_ids=("p4", "p1"))
    e.answer(3, THOUGHT, ANSWER, role=answer_role)
    return e.trajectory(prediction=ANSWER, thought=THOUGHT)


def random_trajectory(seed: int, n_entities: int = 8, max_rounds: int = 4) -> Trajectory:
    """A well-formed trajectory over entities E0..En with random pairs and triplets."""
    rng = random.Random(seed)
    names = [f"Entity {chr(65 + i)}" for i in range(n_entities)]
    rels = ["is part of", "was founded by", "lies in", "wrote"]
    e = Engine(f"Question {seed}?")
    known = [rng.choice(names)]
    for rnd in range(1, rng.randint(1, max_rounds) + 1):
        pairs = []
        for _ in range(rng.randint(1, 3)):
            ent = rng.choice(known) if rng.random() < 0.7 else rng.choice(names)
            p = GuidancePair(ent, f"find what {ent} {rng.choice(rels)}")
            if p not in pairs:
                pairs.append(p)
        e.explore(rnd, pairs)
        for p in pairs:
            trips = []
            for _ in range(rng.randint(0, 3)):
                other = rng.choice(names)
                t = Triplet(p.entity, rng.choice(rels), other) if rng.random() < 0.6 else \
                    Triplet(other, rng.choice(rels), rng.choice(names))
                trips.append(t)
                known.append(other)
            e.complete(rnd, p, trips)
    ents = sorted({x for t in e.graph.triplets for x in (t.triplet.subject, t.triplet.object)}) or names
    answer = rng.choice(ents)
    thought = " ".join(rng.sample(ents, min(len(ents), 2))) + f" so {answer}."
    e.answer(max(c.round for c in e.calls) + 1, thought, answer)
    return e.trajectory(tid=f"r{seed}", answers=(answer,), prediction=answer, thought=thought, dataset="world")
