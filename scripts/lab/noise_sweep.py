"""The noise sweep of issue 76: backtracing's advantage over STaR as a function of the noise in M0's explorations.

    python scripts/lab/noise_sweep.py --point 0=runs/bt0_s0:runs/st0_s0 \\
        --point 0.75=runs/bt_s0,runs/bt_s1:runs/st_s0,runs/st_s1 --point 1.5=runs/bt15_s0:runs/st15_s0 \\
        [--upto Z] [--kind bridge] [--out sweep.png]

A point is one gold noise rate (`strategy.gold_noise`): its backtracing runs, a colon, its STaR runs (one a seed,
comma-separated). Per point, with `knowtrace_train.arms` as `compare_runs.py` uses it: the noise in M0's explorations
(the iteration-1 rollouts' unneeded pairs and extraneous triplets inside traced trajectories, a share of the output
tokens of correct trajectories, mean over the seeds; both modes share those rollouts) and, model by model, backtracing
minus STaR pooled over the seeds both modes ran (sign-flip over questions; `pairing.pooled_paired_test`). The figure:
(a) that difference per iteration, a line a point; (b) the difference at the last model every point compared against
the noise. Runs not finished up to `--upto` are listed and left out. Last line JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from knowtrace_train.arms import compare_arms, group_arms, paper_noise  # noqa: E402
from knowtrace_train.report import load_run, p_text, pyplot, save_figure  # noqa: E402


def point(spec: str, upto: int | None, kind: str | None) -> dict:
    """One rate's backtracing - STaR per model, and its M0's noise."""
    rate, _, runs = spec.partition("=")
    bt, sep, st = runs.partition(":")
    if not sep or not bt or not st:
        raise SystemExit(f"--point {spec!r}: RATE=BT_RUN[,BT_RUN...]:STAR_RUN[,STAR_RUN...]")
    arms = group_arms([load_run(d) for d in (*st.split(","), *bt.split(","))], upto=upto)
    by_mode = {a.mode: a for a in arms}
    if set(by_mode) != {"star", "backtrace"}:
        raise SystemExit(f"--point {rate}: its runs are of modes {sorted(by_mode)}, not one backtrace and one star arm")
    result = compare_arms([by_mode["star"], by_mode["backtrace"]], kind=kind)
    bt_rows = result["arms"][1]["models"]
    m1 = next((r for r in bt_rows if r["iteration"] == 1), None)
    noises = [paper_noise(v) for v in ((m1 or {}).get("fa_by_seed") or {}).values()]
    noises = [x for x in noises if x is not None]
    noise = sum(noises) / len(noises) if noises else None
    diffs = [{k: r[k] for k in ("iteration", "n", "diff", "low", "high", "p_value", "seeds")}
             for r in result["between"] if "refused" not in r]
    return {"rate": rate, "noise_in_traced": noise, "noise_seeds": len(noises),
            "incomplete": [r for a in result["arms"] for r in a["incomplete"]],
            "em": {a["mode"]: {r["iteration"]: r["em_mean"] for r in a["models"]} for a in result["arms"]},
            "backtrace_minus_star": diffs}


def draw(points: list[dict], out: str) -> Path:
    fig, (ax, ax_n) = pyplot().subplots(1, 2, figsize=(11, 4))
    last = min((max(d["iteration"] for d in p["backtrace_minus_star"]) for p in points if p["backtrace_minus_star"]),
               default=None)
    for i, p in enumerate(points):
        d = [r for r in p["backtrace_minus_star"] if r["iteration"] > 0]
        if not d:
            continue
        xs = [r["iteration"] + (i - len(points) / 2) * 0.06 for r in d]
        ax.errorbar(xs, [r["diff"] for r in d], yerr=[[r["diff"] - r["low"] for r in d], [r["high"] - r["diff"] for r in d]],
                    fmt="o-", capsize=3, color=f"C{i}", label=f"gold noise {p['rate']} (seeds {d[0]['seeds']})")
        at = next((r for r in d if r["iteration"] == last), None)
        if at is not None and p["noise_in_traced"] is not None:
            ax_n.errorbar([p["noise_in_traced"]], [at["diff"]], yerr=[[at["diff"] - at["low"]], [at["high"] - at["diff"]]],
                          fmt="o", capsize=4, color=f"C{i}")
            ax_n.annotate(f"{p['rate']}", (p["noise_in_traced"], at["diff"]), textcoords="offset points", xytext=(6, 4))
    for a in (ax, ax_n):
        a.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="iteration", ylabel="dev EM, backtracing - STaR (pooled, 95% CI)", title="(a) per iteration")
    ax.legend(fontsize=7)
    ax_n.set(xlabel="M0's noise: unneeded pairs + extraneous triplets (share of correct trajectories' output tokens)",
             ylabel=f"backtracing - STaR at M{last}", title="(b) against the noise in M0's explorations")
    return save_figure(fig, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--point", action="append", required=True, help="RATE=BT_RUN[,...]:STAR_RUN[,...]")
    ap.add_argument("--upto", type=int, default=None, help="compare models M0..MZ only (runs still going)")
    ap.add_argument("--kind", choices=("bridge", "comparison"), default=None, help="only dev questions of that kind")
    ap.add_argument("--out", default=None, help="write the figure here (PNG)")
    a = ap.parse_args()
    points = [point(s, a.upto, a.kind) for s in a.point]
    for p in points:
        nz = "n/a" if p["noise_in_traced"] is None else f"{p['noise_in_traced']:.3f}"
        print(f"gold noise {p['rate']}: M0's noise in traced trajectories {nz} ({p['noise_seeds']} seeds)"
              + "".join(f"; left out {r['run_dir']} ({r['why']})" for r in p["incomplete"]))
        for r in p["backtrace_minus_star"]:
            print(f"  M{r['iteration']}: backtracing - STaR {r['diff']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] "
                  f"over seeds {r['seeds']} x {r['n']} questions, sign-flip {p_text(r['p_value'])}")
    out = {"kind": a.kind, "upto": a.upto, "points": points}
    if a.out:
        out["figure"] = str(draw(points, a.out))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
