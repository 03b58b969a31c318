"""The registry of methods: name -> Method (config class, strategy, record roles, rationalizers, gold records).

Adding a method is one folder beside `knowtrace/` and one `register(...)` line below (or a call to
`register` from the user's own code). A method's folder touches nothing outside itself but this line.
"""

from __future__ import annotations

from knowtrace_train.methods.base import (
    METHODS,
    Method,
    Rationalizer,
    Strategy,
    StrategyConfig,
    get_method,
    register,
    run_scored,
    run_strategy,
    unregister,
    written,
)


def _register_builtin() -> None:
    from knowtrace_train.methods.baselines import BASELINE_METHODS
    from knowtrace_train.methods.dog import DoGMethod
    from knowtrace_train.methods.knowtrace import KnowTraceMethod
    from knowtrace_train.methods.mintqa import mintqa_methods
    from knowtrace_train.methods.trace import TraceMethod

    register(KnowTraceMethod())
    register(TraceMethod())
    register(DoGMethod())
    for method in mintqa_methods():  # the four MINTQA strategies, one name each
        register(method)
    for method in BASELINE_METHODS:  # the KnowTrace paper's baselines, one name each
        register(method())


_register_builtin()

__all__ = ["METHODS", "Method", "Rationalizer", "Strategy", "StrategyConfig", "get_method", "register", "run_scored",
           "run_strategy", "unregister", "written"]
