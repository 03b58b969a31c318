"""Test helpers for the self-training loop: a tiny world config and an oracle generator.

The oracle answers every prompt that a gold trajectory of the world shows (the exploration and
completion prompts of its gold chain) with the gold output, and asks one extra, unavailing guidance
pair in the first exploration (so backtracing has something to filter); every other prompt goes to
the real generator (the tiny random model with the iteration's adapters), whose text is garbage.
So questions of at most `max_rounds - 1` hops are answered right and the loop has records to train on.

Run as a script, it runs a SelfTrain from a YAML config with the oracle (the kill/resume and the
2-process tests and scripts/lab/chaos.py start it as a subprocess):  python tests/selftrain_helpers.py CONFIG.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from knowtrace_train.methods.knowtrace import outputs  # noqa: E402
from knowtrace_train.generation.base import Completion, GenerationRequest  # noqa: E402
from knowtrace_train.kg import GuidancePair  # noqa: E402
from knowtrace_train.errors import user_errors  # noqa: E402

EXTRA_GUIDANCE = "anything else worth knowing"


def tiny_overrides(tmp: Path, model_dir: Path, **extra: object) -> list[str]:
    """Command-line overrides of the default config for a run of seconds on the tiny model. Reuse is off
    (no test writes into the real cache home, and each run computes its own stages: the kill/resume test
    must kill a rollout, not find it cached); tests of reuse pass reuse=True and their own $KNOWTRACE_CACHE."""
    values: dict[str, object] = {
        "reuse": False,
        "output_dir": str(tmp / "run"),
        "iterations": 2,
        "on_empty": "continue",
        "chunk_size": 4,
        "data.train_questions": 6,
        "data.dev_questions": 4,
        "bootstrap.questions": 8,
        "generator.model": str(model_dir),
        "generator.batch_size": 8,
        "retriever.cache_dir": "null",
        "strategy.max_rounds": 3,
        "strategy.passages": 2,
        "strategy.max_pairs": 2,
        "strategy.max_new_tokens.explore": 8,
        "strategy.max_new_tokens.complete": 8,
        "strategy.max_new_tokens.answer": 6,
        "train.max_steps": 1,
        "train.per_device_batch_size": 2,
        "train.logging_steps": 1,
        "bootstrap.train.max_steps": 1,
        "bootstrap.train.per_device_batch_size": 2,
        "bootstrap.train.logging_steps": 1,
    }
    values.update(extra)
    out: list[str] = []
    for k, v in values.items():
        out += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    return out


class OracleGenerator:
    """Gold outputs for gold prompts (see the module docstring), the wrapped generator for the rest."""

    def __init__(self, inner, answers: dict[str, str]) -> None:
        self.inner = inner
        self.answers = answers
        self.hits = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        rest = []
        for i, r in enumerate(requests):
            gold = self.answers.get(r.prompt) if isinstance(r.prompt, str) else None
            # the engine sends the judgement words as the start of the output (request.prefix)
            text = None if gold is None or not gold.startswith(r.prefix) else gold[len(r.prefix):]
            if text is None:
                rest.append(i)
            else:
                self.hits += 1
                out[i] = Completion(text=text, prompt_tokens=self.count_tokens(r.prompt),
                                    output_tokens=self.count_tokens(text), finish_reason="stop")
        if rest:
            for i, c in zip(rest, self.inner.generate([requests[i] for i in rest])):
                out[i] = c
        return out  # type: ignore[return-value]

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def close(self) -> None:
        self.inner.close()


def oracle_answers(run) -> dict[str, str]:
    """prompt -> gold output over the run's rollout and dev questions (with the run's retriever)."""
    from knowtrace_train.methods.knowtrace.gold import gold_trajectories

    cfg = run.config
    items = run.questions.rollout + run.questions.dev
    trajs, _ = gold_trajectories(items, run.retriever, k=cfg.strategy.passages, fewshot=cfg.fewshot_trained,
                                 kg_format=cfg.strategy.kg_format, require_support=True)
    answers: dict[str, str] = {}
    for t in trajs:
        for c in t.calls:
            text = c.output
            if c.index == 0 and c.pair is None and c.parsed and c.parsed.get("pairs"):
                pairs = [GuidancePair(e, g) for e, g in c.parsed["pairs"]]  # a round's gold pairs, then one unavailing
                text = outputs.exploration_guidance([*pairs, GuidancePair(pairs[0].entity, EXTRA_GUIDANCE)])
            answers.setdefault(c.prompt, text)
    return answers


def oracle_factory(run):
    """A make_generator for SelfTrain: the configured backend wrapped in the oracle."""
    from knowtrace_train.generation import build_generator

    cache: dict[str, dict[str, str]] = {}

    def make(gen_cfg):
        if "answers" not in cache:
            cache["answers"] = oracle_answers(run)
        return OracleGenerator(build_generator(gen_cfg), cache["answers"])

    return make


class CoinOracleGenerator(OracleGenerator):
    """The oracle on the requests whose sampling seed is even, the wrapped generator on the rest: a question's
    sampled trajectories then differ in how much of the gold path they follow (GRPO's groups need rewards that
    differ), and a rerun gives the same ones."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        heads = [i for i, r in enumerate(requests) if r.seed % 2 == 0]
        tails = [i for i, r in enumerate(requests) if r.seed % 2]
        out: list[Completion | None] = [None] * len(requests)
        for idx, gen in ((heads, super().generate), (tails, self.inner.generate)):
            if idx:
                for i, c in zip(idx, gen([requests[i] for i in idx])):
                    out[i] = c
        return out  # type: ignore[return-value]


