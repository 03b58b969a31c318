"""The report's data: run folders and trajectory files read back into one JSON-able page model, never dying on a bad record.

`collect(paths)` reads each path (a self-training run folder, or a trajectory JSONL file such as
recipes/evaluate.py writes) and returns {"runs": [...], "questions": [...]}: per run its config text,
per-iteration table rows, chart series, trajectory sets and notes (what is missing or in progress);
per trajectory everything the question view draws (`questions.py`). Whatever cannot be read becomes a
note where it would have been shown.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterator

from knowtrace_train.report import em_cell, interval_bounds, p_text
from knowtrace_train.io import read_json
from knowtrace_train.report_html.lookups import Lookups
from knowtrace_train.report_html.questions import question_entry
from knowtrace_train.trajectory import TRAJECTORY_LINE_ERRORS, Trajectory, trajectory_from_line

log = logging.getLogger(__name__)

def read_trajectory_file(path: Path, notes: list[str]) -> list[Trajectory]:
    """The trajectories of a JSONL file; a bad line becomes a note (file:line and why) and is skipped.
    Read only (unlike `trajectory.read_trajectories`, it never cuts a truncated line: a run may be writing)."""
    out: list[Trajectory] = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    except OSError as e:
        notes.append(f"{path}: cannot read ({e.strerror})")
        return out
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(trajectory_from_line(line))
        except TRAJECTORY_LINE_ERRORS as e:
            notes.append(f"{path}:{i}: not a trajectory, skipped ({str(e)[:200]})")
    return out


def _read_set(path: Path, notes: list[str]) -> tuple[list[Trajectory], str | None]:
    """A trajectory file of a run; where only its `.parts/` folder exists the stage is running: its trajectories so far."""
    if path.is_file():
        return read_trajectory_file(path, notes), None
    parts = path.parent / f"{path.name}.parts"
    if parts.is_dir():
        trajs: list[Trajectory] = []
        for p in sorted(parts.glob("*.jsonl")):
            trajs += read_trajectory_file(p, notes)
        return trajs, f"in progress: {len(trajs)} trajectories of {path.name} written so far"
    return [], None


def _read_json(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = read_json(path)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        return obj
    except (OSError, ValueError) as e:
        notes.append(f"{path}: unreadable ({e})")
        return None


def _read_yaml(path: Path, notes: list[str]) -> tuple[str | None, dict[str, Any]]:
    if not path.is_file():
        notes.append(f"{path.name}: missing (the config the run used is unknown)")
        return None, {}
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        import yaml

        data = yaml.safe_load(text)
        return text, data if isinstance(data, dict) else {}
    except Exception as e:  # noqa: BLE001 - any YAML trouble is a note, the text is still shown
        notes.append(f"{path}: not valid YAML ({e})")
        return text, {}


# -- the per-iteration table ------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def table_entry(m: dict[str, Any]) -> dict[str, Any]:
    """One row of the run view from a metrics.json: dev EM and F1 with their intervals, FA overall and per
    role, records per role, rollout correct, seconds per phase, the paired test against M0."""
    it = m.get("iteration")
    ev = m.get("eval") if isinstance(m.get("eval"), dict) else {}
    rat = m.get("rationale") if isinstance(m.get("rationale"), dict) else {}
    roll = m.get("rollout") if isinstance(m.get("rollout"), dict) else {}
    secs = {k: round(v, 1) for k, v in (m.get("seconds") or {}).items() if _num(v) is not None}
    em_iv, f1_iv = ev.get("em_interval"), ev.get("f1_interval")
    vs = (m.get("vs_m0") or m.get("vs_base") or {}).get("em") if isinstance(m.get("vs_m0") or m.get("vs_base"), dict) else None
    return {
        "iteration": it,
        "label": "base" if it == "base" else "M0" if it == 0 else f"M{it}",
        "status": m.get("status"),
        "questions": ev.get("questions"),
        "em": _num(ev.get("em")),
        "em_text": em_cell(_num(ev.get("em")), em_iv if isinstance(em_iv, dict) else None),
        "em_interval": interval_bounds(em_iv) if isinstance(em_iv, dict) else None,
        "interval_note": (em_iv or {}).get("note") if isinstance(em_iv, dict) else None,
        "f1": _num(ev.get("f1")),
        "f1_text": em_cell(_num(ev.get("f1")), f1_iv if isinstance(f1_iv, dict) else None),
        "fa_ratio": _num(rat.get("fa_ratio")),
        "fa_by_role": {k: _num(v) for k, v in (rat.get("fa_by_role") or {}).items()},
        "fa_decomposed": {k: _num(v) for k, v in (rat.get("fa_decomposed") or {}).items()},
        "exploration": {k: _num(v) for k, v in (ev.get("exploration") or {}).items()},
        "records": m.get("sft_records") or {},
        "rollout": f"{roll.get('correct')}/{roll.get('questions')}" if roll else ("gold" if it == 0 else None),
        "seconds": secs,
        "seconds_total": round(sum(secs.values()), 1),
        "vs": None if not vs else {"against": "M0" if m.get("vs_m0") else "base", "diff": vs.get("diff"),
                                   "p": p_text(vs["p_value"]) if _num(vs.get("p_value")) is not None else None},
    }


def _add_row(rows: list[dict[str, Any]], m: dict[str, Any], path: Path, notes: list[str]) -> None:
    try:
        rows.append(table_entry(m))
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        notes.append(f"{path}: figures not in the expected shape, row left out ({type(e).__name__}: {e})")


def _iteration_dirs(run_dir: Path) -> list[int]:
    out = []
    for p in run_dir.glob("iter_*"):
        m = re.fullmatch(r"iter_(\d+)", p.name)
        if m and p.is_dir():
            out.append(int(m.group(1)))
    return sorted(out)


def _stage_state(folder: Path) -> str:
    done = sorted(p.name[len("DONE."):] for p in folder.glob("DONE.*"))
    return f"stages done: {', '.join(done)}" if done else "no stage finished yet"


def series(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Figure 2's points: EM from M0 (the base where there is no M0) and per iteration, FA per iteration."""
    em = [r for r in rows if r["em"] is not None and r["iteration"] != "base"]
    if not any(r["iteration"] == 0 for r in em):
        em = [dict(r, iteration=0) for r in rows if r["iteration"] == "base" and r["em"] is not None] + em
    fa = [r for r in rows if isinstance(r["iteration"], int) and r["iteration"] > 0 and r["fa_ratio"] is not None]
    return {"em_x": [r["iteration"] for r in em], "em_y": [r["em"] for r in em],
            "em_iv": [r["em_interval"] for r in em], "fa_x": [r["iteration"] for r in fa],
            "fa_y": [r["fa_ratio"] for r in fa]}


