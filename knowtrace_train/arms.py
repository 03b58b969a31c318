"""Self-training runs as arms of a comparison: one arm per mode (and per value of any config keys named, for an
ablation), one run per seed; the across-seed table, the pooled paired tests (each iteration against M0, and between
arms) and the figure with every seed and the mean.

A seed (`SelfTrainConfig.seed`) draws the LoRA initialisation and record order of the bootstrap and of every
iteration's adapters (`strategy.seed` draws the sampling, which the greedy default does not use); the
questions (`data.seed`) stay the same, so every seed and arm is scored on the same dev questions and the
tests pair them by id. Runs of one arm may differ only in `ARM_FREE_KEYS`; a run that has not finished every
iteration it planned is listed as incomplete and left out of the means and tests; with `upto` Z only models 0..Z are
compared, so a run stopped (or still going) after iteration Z counts as a seed for them.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from knowtrace_train.config import ConfigError
from knowtrace_train.metrics import bootstrap_interval, question_kind
from knowtrace_train.pairing import by_id, pooled_paired_test, read_question_scores
from knowtrace_train.report import model_eval_file, p_text, pyplot, save_figure, series

#: config keys the runs of one arm may differ in: the seed, where and under which name they ran (and were
#: tracked), how many threads, whether stages were taken from the reuse cache and whether evaluations ran beside
#: other stages (on which schedule), whether a resume under another version was let through
ARM_FREE_KEYS = frozenset({"seed", "seeds", "output_dir", "name", "threads", "reuse", "eval_beside",
                           "eval_beside_fixed", "report_to", "run_name", "resume_anyway",
                           # how a step's records are computed, not which: one pass of 4 or 4 accumulated passes
                           # of 1, prompt prefixes shared or not, give the same gradients (tests/test_train.py)
                           "train.per_device_batch_size", "train.share_prefixes",
                           "bootstrap.train.per_device_batch_size", "bootstrap.train.share_prefixes"})


@dataclass
class Arm:
    """The runs of one mode (and of one value of each key in `settings`): `runs` finished every planned iteration;
    `incomplete` did not (with why)."""

    mode: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    incomplete: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    #: the last model compared (None: every model the runs planned)
    upto: int | None = None

    @property
    def seeds(self) -> list[int]:
        return [run_seed(s) for s in self.runs]

    @property
    def name(self) -> str:
        """The mode, then each grouping key's value: `backtrace, bootstrap.questions=48`."""
        return ", ".join([self.mode, *(f"{k}={v}" for k, v in self.settings.items())])


