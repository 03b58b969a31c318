"""Knowledge backtracing: target and initial entities, the evidence subgraph, the two filters,
the FA ratio and the SFT records of the self-training loop (paper, Section 3.3, Algorithm 2).

From each correct trajectory the evidence subgraph S ⊆ G is traced from the *target entities*
(graph entities named in the final thought and the answer) back to the *initial entities*
(the expansion points exploration introduced). S then filters the trajectory's generations:

- unavailing exploration: a guidance pair whose completion produced no triplet of S is
  removed, and the whole exploration record when no pair is left;
- extraneous completion: a triplet outside S is removed, and the whole completion record
  when no triplet is left.

The final answering exploration is kept. Filtered outputs are written back with
`knowtrace_train.methods.knowtrace.outputs`, the texts the parser reads. `mode="star"` is the non-backtracing
variant (plain STaR: every generation of a correct trajectory is kept) behind the same
interface; the FA ratio is measured the same way in both modes, so runs compare directly. Both
write the STaR record (`methods.star.star_record`) and read hinted reruns as the generic STaR does
(`methods.star.plain_question`); KnowTrace's STaR differs from the generic one only where it can do
more: it rebuilds the unhinted prompt (so a hinted rerun trains unless it leaks the hint), writes the
canonical output texts, and measures FA.

A trajectory that cannot be backtraced (empty graph, an answer that names no graph entity,
no path to an initial entity) yields no records in backtrace mode and is counted under its
reason; nothing here raises on a trajectory's content.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.methods.star import plain_question, star_record, undesirable_sources, undesirable_stats
from knowtrace_train.methods.hints import mentions_hint
from knowtrace_train.methods.knowtrace.backtrace.filters import (
    FilteredCall,
    answer_texts,
    filter_trajectory,
    is_answer_call,
)
from knowtrace_train.methods.knowtrace.backtrace.paths import (
    SKIP_HINT_LEAK,
    SKIP_INCORRECT,
    SKIP_NO_ANSWER_CALL,
    TrajectoryBacktrace,
    backtrace,
)
from knowtrace_train.methods.knowtrace.backtrace.training_prompts import PromptOptions, training_prompt
from knowtrace_train.decisions import mark_decision
from knowtrace_train.methods.knowtrace.config import COMPLETE, DEFAULT_PATH_RULE, EXPLORE, PATH_RULES, RECORD_KINDS
from knowtrace_train.methods.knowtrace.outputs import SUFFICIENCY, judgement_span
from knowtrace_train.trajectory import Trajectory, is_correct

log = logging.getLogger(__name__)

MODES = ("backtrace", "star")

#: Why FA's tokens are filtered: the correct trajectory cannot be traced (no evidence subgraph: every call
#: dropped); inside a traced one, unneeded guidance pairs (exploration tokens backtracing's pair filter drops) and
#: extraneous triplets (completion tokens its triplet filter drops), the paper's noise; calls both modes drop
#: (a forced answer contradicting the trajectory's own judgement, an output the parser could not read).
FA_PARTS = ("untraceable", "unneeded_pairs", "extraneous_triplets", "dropped_by_both")


def fa_part(fc: FilteredCall, traced: bool) -> str:
    """Which of FA_PARTS a filtered call's filtered tokens belong to."""
    if not traced:
        return "untraceable"
    if fc.full_output is None:
        return "dropped_by_both"
    if fc.role == EXPLORE:
        return "unneeded_pairs"
    if fc.role == COMPLETE:
        return "extraneous_triplets"
    return "dropped_by_both"


# -- the public entry point ------------------------------------------------------------------


@dataclass
class RoleStats:
    """Counts of one role over the correct trajectories (records and tokens as backtracing
    filters them, whatever the mode) and the records this run wrote."""

    calls: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    items_all: int = 0
    items_kept: int = 0
    tokens_all: int = 0
    tokens_filtered: int = 0
    records_written: int = 0

    @property
    def tokens_kept(self) -> int:
        return self.tokens_all - self.tokens_filtered

    @property
    def fa_ratio(self) -> float:
        return self.tokens_filtered / self.tokens_all if self.tokens_all else 0.0

    def add(self, fc: FilteredCall) -> None:
        self.calls += 1
        self.records_kept += int(fc.kept)
        self.records_dropped += int(not fc.kept)
        self.items_all += fc.items_all
        self.items_kept += fc.items_kept
        self.tokens_all += fc.tokens_all
        self.tokens_filtered += fc.tokens_filtered

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "records_kept": self.records_kept,
            "records_dropped": self.records_dropped,
            "items_all": self.items_all,
            "items_kept": self.items_kept,
            "tokens_all": self.tokens_all,
            "tokens_kept": self.tokens_kept,
            "tokens_filtered": self.tokens_filtered,
            "fa_ratio": self.fa_ratio,
            "records_written": self.records_written,
        }