# -- runs and trajectory files ------------------------------------------------------------------------


def _trajectory_sets(run_dir: Path, iterations: list[int]) -> Iterator[tuple[str, Path]]:
    yield "base · dev", run_dir / "base" / "eval.jsonl"
    for z in iterations:
        if z > 0:
            yield f"iteration {z} · rollouts (train)", run_dir / f"iter_{z}" / "rollouts.jsonl"
        yield f"{'M0' if z == 0 else f'M{z}'} · dev", run_dir / f"iter_{z}" / "eval.jsonl"


def collect_run(run_dir: Path, index: int) -> tuple[dict[str, Any], list[tuple[str, str, list[Trajectory]]]]:
    """The run view of one run folder and its trajectory sets (label, note, trajectories)."""
    notes: list[str] = []
    config_text, config = _read_yaml(run_dir / "config.yaml", notes)
    summary = _read_json(run_dir / "summary.json", notes)
    planned = config.get("iterations") if isinstance(config.get("iterations"), int) else None
    iterations = _iteration_dirs(run_dir)
    rows = []
    base = _read_json(run_dir / "base" / "metrics.json", notes)
    if base is not None:
        _add_row(rows, base, run_dir / "base" / "metrics.json", notes)
    elif config.get("eval_base", True):
        notes.append("base: no metrics.json (not evaluated yet)")
    for z in sorted(set(iterations) | set(range(0, (planned or 0) + 1))):
        folder = run_dir / f"iter_{z}"
        m = _read_json(folder / "metrics.json", notes)
        if m is not None:
            _add_row(rows, m, folder / "metrics.json", notes)
        elif folder.is_dir():
            notes.append(f"iteration {z}: no metrics.json yet (in progress; {_stage_state(folder)})")
        else:
            notes.append(f"iteration {z}: missing (no iter_{z} folder)")
    if summary is None:
        notes.append("no summary.json: the run is in progress or was stopped (rows are read from each metrics.json)")
    strategy = config.get("strategy") if isinstance(config.get("strategy"), dict) else {}
    run = {
        "index": index,
        "dir": str(run_dir),
        "kind": "run",
        "name": config.get("name") or run_dir.name,
        "mode": config.get("mode"),
        "method": strategy.get("name"),
        "strategy_config": strategy,
        "iterations_planned": planned,
        "finished": summary is not None,
        "config_text": config_text,
        "rows": rows,
        "series": series(rows),
        "notes": notes,
    }
    sets = []
    for label, path in _trajectory_sets(run_dir, iterations):
        set_notes: list[str] = []
        trajs, state = _read_set(path, set_notes)
        if not trajs and state is None and not set_notes:
            continue
        notes.extend(set_notes)
        sets.append((label, state or "", trajs))
    return run, sets


