"""The fair table: every method self-trained the same way, each (run, stage) model's dev EM/F1, EM by kind, mechanism statistics and seconds, and each method's best stage paired with the reference's.

A `FairConfig` names self-training run folders (`recipes/selftrain.py --strategy.name <method>`, `--mode star`;
KnowTrace `--mode backtrace`) by label and the stages to read from each: `base` (base/eval.jsonl, the raw base),
`m0` (M0: iter_0/eval.jsonl, or base/eval.jsonl where m0.json says M0 is the raw base) and `iter_<z>`
(iter_<z>/eval.jsonl, M(z)). `fair_table` checks everything before it computes anything (every run folder, its
config.yaml naming a registered method, every eval file finished, every run on the same dev questions) and then
gives one `FairRow` per (label, stage): EM and F1 with their 95% bootstrap intervals, EM of the bridge and of the
comparison questions apart (question kinds from `data`), the method's own mechanism statistics on those
trajectories (`Method.mechanism`, as `compare.py` prints them) and the seconds the run spent. Each label's best
stage (highest EM; the earlier stage in `stages` on a tie) is paired with the reference label's best stage on the
same questions (`pairing.compare_scores`: exact McNemar on EM, paired bootstrap on F1). A label may name several
run folders (seeds of one method): its rows pool them as `compare_runs` pools seeds (each question's scores
averaged over the runs; intervals and the sign-flip test over questions: `pairing.compare_pooled`), every label
then naming as many.

Seconds are the wall-clock seconds each stage recorded in its DONE marker (`<folder>/DONE.<stage>`: "seconds",
or "reused_seconds" for a stage another run computed and this one took from the reuse cache: what it cost
when computed), read per stage, never from this machine: `bootstrap` = iter_0's gold, train_* and merge
markers (and base/DONE.probe, bootstrap "auto"'s probe), where M0 is bootstrapped; `iterations` = the
rollout, rationalize and train_* markers of iter_1 .. iter_<z> (up to the row's stage; none for base and m0);
`eval` = the row's own evaluation (its folder's DONE.eval). On a CPU-only machine they are the time the run
held its cores, not a process's CPU time.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from knowtrace_train.compare import _selected, markdown_table, mechanism
from knowtrace_train.config import load_config, read_yaml
from knowtrace_train.errors import UserError
from knowtrace_train.io import read_json
from knowtrace_train.methods import METHODS
from knowtrace_train.methods.base import MechanismStat
from knowtrace_train.metrics import Interval, bootstrap_interval, em_by_kind, question_kind
from knowtrace_train.pairing import QuestionScores, by_id, compare_pooled, mean_scores, read_question_scores
from knowtrace_train.report import em_cell, p_text
from knowtrace_train.stages import DONE_PREFIX, is_done, read_done
from knowtrace_train.trajectory import read_trajectories

_ITER = re.compile(r"iter_(\d+)")
#: the question kinds the table shows apart
KINDS = ("bridge", "comparison")


class FairTableError(UserError, ValueError):
    """A run folder, a file in it or a config the fair table cannot read as given (names the file and field)."""

    label = "fair table"


@dataclass
class FairConfig:
    """Self-training runs of several methods, read side by side on the same dev questions."""

    runs: dict[str, str | list[str]] = field(
        default_factory=dict, metadata={"help": "label (usually the method's name) -> its self-training run folder, or "
                                                "a list of folders (seeds), pooled"})
    stages: list[str] = field(
        default_factory=lambda: ["base", "m0", "iter_2"],
        metadata={"help": "the models of each run: base (raw base), m0 (M0: iter_0, or base where M0 is the raw "
                          "base), iter_<z> (M(z))"})
    reference: str = field(
        default="knowtrace", metadata={"help": "the label whose best stage every other label's best stage is paired with"})
    data: str = field(
        default="data/world/dev.jsonl",
        metadata={"help": "the dev file the runs' questions come from (question kinds, the mechanism statistics' "
                          "gold evidence)"})
    seed: int = field(default=0, metadata={"help": "seed of the bootstrap intervals and the paired tests"})
    first: int | None = field(
        default=None, metadata={"help": "read only the first N run folders of each label (e.g. 1: the first seed alone "
                                        "while the others run); null: all"})

    def __post_init__(self) -> None:
        from knowtrace_train.data.bundled import bundled_path

        self.data = bundled_path(self.data)
        if not self.stages:
            raise ValueError("stages must name at least one stage (base, m0, iter_<z>)")
        for s in self.stages:
            if s not in ("base", "m0") and not _ITER.fullmatch(s):
                raise ValueError(f"stages: {s!r} is not base, m0 or iter_<z>")
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages names a stage twice: {self.stages}")
        if self.runs and self.reference not in self.runs:  # no runs yet: `fair_table` refuses it
            raise ValueError(f"reference {self.reference!r} is not a label of runs ({sorted(self.runs)})")
        for label, folders in self.runs.items():
            if isinstance(folders, list) and not folders:
                raise ValueError(f"runs.{label}: an empty list of run folders")
        if self.first is not None and self.first < 1:
            raise ValueError(f"first must be at least 1 (or null: every folder), got {self.first}")

    def folders(self, label: str) -> list[str]:
        """The run folders (seeds) of a label."""
        f = self.runs[label]
        return (list(f) if isinstance(f, list) else [f])[: self.first]


def load_fair_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> FairConfig:
    return load_config(FairConfig, path, list(overrides))


@dataclass
class FairRow:
    """One (label, stage) model of the table."""

    label: str
    method: str
    stage: str
    #: the eval file read (the first run's, where the label pools several)
    path: Path
    #: each question's scores (averaged over the label's runs where it pools several: `pairing.mean_scores`)
    scores: QuestionScores
    em: Interval
    f1: Interval
    #: EM of the questions of each kind (bridge, comparison, unknown: those present)
    by_kind: dict[str, Interval]
    mechanism: dict[str, MechanismStat]
    #: {"bootstrap", "iterations", "eval"}: seconds (see the module docstring; the mean over the label's runs)
    seconds: dict[str, float]
    #: whether the stage is M0 as the raw base (m0 read from base/eval.jsonl)
    m0_is_base: bool = False
    best: bool = False
    #: on the label's best stage (not the reference's): `compare_pooled(reference best, this)`
    vs_reference: dict[str, Any] | None = None
    #: on every stage but the label's first: `compare_pooled(the stage before it, this)` (did it learn)
    vs_previous: dict[str, Any] | None = None
    #: the stage `vs_previous` pairs this one with
    previous: str | None = None
    #: each run's (seed's) scores, in the config's order (one where the label names one folder)
    seed_scores: list[QuestionScores] = field(default_factory=list)
    #: each run's eval file
    paths: list[Path] = field(default_factory=list)
    #: how the questions ended: {stop_reason: [questions, of them answered right (EM 1)]}, summed over the runs,
    #: most frequent first (the engine's own words: "answered", "no_progress", "max_rounds", ...)
    stops: dict[str, list[int]] = field(default_factory=dict)

    @property
    def seeds(self) -> int:
        return max(1, len(self.seed_scores))

    @property
    def build_seconds(self) -> float:
        return self.seconds["bootstrap"] + self.seconds["iterations"]


# -- reading the runs --------------------------------------------------------------------------------


@dataclass
class _Run:
    label: str
    folder: Path
    method: str
    strategy: Any
    dev: list[str]
    m0_bootstrapped: bool | None
    #: how errors name it: runs.<label>, or runs.<label>[i] for a label's i-th folder
    where: str = ""


def _read_run(label: str, folder: Path, need_m0: bool, where: str | None = None) -> _Run:
    where = where or f"runs.{label}"
    if not folder.is_dir():
        raise FairTableError(f"{where}: no run folder {folder}")
    cfg_path = folder / "config.yaml"
    if not cfg_path.is_file():
        raise FairTableError(f"{where}: {cfg_path} is missing (not a self-training run folder?)")
    raw = read_yaml(cfg_path)
    section = raw.get("strategy")
    name = section.get("name") if isinstance(section, dict) else None
    if name not in METHODS:
        raise FairTableError(f"{where}: {cfg_path}: strategy.name {name!r} is not a registered method "
                             f"(registered: {', '.join(sorted(METHODS))})")
    from knowtrace_train.selftrain.config import read_run_config

    strategy = read_run_config(cfg_path).strategy
    qfile = folder / "questions.json"
    try:
        dev = [str(i) for i in read_json(qfile)["dev"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FairTableError(f"{where}: {qfile}: no list of dev question ids under \"dev\" ({e})") from None
    boot = None
    if need_m0:
        m0 = folder / "m0.json"
        try:
            boot = bool(read_json(m0)["bootstrapped"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise FairTableError(f"{where}: stage m0: {m0}: no \"bootstrapped\" field (M0 not built yet?) "
                                 f"({e})") from None
    return _Run(label, folder, name, strategy, dev, boot, where)


def stage_folder(run: _Run, stage: str) -> Path:
    """The folder whose eval.jsonl holds the stage's model."""
    if stage == "m0":
        return run.folder / ("iter_0" if run.m0_bootstrapped else "base")
    return run.folder / stage


