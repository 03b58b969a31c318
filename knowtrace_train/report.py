"""Reports of self-training runs (the per-iteration table, summary.json, the paper's Figure 2) and MINTQA-style breakdowns of trajectories (over 500 lines: the table, its end-of-run print and the figures share one row format).

`summarize_run` folds the metrics of the base, M0 and every iteration into the run's summary;
`table_header` / `table_row` print one row per model as the run goes, `run_table` the whole table once it has
ended; `load_run` reads a finished
(or running) run folder back; `plot_runs` draws EM and FA ratio per iteration, one line per run
(backtracing and non-backtracing side by side when both are given).

Every dev EM is shown with its 95% bootstrap interval ("0.250 [0.17,0.33]"; under
`MIN_QUESTIONS_FOR_INTERVAL` dev questions the EM alone and "(n<20: no interval)"), and every
iteration with its EM difference from M0 and the paired test's p-value ("+0.042 p=0.62"; McNemar,
from the loop's `vs_m0`). summary.json and the last JSON line carry the same figures.

`breakdown` scores any method's trajectories as MINTQA reports them: accuracy (gold in the output),
EM and F1 overall, by hop count, by question kind and by the share of popular/new facts in the
chain (`metrics.familiarity_share`, from the items' knowledge types), with the average
sub-questions and retrievals per question where the trajectories record them (`meta`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from knowtrace_train.errors import import_extra
from knowtrace_train.io import read_json
from knowtrace_train.metrics import (
    MIN_QUESTIONS_FOR_INTERVAL,
    familiarity_share,
    question_kind,
    score,
    scores_by_group,
)

COLUMNS = (
    ("iter", 5), ("correct", 9), ("FA", 6), ("FA per kind", 16), ("SFT/adapter", 11),
    ("loss/adapter", 13), ("train s", 8), ("dev EM [95% CI]", 18), ("dev F1", 7), ("EM vs M0", 13),
)

#: what a row says after its cells when the dev set is too small for an interval
NO_INTERVAL = f"(n<{MIN_QUESTIONS_FOR_INTERVAL}: no interval)"
#: the figures of a model's dev evaluation that summary.json keeps (beside em and f1)
EVAL_FIGURES = ("em_interval", "f1_interval", "by_kind", "evidence_supported", "evidence_supported_em", "exploration")


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table_header() -> str:
    return "  ".join(name.rjust(w) for name, w in COLUMNS)


def _has_bounds(iv: dict[str, Any] | None) -> bool:
    return bool(iv) and iv.get("low") is not None and iv.get("high") is not None


def em_cell(em: float | None, iv: dict[str, Any] | None) -> str:
    """`0.250 [0.17,0.33]`; the EM alone where there is no interval (see `interval_marker`)."""
    if em is None:
        return "-"
    if not _has_bounds(iv):
        return f"{em:.3f}"
    return f"{em:.3f} [{iv['low']:.2f},{iv['high']:.2f}]"  # type: ignore[index]


def interval_marker(iv: dict[str, Any] | None) -> str:
    """NO_INTERVAL where an interval was computed for too few questions, else nothing (a run that
    predates intervals has none and says nothing)."""
    return NO_INTERVAL if iv and not _has_bounds(iv) else ""


def p_text(p: float) -> str:
    return "p<0.01" if p < 0.01 else f"p={p:.2f}"


def diff_cell(cmp: dict[str, Any] | None) -> str:
    """`+0.042 p=0.62`: the EM difference of a paired comparison ({"em": PairedComparison dict})
    and its p-value; "-" where there is none."""
    em = (cmp or {}).get("em")
    if not em:
        return "-"
    return f"{em['diff']:+.3f} {p_text(em['p_value'])}"


def table_row(m: dict[str, Any]) -> str:
    """One row: iteration, rollout questions correct, FA ratio overall and per record kind (KnowTrace:
    explore/complete/answer), SFT records per adapter (KnowTrace: explore/complete), training loss per adapter, training seconds, dev EM with its interval, dev F1, and
    for an iteration its EM difference from M0 with the paired test's p-value; NO_INTERVAL after
    the cells where the dev set is too small for an interval."""
    it = m.get("iteration")
    ev = m.get("eval") or {}
    roll = m.get("rollout") or {}
    bt = m.get("rationale") or {}
    sft = m.get("sft_records") or {}
    train = m.get("train") or {}
    if it == "base":
        cells = ["base", "-", "-", "-", "-", "-", "-"]
    elif it == 0:
        recs = m.get("sft_records_per_adapter") or sft
        tr = next(iter(train.values()), {}) if len(train) == 1 else None
        loss = _fmt(tr.get("loss")) if tr else "/".join(_fmt(t.get("loss")) for t in train.values())
        cells = ["0", "gold", "-", "-", "/".join(str(v) for v in recs.values()),
                 loss, _fmt(m.get("seconds", {}).get("train"), 0)]
    else:
        fa = bt.get("fa_by_role") or {}
        vals = list(sft.values())
        losses = [_fmt(t.get("loss")) if t.get("records") else "-" for t in train.values()]
        cells = [
            str(it),
            f"{roll.get('correct', 0)}/{roll.get('trajectories', roll.get('questions', 0))}",  # G per question
            _fmt(bt.get("fa_ratio")),
            "/".join(_fmt(v, 2) for v in fa.values()),  # the method's record kinds, in its order
            "/".join(str(v) for v in vals),
            "/".join(losses),
            _fmt(m.get("seconds", {}).get("train"), 0),
        ]
    iv = ev.get("em_interval")
    cells += [em_cell(ev.get("em"), iv), _fmt(ev.get("f1")), diff_cell(m.get("vs_m0"))]
    marker = interval_marker(iv)
    if m.get("status") == "empty":
        cells[-3:-1] = ["empty", "-"]
    row = "  ".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS))
    return f"{row}  {marker}" if marker else row


#: the exploration table's columns: how each model explores (its dev evaluation) and, for an iteration, why FA's
#: tokens were filtered from its rollouts' correct trajectories (records.FA_PARTS) and how many of backtracing's
#: records differ from STaR's inside a call
SHAPE_COLUMNS = (
    ("model", 5), ("rounds/q", 9), ("pairs/round", 11), ("triplets/compl", 14), ("retr tok/q", 10),
    ("FA untraced", 11), ("unneeded pairs", 14), ("extra triplets", 14), ("both drop", 9), ("recs changed", 12),
)


def shape_row(m: dict[str, Any]) -> str:
    """One row of the exploration table (`SHAPE_COLUMNS`); "-" where a figure does not apply."""
    it = m.get("iteration")
    shape = (m.get("eval") or {}).get("exploration") or {}
    bt = m.get("rationale") or {}
    parts = bt.get("fa_decomposed") or {}
    recs = bt.get("backtrace_records") or {}
    changed = recs.get("changed")
    kept = (recs.get("whole") or 0) + (changed or 0)
    cells = [
        "base" if it == "base" else str(it),
        _fmt(shape.get("rounds_per_question"), 2), _fmt(shape.get("pairs_per_round"), 2),
        _fmt(shape.get("triplets_per_completion"), 2), _fmt(shape.get("retrieved_tokens_per_question"), 0),
        *(_fmt(parts.get(k)) for k in ("untraceable", "unneeded_pairs", "extraneous_triplets", "dropped_by_both")),
        "-" if changed is None else f"{changed}/{kept}",
    ]
    return "  ".join(c.rjust(w) for c, (_, w) in zip(cells, SHAPE_COLUMNS))


def shape_table(metrics: Sequence[dict[str, Any]]) -> str | None:
    """The exploration table (`shape_row` per model, in the run table's order); None where no model's evaluation
    says how it explores (a method without guidance pairs)."""
    if not any(((m.get("eval") or {}).get("exploration")) for m in metrics):
        return None
    order = lambda m: -1 if m.get("iteration") == "base" else int(m.get("iteration"))  # noqa: E731
    header = "  ".join(name.rjust(w) for name, w in SHAPE_COLUMNS)
    return "\n".join([header, *(shape_row(m) for m in sorted(metrics, key=order))])


def run_table(metrics: Sequence[dict[str, Any]]) -> str:
    """The whole per-iteration table: the header, then one `table_row` per model, the raw base first, M0 and the
    iterations in order (whatever order their evaluations finished in)."""
    def order(m: dict[str, Any]) -> int:
        it = m.get("iteration")
        return -1 if it == "base" else int(it)

    return "\n".join([table_header(), *(table_row(m) for m in sorted(metrics, key=order))])


def _eval_entry(ev: dict[str, Any] | None) -> dict[str, Any]:
    ev = ev or {}
    return {"em": ev.get("em"), "f1": ev.get("f1"), **{k: ev.get(k) for k in EVAL_FIGURES}}


def summarize_run(config, run_dir: Path, metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run's summary: dev EM/F1 of the raw base, of M0 and of every iteration (each with its
    intervals, EM by question kind and the evidence-supported EM: EVAL_FIGURES), the paired tests of
    M0 against the base (`vs_base`) and of each iteration against M0 and the previous model
    (`vs_m0`, `vs_previous`), FA ratios, records, losses, and the seconds of each phase (summed over
    the stages as they ran, resumes included)."""
    base = next((m for m in metrics if m.get("iteration") == "base"), None)
    boot = next((m for m in metrics if m.get("iteration") == 0), None)
    iters = [m for m in metrics if isinstance(m.get("iteration"), int) and m["iteration"] > 0]
    phases = {"rollout": 0.0, "rationalize": 0.0, "train": 0.0, "eval": 0.0, "bootstrap": 0.0}
    for m in metrics:
        secs = m.get("seconds", {})
        if m.get("iteration") == 0:
            phases["bootstrap"] += sum(v for k, v in secs.items() if k != "eval")
            phases["eval"] += secs.get("eval", 0.0)
        else:
            for k in ("rollout", "rationalize", "train", "eval"):
                phases[k] += secs.get(k, 0.0)
    phases = {k: round(v, 1) for k, v in phases.items()}
    phases["total"] = round(sum(phases.values()), 1)
    rows = []
    for m in iters:
        ev, bt, roll = m.get("eval") or {}, m.get("rationale") or {}, m.get("rollout") or {}
        rows.append({
            "iteration": m["iteration"],
            "status": m.get("status"),
            **_eval_entry(ev),
            "vs_m0": m.get("vs_m0"),
            "vs_previous": m.get("vs_previous"),
            "fa_ratio": bt.get("fa_ratio"),
            "fa_by_role": bt.get("fa_by_role"),
            "fa_decomposed": bt.get("fa_decomposed"),
            "backtrace_records": bt.get("backtrace_records"),
            "rollout_correct": roll.get("correct"),
            "rollout_questions": roll.get("questions"),
            "rollout_trajectories": roll.get("trajectories", roll.get("questions")),
            "rollout_samples": roll.get("samples", 1),
            "rollout_pass_at_samples": roll.get("pass_at_samples"),
            "rollout_em": roll.get("em"),
            "sft_records": m.get("sft_records"),
            "train_loss": {a: t.get("loss") for a, t in (m.get("train") or {}).items()},
        })
    return {
        "run_dir": str(run_dir),
        "name": config.name,
        "method": config.strategy.name,
        "mode": config.mode,
        "model": config.generator.model,
        "iterations_planned": config.iterations,
        "base": None if base is None else _eval_entry(base["eval"]),
        "bootstrap": None if boot is None else {
            **_eval_entry(boot["eval"]), "vs_base": boot.get("vs_base"), "sft_records": boot.get("sft_records"),
            "gold_trajectories": (boot.get("gold") or {}).get("trajectories"),
        },
        "iterations": rows,
        "seconds": phases,
    }


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The recipe's last line: the run folder, dev EM of base / M0 / each iteration with its 95%
    interval ([low, high], null without one), each iteration's EM difference from M0 and its p-value
    (and M0's from the base), FA ratios, seconds."""
    r = lambda v: None if v is None else round(v, 4)  # noqa: E731
    base, boot, iters = summary.get("base") or {}, summary.get("bootstrap") or {}, summary["iterations"]
    return {
        "run_dir": summary["run_dir"],
        "mode": summary["mode"],
        "base_em": r(base.get("em")),
        "base_em_interval": interval_bounds(base.get("em_interval")),
        "m0_em": r(boot.get("em")),
        "m0_em_interval": interval_bounds(boot.get("em_interval")),
        "m0_p_vs_base": r(_em_cmp(boot.get("vs_base"), "p_value")),
        "em": [r(x["em"]) for x in iters],
        "em_interval": [interval_bounds(x.get("em_interval")) for x in iters],
        "em_diff_vs_m0": [r(_em_cmp(x.get("vs_m0"), "diff")) for x in iters],
        "p_vs_m0": [r(_em_cmp(x.get("vs_m0"), "p_value")) for x in iters],
        "fa_ratio": [r(x["fa_ratio"]) for x in iters],
        "seconds": summary["seconds"],
    }


#: an EM interval wider than this cannot show the differences self-training makes (a few points)
WIDE_INTERVAL = 0.3
#: fewer dev questions than this decide nothing, however narrow their intervals (near EM 0 they are narrow)
FEW_DEV_QUESTIONS = 100
#: the command whose figures can (README, the headline)
HEADLINE_COMMAND = ("python recipes/selftrain.py --config recipes/configs/selftrain_world_scale.yaml "
                    "--data.train_questions 200 --data.dev_questions 100 --seeds 0,1,2")


def small_dev_note(summary: dict[str, Any]) -> str | None:
    """Words for a table whose dev set is too small for the differences it prints: where a model's 95% EM
    interval is wider than `WIDE_INTERVAL`, or the questions are fewer than `FEW_DEV_QUESTIONS` or too few for an
    interval: how wide, what one question is worth, and the command whose figures can tell a difference (None where
    every interval is narrow and the questions are enough)."""
    rows = [("M0", summary.get("bootstrap"))] + [(f"iteration {r['iteration']}", r) for r in summary["iterations"]]
    ivs = [(name, r["em_interval"]) for name, r in rows if r and isinstance(r.get("em_interval"), dict)]
    if not ivs:
        return None
    n = ivs[0][1].get("n")
    widths = [(name, b[1] - b[0]) for name, iv in ivs if (b := interval_bounds(iv))]
    wide = [(name, w) for name, w in widths if w > WIDE_INTERVAL]
    if widths and not wide and (n is None or n >= FEW_DEV_QUESTIONS):
        return None
    if wide:
        name, w = max(wide, key=lambda x: x[1])
        why = f"{name}'s 95% EM interval is {w:.2f} wide (over {WIDE_INTERVAL})"
    elif widths:
        name, w = max(widths, key=lambda x: x[1])
        why = f"they are fewer than {FEW_DEV_QUESTIONS} ({name}'s 95% EM interval is {w:.2f} wide)"
    else:
        why = "they are too few for an interval"
    one = f"; one question is {1 / n:.3f} of EM" if n else ""
    return (f"{n} dev questions cannot show the differences above: {why}{one}, so neither a gain nor a loss here "
            f"means anything. Figures that can: the headline, `{HEADLINE_COMMAND}` (100 dev questions, 3 seeds, a "
            "pooled test; README).")


def interval_bounds(iv: dict[str, Any] | None) -> list[float] | None:
    """[low, high] of an interval dict, rounded; None without bounds."""
    return [round(iv["low"], 4), round(iv["high"], 4)] if _has_bounds(iv) else None  # type: ignore[index]


def _em_cmp(cmp: dict[str, Any] | None, key: str) -> float | None:
    return ((cmp or {}).get("em") or {}).get(key)


# -- reading runs back and plotting ------------------------------------------------------------------


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """summary.json of a run folder; its "run_dir" is where it was read from now (a run folder may
    have been moved since it ran)."""
    run_dir = Path(run_dir)
    path = run_dir / "summary.json"
    if path.is_file():
        return {**read_json(path), "run_dir": str(run_dir)}
    raise FileNotFoundError(f"{run_dir}: no summary.json (not a self-training run folder, or not started)")


def model_eval_file(summary: dict[str, Any], iteration: int) -> Path:
    """The dev trajectories of a run's model `iteration` (0: M0, or the raw base in a run without a
    bootstrap)."""
    folder = "base" if iteration == 0 and not summary.get("bootstrap") else f"iter_{iteration}"
    return Path(summary["run_dir"]) / folder / "eval.jsonl"


def paired_between_runs(summaries: Sequence[dict[str, Any]], *, seed: int = 0) -> list[dict[str, Any]]:
    """Each later run against the first, model by model (M0 = iteration 0, then every iteration both
    have evaluated), on the dev questions: the paired tests of `evaluate.compare_scores` (EM: exact
    McNemar; F1: paired bootstrap), the questions matched by id whatever the files' order. One dict
    per pair and iteration: {"a", "b" (run folders), "iteration", "n", "em", "f1", "only_a", "only_b"
    (the questions only a, only b answered exactly: McNemar's discordant pairs)}, or "refused" with
    the reason where the two files do not hold the same questions or one is missing."""
    from knowtrace_train.pairing import compare_scores, read_question_scores

    out: list[dict[str, Any]] = []
    if not summaries:
        return out
    ref = summaries[0]
    for other in summaries[1:]:
        for z in sorted(set(series(ref)[0]) & set(series(other)[0])):  # the models both runs evaluated
            row: dict[str, Any] = {"a": ref["run_dir"], "b": other["run_dir"], "iteration": z}
            fa, fb = model_eval_file(ref, z), model_eval_file(other, z)
            try:
                row.update(compare_scores(read_question_scores(fa), read_question_scores(fb), seed=seed))
            except (OSError, ValueError) as e:
                row["refused"] = str(e)
            out.append(row)
    return out


def between_runs_table(rows: Sequence[dict[str, Any]]) -> str:
    """`paired_between_runs` as lines: the second run's EM minus the first's on the same questions,
    its 95% interval, the McNemar p-value and the questions only one of them answered."""
    lines = [f"{'run b - run a':60} {'iter':>4} {'n':>4} {'EM diff [95% CI]':>24} {'McNemar':>8} {'only a/only b':>14}"]
    for r in rows:
        pair = f"{Path(r['b']).name} - {Path(r['a']).name}"[:60]
        if "refused" in r:
            lines.append(f"{pair:60} {r['iteration']:>4} not paired: {r['refused']}")
            continue
        em = r["em"]
        ci = f"{em['diff']:+.3f}" + (f" [{em['low']:+.2f},{em['high']:+.2f}]" if _has_bounds(em) else "")
        counts = f"{r['only_a']}/{r['only_b']}"
        lines.append(f"{pair:60} {r['iteration']:>4} {r['n']:>4} {ci:>24} {p_text(em['p_value']):>8} {counts:>14}")
    return "\n".join(lines)


def series(summary: dict[str, Any]) -> tuple[list[int], list[float | None], list[int], list[float | None]]:
    """(iterations with EM, EM, iterations with FA, FA): EM starts at M0 (iteration 0; the raw base
    where there is no bootstrap), FA at iteration 1 (it is measured on each iteration's rollouts)."""
    em_x, em_y = [], []
    start = summary.get("bootstrap") or summary.get("base")
    if start is not None:
        em_x.append(0)
        em_y.append(start["em"])
    for row in summary["iterations"]:
        if row.get("em") is not None:
            em_x.append(row["iteration"])
            em_y.append(row["em"])
    fa = [(row["iteration"], row["fa_ratio"]) for row in summary["iterations"] if row.get("fa_ratio") is not None]
    return em_x, em_y, [x for x, _ in fa], [y for _, y in fa]


def em_intervals(summary: dict[str, Any]) -> list[list[float] | None]:
    """[low, high] of each EM point of `series` (same order), None where a point has no interval."""
    out = []
    start = summary.get("bootstrap") or summary.get("base")
    if start is not None:
        out.append(interval_bounds(start.get("em_interval")))
    out += [interval_bounds(row.get("em_interval")) for row in summary["iterations"] if row.get("em") is not None]
    return out


def label(summary: dict[str, Any]) -> str:
    method = summary.get("method", "knowtrace")
    kind = "backtracing" if summary.get("mode") == "backtrace" else "non-backtracing (STaR)"
    return f"{method} {kind}: {summary.get('name')}"


def plot_runs(summaries: Sequence[dict[str, Any]], out: str | Path, title: str = "") -> Path:
    """Figure 2 of the paper for these runs: (a) dev EM per iteration, with its 95% interval as an
    error bar where the run has one, (b) FA ratio per iteration."""
    plt = pyplot()

    fig, (ax_em, ax_fa) = plt.subplots(1, 2, figsize=(10, 4))
    markers = {"backtrace": "o-", "star": "s--"}
    for s in summaries:
        ex, ey, fx, fy = series(s)
        style = markers.get(s.get("mode"), "^-")
        (line,) = ax_em.plot(ex, ey, style, label=label(s))
        bars = [(x, y, iv) for x, y, iv in zip(ex, ey, em_intervals(s)) if iv is not None]
        if bars:
            ax_em.errorbar([x for x, _, _ in bars], [y for _, y, _ in bars],
                           yerr=[[y - iv[0] for _, y, iv in bars], [iv[1] - y for _, y, iv in bars]],
                           fmt="none", ecolor=line.get_color(), capsize=3, alpha=0.7)
        ax_fa.plot(fx, fy, style, label=label(s))
    base = next((s["base"]["em"] for s in summaries if s.get("base")), None)
    if base is not None:
        ax_em.axhline(base, color="grey", linestyle=":", linewidth=1, label="raw base (few-shot)")
    ax_em.set(xlabel="self-training iteration (0 = M0)", ylabel="dev EM", title="(a) EM")
    ax_fa.set(xlabel="self-training iteration", ylabel="FA ratio", title="(b) FA ratio")
    for ax in (ax_em, ax_fa):
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    ax_em.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title)
    return save_figure(fig, out)


def pyplot():
    """matplotlib's pyplot on the Agg backend (the plot extra; a `MissingExtraError` without it)."""
    import_extra("matplotlib", "plot", "a figure (--out FILE.png)").use("Agg")
    return import_extra("matplotlib.pyplot", "plot", "a figure (--out FILE.png)")


def save_figure(fig, out: str | Path) -> Path:
    """Write `fig` to `out` (its folder made) and close it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    pyplot().close(fig)
    return out


def comparison_table(summaries: Sequence[dict[str, Any]]) -> str:
    """Per run and iteration: dev EM with its 95% interval, F1, EM on bridge questions alone (a
    comparison question is a coin flip), evidence-supported EM, FA ratio, correct rollouts, SFT
    records, and the EM difference from M0 with its p-value; NO_INTERVAL at the end of a row without one."""
    lines = [f"{'run':28} {'mode':9} {'iter':>4} {'dev EM [95% CI]':>18} {'dev F1':>7} {'bridge':>6} {'evid.':>6} "
             f"{'FA':>6} {'correct':>8} {'SFT records':>14} {'EM vs M0':>13}"]

    def em(entry: dict[str, Any]) -> str:
        bridge = ((entry.get("by_kind") or {}).get("bridge") or {}).get("em")
        return (f"{em_cell(entry.get('em'), entry.get('em_interval')):>18} {_fmt(entry.get('f1')):>7} "
                f"{_fmt(bridge):>6} {_fmt(entry.get('evidence_supported_em')):>6}")

    def end(line: str, entry: dict[str, Any]) -> str:
        marker = interval_marker(entry.get("em_interval"))
        return f"{line}  {marker}" if marker else line

    names = [s.get("name", "") for s in summaries]
    for s in summaries:
        name = s.get("name", "")
        if names.count(name) > 1 and s.get("run_dir"):  # runs of one config: tell them by their folders
            name = Path(s["run_dir"]).name
        name = name[:28]
        if s.get("base"):
            b = s["base"]
            lines.append(end(f"{name:28} {s['mode']:9} {'base':>4} {em(b)} {'-':>6} {'-':>8} {'-':>14} "
                             f"{'-':>13}", b))
        if s.get("bootstrap"):
            b = s["bootstrap"]
            lines.append(end(f"{name:28} {s['mode']:9} {0:>4} {em(b)} {'-':>6} {'gold':>8} "
                             f"{'/'.join(str(v) for v in (b.get('sft_records') or {}).values()):>14} {'-':>13}", b))
        for r in s["iterations"]:
            recs = "/".join(str(v) for v in (r.get("sft_records") or {}).values())
            lines.append(end(
                f"{name:28} {s['mode']:9} {r['iteration']:>4} {em(r)} "
                f"{_fmt(r.get('fa_ratio')):>6} {str(r.get('rollout_correct')) + '/' + str(r.get('rollout_trajectories', r.get('rollout_questions'))):>8} "
                f"{recs:>14} {diff_cell(r.get('vs_m0')):>13}", r))
    return "\n".join(lines)


# -- MINTQA-style breakdowns ---------------------------------------------------------------------------


def breakdown(trajectories: Sequence[Any], items_by_id: Any, *, seed: int = 0) -> dict[str, Any]:
    """MINTQA's figures of `trajectories` (Trajectory objects) against their items (question_id ->
    QAItem; a trajectory whose item is absent is an error): {"questions", "all", "by_hops",
    "by_kind", "by_kind_hops" (None under two kinds: bridge and comparison apart, by hops),
    "by_familiarity" (None where no item carries knowledge types), "subquestions" and
    "retrievals" per question (None where the trajectories do not record them), "stop_reasons"}.
    Each group is `metrics.scores_by_group`'s {"n", "acc", "em", "f1", "em_interval"}."""
    missing = [t.question_id for t in trajectories if t.question_id not in items_by_id]
    if missing:
        raise ValueError(f"breakdown: {len(missing)} trajectories have no item in the dataset (first: {missing[0]!r})")
    items = [items_by_id[t.question_id] for t in trajectories]
    scores = [score(t.prediction, t.answers, dataset=t.dataset) for t in trajectories]
    familiarity = [familiarity_share(it) for it in items]
    kinds = [question_kind(it) for it in items]
    n = len(trajectories)

    def per_question(key: str, count) -> float | None:
        if not n or not all(key in t.meta for t in trajectories):
            return None
        return round(sum(count(t.meta[key]) for t in trajectories) / n, 3)

    stops: dict[str, int] = {}
    for t in trajectories:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    return {
        "questions": n,
        "all": scores_by_group(scores, ["all"] * n, seed=seed).get("all"),
        "by_hops": scores_by_group(scores, [it.hops for it in items], seed=seed),
        "by_kind": scores_by_group(scores, kinds, seed=seed),
        "by_kind_hops": None if len(set(kinds)) < 2 else scores_by_group(
            scores, [f"{k or 'unknown'} {it.hops}-hop" for k, it in zip(kinds, items)], seed=seed),
        "by_familiarity": None if all(f is None for f in familiarity) else scores_by_group(scores, familiarity, seed=seed),
        "subquestions": per_question("subquestions", len),
        "retrievals": per_question("retrievals", int),
        "stop_reasons": dict(sorted(stops.items())),
    }


def breakdown_table(figures: dict[str, Any]) -> str:
    """`breakdown`'s figures as text: one line per group (n, accuracy, EM [95% CI], F1)."""
    lines = [f"{'group':22} {'n':>4} {'acc':>6} {'EM':>6} {'F1':>6}  EM 95% CI"]

    def row(label: str, g: dict[str, Any]) -> str:
        iv = g["em_interval"]
        ci = f"[{iv[0]:.3f},{iv[1]:.3f}]" if iv else NO_INTERVAL
        return f"{label:22} {g['n']:>4} {g['acc']:>6.3f} {g['em']:>6.3f} {g['f1']:>6.3f}  {ci}"

    if figures["all"] is not None:
        lines.append(row("all", figures["all"]))
    for section, prefix in (("by_hops", "hops "), ("by_kind", ""), ("by_kind_hops", ""), ("by_familiarity", "")):
        for label, g in (figures[section] or {}).items():
            lines.append(row(prefix + label, g))
    lines.append(f"sub-questions / question {_fmt(figures['subquestions'])}; retrievals / question "
                 f"{_fmt(figures['retrievals'])}; stop reasons {json.dumps(figures['stop_reasons'])}")
    return "\n".join(lines)
