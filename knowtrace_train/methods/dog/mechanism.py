"""Whether DoG's walk runs: relation filtering at hop 1 and the answer try's Yes where it should say Yes and
elsewhere (`DoGMethod.mechanism`; `first_relation_counts` also serves scripts/lab/dog_table.py).

- `hop1_relation`: questions whose first hop chose the relation of the item's first gold triple
  (`evidence.triples[0]`, exact name as the graph spells it; a walk that stopped before choosing one
  counts as wrong), over the questions whose item has gold triples.
- `yes_at_gold_last_hop`: answer tries that said Yes (`parsed.sufficient`; no Yes/No found reads as No,
  as the engine reads it) at the gold chain's last hop, over the answer tries made at that hop. The gold
  chain's last hop is its triple count where the gold triples form one chain from the topic entity (each
  triple's subject the previous one's object): the hop whose filled triples hold the answer.
- `yes_elsewhere`: the same over every other answer try of a question with gold triples: an earlier or
  later hop of a chain, and every hop of a question whose gold triples form no chain (a comparison's
  parallel facts: no single hop's triples answer it).

Questions whose item carries no gold triples (HotpotQA) are left out of all three; where none has any,
they have no value.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.kg import entity_key
from knowtrace_train.methods.base import MechanismStat
from knowtrace_train.methods.dog.config import ANSWER_TRY
from knowtrace_train.trajectory import Trajectory

NO_GOLD = "no question carries gold evidence triples (e.g. HotpotQA)"


def gold_first_relations(items) -> dict[str, str]:
    """{item id: the relation of its first gold triple}, for the items that have gold triples."""
    return {it.id: str(it.evidence.triples[0][1]) for it in items if it.evidence.triples and len(it.evidence.triples[0]) == 3}


def first_relation_right(traj: Trajectory, gold_relation: str) -> bool:
    """Whether the walk's first hop chose `gold_relation` (False where it chose none or the record is unreadable)."""
    hops = traj.meta.get("hops")
    first = hops[0] if isinstance(hops, list) and hops else None
    return isinstance(first, dict) and first.get("relation") == gold_relation


def first_relation_counts(trajectories: Sequence[Trajectory], gold_relation: Mapping[str, str]) -> tuple[int, int]:
    """(questions whose first hop chose their gold first relation, questions with a gold first relation)."""
    pairs = [(t, gold_relation[t.question_id]) for t in trajectories if t.question_id in gold_relation]
    return sum(first_relation_right(t, g) for t, g in pairs), len(pairs)


def gold_last_hop(item: QAItem) -> int | None:
    """The gold chain's hop count where the item's gold triples form one chain (each subject the previous
    object, as `kg.entity_key`s); None where they do not (a comparison) or there are none."""
    triples = [t for t in item.evidence.triples if len(t) == 3]
    if not triples or len(triples) != len(item.evidence.triples):
        return None
    if any(entity_key(str(triples[i][0])) != entity_key(str(triples[i - 1][2])) for i in range(1, len(triples))):
        return None
    return len(triples)


def _said_yes(call) -> bool:
    return isinstance(call.parsed, dict) and call.parsed.get("sufficient") is True


def dog_mechanism(trajectories: Sequence[Trajectory], items_by_id: Mapping[str, QAItem]) -> dict[str, MechanismStat]:
    right, with_gold = first_relation_counts(trajectories, gold_first_relations(
        items_by_id[t.question_id] for t in trajectories if t.question_id in items_by_id))
    at_yes = at_n = else_yes = else_n = 0
    for t in trajectories:
        item = items_by_id.get(t.question_id)
        if item is None or not item.evidence.triples:
            continue
        last = gold_last_hop(item)
        for call in t.calls:
            if call.role != ANSWER_TRY:
                continue
            if last is not None and call.round == last:
                at_n += 1
                at_yes += _said_yes(call)
            else:
                else_n += 1
                else_yes += _said_yes(call)
    left_out = len(trajectories) - with_gold
    gold_note = (("no trajectories" if not trajectories else NO_GOLD) if not with_gold
                 else f"{left_out} of {len(trajectories)} questions without gold triples left out" if left_out else None)

    def tries_note(n: int, where: str) -> str | None:
        return f"no answer try {where}" if with_gold and not n else gold_note

    return {
        "hop1_relation": MechanismStat(right, with_gold, gold_note),
        "yes_at_gold_last_hop": MechanismStat(at_yes, at_n, tries_note(at_n, "at a gold chain's last hop")),
        "yes_elsewhere": MechanismStat(else_yes, else_n, tries_note(else_n, "away from a gold chain's last hop")),
    }