def _check_same_questions(runs: Sequence[_Run]) -> None:
    first = runs[0]
    for r in runs[1:]:
        if set(r.dev) != set(first.dev):
            raise FairTableError(
                f"{first.where} ({first.folder}) and {r.where} ({r.folder}) evaluate other dev questions "
                f"({len(set(first.dev) ^ set(r.dev))} ids in one questions.json but not the other); paired tests "
                "need the same questions: rerun with the same data.dev, data.dev_questions and data.seed")


def _marker_seconds(folder: Path, stage: str) -> float:
    info = read_done(folder, stage)
    return float(info.get("reused_seconds") or info.get("seconds") or 0.0)


def _stages_seconds(folder: Path, skip: Sequence[str] = ("eval",)) -> float:
    """The seconds of every stage marker in `folder` but those in `skip`."""
    names = [m.name[len(DONE_PREFIX):] for m in sorted(folder.glob(DONE_PREFIX + "*"))]
    return sum((_marker_seconds(folder, n) for n in names if n not in skip), 0.0)


def run_seconds(run: _Run, stage: str) -> dict[str, float]:
    """{"bootstrap", "iterations", "eval"} of a stage's model (see the module docstring)."""
    boot = 0.0
    if stage != "base":
        if is_done(run.folder / "base", "probe"):
            boot += _marker_seconds(run.folder / "base", "probe")
        if (run.folder / "iter_0" / f"{DONE_PREFIX}merge").is_file():
            boot += _stages_seconds(run.folder / "iter_0")
    m = _ITER.fullmatch(stage)
    last = int(m.group(1)) if m else 0
    iters = sum((_stages_seconds(run.folder / f"iter_{z}") for z in range(1, last + 1)), 0.0)
    return {"bootstrap": round(boot, 3), "iterations": round(iters, 3),
            "eval": round(_marker_seconds(stage_folder(run, stage), "eval"), 3)}


