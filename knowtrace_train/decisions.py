"""Decisions inside a record's completion, and the loss weights that make each one learned from its evidence.

A method's decision call (KnowTrace's sufficiency judgement, DoG's answer try, ...) writes a few tokens that
decide what the engine does next (" Yes" or " No"), inside a completion of tens of other tokens. Trained as
plain tokens, a decision carries a few percent of the loss, and the model learns the labels' proportion rather
than the evidence (the bootstrapped M0 judged its graph sufficient in 0 of 66 explorations: docs/selftrain.md,
"Decisions"). A record marks its decision with `mark_decision` (its kind, its label and the span of the
completion's characters that state it); `decision_weights` gives each marked span a loss weight: balanced over
the labels of its kind (each label's records together weigh as much as every other label's) and scaled by
`decision_weight` (train.decision_weight), so that a decision is learned from which prompts carry which label.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, MutableMapping, Sequence

#: the record field that marks a decision: {"kind", "label", "start", "end"} (characters of the completion)
DECISION = "decision"


def mark_decision(record: MutableMapping[str, Any], kind: str, label: str, start: int, end: int) -> MutableMapping[str, Any]:
    """Marks `record`'s decision: the completion's characters [start, end) state `label` of decision `kind`."""
    completion = record.get("completion", "")
    if not (0 <= start < end <= len(completion)):
        raise ValueError(f"a decision span [{start}, {end}) outside the completion of {len(completion)} characters")
    record[DECISION] = {"kind": kind, "label": label, "start": start, "end": end}
    return record


def decision_of(record: Mapping[str, Any], where: str = "record") -> dict[str, Any] | None:
    """The record's decision mark, checked (None where it has none); a malformed one raises naming `where`."""
    d = record.get(DECISION)
    if d is None:
        return None
    completion = record.get("completion")
    ok = (isinstance(d, Mapping) and isinstance(d.get("kind"), str) and isinstance(d.get("label"), str)
          and isinstance(d.get("start"), int) and isinstance(d.get("end"), int) and isinstance(completion, str)
          and 0 <= d["start"] < d["end"] <= len(completion))
    if not ok:
        raise ValueError(f"{where}: field 'decision' must be {{kind, label, start, end}} with 0 <= start < end <= "
                         f"the completion's length, got {d!r}")
    return dict(d)


def decision_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per decision kind, the records of each label."""
    counts: dict[str, Counter] = {}
    for r in records:
        d = decision_of(r)
        if d is not None:
            counts.setdefault(d["kind"], Counter())[d["label"]] += 1
    return {k: dict(sorted(c.items())) for k, c in sorted(counts.items())}


def decision_weights(records: Sequence[Mapping[str, Any]], decision_weight: float | None) -> list[float | None]:
    """Per record, the loss weight of its decision's tokens (None: no decision, or weighting off). With
    `decision_weight` w, a record of label l of kind k weighs w * n_k / (L_k * n_kl): n_k the kind's marked
    records, L_k its labels, n_kl the label's; each label then weighs w * n_k / L_k in all, and a kind whose
    labels are balanced weighs w a token, as many records as it has. A kind whose records all carry one label
    is not weighted (None): there is no evidence to tell its labels apart, and weighting would only push that
    label harder (an iteration whose model never judged its graph sufficient has "No" records only). None or 0:
    no weighting."""
    if not decision_weight:
        return [None] * len(records)
    counts = decision_counts(records)
    out: list[float | None] = []
    for r in records:
        d = decision_of(r)
        labels = counts[d["kind"]] if d is not None else {}
        if len(labels) < 2:
            out.append(None)
            continue
        n = sum(labels.values())
        out.append(decision_weight * n / (len(labels) * labels[d["label"]]))
    return out
