"""Whether TRACE's chain constructor runs: the chosen chain's length, how often the selector stops first, and
how many gold triples the final chains hold (`TraceMethod.mechanism`).

- `chain_length`: triples in each question's chosen chain (the best beam, `meta["chains"][0]`) over the
  questions that record chains: the mean chain length. 0 means the empty chain won.
- `first_step_stop`: questions whose selector's first choice (the top option of its first call, ties to
  the earlier option as the beam search breaks them) was A, "no need for additional knowledge triples",
  over the questions with a first selector call (a question whose graph is empty has none, and one whose
  recorded distribution cannot be read is none either: left out, and the note says how many).
  A call whose distribution held no option letter records the ranker's order, which never stops: it
  counts as not stopping, as the search took it.
- `gold_triple_recall`: the item's gold triples (`evidence.triples`) that a triple of the final chains
  (every beam: what TRACE-Triple reads) matches, over the gold triples of the questions that record
  chains. A triple matches by the rule backtracing quality uses against gold evidence
  (scripts/lab/evidence_quality.py, which a method may not import): its two entities are the gold triple's two, in
  either order (equal as `kg.entity_key`s, the official answer normalisation, or one containing the other
  as whole words), whatever the relation's wording (TRACE's relations are free text). Items without gold
  triples (HotpotQA, MuSiQue) are left out; where no item has them the statistic has no value.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.kg import states_gold
from knowtrace_train.methods.base import MechanismStat
from knowtrace_train.methods.trace.config import SELECT
from knowtrace_train.methods.trace.explain import chain_triplets
from knowtrace_train.trajectory import Trajectory

#: the selector's option index that ends a chain (option A)
STOP_INDEX = 0


def first_choice(traj: Trajectory) -> int | None:
    """The option index the selector ranked first at the question's first step (its first `select` call):
    the highest probability, ties to the earlier option. None: no selector call, or one whose recorded
    distribution cannot be read."""
    call = next((c for c in traj.calls if c.role == SELECT), None)
    probs = call.parsed.get("probs") if call is not None and isinstance(call.parsed, dict) else None
    if not isinstance(probs, list) or not probs or not all(
            isinstance(p, (int, float)) and not isinstance(p, bool) for p in probs):
        return None
    return min(range(len(probs)), key=lambda j: (-probs[j], j))




def trace_mechanism(trajectories: Sequence[Trajectory], items_by_id: Mapping[str, QAItem]) -> dict[str, MechanismStat]:
    """`TraceMethod.mechanism`: the three statistics of the module docstring, over one trajectory per question."""
    length = with_chains = stops = first = no_first = found = gold = 0
    gold_items = 0
    for t in trajectories:
        chains = chain_triplets(t)
        choice = first_choice(t)
        if choice is None:
            no_first += 1
        else:
            first += 1
            stops += choice == STOP_INDEX
        if chains is None:
            continue
        with_chains += 1
        length += len(chains[0]) if chains else 0
        item = items_by_id.get(t.question_id)
        triples = [g for g in (item.evidence.triples if item is not None else ()) if len(g) == 3]
        if not triples:
            continue
        gold_items += 1
        read = [t.graph.triplets[i].triplet for i in dict.fromkeys(i for chain in chains for i in chain)]
        gold += len(triples)
        found += sum(any(states_gold(x.subject, x.object, [str(v) for v in g]) for x in read) for g in triples)
    n = len(trajectories)
    if not n:
        return {k: MechanismStat(0, 0, "no trajectories") for k in ("chain_length", "first_step_stop", "gold_triple_recall")}
    no_chains = "no trajectory records reasoning chains"
    if not first:
        first_note = "no question has a readable first selector call (empty graphs or unreadable records)"
    elif no_first:
        first_note = f"{no_first} of {n} questions without a readable first selector call (an empty graph or an unreadable record) left out"
    else:
        first_note = None
    if not with_chains:
        recall_note = no_chains
    elif not gold_items:
        recall_note = "no question carries gold evidence triples (e.g. HotpotQA, MuSiQue)"
    elif gold_items < with_chains:
        recall_note = f"{with_chains - gold_items} of {with_chains} questions without gold triples left out"
    else:
        recall_note = None
    return {
        "chain_length": MechanismStat(length, with_chains, None if with_chains else no_chains),
        "first_step_stop": MechanismStat(stops, first, first_note),
        "gold_triple_recall": MechanismStat(found, gold, recall_note),
    }
