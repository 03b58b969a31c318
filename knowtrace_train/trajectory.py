"""The Trajectory record: every model call of one question, its graph, prediction and costs."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowtrace_train.io import DataFileError, atomic_write_text, read_text
from knowtrace_train.kg import GuidancePair, KnowledgeGraph
from knowtrace_train.metrics import exact_match

log = logging.getLogger(__name__)


@dataclass
class ModelCall:
    """One model call as the strategy made it. `parsed` is the parser's typed result as JSON;
    `error` says why an output could not be used (the run goes on). `output` is the response as the parsers read
    it: `prefix` (what the engine fed after the prompt as the start of the answer) followed by the generated text;
    training puts its loss on the generated text only (`generated_text`)."""

    index: int
    role: str
    round: int
    prompt: str
    output: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str = "eos"
    parsed: dict[str, Any] | None = None
    error: str | None = None
    #: the guidance pair a completion call served
    pair: GuidancePair | None = None
    #: indices into the trajectory graph's triplets that this call added
    triplets: list[int] = field(default_factory=list)
    #: ids of the passages in the prompt
    passage_ids: list[str] = field(default_factory=list)
    retrieved_tokens: int = 0
    #: the start of the answer the engine fed after the prompt (not generated: prompt-side in training)
    prefix: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["pair"] = None if self.pair is None else [self.pair.entity, self.pair.guidance]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelCall":
        d = dict(d)
        d["pair"] = None if d.get("pair") is None else GuidancePair(*d["pair"])
        return cls(**d)


@dataclass
class Trajectory:
    """One question run by one strategy. Scoring fills `em`/`f1`; nothing else mutates it."""

    id: str
    question_id: str
    question: str
    answers: list[str]
    dataset: str
    strategy: str
    calls: list[ModelCall] = field(default_factory=list)
    graph: KnowledgeGraph = field(default_factory=KnowledgeGraph)
    prediction: str | None = None
    thought: str | None = None
    #: why the question ended: "answered", "max_rounds", "no_progress", "error: ..."
    stop_reason: str = ""
    rounds: int = 0
    wall_time: float = 0.0
    em: float | None = None
    f1: float | None = None
    iteration: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def retrieved_tokens(self) -> int:
        return sum(c.retrieved_tokens for c in self.calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.calls)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["calls"] = [c.to_dict() for c in self.calls]
        d["graph"] = self.graph.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["calls"] = [ModelCall.from_dict(c) for c in d.get("calls", ())]
        d["graph"] = KnowledgeGraph.from_dict(d.get("graph") or {})
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def split_prefix(prefix: str, text: str) -> tuple[str, str]:
    """(prefix, the rest) of a response `text` that the engine began with `prefix`: the part the model writes at
    inference is the rest. A text that does not begin with `prefix` (rewritten so that it no longer does) is all
    the model's: ("", text)."""
    if prefix and text.startswith(prefix):
        return prefix, text[len(prefix):]
    return "", text


def generated_text(call: ModelCall) -> str:
    """What the model generated in `call`: its output less the prefix the engine fed."""
    return split_prefix(call.prefix, call.output)[1]


def is_correct(traj: Trajectory) -> bool:
    """Exact match of the prediction (the trajectory's own `em` where scoring filled it)."""
    if traj.em is not None:
        return traj.em >= 1.0
    return bool(traj.prediction) and any(exact_match(traj.prediction or "", a) for a in traj.answers)


#: what `trajectory_from_line` raises on a line that is no trajectory
TRAJECTORY_LINE_ERRORS = (ValueError, TypeError, KeyError, AttributeError)


def trajectory_from_line(line: str) -> Trajectory:
    """One JSONL line as a Trajectory; one of TRAJECTORY_LINE_ERRORS where it is none."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return Trajectory.from_dict(obj)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """The trajectories already in `path` (none if it does not exist). A truncated last line
    (a kill mid-write) is dropped with a warning and cut from the file, so appends stay valid;
    a bad line elsewhere is an error naming file:line."""
    path = Path(path)
    if not path.exists():
        return []
    text = read_text(path)
    lines = text.split("\n")
    out: list[Trajectory] = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(trajectory_from_line(line))
        except TRAJECTORY_LINE_ERRORS as e:
            if i == last:
                log.warning("%s:%d: dropping a truncated last line (%s)", path, i + 1, e)
                atomic_write_text(path, "\n".join(lines[:i]) + ("\n" if i else ""))
                break
            raise DataFileError(f"{path}:{i + 1}: not a trajectory ({e})") from e
    return out
