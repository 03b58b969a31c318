"""The registry of methods: name -> Method (config class, strategy, record roles, rationalizers, gold records).

Adding a method is one folder beside `knowtrace/` and one `register(...)` line below (or a call to
`register` from the user's own code). A method's folder touches nothing outside itself but this line.
"""

from __future__ import annotations

from knowtrace_train.methods.base import Method, Rationalizer, Strategy, StrategyConfig

METHODS: dict[str, Method] = {}


def register(method: Method, *, replace: bool = False) -> Method:
    """Make `method` available by its name (to configs' `strategy.name`); returns it."""
    if not method.name:
        raise ValueError(f"{type(method).__name__} has no name")
    if method.name in METHODS and not replace and type(METHODS[method.name]) is not type(method):
        raise ValueError(f"a method named {method.name!r} is registered already ({type(METHODS[method.name]).__name__})")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    """The registered method called `name`; a ValueError naming the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; registered: {sorted(METHODS)}") from None


def unregister(name: str) -> None:
    METHODS.pop(name, None)


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

__all__ = ["METHODS", "Method", "Rationalizer", "Strategy", "StrategyConfig", "get_method", "register", "unregister"]
