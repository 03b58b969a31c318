"""Simulated KnowTrace rollouts for measuring backtracing where no model answers yet.

    python scripts/lab/backtrace_simulated_rollouts.py --items data/world/train.jsonl \
        --corpus data/world/corpus.jsonl --output /tmp/sim_rollouts.jsonl [--n 200 --noise 0.5 --seed 0]
    python scripts/lab/backtrace_quality.py --rollouts /tmp/sim_rollouts.jsonl --items data/world/train.jsonl \
        --corpus data/world/corpus.jsonl

The real KnowTrace engine and a BM25 retriever run with a scripted model in place of the LLM:
exploration asks the gold chain's pair for each hop and, with probability `--noise`, one more
pair about an entity of the graph that is off the chain (an unavailing exploration); completion
is a greedy extractor that writes every gold-format fact (any item's gold triple) whose passage
the retriever returned, whatever the pair asked (extraneous completions come from real retrieval
noise); the final exploration answers with the gold thought. Every trajectory is correct by
construction, so the figures measure the backtracing, not a model: the noise is the retriever's
and the off-chain pairs', and the gold chain is known. Not a substitute for real rollouts.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from knowtrace_train.errors import user_errors  # noqa: E402
from knowtrace_train.methods.knowtrace import outputs  # noqa: E402
from knowtrace_train.data.corpus import read_corpus  # noqa: E402
from knowtrace_train.data.loaders import load_items  # noqa: E402
from knowtrace_train.generation.base import Completion, GenerationRequest  # noqa: E402
from knowtrace_train.methods.knowtrace.gold import gold_chain, gold_thought  # noqa: E402
from knowtrace_train.io import write_jsonl  # noqa: E402
from knowtrace_train.kg import GuidancePair, Triplet  # noqa: E402
from knowtrace_train.metrics import score  # noqa: E402
from knowtrace_train.methods.knowtrace.prompts import KG_HEADER, QUESTION, TRIPLETS_HEADER, answer_prefix, render_passage  # noqa: E402
from knowtrace_train.retrieval import RetrieverConfig, build_retriever  # noqa: E402
from knowtrace_train.methods.knowtrace import KnowTrace, KnowTraceConfig  # noqa: E402


class ScriptedKnowTrace:
    """The scripted model (see the module docstring); deterministic for a seed."""

    def __init__(self, items, facts_by_passage, passage_by_line, noise: float, seed: int):
        self.by_question = {it.question.strip(): it for it in items}
        self.chains = {it.id: gold_chain(it) for it in items}
        self.facts = facts_by_passage
        self.passage_by_line = passage_by_line
        self.noise = noise
        self.rng = random.Random(seed)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def _explore(self, prompt: str, forced: bool) -> str:
        question = re.findall(rf"^{QUESTION} (.*)$", prompt, re.M)[-1].strip()
        item = self.by_question[question]
        chain = self.chains[item.id]
        kg = prompt.rsplit(KG_HEADER + "\n", 1)[1]
        shown = [] if kg.strip().startswith("None") else [ln for ln in kg.strip().splitlines() if ln.startswith("(")]
        missing = [h for h in chain if h.triplet.render() not in shown]
        if forced or not missing:
            thought = gold_thought(chain, item.answer)
            text = outputs.exploration_answer(thought, item.answer)
            return text
        pairs = [missing[0].pair]
        if self.rng.random() < self.noise:
            on_chain = {h.pair.entity.lower() for h in chain} | {h.triplet.object.lower() for h in chain}
            off = sorted({x for ln in shown for x in ln.strip("()").split("; ")[::2]})
            off = [x for x in off if x.lower() not in on_chain]
            if off:
                e = self.rng.choice(off)
                pairs.append(GuidancePair(e, f"find more about {e}"))
        return outputs.exploration_guidance(pairs)

    def _complete(self, prompt: str) -> str:
        block = prompt.rsplit("Documents:\n", 1)[1].split("\nInput Entity", 1)[0]
        found: list[Triplet] = []
        for line in block.splitlines():
            pid = self.passage_by_line.get(line.strip())
            for t in self.facts.get(pid, ()):
                if t not in found:
                    found.append(t)
        return outputs.completion(found)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            p = r.prompt + r.prefix  # the response prefix the engine sent
            if p.endswith(answer_prefix()):
                text = self._explore(p, forced=True)
            elif p.endswith(TRIPLETS_HEADER + "\n"):
                text = self._complete(p)
            else:
                text = self._explore(p, forced=False)
            text = text[len(r.prefix):] if r.prefix and text.startswith(r.prefix) else text
            out.append(Completion(text, len(p.split()), len(text.split()), "stop"))
        return out


@user_errors
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", required=True, help="items with gold triples and sub-questions (the world)")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--facts-from", nargs="*", default=[], help="more item files whose gold triples the extractor knows")
    ap.add_argument("--output", required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.5)
    ap.add_argument("--passages", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    items = [it for it in load_items(a.items) if it.evidence.triples][: a.n]
    corpus = read_corpus(a.corpus)
    facts: dict[str, list[Triplet]] = defaultdict(list)
    for path in [a.items, *a.facts_from]:
        for it in load_items(path):
            ev = it.evidence
            for t, sq in zip(ev.triples, ev.sub_questions):
                for pid in sq.paragraph_ids:
                    if Triplet(*t) not in facts[pid]:
                        facts[pid].append(Triplet(*t))
    by_line = {render_passage(p): p.id for p in corpus}
    model = ScriptedKnowTrace(items, facts, by_line, a.noise, a.seed)
    ret = build_retriever(RetrieverConfig(backend="bm25"), corpus)
    trajs = KnowTrace(KnowTraceConfig(max_rounds=6, passages=a.passages)).run(items, model, ret)
    for t in trajs:
        s = score(t.prediction, t.answers, dataset=t.dataset)
        t.em, t.f1 = s["em"], s["f1"]
    write_jsonl(a.output, [t.to_dict() for t in trajs])
    print(f"{len(trajs)} simulated trajectories -> {a.output}; EM {sum(t.em for t in trajs) / max(len(trajs), 1):.3f}")


if __name__ == "__main__":
    main()