def collect_file(path: Path, index: int) -> tuple[dict[str, Any], list[tuple[str, str, list[Trajectory]]]]:
    """A trajectory file alone: no table, its trajectories as one set."""
    notes: list[str] = []
    trajs = read_trajectory_file(path, notes)
    run = {"index": index, "dir": str(path), "kind": "file", "name": path.name, "mode": None,
           "method": trajs[0].strategy if trajs else None, "strategy_config": {}, "iterations_planned": None,
           "finished": True, "config_text": None, "rows": [], "series": series([]), "notes": notes}
    return run, [(path.name, "", trajs)]


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and any((path / n).exists() for n in ("config.yaml", "base", "iter_0", "summary.json"))


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Run folders and files as given; a folder that is no run folder (runs/eval/) stands for its *.jsonl files."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() and not is_run_folder(path) else []
        out += files or [path]
    return out


def collect(paths: list[str | Path], data_files: list[str | Path] = (), corpus: str | Path | None = None
            ) -> dict[str, Any]:
    """The whole page model: runs (run view) and questions (question view) of every path."""
    runs, questions = [], []
    lookups = Lookups()
    for i, path in enumerate(expand_paths(paths)):
        if is_run_folder(path):
            run, sets = collect_run(path, i)
            lookups.add_run_inputs(path)
        elif path.is_file():
            run, sets = collect_file(path, i)
        else:
            runs.append({"index": i, "dir": str(path), "kind": "missing", "name": path.name, "rows": [],
                         "series": series([]), "notes": [f"{path}: neither a run folder nor a trajectory file (nor a folder of them)"],
                         "sets": [], "config_text": None})
            continue
        run["sets"] = []
        for label, state, trajs in sets:
            run["sets"].append({"label": label, "note": state, "n": len(trajs)})
            for t in trajs:
                questions.append((run, len(run["sets"]) - 1, t))
        runs.append(run)
    for f in data_files:
        lookups.add_data(Path(f))
    if corpus is not None:
        lookups.add_corpus(Path(corpus))
    wanted = {pid for _, _, t in questions for c in t.calls for pid in c.passage_ids}
    passages = lookups.passages(wanted)
    entries = []
    for run, s, t in questions:
        try:
            entries.append(question_entry(len(entries), run, s, t, lookups))
        except Exception as e:  # noqa: BLE001 - one record the page cannot draw is a note, never the end
            run["notes"].append(f"{run['sets'][s]['label']}: trajectory {t.id!r} cannot be shown ({type(e).__name__}: {e})")
    return {"runs": runs, "questions": entries, "passages": passages, "notes": lookups.notes}