def _eval_file(run: _Run, stage: str) -> Path:
    folder = stage_folder(run, stage)
    path = folder / "eval.jsonl"
    if not path.is_file():
        why = " (M0 is the raw base and the base was not evaluated: eval_base false)" if stage == "m0" else ""
        raise FairTableError(f"{run.where}: stage {stage}: no eval file {path}{why}")
    if not is_done(folder, "eval"):
        raise FairTableError(f"{run.where}: stage {stage}: {path} is not finished (no {folder / 'DONE.eval'}: "
                             "the run is still evaluating this model)")
    return path


def _items(path: str, ids: Sequence[str]):
    from knowtrace_train.data.loaders import load_items

    if not Path(path).is_file():
        raise FairTableError(f"data: no such file {path!r}")
    items = {it.id: it for it in load_items(path)}
    missing = [i for i in ids if i not in items]
    if missing:
        raise FairTableError(f"data: {path} lacks {len(missing)} of the runs' dev question ids (e.g. {missing[:3]}); "
                             "name the dev file the runs used")
    return [items[i] for i in ids]


# -- the table -----------------------------------------------------------------------------------------


def fair_table(config: FairConfig) -> list[FairRow]:
    """One row per (label, stage), in the config's order, after every check (see the module docstring). A label
    with several run folders (seeds) gets one pooled row per stage: EM and F1 the mean over its runs, their
    intervals a bootstrap over questions of each question's mean, the mechanism's counts summed over the runs,
    the seconds their mean; its paired tests pool the runs as `compare_runs` does (`pairing.compare_pooled`)."""
    if not config.runs:
        raise FairTableError("runs: no run folder named (label: folder, one per method)")
    runs: dict[str, list[_Run]] = {}
    for label in config.runs:
        folders = config.folders(label)
        runs[label] = [_read_run(label, Path(f), "m0" in config.stages,
                                 f"runs.{label}" + (f"[{i}]" if len(folders) > 1 else ""))
                       for i, f in enumerate(folders)]
    every = [r for rs in runs.values() for r in rs]
    counts = {label: len(rs) for label, rs in runs.items()}
    if len(set(counts.values())) > 1:
        raise FairTableError("runs: every label must name as many run folders (seeds) for the pooled paired tests; "
                             "got " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    _check_same_questions(every)
    for label, rs in runs.items():
        if len({r.method for r in rs}) > 1:
            raise FairTableError(f"runs.{label}: its folders run other methods ({', '.join(r.method for r in rs)}); "
                                 "a label pools the seeds of one method")
    files = {(r.where, s): _eval_file(r, s) for r in every for s in config.stages}
    items = _items(config.data, every[0].dev)
    kinds = {it.id: question_kind(it) for it in items}
    rows = []
    for label, rs in runs.items():
        for s in config.stages:
            per_seed, mechs, secs, stops = [], [], [], []
            for r in rs:
                path = files[r.where, s]
                try:
                    scores = by_id(read_question_scores(path))
                except ValueError as e:
                    raise FairTableError(f"{r.where}: stage {s}: {e}") from None
                if set(scores.ids) != set(r.dev):
                    have, dev = set(scores.ids), set(r.dev)
                    raise FairTableError(f"{r.where}: stage {s}: {path} holds {len(have & dev)} of the run's {len(dev)} "
                                         f"dev questions (questions.json) and {len(have - dev)} others")
                per_seed.append(scores)
                trajs = list(read_trajectories(path))
                mechs.append(mechanism(r.strategy, trajs, items))
                stops.append(stop_reasons(trajs, scores))
                secs.append(run_seconds(r, s))
            scores = mean_scores(per_seed)
            rows.append(FairRow(
                label=label, method=rs[0].method, stage=s, path=files[rs[0].where, s], scores=scores,
                em=bootstrap_interval(scores.em, seed=config.seed), f1=bootstrap_interval(scores.f1, seed=config.seed),
                by_kind=em_by_kind(scores.em, [kinds[i] for i in scores.ids], seed=config.seed),
                mechanism=pool_mechanism(mechs),
                seconds={k: round(sum(x[k] for x in secs) / len(secs), 3) for k in secs[0]},
                m0_is_base=s == "m0" and not any(r.m0_bootstrapped for r in rs),
                seed_scores=per_seed, paths=[files[r.where, s] for r in rs], stops=pool_stops(stops)))
    _pair_best(rows, config.reference, config.seed)
    _pair_steps(rows, config.seed)
    return rows


def stop_reasons(trajs, scores: QuestionScores) -> dict[str, list[int]]:
    """{stop_reason: [questions, right]} over the scored questions (`scores`; the first trajectory of a question
    where a file holds two, as `compare._selected` picks it), most frequent first: how each question ended and which
    endings were right."""
    em = dict(zip(scores.ids, scores.em))
    return pool_stops([{t.stop_reason or "(none)": [1, int(em[t.question_id] == 1.0)]}
                       for t in _selected(trajs, scores.ids)])


def pool_stops(stops: Sequence[dict[str, list[int]]]) -> dict[str, list[int]]:
    """Several `stop_reasons` summed, most frequent first."""
    out: dict[str, list[int]] = {}
    for st in stops:
        for k, (n, right) in st.items():
            c = out.setdefault(k, [0, 0])
            c[0] += n
            c[1] += right
    return dict(sorted(out.items(), key=lambda kv: (-kv[1][0], kv[0])))


def pool_mechanism(stats: Sequence[dict[str, MechanismStat]]) -> dict[str, MechanismStat]:
    """Several runs' mechanism statistics as one: each figure's numerator and denominator summed over the runs
    (a mean per question stays one: the total over every run's questions), the first note kept."""
    if len(stats) == 1:
        return dict(stats[0])
    out: dict[str, MechanismStat] = {}
    for name in dict.fromkeys(k for st in stats for k in st):
        have = [st[name] for st in stats if name in st]
        out[name] = MechanismStat(sum(x.numerator for x in have), sum(x.denominator for x in have),
                                  next((x.note for x in have if x.note), None))
    return out


def _pair_steps(rows: Sequence[FairRow], seed: int) -> None:
    """Each row against the same label's row before it (base -> m0 -> iter_z): what that stage's training bought."""
    for before, row in zip(rows, rows[1:]):
        if before.label == row.label:
            row.vs_previous = compare_pooled(before.seed_scores, row.seed_scores, seed=seed)
            row.previous = before.stage


def best_rows(rows: Sequence[FairRow]) -> dict[str, FairRow]:
    """Each label's best row: highest EM, the earlier stage on a tie."""
    out: dict[str, FairRow] = {}
    for row in rows:
        if row.label not in out or row.em.mean > out[row.label].em.mean:
            out[row.label] = row
    return out


def _pair_best(rows: Sequence[FairRow], reference: str, seed: int) -> None:
    best = best_rows(rows)
    for row in best.values():
        row.best = True
    ref = best[reference]
    for label, row in best.items():
        if label != reference:
            row.vs_reference = compare_pooled(ref.seed_scores, row.seed_scores, seed=seed)


# -- rendering ---------------------------------------------------------------------------------------


def _iv(iv: Interval | None) -> dict[str, Any] | None:
    return None if iv is None else dataclasses.asdict(iv)


def _kind_cell(row: FairRow, kind: str) -> str:
    iv = row.by_kind.get(kind)
    return "-" if iv is None else f"{em_cell(iv.mean, _iv(iv))} (n={iv.n})"


def _stage_cell(row: FairRow) -> str:
    return row.stage + (" (= base)" if row.m0_is_base else "") + (" *" if row.best else "")


def format_fair_table(rows: Sequence[FairRow], reference: str) -> str:
    """The table as markdown (one row per label and stage; mechanism cells "name: numerator/denominator =
    value"), then one line per label's best stage against the reference's best."""
    width = max((len(r.mechanism) for r in rows), default=0) or 1
    head = (["label", "stage", "n" if max(r.seeds for r in rows) == 1 else "n x seeds", "EM [95% CI]", "bridge EM", "comparison EM", "F1",
             "mechanism: numerator/denominator = value"] + [""] * (width - 1)
            + ["train s (bootstrap + iterations)", "eval s"])
    body = []
    for r in rows:
        mech = [f"{k}: {v.cell()}" for k, v in r.mechanism.items()] or ["none"]
        body.append([r.label, _stage_cell(r), str(r.em.n) + (f" x {r.seeds}" if r.seeds > 1 else ""), em_cell(r.em.mean, _iv(r.em)), _kind_cell(r, "bridge"),
                     _kind_cell(r, "comparison"), f"{r.f1.mean:.3f}", *mech, *[""] * (width - len(mech)),
                     f"{r.build_seconds:.1f} ({r.seconds['bootstrap']:.1f} + {r.seconds['iterations']:.1f})",
                     f"{r.seconds['eval']:.1f}"])
    seeds = max(r.seeds for r in rows)
    pooled = f", each the mean of {seeds} runs (seeds)" if seeds > 1 else ""
    test = ("the sign-flip test over questions, each question's difference averaged over the seeds" if seeds > 1
            else "exact McNemar")
    title = ("The fair table: every method self-trained the same way, on the same dev questions "
             f"(* = the label's best stage, highest EM{pooled}; intervals: 95% bootstrap over questions, none under "
             "20 questions)")
    out = [title, markdown_table(head, body), ""]
    best = best_rows(rows)
    ref = best[reference]
    out.append(f"Best stage against {reference}'s best ({ref.stage}, EM {ref.em.mean:.3f}) on the same questions "
               f"({test} on EM; the best stages are picked on these questions, so p is optimistic"
               + ("; right in only one of the two counts (seed, question) pairs):" if seeds > 1 else "):"))
    for label, row in best.items():
        if row.vs_reference is None:
            continue
        v = row.vs_reference
        out.append(f"- {label} {row.stage}: EM {row.em.mean:.3f}, {_em_diff_text(v)} vs {reference}, "
                   f"{p_text(v['em']['p_value'])} (n={v['n']}; only {reference} right: "
                   f"{v['only_a']}, only {label} right: {v['only_b']})")
    out += ["", "How the questions ended (stop_reason: questions, of them right"
            + (f"; summed over the {seeds} seeds" if seeds > 1 else "") + "):"]
    for row in rows:
        out.append(f"- {row.label} {row.stage}: " + ", ".join(f"{k} {n} ({right} right)" for k, (n, right) in row.stops.items()))
    out += ["", f"Each stage against the label's stage before it ({test} on EM; what that stage's training bought):"]
    for row in rows:
        if (v := row.vs_previous) is not None:
            out.append(f"- {row.label} {row.stage} vs {row.previous}: {_em_diff_text(v)}, {p_text(v['em']['p_value'])} "
                       f"(n={v['n']}; only the earlier right: {v['only_a']}, only the later right: {v['only_b']})")
    return "\n".join(out)


def _em_diff_text(v: dict[str, Any]) -> str:
    """A `compare_scores` result's EM difference with its paired interval: "+0.090 [+0.040, +0.150]"."""
    em = v["em"]
    return f"{em['diff']:+.3f}" + ("" if em["low"] is None else f" [{em['low']:+.3f}, {em['high']:+.3f}]")


def _em_diff_figures(v: dict[str, Any]) -> dict[str, Any]:
    """A `compare_scores` result's EM figures for the JSON."""
    return {"n": v["n"], "em_diff": round(v["em"]["diff"], 4), "em_low": v["em"]["low"], "em_high": v["em"]["high"],
            "p_value": v["em"]["p_value"]}


def fair_figures(rows: Sequence[FairRow], config: FairConfig) -> dict[str, Any]:
    """The JSON of the table: every row's figures, and the paired tests of the best stages."""
    out_rows = []
    for r in rows:
        out_rows.append({
            "label": r.label, "method": r.method, "stage": r.stage, "m0_is_base": r.m0_is_base, "seeds": r.seeds,
            "eval": str(r.path) if len(r.paths) <= 1 else [str(x) for x in r.paths],
            "n": r.em.n, "em": _iv(r.em), "f1": _iv(r.f1), "by_kind": {k: _iv(v) for k, v in r.by_kind.items()},
            "mechanism": {k: v.to_dict() for k, v in r.mechanism.items()}, "seconds": r.seconds, "best": r.best,
            "stops": {k: {"questions": n, "right": right} for k, (n, right) in r.stops.items()}})
    paired = []
    best = best_rows(rows)
    for label, row in best.items():
        if row.vs_reference is not None:
            v = row.vs_reference
            paired.append({"label": label, "stage": row.stage, "reference": config.reference,
                           "reference_stage": best[config.reference].stage, **_em_diff_figures(v),
                           "test": v["em"]["test"], "f1_diff": round(v["f1"]["diff"], 4),
                           "only_reference": v["only_a"], "only_label": v["only_b"]})
    steps = [{"label": r.label, "stage": r.stage, "previous": r.previous, **_em_diff_figures(r.vs_previous),
              "only_previous": r.vs_previous["only_a"], "only_stage": r.vs_previous["only_b"]}
             for r in rows if r.vs_previous is not None]
    return {"reference": config.reference, "stages": list(config.stages), "data": config.data,
            "runs": dict(config.runs), "rows": out_rows, "paired": paired, "steps": steps}