def coin_oracle_factory(run):
    """A make_generator for SelfTrain: the configured backend wrapped in CoinOracleGenerator."""
    from knowtrace_train.generation import build_generator

    cache: dict[str, dict[str, str]] = {}

    def make(gen_cfg):
        if "answers" not in cache:
            cache["answers"] = oracle_answers(run)
        return CoinOracleGenerator(build_generator(gen_cfg), cache["answers"])

    return make


def pinned_run_config(tmp: Path, model_dir: Path):
    """The run tests/pin_run.py pins: the tiny config, no bootstrap, one backtracing iteration (few-shot
    prompts throughout, which the oracle knows: the untrained M0 runs the strategy's exemplars)."""
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain.config import SelfTrainConfig

    return load_config(SelfTrainConfig, None, tiny_overrides(
        tmp, model_dir, iterations=1, fewshot_trained=True,
        **{"bootstrap.mode": "never", "data.train_questions": 8}))


def star_and_gold_records(run) -> dict[str, str]:
    """For the pinned run: STaR records of iteration 1's rollouts and gold records of 8 train
    questions after the rollout ones, as JSONL text per role."""
    import json

    from knowtrace_train.methods.knowtrace.backtrace import backtrace_trajectories
    from knowtrace_train.data.loaders import load_items
    from knowtrace_train.trajectory import read_trajectories
    from knowtrace_train.methods.knowtrace.gold import gold_trajectory_records

    def jsonl(rows) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    cfg = run.config
    trajs = read_trajectories(run.run_dir / "iter_1" / "rollouts.jsonl")
    star = backtrace_trajectories(trajs, run.items_by_id, count_tokens=run.count_tokens, mode="star",
                                  fewshot=cfg.fewshot_trained, iteration=1, passages={p.id: p for p in run.corpus})
    rollout_ids = {it.id for it in run.questions.rollout}
    boot = [it for it in load_items(cfg.data.train) if it.id not in rollout_ids][:8]
    gold = gold_trajectory_records(boot, run.retriever, k=cfg.strategy.passages, fewshot=cfg.fewshot_trained,
                                   kg_format=cfg.strategy.kg_format, count_tokens=run.count_tokens, iteration=0)
    out = {f"star_sft_{r}.jsonl": jsonl(v) for r, v in sorted(star.records_by_role.items())}
    out["star_stats.json"] = json.dumps(star.stats, indent=1, sort_keys=True) + "\n"
    out.update({f"gold_sft_{r}.jsonl": jsonl(v) for r, v in sorted(gold.records_by_role.items())})
    out["gold_stats.json"] = json.dumps(gold.stats, indent=1, sort_keys=True) + "\n"
    return out


#: Figures that measure time, or say where a stage's output came from (the reuse cache) rather than what it is: left
#: out where two runs of one config are compared (`run_outputs`)
NOT_COMPARED = ("seconds", "wall_time", "sec_per_question", "train_seconds", "tokens_per_second", "run_dir",
                "reused_from", "reused_seconds", "m0_files")
#: text files compared as text (the run folder's path as RUN); JSON and JSONL ones parsed, without NOT_COMPARED
TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".md", ".jinja", ".txt")


def _strip(obj):
    if isinstance(obj, dict):
        return {k: sorted(v) if k == "target_modules" and isinstance(v, list) else _strip(v)  # PEFT writes a set
                for k, v in obj.items() if k not in NOT_COMPARED}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def run_outputs(run_dir: Path) -> dict[str, object]:
    """Every file of a finished run folder as two runs of one config are compared, by its path in the folder: JSON
    and JSONL files parsed, without the figures of NOT_COMPARED; other text files (config.yaml, a model card) as
    text; every other file (the adapters' and M0's safetensors, bit for bit) by the SHA-256 of its bytes; the run
    folder's path as RUN throughout. Left out: the DONE markers (their seconds; the files they list are compared)
    and report.html (the time it was made). Anything else counts, a temporary file left behind included."""
    import hashlib
    import json

    out: dict[str, object] = {}
    for p in sorted(Path(run_dir).rglob("*")):
        rel = str(p.relative_to(run_dir))
        if not p.is_file() or p.name.startswith("DONE.") or rel == "report.html":
            continue
        if p.suffix not in TEXT_SUFFIXES:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            continue
        text = p.read_text(encoding="utf-8").replace(str(Path(run_dir).resolve()), "RUN").replace(str(run_dir), "RUN")
        if p.suffix == ".jsonl":
            out[rel] = [_strip(json.loads(line)) for line in text.splitlines()]
        elif p.suffix == ".json":
            out[rel] = _strip(json.loads(text))
        else:
            out[rel] = text
    return out


