"""The strategy interface: a method that turns QAItems into Trajectories over shared parts."""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.generation.base import Generator
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import Trajectory


class Strategy(Protocol):
    """KnowTrace, TRACE, DoG and the baselines each implement this. A strategy advances many
    questions together (batched calls) and hands each finished Trajectory to `on_done` as soon
    as it is finished, so a caller can persist it before the rest of the batch ends."""

    name: str

    def run(
        self,
        items: Sequence[QAItem],
        generator: Generator,
        retriever: Retriever,
        on_done: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]: ...
