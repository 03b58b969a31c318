"""KnowTrace's sufficiency judgement of a run's model: on held-out gold prompts, and on its own dev explorations.

    python scripts/lab/judgement.py RUN [--iteration 0] [--limit N] [--dev_questions N] [--dev_only] [--calibrate] [--json FILE]

Held-out gold prompts (`methods/knowtrace/judgement.py`): every exploration prompt of the gold trajectories of the
run's dev questions (`--questions dev`), labelled No while a hop is missing and Yes once the chain is in the graph;
the model's P(" Yes") against P(" No") after the judgement words (one prefill each, the run's generator settings),
its decision at the model's calibrated threshold (greedy where it has none), and the accuracy, each label's recall and the mean P(Yes) per label with 95% intervals. Then,
where the run evaluated that model (`iter_<z>/eval.jsonl`), its explorations counted by whether the graph shown
names the gold answer and what the model said, and its right answers by source (an exploration that answered, or
the forced answer). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the lab's helper modules beside this script

from knowtrace_train.errors import UserError  # noqa: E402


def calibrate(run_dir: Path, iteration: str = "0") -> dict:
    """Calibrate the run's model of `iteration` as the loop does (its calibration questions' gold prompts) and
    write iter_<z>/calibration.json: a run made before calibration existed then evaluates with its thresholds."""
    import dataclasses

    from knowtrace_train.generation import build_generator
    from knowtrace_train.methods import get_method
    from knowtrace_train.selftrain.calibration import calibrate_model
    from knowtrace_train.selftrain.loop import select_questions
    from knowtrace_train.selftrain.models import run_model

    rm = run_model(run_dir, iteration)
    if not rm.state.trained:
        raise UserError(f"{run_dir}: the model of iteration {iteration} is the raw base: nothing trained to calibrate")
    plain = dataclasses.replace(rm.state, thresholds={})
    strategy = dataclasses.replace(rm, state=plain).strategy
    items = select_questions(rm.config, bootstrap=rm.config.bootstrap.mode != "never").calibration
    method = get_method(strategy.name)
    kinds = method.threshold_decisions(strategy)
    prompts = [p for p in method.decision_prompts(strategy, items) if p.kind in kinds]
    if not prompts:
        raise UserError(f"{run_dir}: no decision prompt from {len(items)} calibration questions")
    z = rm.state.name[1:]
    return calibrate_model(lambda: build_generator(dataclasses.replace(rm, state=plain).generator), prompts,
                           run_dir / f"iter_{z}", rm.state.name, len(items))


def measure(run_dir: Path, iteration: str = "0", limit: int | None = None, generator=None,
            held_out: bool = True, dev_questions: int | None = None) -> dict:
    import dataclasses

    from knowtrace_train.generation import build_generator
    from knowtrace_train.metrics import format_interval
    from judgement_figures import exploration_confusion, judgement_figures, score_judgements

    from knowtrace_train.methods.knowtrace.judgement import gold_judgement_prompts
    from knowtrace_train.selftrain.loop import select_questions
    from knowtrace_train.selftrain.models import run_model
    from knowtrace_train.trajectory import read_trajectories

    rm = run_model(run_dir, iteration)
    strategy = rm.strategy
    if strategy.name != "knowtrace":
        raise UserError(f"{run_dir}: scripts/lab/judgement.py measures KnowTrace's judgement; this run's method is "
                        f"{strategy.name!r}")
    config = rm.config
    if dev_questions is not None:  # the held-out prompts of more (or fewer) of the same shuffled dev questions
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, dev_questions=dev_questions))
    questions = select_questions(config, bootstrap=False)
    dev = questions.dev[:limit] if limit else questions.dev
    out = {"run": str(run_dir), "model": rm.state.name, "questions": len(dev),
           "threshold": getattr(strategy, "judgement_threshold", None)}
    if held_out:
        prompts, out["skipped"] = gold_judgement_prompts(dev, fewshot=strategy.fewshot.explore,
                                                         kg_format=strategy.kg_format)
        gen = generator or build_generator(rm.generator)
        try:
            odds = score_judgements(gen, prompts, strategy.roles.explore, strategy.prefill_judgement)
        finally:
            if generator is None:
                gen.close()
        out["held_out"] = judgement_figures(prompts, odds, out["threshold"])
    z = rm.state.name[1:] if rm.state.name.startswith("M") else None
    ev = run_dir / f"iter_{z}" / "eval.jsonl" if z is not None else run_dir / "base" / "eval.jsonl"
    if ev.is_file():
        trajs = read_trajectories(ev)
        out["dev_explorations"] = exploration_confusion(trajs, {it.id: it for it in questions.all_items})
        out["dev_em"] = sum(1 for t in trajs if (t.em or 0) >= 1.0) / len(trajs) if trajs else None
        out["dev_trajectories"] = len(trajs)
    from knowtrace_train.metrics import Interval

    def text(d):
        return "n/a" if d["mean"] is None else format_interval(Interval(mean=d["mean"], low=d["low"], high=d["high"],
                                                                        n=d["n"], confidence=0.95))
    if held_out:
        h = out["held_out"]["all"]
        print(f"{run_dir} {rm.state.name}: held-out gold prompts of {len(dev)} dev questions: accuracy {text(h['accuracy'])}; "
              f"Yes said on gold Yes {text(h['recall_yes'])}, No on gold No {text(h['recall_no'])}; "
              f"mean P(Yes) {text(h['p_yes_when_gold_yes'])} on gold Yes, {text(h['p_yes_when_gold_no'])} on gold No")
    if "dev_explorations" in out:
        d = out["dev_explorations"]["all"]
        print(f"  dev explorations: graph names the answer: Yes {d['holds_yes']}, No {d['holds_no']}, unread "
              f"{d['holds_none']}; it does not: Yes {d['lacks_yes']}, No {d['lacks_no']}, unread {d['lacks_none']}; "
              f"right answers {d['right_explored']} explored, {d['right_forced']} forced (EM {out['dev_em']:.3f}, "
              f"n={out['dev_trajectories']})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a self-training run folder")
    ap.add_argument("--iteration", default="0", help="the model: base, 0 (M0), z or last")
    ap.add_argument("--limit", type=int, default=None, help="the first N dev questions only")
    ap.add_argument("--dev_questions", type=int, default=None,
                    help="held-out prompts of this many of the run's shuffled dev questions (default: the run's own)")
    ap.add_argument("--dev_only", action="store_true", help="only the run's own dev explorations (no scoring)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--calibrate", action="store_true", help=(
        "first calibrate the model's judgement threshold on the run's calibration questions, as the loop does, and "
        "write iter_<z>/calibration.json (for a run made before calibration existed)"))
    args = ap.parse_args(argv)
    try:
        if args.calibrate:
            print(json.dumps({"calibration": calibrate(args.run, args.iteration)}))
        out = measure(args.run, args.iteration, args.limit, held_out=not args.dev_only,
                      dev_questions=args.dev_questions)
    except (UserError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