def differing(a: dict[str, object], b: dict[str, object]) -> list[str]:
    """The paths whose outputs (`run_outputs`) differ or are in one folder only."""
    return sorted(k for k in set(a) | set(b) if a.get(k, a) != b.get(k, b))


#: The fault-injection hook (scripts/lab/chaos.py, the kill/resume tests). Set to a point, "POINT" or "POINT#N", the run
#: SIGKILLs its own process group the N-th time (the first by default) one of its processes reaches POINT (started in
#: a session of its own, as the harness starts it, that is the whole run; under torchrun, whose workers are sessions
#: of their own, the launcher's group and every worker's). Set to "list:FILE", it appends every point it reaches
#: ("POINT#N") to FILE and kills nothing. The points are "<folder>/<stage>:<where>" (folder base, iter_0, iter_1, ...)
#: for every stage the run computes (not those done already): `start` (its marker absent, before its body), `record`
#: (a finished trajectory appended to a rollout's or an evaluation's part file), `step` (a training's optimizer step
#: ended), `save` (a safetensors file of an adapter or of M0 written: killed there, it is left half written), `store`
#: (a file copied into the reuse cache's entry), `end` (the stage's files written, its marker not yet) and `marked`
#: (the marker written, before the processes meet); and "run/summary" (summary.json about to be written: after every
#: model's row, and at the end), "run/report" (the main job's report.html about to be written). Nothing is wrapped
#: where the variable is unset: the package holds no hook.
KILL_ENV = "KNOWTRACE_TEST_KILL_AT"