def flat_config(run_dir: str | Path) -> dict[str, Any]:
    """A run's config.yaml as dotted keys (its `launch` record left out)."""
    def walk(d: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(d, dict):
            out: dict[str, Any] = {}
            for k, v in d.items():
                out.update(walk(v, f"{prefix}{k}."))
            return out
        return {prefix[:-1]: d}

    import dataclasses

    from knowtrace_train.selftrain.config import read_run_config

    # through the config class, so a key a run's older code did not write reads as its default
    return walk(dataclasses.asdict(read_run_config(Path(run_dir) / "config.yaml")))


def started_run(run_dir: str | Path) -> dict[str, Any]:
    """A run folder that has its config.yaml but no summary.json yet (the run is still building M0): a summary
    with no evaluated model, so that `group_arms` lists it as incomplete instead of refusing the comparison."""
    cfg = flat_config(run_dir)
    return {"run_dir": str(run_dir), "mode": cfg.get("mode"), "iterations_planned": int(cfg.get("iterations") or 0),
            "base": None, "bootstrap": None, "iterations": []}


def run_seed(summary: dict[str, Any]) -> int:
    return int(flat_config(summary["run_dir"]).get("seed", 0))


def config_differences(a: dict[str, Any], b: dict[str, Any], free: frozenset[str]) -> list[str]:
    """`key (a vs b)` for every dotted key whose value differs, the `free` keys (and their sub-keys) aside."""
    def is_free(k: str) -> bool:
        return any(k == f or k.startswith(f + ".") for f in free)

    keys = sorted(k for k in set(a) | set(b) if not is_free(k) and a.get(k) != b.get(k))
    return [f"{k} ({a.get(k)!r} vs {b.get(k)!r})" for k in keys]


def evaluated_models(summary: dict[str, Any], upto: int | None = None) -> list[int]:
    """The models a run plans to evaluate: M0 and every iteration, or with `eval_every` k every k-th iteration
    and the last (GRPO's many cheap steps); with `upto` Z those up to model Z."""
    from knowtrace_train.selftrain.config import evaluates

    planned = int(summary.get("iterations_planned") or 0)
    every = int(flat_config(summary["run_dir"]).get("eval_every") or 1)
    return [z for z in range(planned + 1) if evaluates(z, planned, every) and (upto is None or z <= upto)]


def finished(summary: dict[str, Any], upto: int | None = None) -> str | None:
    """None where the run evaluated every model it planned to (`evaluated_models`), up to model `upto` where
    given; else why not."""
    em_x = series(summary)[0]
    planned = int(summary.get("iterations_planned") or 0)
    missing = [z for z in evaluated_models(summary, upto) if z not in em_x]
    if missing:
        return (f"no dev evaluation of model(s) {missing} (planned iterations 1..{planned}"
                + (f", compared up to M{upto})" if upto is not None else ")"))
    return None


def common_models(runs: Sequence[dict[str, Any]], upto: int | None = None) -> list[int]:
    """The models every one of `runs` evaluated (in order), up to model `upto` where given: of those it planned,
    those it has (a run still going, compared alone, shows its models so far)."""
    sets = [set(evaluated_models(s, upto)) & set(series(s)[0]) for s in runs]
    return sorted(set.intersection(*sets)) if sets else []


def replicated(summaries: Sequence[dict[str, Any]]) -> bool:
    """Whether two of the runs are seeds of one arm: the same mode and the same config but for `ARM_FREE_KEYS`.
    Without such a pair the runs are single runs of other settings (epochs 1 against 2, one sample against
    four), compared run by run; with one, they are arms, and an arm's runs must agree (`group_arms`)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    for s in summaries:
        mode, cfg = str(s.get("mode")), flat_config(s["run_dir"])
        if any(m == mode and not config_differences(c, cfg, ARM_FREE_KEYS) for m, c in seen):
            return True
        seen.append((mode, cfg))
    return False


def group_arms(summaries: Sequence[dict[str, Any]], keys: Sequence[str] = (), upto: int | None = None) -> list[Arm]:
    """The runs grouped by mode and by the values of the config `keys` (dotted, e.g. `bootstrap.questions`: the
    arms of an ablation), in the order given. Runs of one arm whose configs differ in anything but
    `ARM_FREE_KEYS` are a ConfigError naming the keys, as is a key no run's config has; incomplete runs (those
    missing a model up to `upto` where given) are set aside in `Arm.incomplete`."""
    if upto is not None and upto < 0:
        raise ConfigError(f"upto: the last model compared is M0 or an iteration (>= 0), got {upto}")
    arms: dict[tuple, Arm] = {}
    first: dict[tuple, tuple[dict[str, Any], dict[str, Any]]] = {}
    for s in summaries:
        mode = str(s.get("mode"))
        cfg = flat_config(s["run_dir"])
        for key in keys:
            if key not in cfg:
                near = difflib.get_close_matches(key, list(cfg), n=1)
                raise ConfigError(f"--arm {key}: no such config key in {s['run_dir']}/config.yaml"
                                  + (f" (did you mean {near[0]!r}?)" if near else ""))
        settings = {key: cfg[key] for key in keys}
        group = (mode, *map(repr, settings.values()))
        arm = arms.setdefault(group, Arm(mode, settings=settings, upto=upto))
        if group in first:
            ref_summary, ref_cfg = first[group]
            diff = config_differences(ref_cfg, cfg, ARM_FREE_KEYS)
            if diff:
                raise ConfigError(f"{s['run_dir']} and {ref_summary['run_dir']} are one arm (mode {arm.name}) but "
                                  f"their configs differ in {', '.join(diff)}: an arm's runs may differ only in "
                                  f"{', '.join(sorted(ARM_FREE_KEYS))}"
                                  + ("" if keys else " (an ablation's arms: compare_runs.py --arm KEY)"))
        else:
            first[group] = (s, cfg)
        why = finished(s, upto)
        if why is None:
            arm.runs.append(s)
        else:
            arm.incomplete.append({"run_dir": s["run_dir"], "seed": int(cfg.get("seed", 0)), "why": why})
    for arm in arms.values():
        seeds = arm.seeds
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"arm {arm.name} has two runs of one seed ({sorted(seeds)}): each seed once")
    return list(arms.values())


def run_arms(summaries: Sequence[dict[str, Any]]) -> list[Arm]:
    """Each run an arm of its own, of one seed, named by its folder (runs that are no seeds of one setting, as
    `compare_runs.py --kind` compares them): its models so far against its own M0, each run against the first
    where their seeds match."""
    return [Arm(str(s.get("mode")), runs=[s], settings={"run": s["run_dir"]}) for s in summaries]


def question_kinds(summary: dict[str, Any]) -> dict[str, str | None]:
    """question id -> "bridge", "comparison" or None, from the run's dev file (its config's data.dev)."""
    from knowtrace_train.data.loaders import load_items

    cfg = flat_config(summary["run_dir"])
    return {it.id: question_kind(it) for it in load_items(cfg["data.dev"], cfg.get("data.format"))}


def _em_table(summaries: Sequence[dict[str, Any]], z: int, keep: set[str] | None = None
              ) -> tuple[list[str], list[list[float]]]:
    """(question ids, EM per run in id order) of model z in every run, only the `keep` questions where given;
    other questions in any run: ConfigError."""
    ids: list[str] | None = None
    rows = []
    for s in summaries:
        q = by_id(read_question_scores(model_eval_file(s, z)))
        if keep is not None:
            chosen = [i for i, qid in enumerate(q.ids) if qid in keep]
            q = dataclasses.replace(q, ids=[q.ids[i] for i in chosen], em=[q.em[i] for i in chosen],
                                    f1=[q.f1[i] for i in chosen])
        if ids is not None and q.ids != ids:
            raise ConfigError(f"{model_eval_file(s, z)} holds other dev questions than {model_eval_file(summaries[0], z)}: "
                              "the runs of a comparison must score the same questions (the same data settings)")
        ids = q.ids
        rows.append(q.em)
    return ids or [], rows


def _fa(summary: dict[str, Any], z: int) -> dict[str, Any] | None:
    """Iteration z's FA ratio of a run and its parts (`fa_decomposed`, where the rationalizer tells them)."""
    row = next((r for r in summary.get("iterations") or () if r.get("iteration") == z), None)
    if row is None or row.get("fa_ratio") is None:
        return None
    return {"fa_ratio": row["fa_ratio"], **(row.get("fa_decomposed") or {})}


