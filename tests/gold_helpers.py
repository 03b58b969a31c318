"""Test helpers for the methods' gold trajectories (test_gold_baselines.py, test_gold_dog.py, test_gold_mintqa.py,
test_gold_trace.py): a hand-built 2-hop world item and its passages, items that cannot give a gold trajectory, a
retriever that returns the passages a test maps each query to, and one bootstrap + STaR iteration of a method on
the tiny model with an oracle that writes the gold calls' outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

from knowtrace_train.config import load_config
from knowtrace_train.data.schema import GoldEvidence, Passage, QAItem, SubQuestion
from knowtrace_train.generation.base import Completion, OptionScores
from knowtrace_train.retrieval.base import ScoredPassage, check_search_args
from knowtrace_train.selftrain import SelfTrain
from knowtrace_train.selftrain.config import SelfTrainConfig
from knowtrace_train.trajectory import Trajectory

from selftrain_helpers import tiny_overrides

#: the world's passages, by key
P = {k: Passage(id=f"p-{k}", title=t, text=x) for k, t, x in [
    ("zentor", "Zentor", "Zentor is a bicycle company founded by Odile Farrant."),
    ("odile", "Odile Farrant", "Odile Farrant (born 1902 in Castelbrun) was an engineer."),
    ("castel", "Castelbrun", "Castelbrun is a river port in Doravia."),
    ("harlow", "Harlow Press", "Harlow Press is a publisher of maps founded in 1821."),
]}
Q = "Where was the founder of Zentor born?"
#: a 2-hop bridge question: two triples and their aligned sub-questions (the second with a "#1" reference)
ITEM = QAItem(
    id="w2", question=Q, answers=("Castelbrun",), dataset="world", type="bridge", hops=2,
    evidence=GoldEvidence(
        triples=(("Zentor", "founded by", "Odile Farrant"), ("Odile Farrant", "born in", "Castelbrun")),
        sub_questions=(SubQuestion("Who founded Zentor?", "Odile Farrant"),
                       SubQuestion("Where was #1 born?", "Castelbrun")),
    ),
)

#: items without a gold chain: HotpotQA's (titles only), and a MuSiQue step that names no entity
HOTPOT = QAItem(id="h", question="Which is older, A or B?", answers=("A",), evidence=GoldEvidence(titles=("A", "B")))
NO_ENTITY = QAItem(id="m", question="q?", answers=("x",), evidence=GoldEvidence(sub_questions=(
    SubQuestion("What did nobody write?", "x"),)))
#: the same sub-question twice: a loop that stops on a repeated sub-question cannot read the gold outputs back
ASKED_TWICE = QAItem(id="s", question="Who founded the founder of Zentor?", answers=("Odile Farrant",),
                     evidence=GoldEvidence(triples=(("Zentor", "founded by", "Odile Farrant"),) * 2,
                                           sub_questions=(SubQuestion("Who founded Zentor?", "Odile Farrant"),) * 2))

#: the statistics of the `Rationale` protocol, and the items a gold result counts
RATIONALE_STATS = {"mode", "trajectories", "correct", "skipped", "records", "tokens_all", "tokens_filtered", "fa_ratio",
                   "roles", "items"}


class Mapped:
    """A retriever that returns the passages `hits` lists for a query (keys of P, at most k; nothing for any other
    query) and records every query it is sent."""

    def __init__(self, hits: Mapping[str, Sequence[str]]) -> None:
        self.hits = hits
        self.queries: list[str] = []

    def search(self, queries, k):
        check_search_args(queries, k)
        self.queries += list(queries)
        return [[ScoredPassage(P[key], 1.0) for key in self.hits.get(q, [])[:k]] for q in queries]


def words(s: str) -> int:
    return len(s.split())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


class GoldOracle:
    """Writes the gold output where a request is a gold call's: its prompt, and its response prefix the start of the
    call's output (the shortest such output, less the prefix; a non-empty prefix with nothing after it is not one).
    For a call kind in `scored` (TRACE's selector, scored rather than decoded: its output is the gold letter), it
    scores the gold letter of a gold call's prompt. The wrapped model elsewhere; `hits` counts the gold answers."""

    def __init__(self, inner, trajectories: Sequence[Trajectory], scored: Collection[str] = ()) -> None:
        self.inner, self.hits = inner, 0
        self.outputs: dict[str, list[str]] = {}
        self.letters: dict[str, str] = {}
        for t in trajectories:
            for c in t.calls:
                if c.role in scored:
                    self.letters[c.prompt] = c.output.strip()
                else:
                    self.outputs.setdefault(c.prompt, []).append(c.output)

    def _gold_text(self, r) -> str | None:
        known = [o for o in self.outputs.get(r.prompt, ()) if o.startswith(r.prefix) and not (r.prefix and o == r.prefix)]
        return min(known, key=len)[len(r.prefix):] if known else None

    def generate(self, requests):
        out, rest = [None] * len(requests), []
        for i, r in enumerate(requests):
            text = self._gold_text(r)
            if text is not None:
                self.hits += 1
                out[i] = Completion(text=text, prompt_tokens=1, output_tokens=self.count_tokens(text), finish_reason="stop")
            else:
                rest.append(i)
        for i, c in zip(rest, self.inner.generate([requests[i] for i in rest]) if rest else []):
            out[i] = c
        return out

    def score_options(self, requests, options):
        out, rest = [None] * len(requests), []
        for i, (r, opts) in enumerate(zip(requests, options)):
            if r.prompt in self.letters:
                self.hits += 1
                out[i] = OptionScores({o: 0.0 if o == self.letters[r.prompt] else -math.inf for o in opts}, prompt_tokens=1)
            else:
                rest.append(i)
        inner = self.inner.score_options([requests[i] for i in rest], [options[i] for i in rest]) if rest else []
        for i, s in zip(rest, inner):
            out[i] = s
        return out

    def count_tokens(self, text):
        return self.inner.count_tokens(text)

    def close(self):
        self.inner.close()


def bootstrap_and_one_star_iteration(
    tmp_path: Path,
    tiny_model_dir: Path,
    method: str,
    strategy_args: Sequence[str],
    gold_trajectories: Callable[[SelfTrain], Sequence[Trajectory]],
    *,
    train_questions: int = 4,
    dev_questions: int = 2,
    scored: Collection[str] = (),
) -> tuple[SelfTrain, dict[str, Any], dict[str, Any]]:
    """Runs `method`'s bootstrap (M0 trained on its gold trajectories of the 8 bootstrap questions) and one STaR
    iteration on the tiny model, the tiny overrides' KnowTrace keys replaced by `strategy_args`. The rollout's
    generator is a `GoldOracle` over `gold_trajectories(run)` (the run's rollout questions' gold trajectories), so
    STaR has correct trajectories. Checks what every method's run shows (the gold statistics, M0 bootstrapped,
    iteration 1 trained on correct rollouts, the oracle used) and returns the run, the gold statistics
    (iter_0/gold.json) and iteration 1's metrics."""
    from knowtrace_train.generation import build_generator

    args = tiny_overrides(tmp_path, tiny_model_dir, iterations=1, eval_base=False, mode="star",
                          **{"strategy.name": method, "data.train_questions": train_questions,
                             "data.dev_questions": dev_questions})
    keep = []
    for k, v in zip(args[::2], args[1::2]):  # the KnowTrace keys of the tiny overrides are not this method's
        if not k.startswith("--strategy.") or k == "--strategy.name":
            keep += [k, v]
    cfg = load_config(SelfTrainConfig, None, [*keep, *strategy_args])
    run = SelfTrain(cfg, progress=False)
    made = []

    def make(gen_cfg):  # the rollout questions' gold calls are answered: STaR has correct trajectories
        made.append(GoldOracle(build_generator(gen_cfg), gold_trajectories(run), scored=scored))
        return made[-1]

    run.make_generator = make
    summary = run.run()
    d = run.run_dir
    gold_stats = json.loads((d / "iter_0/gold.json").read_text())
    assert gold_stats["mode"] == "gold" and gold_stats["method"] == method and gold_stats["items"] == 8
    assert gold_stats["trajectories"] + sum(gold_stats["skipped"].values()) == 8 and gold_stats["trajectories"] > 0
    assert json.loads((d / "m0.json").read_text())["bootstrapped"]
    it = json.loads((d / "iter_1/metrics.json").read_text())
    assert it["status"] == "trained" and it["rationale"]["mode"] == "star" and it["rollout"]["correct"] >= 1
    assert summary["method"] == method and len(summary["iterations"]) == 1
    assert any(g.hits for g in made)
    return run, gold_stats, it
