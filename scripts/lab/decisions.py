"""Each method's decisions measured: a run's models on held-out gold prompts of its dev questions.

    python scripts/lab/decisions.py RUN [--base] [--iteration 0 [1 ...]] [--limit N] [--dev_questions N] [--json FILE]
    python scripts/lab/decisions.py --table FILE [FILE ...]

The prompts are the method's (`Method.decision_prompts`) over the run's dev questions (never trained on), rendered
as each model runs them: KnowTrace's sufficiency judgement, DoG's answer try, TRACE's selector stop (and the gold
triple's rank among the candidates), MINTQA-dynamic's certainty (labelled by whether the raw base answers the hop
right without retrieval), Self-Ask's "Are follow up questions needed here:" and its final answer against another
follow-up, IRCoT's stop (docs/decisions.md, "Each method's decisions, measured"). Each prompt is scored once (one
prefill, the run's generator settings; IRCoT's stop, which has no fixed words, is decoded greedily and read as its
loop reads it); per decision kind: accuracy, each label's recall, the balanced accuracy and the mean
P(positive) per label, with 95% intervals and the count of prompts, for the greedy choice and, where the model was
calibrated (iter_<z>/calibration.json), at its threshold. `--base` adds the raw base (few-shot, as the run
evaluated it). The last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the lab's helper modules beside this script

from knowtrace_train.errors import UserError  # noqa: E402


def _text(d: dict[str, Any]) -> str:
    from knowtrace_train.metrics import Interval, format_interval

    if d["mean"] is None:
        return "n/a"
    return format_interval(Interval(mean=d["mean"], low=d["low"], high=d["high"], n=d["n"], confidence=0.95))


def measure(run_dir: Path, models: list[str], limit: int | None = None, dev_questions: int | None = None,
            make_generator=None, retriever=None) -> dict[str, Any]:
    """Per model of `models` ("base", 0, z, "last"), `decision_figures` over the method's held-out gold prompts
    of the run's dev questions. `make_generator(GeneratorConfig)` builds a model (default: the configured
    backend); `retriever` the run's (default: built from the run's config and corpus)."""
    from decision_figures import decision_figures
    from knowtrace_train.decisions import require_scorer, score_prompts
    from knowtrace_train.generation import build_generator
    from knowtrace_train.methods import get_method
    from knowtrace_train.selftrain.loop import select_questions
    from knowtrace_train.selftrain.models import run_model

    build = make_generator or build_generator
    base = run_model(run_dir, "base")
    config = base.config
    if dev_questions is not None:  # the prompts of more (or fewer) of the same shuffled dev questions
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, dev_questions=dev_questions))
    questions = select_questions(config, bootstrap=False)
    dev = questions.dev[:limit] if limit else questions.dev
    method = get_method(config.strategy.name)
    if retriever is None:
        from knowtrace_train.evaluate import EvalConfig, load_corpus
        from knowtrace_train.retrieval import build_retriever

        retriever = build_retriever(config.retriever, load_corpus(EvalConfig(corpus=config.data.corpus), questions.all_items))
    out: dict[str, Any] = {"run": str(run_dir), "method": method.name, "questions": len(dev), "models": {}}
    made: dict[str, list] = {}  # the prompts, once per rendering (a trained role's prompts may drop exemplars)
    for which in models:
        rm = run_model(run_dir, which)
        rendering = method.for_model(config.strategy, rm.state.trained, config.fewshot_trained)
        key = repr(rendering)
        if key not in made:
            made[key] = method.decision_prompts(rendering, dev, retriever=retriever,
                                                make_generator=lambda: build(base.generator))
        prompts = made[key]
        entry: dict[str, Any] = {"thresholds": dict(rm.state.thresholds), "decisions": {}}
        if prompts:
            generator = build(rm.generator)
            try:
                require_scorer(generator, "scripts/lab/decisions.py")
                scores = score_prompts(generator, prompts)
            finally:
                close = getattr(generator, "close", None)
                if callable(close):
                    close()
            entry["decisions"] = decision_figures(prompts, scores, dict(rm.state.thresholds))
        out["models"][rm.state.name] = entry
        if not prompts:
            print(f"{run_dir} {rm.state.name}: {method.name} has no decision between fixed words to measure")
        for kind, f in entry["decisions"].items():
            for how in ("greedy", "calibrated"):
                if how not in f:
                    continue
                g = f[how]
                at = "greedy" if how == "greedy" else f"threshold {g['threshold']:.3f}"
                print(f"{run_dir} {rm.state.name} {kind} ({f['positive']!r} against {f['negative']!r}; "
                      f"{f['prompts']} prompts of {f['questions']} questions, gold {f['gold_positive']} / "
                      f"{f['gold_negative']}), {at}: accuracy {_text(g['accuracy'])}; recall of "
                      f"{f['positive']!r} {_text(g['recall_positive'])}, of the other {_text(g['recall_negative'])}; "
                      f"balanced {_text(g['balanced_accuracy'])}")
            if "choice" in f:
                c = f["choice"]
                print(f"  {kind}: the gold option's rank among {_text(c['options'])} others {_text(c['rank'])}; "
                      f"first {_text(c['top1'])}; best of all options {_text(c['best_of_all'])}")
    return out


def _cell(d: dict[str, Any]) -> str:
    if d["mean"] is None:
        return "n/a"
    if d["low"] is None:
        return f"{d['mean']:.2f}"
    return f"{d['mean']:.2f} [{d['low']:.2f}, {d['high']:.2f}]"


def table(files: list[Path]) -> str:
    """A markdown table of the figures that `--json` wrote (one file per run), rows grouped by method and decision
    kind (the files' order within): per run and model, the greedy choice and, where calibrated, the threshold's;
    the raw base once per method and kind (its prompts and scores are the same in every seed's run of the same
    dev questions)."""
    head = ("| method | kind: first option (prompts gold first / other) | model | decided by | accuracy [95% CI] | "
            "recall of the first option | recall of the other | balanced accuracy | the gold option first among "
            "the others (mean rank) |")
    rows: list[tuple[str, str, str]] = []
    seen_base: set[tuple[str, str]] = set()
    for f in files:
        out = json.loads(Path(f).read_text(encoding="utf-8"))
        run = Path(out["run"]).name
        for model, entry in out["models"].items():
            for kind, d in entry["decisions"].items():
                key = (out["method"], kind)
                if model == "base" and key in seen_base:
                    continue
                if model == "base":
                    seen_base.add(key)
                who = "raw base" if model == "base" else f"{model} ({run})"
                choice = d.get("choice")
                for how in ("greedy", "calibrated"):
                    if how not in d:
                        continue
                    g = d[how]
                    rank = (f"{_cell(choice['top1'])} ({choice['rank']['mean']:.2f})"
                            if choice and choice["rank"]["mean"] is not None else "")
                    rows.append((out["method"], kind,
                                 f"| {out['method']} | `{kind}`: {d['positive'].strip()} ({d['gold_positive']} / "
                                 f"{d['gold_negative']}) | {who} | "
                                 f"{'greedy' if how == 'greedy' else 'threshold %.2f' % g['threshold']} | "
                                 f"{_cell(g['accuracy'])} | {_cell(g['recall_positive'])} | "
                                 f"{_cell(g['recall_negative'])} | {_cell(g['balanced_accuracy'])} | "
                                 f"{rank if how == 'greedy' else ''} |"))
    rows.sort(key=lambda r: (r[0], r[1]))  # stable: each group keeps the files' order
    return "\n".join([head, "|" + "---|" * 9] + [r[2] for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, nargs="?", help="a self-training run folder")
    ap.add_argument("--table", type=Path, nargs="+", default=None, metavar="FILE",
                    help="instead of measuring, the files --json wrote as one markdown table")
    ap.add_argument("--iteration", nargs="+", default=["0"], help="the models: 0 (M0), z or last (default: 0)")
    ap.add_argument("--base", action="store_true", help="also the raw base, first")
    ap.add_argument("--limit", type=int, default=None, help="the first N dev questions only")
    ap.add_argument("--dev_questions", type=int, default=None,
                    help="the prompts of this many of the run's shuffled dev questions (default: the run's own)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.run is None:
        ap.error("a run folder is required (or --table FILE ...)")
    models = (["base"] if args.base else []) + [z for z in args.iteration if z != "base"]
    try:
        out = measure(args.run, models, args.limit, args.dev_questions)
    except (UserError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