def paper_noise(parts: dict[str, Any] | None) -> float | None:
    """The paper's noise among FA's parts: unneeded pairs and extraneous triplets inside traced trajectories, a share
    of the correct trajectories' output tokens (None where the parts are not recorded)."""
    if not parts or "unneeded_pairs" not in parts:
        return None
    return parts["unneeded_pairs"] + parts["extraneous_triplets"]


def compare_arms(arms: Sequence[Arm], *, kind: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Per arm and model (0 = M0, then each iteration): the seeds' EM, their mean with an interval (bootstrap over
    questions of each question's mean EM over the seeds), the pooled paired test against M0; and each later arm
    against the first on the seeds both ran, model by model (`pairing.pooled_paired_test`). With `kind`
    ("bridge" or "comparison") only the dev questions of that kind count (kinds from the runs' dev file)."""
    out: dict[str, Any] = {"kind": kind, "upto": arms[0].upto if arms else None, "arms": [], "between": []}
    keep = None
    if kind is not None:
        first = next((a.runs[0] for a in arms if a.runs), None)
        keep = {q for q, k in question_kinds(first).items() if k == kind} if first else set()
    for arm in arms:
        rows = []
        if arm.runs:
            m0_em: list[list[float]] = []
            for z in common_models(arm.runs, arm.upto):
                ids, em = _em_table(arm.runs, z, keep)
                if z == 0:
                    m0_em = em
                per_question = [sum(col) / len(col) for col in zip(*em)]
                iv = bootstrap_interval(per_question, seed=seed)
                row = {"iteration": z, "n": len(ids), "em_mean": iv.mean,
                       "em_interval": None if iv.low is None else [iv.low, iv.high],
                       "em_by_seed": {str(sd): sum(e) / len(e) for sd, e in zip(arm.seeds, em)}}
                if z > 0:
                    row["vs_m0"] = dataclasses.asdict(pooled_paired_test(m0_em, em, seed=seed))
                    row["fa_by_seed"] = {str(sd): _fa(s, z) for sd, s in zip(arm.seeds, arm.runs)}
                rows.append(row)
        out["arms"].append({"arm": arm.name, "mode": arm.mode, "settings": arm.settings, "seeds": arm.seeds,
                            "incomplete": arm.incomplete, "models": rows})
    ref = arms[0] if arms else None
    for other in arms[1:]:
        common = sorted(set(ref.seeds) & set(other.seeds))
        a_runs = [s for s in ref.runs if run_seed(s) in common]
        b_runs = [s for s in other.runs if run_seed(s) in common]
        a_runs.sort(key=run_seed)
        b_runs.sort(key=run_seed)
        if not common:
            out["between"].append({"a": ref.name, "b": other.name, "refused": "no seed among both arms' compared "
                                   "runs: questions pair only within a seed"})
            continue
        for z in common_models([*a_runs, *b_runs], ref.upto):
            ids_a, em_a = _em_table(a_runs, z, keep)
            ids_b, em_b = _em_table(b_runs, z, keep)
            if ids_a != ids_b:
                raise ConfigError(f"arms {ref.name} and {other.name} scored other dev questions at model {z}")
            out["between"].append({"a": ref.name, "b": other.name, "iteration": z,
                                   **dataclasses.asdict(pooled_paired_test(em_a, em_b, seed=seed)), "seeds": common})
    return out


def _ci(low: float | None, high: float | None, signed: bool = False) -> str:
    if low is None or high is None:
        return ""
    f = "+.3f" if signed else ".3f"
    return f" [{low:{f}}, {high:{f}}]"


def arms_table(result: dict[str, Any]) -> str:
    """`compare_arms` as text: per arm and model the mean dev EM over the seeds with its interval, each seed's
    EM and the pooled test against M0; then the arms against the first."""
    lines = [f"{result['kind']} questions only"] if result.get("kind") else []
    if result.get("upto") is not None:
        lines.append(f"models up to M{result['upto']} (later ones not compared)")
    for arm in result["arms"]:
        lines.append(f"arm {arm['arm']}: seeds {arm['seeds']}" + (
            "; incomplete, left out: " + "; ".join(f"seed {r['seed']} ({r['run_dir']}: {r['why']})" for r in arm["incomplete"])
            if arm["incomplete"] else ""))
        lines.append(f"  {'model':6} {'n':>4}  {'mean EM [95% CI]':22}  {'EM per seed':30} {'vs M0, pooled [95% CI]':26} {'sign-flip':>9}")
        for row in arm["models"]:
            iv = row["em_interval"] or [None, None]
            per_seed = ", ".join(f"{sd}: {em:.3f}" for sd, em in row["em_by_seed"].items())
            cmp = row.get("vs_m0")
            vs = f"{cmp['diff']:+.3f}{_ci(cmp['low'], cmp['high'], True)}" if cmp else ""
            p = p_text(cmp["p_value"]) if cmp else ""
            name = "M0" if row["iteration"] == 0 else f"M{row['iteration']}"
            mean = f"{row['em_mean']:.3f}{_ci(*iv)}"
            lines.append(f"  {name:6} {row['n']:>4}  {mean:22}  {per_seed:30} {vs:26} {p:>9}")
    for r in result["between"]:
        if "refused" in r:
            lines.append(f"{r['b']} - {r['a']}: not compared ({r['refused']})")
            continue
        name = "M0" if r["iteration"] == 0 else f"M{r['iteration']}"
        lines.append(f"{r['b']} - {r['a']} at {name} over seeds {r['seeds']} x {r['n']} questions: "
                     f"{r['diff']:+.3f}{_ci(r['low'], r['high'], True)}, sign-flip {p_text(r['p_value'])}")
    return "\n".join(lines)


def plot_arms(result: dict[str, Any], out: str | Path, title: str = "") -> Path:
    """The paper's Figure 2 over seeds: (a) dev EM per model for each arm, every seed a thin line, the mean over the
    seeds a thick one with its 95% interval (bootstrap over questions); (b) each iteration's FA ratio, the mean
    over the seeds, and beside it (dashed) its part inside traced trajectories, the paper's noise (unneeded pairs
    and extraneous triplets), where the runs record it."""
    fig, (ax, ax_fa) = pyplot().subplots(1, 2, figsize=(11, 4))
    for i, arm in enumerate(result["arms"]):
        fa_rows = [(r["iteration"], [v for v in (r.get("fa_by_seed") or {}).values() if v]) for r in arm["models"]]
        fa_rows = [(z, vs) for z, vs in fa_rows if vs]
        if not fa_rows:
            continue
        ax_fa.plot([z for z, _ in fa_rows], [sum(v["fa_ratio"] for v in vs) / len(vs) for _, vs in fa_rows],
                   "o-", color=f"C{i}", label=f"{arm['arm']}: FA")
        noisy = [(z, vs) for z, vs in fa_rows if all(paper_noise(v) is not None for v in vs)]
        if noisy:
            ax_fa.plot([z for z, _ in noisy], [sum(paper_noise(v) for v in vs) / len(vs)
                                               for _, vs in noisy], "s--", color=f"C{i}",
                       label=f"{arm['arm']}: unneeded pairs + extraneous triplets")
    ax_fa.set(xlabel="self-training iteration", ylabel="share of the correct trajectories' output tokens",
              title="(b) FA ratio (mean over seeds)")
    if ax_fa.lines:
        ax_fa.legend(fontsize=7)
    for i, arm in enumerate(result["arms"]):
        color = f"C{i}"
        xs = [r["iteration"] for r in arm["models"]]
        for sd in arm["seeds"]:
            ax.plot(xs, [r["em_by_seed"][str(sd)] for r in arm["models"]], color=color, lw=0.8, alpha=0.45)
        means = [r["em_mean"] for r in arm["models"]]
        lows = [m - (r["em_interval"] or [m, m])[0] for m, r in zip(means, arm["models"])]
        highs = [(r["em_interval"] or [m, m])[1] - m for m, r in zip(means, arm["models"])]
        ax.errorbar(xs, means, yerr=[lows, highs], color=color, lw=2.5, capsize=4,
                    label=f"{arm['arm']}: mean of {len(arm['seeds'])} seeds")
    ax.set_xlabel("iteration (0 = M0)")
    ax.set_ylabel("dev EM")
    ax.set_title("(a) dev EM")
    ax.set_xticks(sorted({r["iteration"] for arm in result["arms"] for r in arm["models"]}))
    ax.legend()
    if title:
        ax.set_title(title)
    return save_figure(fig, out)
