"""The registry of training modes: name -> TrainingMode (the settings section it reads, the records it trains on,
how one role's adapter trains on them).

A run's `mode` is either a rationalizer of its method (SFT on that rationalizer's records: the "sft" mode) or a
registered mode's name (`kto`, `grpo`: each labels its records with the first of its `rationalizers` the method
has). Adding a mode is one module holding its settings, its trainer and a `TrainingMode`, and one `register(...)`
line below (or a call to `register` from the user's own code, as tests/test_train_modes.py does); the
self-training loop asks this registry and never names a mode.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from knowtrace_train.train.mode import TrainingMode, trained_info

#: name -> the registered TrainingMode
MODES: dict[str, TrainingMode] = {}


def register(mode: TrainingMode) -> TrainingMode:
    """Add `mode` under its name (a later registration of the same name replaces the earlier one)."""
    if not mode.name:
        raise ValueError(f"a training mode needs a name: {type(mode).__name__}")
    MODES[mode.name] = mode
    return mode


def unregister(name: str) -> None:
    MODES.pop(name, None)


def get_mode(name: str) -> TrainingMode:
    if name not in MODES:
        raise KeyError(f"unknown training mode {name!r}; registered: {sorted(MODES)}")
    return MODES[name]


def resolve(mode: str, rationalizers: Mapping[str, Any] | Sequence[str]) -> tuple[str, TrainingMode]:
    """(rationalizer, TrainingMode) of a run's `mode` for a method with `rationalizers` (names): a registered mode
    with rationalizers of its own labels its records with the first the method has; any other `mode` is a
    rationalizer's name, trained by SFT."""
    m = MODES.get(mode)
    if m is not None and m.rationalizers:
        return m.rationalizer(rationalizers), m
    return mode, MODES["sft"]


def mode_names() -> list[str]:
    """The registered modes a run may name beside its method's rationalizers."""
    return [n for n, m in MODES.items() if m.rationalizers]


def _register_builtin() -> None:
    from knowtrace_train.train.grpo import GRPOMode
    from knowtrace_train.train.kto import KTOMode
    from knowtrace_train.train.lora import SFTMode

    register(SFTMode())
    register(KTOMode())
    register(GRPOMode())


_register_builtin()

__all__ = ["MODES", "TrainingMode", "get_mode", "mode_names", "register", "resolve", "trained_info", "unregister"]
