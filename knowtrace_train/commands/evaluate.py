"""Evaluate a method (KnowTrace by default) on a dataset split and print EM, F1 and the paper's cost columns.

    python recipes/evaluate.py --config recipes/configs/eval_world.yaml --limit 16 --output runs/eval/world_dev.jsonl
    python recipes/evaluate.py --run runs/selftrain_default --iteration 2 --config recipes/configs/eval_hotpotqa.yaml

`--run RUN --iteration Z` evaluates a self-training run's model: M0, iteration Z's adapters per role, the
prompt format and the strategy settings all come from the run (`--iteration 0` is M0, `base` the raw model,
`last` the default); the trajectories go to RUN/eval/<dataset>_<model>.jsonl unless --output says otherwise.

Any config key can be overridden (`--strategy.max_rounds 3`, `--generator.adapters.explore DIR`).
Trajectories are appended to --output as each question finishes; a rerun skips the questions
already there. The printout gives EM and F1 with their 95% bootstrap intervals (under 20 questions
it says there are too few for one), EM by question kind (bridge / comparison) and, where the method
can tell, the evidence-supported EM. The last line printed is one JSON object: em, f1, em_interval,
f1_interval ([low, high], or null with interval_note saying why), em_by_kind, evidence_supported_em,
rounds, retrieved_tokens, sec_per_question, questions.
"""

from __future__ import annotations

import json
from pathlib import Path

from knowtrace_train.compare import output_settings, record_settings
from knowtrace_train.config import ConfigError, RecipeArgs, run_recipe
from knowtrace_train.evaluate import EvalConfig, evaluate, format_summary, load_eval_config


def main(argv: list[str] | None = None) -> int:
    return run_recipe(argv, __doc__, "YAML config (recipes/configs/eval_*.yaml)", load_eval_config, run, config_class=EvalConfig)


def run(config: EvalConfig, args: RecipeArgs) -> int:
    if not config.output:
        return _report(evaluate(config, progress=not args.quiet))
    output = Path(config.output)
    if output.is_dir():
        raise ConfigError(f"output {output} is a folder: name the trajectory file to write (e.g. {output / 'eval.jsonl'})")
    # the settings its trajectories were made with, beside the output: another config's file is refused
    settings, mine = output_settings(config, output.parent, f"the trajectory file {output}")
    try:
        summary = evaluate(config, progress=not args.quiet)
    finally:
        if output.is_file():  # recorded once trajectories exist (a failed start leaves nothing)
            record_settings(settings, mine)
    return _report(summary)


def _report(summary) -> int:
    print(format_summary(summary))
    print(json.dumps(summary.headline()))
    return 0