def _kill_at() -> None:
    import os
    import signal
    import threading

    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    import peft.peft_model as peft_model
    import transformers.modeling_utils as mu
    from transformers.trainer_callback import CallbackHandler

    from knowtrace_train import stages
    from knowtrace_train.methods import base as scored
    from knowtrace_train.selftrain import loop, reuse

    listing = Path(spec[len("list:"):]) if spec.startswith("list:") else None
    target, _, nth = spec.partition("#")
    nth = int(nth or 1)
    seen: dict[str, int] = {}
    lock = threading.Lock()
    where = threading.local()  # the stage each thread runs (an evaluation runs beside the next stages)

    def here(what: str) -> str:
        return f"{getattr(where, 'stage', None) or 'run'}:{what}"

    def hit(point: str, torn=None) -> None:
        with lock:
            n = seen[point] = seen.get(point, 0) + 1
            if listing is not None:
                with open(listing, "a", encoding="utf-8") as f:
                    f.write(f"{point}#{n}\n")
                return
        if point == target and n == nth:
            if torn is not None:
                torn()
            print(f"fault injection: SIGKILL at {point}#{n}", file=sys.stderr, flush=True)
            if os.environ.get("TORCHELASTIC_RUN_ID"):  # torchrun starts each worker in a session of its own
                import psutil

                launcher = psutil.Process(os.getppid())
                for worker in launcher.children():
                    if worker.pid != os.getpid():
                        os.killpg(worker.pid, signal.SIGKILL)
                os.killpg(os.getpgid(launcher.pid), signal.SIGKILL)
            os.killpg(os.getpgrp(), signal.SIGKILL)

    run_stage = stages.StageRunner.run

    def run(self, folder, name, body):
        if stages.is_done(folder, name):
            return run_stage(self, folder, name, body)
        before, where.stage = getattr(where, "stage", None), f"{Path(folder).name}/{name}"
        try:
            hit(here("start"))
            return run_stage(self, folder, name, body)
        finally:
            where.stage = before

    mark_done = stages.mark_done

    def mark(folder, stage, info):
        hit(f"{Path(folder).name}/{stage}:end")
        mark_done(folder, stage, info)
        hit(f"{Path(folder).name}/{stage}:marked")

    append = scored.append_jsonl

    def append_then_hit(path, row):
        append(path, row)
        hit(here("record"))

    def save_then_hit(save):
        def saved(tensors, filename, metadata=None):
            save(tensors, filename, metadata=metadata)

            def halve():
                with open(filename, "r+b") as f:
                    f.truncate(os.path.getsize(filename) // 2)

            hit(here("save"), torn=halve)
        return saved

    on_step_end = CallbackHandler.on_step_end

    def step_then_hit(self, args, state, control):
        out = on_step_end(self, args, state, control)
        hit(here("step"))
        return out

    copy_tree = reuse.copy_tree

    def copy_then_hit(src, dst, link=False):
        copy_tree(src, dst, link)
        if Path(src).is_file():
            hit(here("store"))

    write_summary = loop.SelfTrain._write_summary

    def summary(self, metrics):
        hit("run/summary")
        return write_summary(self, metrics)

    stages.StageRunner.run, stages.mark_done, scored.append_jsonl = run, mark, append_then_hit
    mu.safe_save_file, peft_model.safe_save_file = save_then_hit(mu.safe_save_file), save_then_hit(peft_model.safe_save_file)
    CallbackHandler.on_step_end, reuse.copy_tree, loop.SelfTrain._write_summary = step_then_hit, copy_then_hit, summary
    try:
        from knowtrace_train.commands import selftrain as command
    except ImportError:
        return
    write_report = command.write_report

    def report(*a, **kw):
        hit("run/report")
        return write_report(*a, **kw)

    command.write_report = report


#: set by the full-disk test: "append:<path's end>:<n>" makes the n-th record appended to that file (a rollout's
#: part, e.g. iter_1/rollouts.jsonl.parts/rank0.jsonl) meet a full disk halfway through; "save" makes the first safetensors save of a model (M0's merge) write
#: half its file and fail as safetensors does on a full disk; "store" makes the first reuse-cache store fill it
DISK_FULL_ENV = "KNOWTRACE_TEST_DISK_FULL"


def _disk_full_at() -> None:
    import errno
    import os

    point = os.environ.get(DISK_FULL_ENV)
    if not point:
        return
    if point == "save":
        import transformers.modeling_utils as mu

        def half_then_full(tensors, filename, metadata=None):
            real_save(tensors, filename, metadata=metadata)
            with open(filename, "r+b") as f:
                f.truncate(os.path.getsize(filename) // 2)
            raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

        real_save, mu.safe_save_file = mu.safe_save_file, half_then_full
        return
    if point == "store":  # the first store into the reuse cache: its first file fills the disk
        from knowtrace_train.selftrain import reuse

        copy_tree, calls = reuse.copy_tree, [0]

        def fill_first(src, dst, link=False):
            calls[0] += 1
            if calls[0] == 1:
                Path(dst).write_bytes(b"\0" * 100)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return copy_tree(src, dst, link)

        reuse.copy_tree = fill_first
        return
    from knowtrace_train import io
    from knowtrace_train.methods import base as scored

    name, n = point.split(":", 1)[1].rsplit(":", 1)
    append, seen = scored.append_jsonl, [0]

    def append_or_fill(path, row):
        if not Path(path).as_posix().endswith(name):
            return append(path, row)
        seen[0] += 1
        if seen[0] != int(n):
            return append(path, row)
        real = io.os.write

        def half_then_full(fd, data):
            real(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        io.os.write = half_then_full
        try:
            return append(path, row)
        finally:
            io.os.write = real

    scored.append_jsonl = append_or_fill


@user_errors
def main(argv: list[str]) -> int:
    """CONFIG.yaml [--key value ...], with `--coin` the coin oracle (GRPO's groups), with `--main-job` through the
    main job's command (knowtrace_train/commands/selftrain.py: its table and report.html) instead of `SelfTrain.run`."""
    import json
    import logging

    from knowtrace_train.config import load_config
    from knowtrace_train.report import headline
    from knowtrace_train.selftrain import SelfTrain
    from knowtrace_train.selftrain.config import SelfTrainConfig

    flags = {a for a in argv if a in ("--coin", "--main-job")}
    argv = [a for a in argv if a not in flags]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _kill_at()
    _disk_full_at()
    # the factory from the module by its name, not __main__'s copy: reuse keys name the generator factory,
    # and a run of this script must share the cache with a test's in-process run
    import selftrain_helpers

    factory = selftrain_helpers.coin_oracle_factory if "--coin" in flags else selftrain_helpers.oracle_factory
    if "--main-job" in flags:
        from knowtrace_train.commands import selftrain as command

        init = SelfTrain.__init__

        def with_oracle(self, *a, **kw):
            init(self, *a, **kw)
            self.make_generator = factory(self)

        SelfTrain.__init__ = with_oracle
        return command.main(["--config", argv[0], *argv[1:]])
    config = load_config(SelfTrainConfig, argv[0], argv[1:])
    run = SelfTrain(config, progress=False)
    run.make_generator = factory(run)
    summary = run.run()
    if run.procs.is_main:
        print(json.dumps(headline(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
