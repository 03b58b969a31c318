"""The models of the loop: a model state (weights and an adapter per role), and the records a stage wrote."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from knowtrace_train.io import iter_jsonl


@dataclass(frozen=True)
class ModelState:
    """A model of the loop: weights (`model`, a folder or alias) and the adapter of each role.
    `trained` names the generator roles whose weights were trained (by the bootstrap or an adapter):
    their prompts follow `fewshot_trained`; untrained roles keep the strategy's exemplars."""

    name: str
    model: str
    adapters: Mapping[str, str] = field(default_factory=dict)
    trained: frozenset[str] = frozenset()


def read_records(path: Path) -> list[dict[str, Any]]:
    """The SFT records of a sft_<kind>.jsonl file (none where it does not exist)."""
    return [obj for _, obj in iter_jsonl(path)] if path.is_file() else []
