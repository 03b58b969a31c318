"""Which gold noise rate to default to (issue 76): each arm's M0 against the baseline's M0 over the seeds both ran,
and the noise inside traced trajectories of its iteration-1 rollouts.

    python scripts/lab/noise_choice.py --baseline runs/old_s0 runs/old_s1 runs/old_s2 \\
        --arm 0.5=runs/n05_s0 --arm 1.0=runs/n10_s0,runs/n10_s1,runs/n10_s2

Runs pair by seed (summary.json's seed); the runs may come from different code (their configs are not compared,
unlike `compare_runs.py --arm`), but they must score the same dev questions. Per arm: M0's dev EM per seed and
pooled (mean over seeds, 95% bootstrap interval over questions), the pooled paired test against the baseline on the
common seeds (sign-flip over questions; one seed: exact McNemar), the same for bridge and comparison questions
apart, and per seed the iteration-1 FA ratio and its parts (`rationale.json`): the paper's noise is the unneeded
pairs and extraneous triplets inside traced trajectories, a share of all output tokens of correct trajectories.
Last line JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path

from knowtrace_train.arms import paper_noise, question_kinds, run_seed
from knowtrace_train.metrics import bootstrap_interval
from knowtrace_train.pairing import by_id, pooled_paired_test, read_question_scores
from knowtrace_train.report import load_run, model_eval_file


@functools.lru_cache(maxsize=None)
def _scores(path: Path):
    """An evaluation file's scores in question-id order, read once however many tables ask for them."""
    return by_id(read_question_scores(path))


def _em(summary: dict, keep: set[str] | None) -> tuple[list[str], list[float]]:
    q = _scores(model_eval_file(summary, 0))
    pairs = [(i, e) for i, e in zip(q.ids, q.em) if keep is None or i in keep]
    return [i for i, _ in pairs], [e for _, e in pairs]


def _noise(run_dir: str) -> dict | None:
    path = Path(run_dir) / "iter_1" / "rationale.json"
    if not path.is_file():
        return None
    r = json.loads(path.read_text())
    parts = r.get("fa_decomposed") or {}
    return {"fa_ratio": round(r["fa_ratio"], 4), "fa_ratio_backtraced": round(r.get("fa_ratio_backtraced") or 0.0, 4),
            "noise_in_traced": round(paper_noise(parts) or 0.0, 4),
            **{k: round(v, 4) for k, v in parts.items()}, "correct": r.get("correct"), "backtraced": r.get("backtraced"),
            "records": r.get("backtrace_records")}


def _pooled(base: list[dict], arm: list[dict], keep: set[str] | None) -> dict:
    by_seed = {run_seed(s): s for s in base}
    common = sorted(set(by_seed) & {run_seed(s) for s in arm})
    a, b, ids0 = [], [], None
    for s in sorted(arm, key=run_seed):
        sd = run_seed(s)
        if sd not in by_seed:
            continue
        ia, ea = _em(by_seed[sd], keep)
        ib, eb = _em(s, keep)
        if ia != ib or (ids0 is not None and ia != ids0):
            raise SystemExit(f"{s['run_dir']} scored other dev questions than {by_seed[sd]['run_dir']}")
        ids0 = ia
        a.append(ea)
        b.append(eb)
    if not common:
        return {"refused": "no common seed"}
    t = pooled_paired_test(a, b)
    return {**{k: v for k, v in dataclasses.asdict(t).items() if k != "note"}, "paired_seeds": common}


def _em_row(runs: list[dict], keep: set[str] | None) -> dict:
    rows = [_em(s, keep)[1] for s in runs]
    per_q = [sum(c) / len(c) for c in zip(*rows)]
    iv = bootstrap_interval(per_q)
    return {"n": len(per_q), "seeds": [run_seed(s) for s in runs], "em_by_seed": [round(sum(r) / len(r), 3) for r in rows],
            "em": round(iv.mean, 3), "interval": None if iv.low is None else [round(iv.low, 3), round(iv.high, 3)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", nargs="+", required=True, help="run folders of the baseline's M0, one a seed")
    ap.add_argument("--arm", action="append", default=[], help="NAME=DIR[,DIR...]: one arm's runs, one a seed")
    a = ap.parse_args()
    base = sorted((load_run(d) for d in a.baseline), key=run_seed)
    kinds = question_kinds(base[0])
    keeps = {"all": None, **{k: {q for q, v in kinds.items() if v == k} for k in ("bridge", "comparison")}}
    out = {"baseline": {"runs": a.baseline, **{k: _em_row(base, keep) for k, keep in keeps.items()}}, "arms": []}
    b = out["baseline"]["all"]
    print(f"baseline  M0 EM {b['em']:.3f} {b['interval']} n={b['n']} seeds {b['seeds']} by seed {b['em_by_seed']}")
    for spec in a.arm:
        name, _, dirs = spec.partition("=")
        runs = sorted((load_run(d) for d in dirs.split(",")), key=run_seed)
        row = {"arm": name, "runs": dirs.split(",")}
        for k, keep in keeps.items():
            row[k] = {**_em_row(runs, keep), "vs_baseline": _pooled(base, runs, keep)}
        row["iteration_1_noise"] = {str(run_seed(s)): _noise(s["run_dir"]) for s in runs}
        out["arms"].append(row)
        r, v = row["all"], row["all"]["vs_baseline"]
        print(f"{name:9} M0 EM {r['em']:.3f} {r['interval']} n={r['n']} seeds {r['seeds']} by seed {r['em_by_seed']}; "
              f"vs baseline on seeds {v.get('paired_seeds')}: {v.get('diff', float('nan')):+.3f} p={v.get('p_value', float('nan')):.3f}")
        for k in ("bridge", "comparison"):
            r, v = row[k], row[k]["vs_baseline"]
            print(f"          {k:10} n={r['n']} EM {r['em']:.3f} {r['interval']}; vs baseline {v.get('diff', float('nan')):+.3f} "
                  f"p={v.get('p_value', float('nan')):.3f}")
        for sd, nz in row["iteration_1_noise"].items():
            print(f"          seed {sd} iteration-1 rollouts: {nz}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