@dataclass
class BacktraceResult:
    """SFT records per role, the JSON-able statistics (FA ratio overall and per role, and the
    counts behind it) and each correct trajectory's backtrace."""

    records_by_role: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any]
    traces: list[TrajectoryBacktrace] = field(default_factory=list)

    def write(self, folder: str | Path) -> dict[str, Path]:
        """Write `sft_<role>.jsonl` for every role (empty files included) and
        `backtrace_stats.json` into `folder`, each atomically; returns the record files."""
        from knowtrace_train.io import write_json, write_jsonl

        folder = Path(folder)
        paths = {}
        for role in RECORD_KINDS:
            paths[role] = folder / f"sft_{role}.jsonl"
            write_jsonl(paths[role], self.records_by_role.get(role, []))
        write_json(folder / "backtrace_stats.json", self.stats)
        return paths


def backtrace_trajectories(
    trajectories: Iterable[Trajectory],
    items_by_id: Mapping[str, QAItem] | None = None,
    *,
    count_tokens: Callable[[str], int],
    mode: str = "backtrace",
    path_rule: str = DEFAULT_PATH_RULE,
    fewshot: bool = True,
    rerender: bool = False,
    kg_format: str | None = None,
    iteration: int | None = None,
    passages: Mapping[str, Passage] | None = None,
    undesirable: Iterable[str] = (),
    prompt_set: str = "short",
) -> BacktraceResult:
    """Algorithm 2, lines 6-11: keep the correct trajectories, backtrace each, filter its
    generations (mode "backtrace") or keep them all (mode "star"), and write SFT records
    {"prompt", "prefix", "completion", "role", "trajectory_id", "iteration"} per role: `prefix` is the start of the
    answer the engine fed (the judgement words), prompt-side in training; an exploration's judgement is marked
    as its decision (knowtrace_train.decisions).

    `undesirable` (preference training, `mode: kto`) adds records labelled false beside the kept ones
    (then labelled true): "incorrect", every call of a wrong, unhinted trajectory as the model wrote it
    (in the canonical output texts; a call the parser could not read has none and is counted); and
    "filtered", every call backtracing drops whole from a correct trajectory. Each record then carries
    `"label"`, and `stats["undesirable"]` counts them per role and source. The FA ratio and every other
    statistic stay over the correct trajectories, whatever `undesirable` holds.

    `items_by_id` gives the plain question of hinted (rationalization) rollouts and the
    passages for re-rendered completion prompts (with `passages`). FA counts every output
    token of the correct trajectories with `count_tokens` (the model's tokenizer)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if path_rule not in PATH_RULES:
        raise ValueError(f"path_rule must be one of {PATH_RULES}, got {path_rule!r}")
    undesirable = undesirable_sources(undesirable)
    labelled = bool(undesirable)
    items_by_id = items_by_id or {}
    if passages is None:
        passages = {p.id: p for it in items_by_id.values() for p in it.context}
    opts = PromptOptions(fewshot=fewshot, rerender=rerender, kg_format=kg_format, prompt_set=prompt_set)
    records: dict[str, list[dict[str, Any]]] = {r: [] for r in RECORD_KINDS}
    roles = {r: RoleStats() for r in RECORD_KINDS}
    reasons: dict[str, int] = defaultdict(int)
    traces: list[TrajectoryBacktrace] = []
    n_traj = n_correct = n_ok = n_hinted = prompt_unavailable = 0
    ok_all = ok_filtered = 0  # tokens of the backtraced trajectories alone
    graph_triplets = evidence_triplets = 0
    unwanted: dict[str, dict[str, int]] = {r: {s: 0 for s in sorted(undesirable)} for r in RECORD_KINDS}
    unwanted_skipped: dict[str, int] = defaultdict(int)
    # FA's filtered tokens by why (FA_PARTS) and the records backtracing keeps whole or changes inside a call
    fa_parts = dict.fromkeys(FA_PARTS, 0)
    kept_whole = kept_changed = 0

    def record(fc: FilteredCall, traj: Trajectory, prompt: str, text: str, label: bool) -> dict[str, Any]:
        rec = star_record(prompt, fc.call.prefix, text, fc.role, traj, iteration, label if labelled else None)
        span = judgement_span(rec["prefix"], rec["completion"]) if fc.role == EXPLORE else None
        if span is not None:
            mark_decision(rec, SUFFICIENCY, *span)
        return rec

    def add_undesirable(fc: FilteredCall, traj: Trajectory, question: str, source: str) -> None:
        if fc.full_output is None:
            unwanted_skipped["unparsed"] += 1
            return
        prompt = training_prompt(fc, traj, question, None, opts, passages)
        if prompt is None:
            unwanted_skipped["prompt_unavailable"] += 1
            return
        records[fc.role].append(record(fc, traj, prompt, fc.full_output, False))
        unwanted[fc.role][source] += 1

    for traj in trajectories:
        n_traj += 1
        question, hinted = plain_question(traj, items_by_id)
        if not is_correct(traj):
            reasons[SKIP_INCORRECT] += 1
            if "incorrect" in undesirable:
                if hinted:  # a hinted rerun's failure says little about the plain question
                    unwanted_skipped["hinted"] += 1
                else:
                    for fc in filter_trajectory(traj, None, count_tokens):
                        add_undesirable(fc, traj, question, "incorrect")
            continue
        n_correct += 1
        n_hinted += int(hinted)
        bt = backtrace(traj, path_rule)
        if bt.ok and not any(is_answer_call(c) for c in traj.calls):
            bt = TrajectoryBacktrace(bt.trajectory_id, bt.question_id, bt.dataset, SKIP_NO_ANSWER_CALL,
                                     bt.targets, bt.initial_entities, ())
        leak = hinted and (mentions_hint(traj.thought) or any(
            mentions_hint((answer_texts(c, traj) or ("", ""))[0]) for c in traj.calls if is_answer_call(c)))
        if bt.ok and leak:
            bt = TrajectoryBacktrace(bt.trajectory_id, bt.question_id, bt.dataset, SKIP_HINT_LEAK,
                                     bt.targets, bt.initial_entities, ())
        traces.append(bt)
        if bt.ok:
            n_ok += 1
            graph_triplets += len(traj.graph.triplets)
            evidence_triplets += len(bt.evidence)
        else:
            reasons[bt.status] += 1
        filtered = filter_trajectory(traj, bt.evidence if bt.ok else None, count_tokens)
        s_keys = {traj.graph.triplets[i].triplet.key() for i in bt.evidence} if bt.ok else None
        star = mode == "star"
        star_ok = not leak  # never train on a rationale that needs the hint
        for fc in filtered:
            roles[fc.role].add(fc)
            fa_parts[fa_part(fc, bt.ok)] += fc.tokens_filtered
            if bt.ok:
                ok_all += fc.tokens_all
                ok_filtered += fc.tokens_filtered
                kept_whole += int(fc.kept and fc.items_kept == fc.items_all)
                kept_changed += int(fc.kept and fc.items_kept < fc.items_all)
            target = fc.full_output if star else fc.output
            if bt.ok and not star and target is None and "filtered" in undesirable:
                add_undesirable(fc, traj, question, "filtered")
            if target is None or (star and not star_ok):
                continue
            prompt = training_prompt(fc, traj, question, None if star else s_keys, opts, passages)
            if prompt is None:
                prompt_unavailable += 1
                continue
            records[fc.role].append(record(fc, traj, prompt, target, True))
            roles[fc.role].records_written += 1

    tokens_all = sum(r.tokens_all for r in roles.values())
    tokens_filtered = sum(r.tokens_filtered for r in roles.values())
    stats: dict[str, Any] = {
        "mode": mode,
        "path_rule": path_rule,
        "fewshot": fewshot,
        "rerender": rerender,
        "trajectories": n_traj,
        "correct": n_correct,
        "backtraced": n_ok,
        "hinted": n_hinted,
        "skipped": dict(sorted(reasons.items())),
        "graph_triplets": graph_triplets,
        "evidence_triplets": evidence_triplets,
        "tokens_all": tokens_all,
        "tokens_kept": tokens_all - tokens_filtered,
        "tokens_filtered": tokens_filtered,
        "fa_ratio": tokens_filtered / tokens_all if tokens_all else 0.0,
        # the same ratio over the trajectories that backtraced (skipped ones count as all filtered above)
        "fa_ratio_backtraced": ok_filtered / ok_all if ok_all else 0.0,
        # the FA ratio by why the tokens are filtered; the parts add up to fa_ratio
        "fa_decomposed": {k: v / tokens_all if tokens_all else 0.0 for k, v in fa_parts.items()},
        "tokens_filtered_by_part": fa_parts,
        # backtracing's records of traced trajectories: as STaR writes them, or changed inside the call (pairs or
        # triplets filtered out): the records where the two modes differ by more than which records they keep
        "backtrace_records": {"whole": kept_whole, "changed": kept_changed},
        "roles": {r: s.to_dict() for r, s in roles.items()},
        "records": {r: len(v) for r, v in records.items()},
        "prompt_unavailable": prompt_unavailable,
    }
    if labelled:
        stats["undesirable"] = undesirable_stats(undesirable, unwanted, unwanted_skipped)
    log.info("backtracing: %d/%d correct trajectories backtraced, FA %.3f", n_ok, n_correct, stats["fa_ratio"])
    return BacktraceResult(records_by_role=records, stats=stats, traces=traces)


def evidence_calls(trajectories: Iterable[Trajectory], *, count_tokens: Callable[[str], int],
                   path_rule: str = DEFAULT_PATH_RULE) -> dict[str, set[int]]:
    """The credit rule of `mode: grpo` with `credit: backtrace`: for each correct trajectory, the indices of the
    calls backtracing keeps (wholly or filtered: the calls `mode: backtrace` trains on). A correct trajectory that
    cannot be backtraced (no path, no answer call) keeps none: its answer is not supported by evidence it traced.
    Wrong trajectories are not in the result."""
    out: dict[str, set[int]] = {}
    for traj in trajectories:
        if not is_correct(traj):
            continue
        bt = backtrace(traj, path_rule)
        if not bt.ok or not any(is_answer_call(c) for c in traj.calls):
            out[traj.id] = set()
            continue
        out[traj.id] = {fc.call.index for fc in filter_trajectory(traj, bt.evidence, count_tokens) if fc.kept}
    return out

