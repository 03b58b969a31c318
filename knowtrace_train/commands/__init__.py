"""The commands' `main` functions, one module each: what the recipes and scripts run, reachable from an installed
package (`knowtrace-train <command>`, knowtrace_train/cli.py).

    selftrain   recipes/selftrain.py        self-train a method, its per-iteration table and the run folder
    evaluate    recipes/evaluate.py         a method (or a run's model) on a dataset split: EM, F1, costs
    report      scripts/report.py           the HTML report of runs or trajectory files
    export      scripts/export.py           a run's adapters as merged, checked, ready-to-serve models
    compare     scripts/compare_runs.py     runs side by side (seeds as arms), the paper's Figure 2
    doctor      scripts/doctor.py           what works on this machine, and how fast

The recipes and scripts are thin wrappers of these modules (their output unchanged); `data` is
`python -m knowtrace_train.data`.
"""
