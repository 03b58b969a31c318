"""The pinned behaviour of a tiny-model run: its trajectories and SFT records, frozen before a refactor.

`python tests/pin_run.py` writes tests/fixtures/pinned/ (run it only to re-pin, on purpose, after a
change meant to alter behaviour); tests/test_pinned.py reruns the same steps and compares byte for byte.
The run: the default config on the tiny random model with the oracle generator (tests/selftrain_helpers),
no bootstrap, one backtracing iteration; then STaR records of the same rollouts and gold records of
the bootstrap questions. Nothing pinned depends on a training step (the rollouts come from M0 = the
raw tiny model; training happens after the records are written), so the files are deterministic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

PINNED = REPO / "tests" / "fixtures" / "pinned"
#: trajectory fields that measure this machine, not the behaviour
UNSTABLE = ("wall_time",)


def canonical_trajectories(path: Path) -> str:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            for k in UNSTABLE:
                d.pop(k, None)
            rows.append(json.dumps(d, sort_keys=True, ensure_ascii=False))
    return "\n".join(rows) + "\n"


def pinned_files(tmp: Path, model_dir: Path) -> dict[str, str]:
    """Run the pinned steps in `tmp`; file name -> canonical text."""
    from selftrain_helpers import oracle_factory, pinned_run_config

    from knowtrace_train.selftrain import SelfTrain

    config = pinned_run_config(tmp, model_dir)
    run = SelfTrain(config, progress=False)
    run.make_generator = oracle_factory(run)
    run.run()
    rd = run.run_dir
    out = {
        "base_eval.jsonl": canonical_trajectories(rd / "base" / "eval.jsonl"),
        "iter_1_rollouts.jsonl": canonical_trajectories(rd / "iter_1" / "rollouts.jsonl"),
    }
    for f in sorted((rd / "iter_1").glob("sft_*.jsonl")):
        out[f"iter_1_{f.name}"] = f.read_text(encoding="utf-8")
    out["iter_1_rationale.json"] = (rd / "iter_1" / "rationale.json").read_text(encoding="utf-8")
    out.update(extra_records(run))
    return out


def extra_records(run) -> dict[str, str]:
    """STaR records of the same rollouts and the gold (bootstrap) records, as JSONL per role."""
    from selftrain_helpers import star_and_gold_records

    return star_and_gold_records(run)


def main() -> int:
    import tempfile

    from conftest import tiny_model  # the same construction as the tiny_model_dir fixture

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model_dir = tiny_model(tmp / "tiny_model")
        files = pinned_files(tmp, model_dir)
    PINNED.mkdir(parents=True, exist_ok=True)
    for old in PINNED.iterdir():
        old.unlink()
    for name, text in files.items():
        (PINNED / name).write_text(text, encoding="utf-8")
    print(f"pinned {len(files)} files in {PINNED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
