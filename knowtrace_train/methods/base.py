"""What a method is: its config section, its Strategy (QAItems -> Trajectories) and its Rationalizers (-> SFT records).

A method registers one `Method` object (knowtrace_train.methods.METHODS). The loops ask it for the
rest: `selftrain` and `evaluate` read `strategy: {name: <method>, ...its settings}`, build the strategy,
train one adapter per generator role its records name, and rationalize correct trajectories with
the rationalizer the run's `mode` names ("star", generic, works for every method; a method may add
its own, as KnowTrace adds "backtrace"). A method never imports the loops.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping, Protocol, Sequence, TypeVar

from knowtrace_train.config import TaggedConfig
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.generation.base import Generator
from knowtrace_train.io import append_jsonl
from knowtrace_train.metrics import score
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import Trajectory, read_trajectories

K = TypeVar("K", bound=Hashable)


@dataclass
class StrategyConfig(TaggedConfig):
    """The settings every method has; a method's config class extends it. The `name` key picks the
    class when a config file is read (`strategy: {name: knowtrace, max_rounds: 3}`)."""

    name: str = field(default="knowtrace", metadata={"help": "the method: a name registered in knowtrace_train.methods"})
    seed: int = field(
        default=0, metadata={"help": "seed of the method's sampling and random choices (self-training adds the iteration)"}
    )

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("strategy.name must name a method")

    def check_installed(self) -> None:
        """Import what these settings need from an optional extra (most methods: nothing), so that a
        missing extra is one clear error before any work."""

    @classmethod
    def section_class(cls, name: str) -> type:
        return get_method(name).config_class


class Strategy(Protocol):
    """A method that turns QAItems into Trajectories over the shared parts. It advances many
    questions together (batched calls) and hands each finished Trajectory to `on_done` as soon as
    it is finished, so a caller can persist it before the rest of the batch ends."""

    name: str

    def run(
        self,
        items: Sequence[QAItem],
        generator: Generator,
        retriever: Retriever,
        on_done: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]: ...


def check_width(width: int | None) -> None:
    """Refuse a count of questions in flight below 1 (None: all of them)."""
    if width is not None and width < 1:
        raise ValueError(f"width must be >= 1 (or None for all questions at once), got {width}")


def run_strategy(strategy: Strategy, items: Sequence[QAItem], generator: Generator, retriever: Retriever, *,
                 width: int | None = None, on_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """`strategy` over `items`, at most `width` questions in flight at once (None: all). A strategy that
    pipelines (`pipelined = True`: its `run` takes `width` and admits the next question as soon as one
    finishes, as KnowTrace's does) gets every question in one run; any other runs them in consecutive
    groups of `width`, each group in lockstep until its last question ends."""
    check_width(width)
    if getattr(strategy, "pipelined", False):
        return strategy.run(items, generator, retriever, on_done=on_done, width=width)  # type: ignore[call-arg]
    step = width or max(1, len(items))
    out: list[Trajectory] = []
    for start in range(0, len(items), step):
        out.extend(strategy.run(items[start : start + step], generator, retriever, on_done=on_done))
    return out


def run_scored(strategy: Strategy, items: Sequence[QAItem], generator: Generator, retriever: Retriever,
               out: str | Path | None, *, width: int | None = None, stamp: Callable[[Trajectory], None] | None = None,
               bar: Any = None, on_done: Callable[[Trajectory], None] | None = None) -> None:
    """The one loop of evaluation and rollouts: `run_strategy`, each finished trajectory scored (its `em` and `f1`),
    given the caller's own fields (`stamp`), appended to the JSONL `out` the moment it ends (None: no file),
    counted on `bar` (a progress bar) and passed to `on_done`. A kill loses only the questions in flight:
    `written` reads back what was appended, and a rerun runs only the rest."""

    def finished(t: Trajectory) -> None:
        s = score(t.prediction, t.answers, dataset=t.dataset)
        t.em, t.f1 = s["em"], s["f1"]
        if stamp is not None:
            stamp(t)
        if out is not None:
            append_jsonl(out, t.to_dict())
        if bar is not None:
            bar.update(1)
        if on_done is not None:
            on_done(t)

    run_strategy(strategy, items, generator, retriever, width=width, on_done=finished)


def written(paths: Iterable[str | Path], key: Callable[[Trajectory], K],
            check: Callable[[Path, Trajectory], None] | None = None) -> dict[K, Trajectory]:
    """The trajectories `run_scored` already appended to `paths` (resume): the first one per `key`, each passed to
    `check` (with its file) first; a torn last line (a kill mid-write) is dropped on reading."""
    done: dict[K, Trajectory] = {}
    for path in paths:
        for t in read_trajectories(path):
            if check is not None:
                check(Path(path), t)
            done.setdefault(key(t), t)
    return done


class Rationale(Protocol):
    """What a rationalizer returns: SFT records per record kind ({"prompt", "completion", "role",
    "trajectory_id", "iteration"}, and a boolean "label" where undesirable records were asked for) and
    JSON-able statistics with at least `mode`, `trajectories`,
    `correct`, `skipped`, `records`, `tokens_all`, `tokens_filtered`, `fa_ratio` (None where the
    rationalizer filters nothing) and `roles` ({kind: {"fa_ratio", ...}})."""

    records_by_role: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any]


class Rationalizer(Protocol):
    """Correct trajectories -> SFT records per record kind, and the FA ratio; with `undesirable` sources
    ("incorrect": the calls of wrong trajectories; "filtered": calls a filtering rationalizer drops), the
    undesirable calls too, every record labelled (preference training)."""

    def __call__(
        self,
        trajectories: Iterable[Trajectory],
        items_by_id: Mapping[str, QAItem],
        *,
        strategy: StrategyConfig,
        count_tokens: Callable[[str], int],
        fewshot: bool,
        iteration: int | None,
        passages: Mapping[str, Passage],
        undesirable: Iterable[str] = (),
    ) -> Rationale: ...


@dataclass(frozen=True)
class MechanismStat:
    """One figure of whether a method's own mechanism runs (not whether it answers right), kept as its
    numerator and denominator so a table prints "12/30 = 0.400" and a reader can check the counts. A mean
    per question is (the total, the questions): 45 triples over 30 chosen chains, 1.500. An empty
    denominator has no value (None, printed "-"), and `note` then says why (e.g. the items carry no gold
    evidence); a note on a non-empty one says what was left out."""

    numerator: int
    denominator: int
    note: str | None = None

    def __post_init__(self) -> None:
        if self.denominator < 0 or self.numerator < 0:
            raise ValueError(f"a mechanism statistic counts things: got {self.numerator}/{self.denominator}")

    @property
    def value(self) -> float | None:
        return self.numerator / self.denominator if self.denominator else None

    def cell(self, digits: int = 3) -> str:
        """"12/30 = 0.400"; "-" (with the note) where the denominator is empty."""
        if self.value is None:
            return "-" + (f" ({self.note})" if self.note else "")
        return f"{self.numerator}/{self.denominator} = {self.value:.{digits}f}"

    def to_dict(self) -> dict[str, Any]:
        v = self.value
        return {"numerator": self.numerator, "denominator": self.denominator,
                "value": None if v is None else round(v, 4), "note": self.note}


class Method:
    """A method's registry entry. Subclasses set `name` and `config_class` and implement `strategy`
    and `record_roles`; the other hooks have defaults that fit a method with no exemplars to drop,
    no gold trajectories and only the generic STaR rationalizer."""

    name: str = ""
    config_class: type[StrategyConfig] = StrategyConfig

    def strategy(self, config: StrategyConfig) -> Strategy:
        raise NotImplementedError

    def record_roles(self, config: StrategyConfig) -> dict[str, str]:
        """Record kind (a ModelCall.role whose outputs are trained) -> the generator role (adapter)
        its records train. Two kinds may share an adapter (KnowTrace's forced answer trains the
        exploration adapter)."""
        raise NotImplementedError

    def generator_roles(self, config: StrategyConfig) -> set[str]:
        """Every generator role the strategy sends requests with (roles without a trained adapter
        run on the base weights)."""
        return set(self.record_roles(config).values())

    def credited_calls(self, trajectories: Iterable[Trajectory], *, strategy: StrategyConfig,
                       count_tokens: Callable[[str], int]) -> dict[str, set[int]] | None:
        """`mode: grpo`'s `credit: backtrace`: per correct trajectory id, the indices of the calls that earned its
        answer (the others get no positive advantage). None: the method has no such rule (only `credit: outcome`)."""
        return None

    def rationalizers(self) -> dict[str, Rationalizer]:
        """The rationalizers a run's `mode` may name."""
        from knowtrace_train.methods.star import star_records

        return {"star": star_records}

    def for_model(self, config: StrategyConfig, trained: frozenset[str], fewshot_trained: bool) -> StrategyConfig:
        """The settings a model runs with, given the generator roles whose weights were trained
        (KnowTrace drops the exemplars of trained roles' prompts)."""
        return config

    def gold_records(self, config: StrategyConfig, items: Sequence[QAItem], retriever: Retriever, *,
                     fewshot: bool, require_support: bool, count_tokens: Callable[[str], int],
                     iteration: int | None, make_generator: Callable[[], Any] | None = None,
                     facts: Any = None) -> Rationale:
        """SFT records of the ideal trajectories the items' gold evidence implies (the bootstrap). `make_generator`
        builds the run's raw base model (a `Generator`, which the method closes) for a method whose gold labels
        measure what that model knows (MINTQA-dynamic's certainty); the others never build it. None: no model
        is at hand (such a method then falls back to labels it can write without one, and says so). `facts`: the
        facts the corpus states (data/facts.py's `FactIndex`), for a method whose gold writes what passages state
        (KnowTrace); None: the items' own gold evidence."""
        raise ValueError(f"method {self.name!r} has no gold trajectories: set bootstrap.mode: never")

    def evidence_supported(self, traj: Trajectory, config: StrategyConfig) -> bool | None:
        """Whether `traj` answered right AND its own retrieved evidence backs the answer (the share of
        right answers that are not guesses: "evidence-supported EM"). None: the method cannot tell
        (the default; a method without a traced graph has nothing to check the answer against)."""
        return None

    def explain(self, traj: Trajectory, config: StrategyConfig) -> dict[str, Any] | None:
        """What the method's rationalizer sees in `traj`, for a report to draw (JSON-able; never raises on
        the trajectory's content): `status` ("ok" or why nothing was traced), `initial_entities` and
        `target_entities` (graph node keys, `kg.entity_key`), `evidence` (indices into
        `traj.graph.triplets`: the evidence subgraph), `dropped` ({call index as str: {"all": bool,
        "items": [the rendered pairs/triplets the filters removed]}}) and a `note`; optionally `traced_by` and
        `dropped_label`, the words a report uses for them (default "backtracing", "dropped by the filters"). None: the method
        traces nothing (the default; a report then shows the graph and calls as recorded)."""
        return None

    def mechanism(self, trajectories: Sequence[Trajectory], config: StrategyConfig,
                  items_by_id: Mapping[str, QAItem]) -> dict[str, MechanismStat]:
        """Whether the method's own mechanism ran in these scored trajectories (one per question, as
        `evaluate` wrote them; `items_by_id` their questions, for gold evidence): {statistic name:
        MechanismStat}, in the order a table prints them (TRACE's first-step stop rate, DoG's hop-1
        relation accuracy, ...). A statistic whose gold evidence the items lack, or whose denominator is
        otherwise empty, has no value and a note; a trajectory's content (unparseable calls, missing
        meta) never raises. {} (the default): the method reports no such statistic."""
        return {}

    def validate_for_training(self, config: StrategyConfig) -> None:
        """Cross-field rules the self-training loop needs (an adapter per role); raise ValueError."""

    def with_seed(self, config: StrategyConfig, seed: int) -> StrategyConfig:
        return replace(config, seed=seed)

    def decision_prompts(self, config: StrategyConfig, items: Sequence[QAItem], *, retriever: Retriever | None = None,
                         make_generator: Callable[[], Any] | None = None) -> list[Any]:
        """Held-out gold prompts of the method's decisions over `items` (`decisions.DecisionPrompt`s, as
        `config` renders them): where its gold trajectories make each decision and which option they take, for
        measuring a model's decisions (scripts/lab/decisions.py) and calibrating those the engine decides by
        threshold (`threshold_decisions`). `retriever` (the run's) for a method whose prompts show retrieved
        passages; `make_generator` (the raw base model) for one whose gold labels are what that model knows
        (MINTQA-dynamic's certainty); a method that needs one and is given none raises ValueError. [] (the
        default): no decision the method makes at a fixed point between fixed words."""
        return []

    def threshold_decisions(self, config: StrategyConfig) -> frozenset[str]:
        """The decision kinds of `decision_prompts` that the engine (with `config`) decides on a threshold of
        their log-odds (`with_thresholds`), and that self-training therefore calibrates; the others are
        measured only. frozenset() (the default): none."""
        return frozenset()

    def probe_decisions(self, config: StrategyConfig) -> StrategyConfig | None:
        """`config` scoring every calibrated decision and never taking its positive branch (a rollout that visits
        every state a run would decide in), for calibration on the model's own trajectories; None (the default):
        the method cannot, and calibrates on its gold prompts."""
        return None

    def decision_outcomes(self, trajectories: Sequence[Trajectory], items_by_id: Mapping[str, QAItem]
                          ) -> list[tuple[str, float, bool]]:
        """Per scored decision of a probe's trajectories (`probe_decisions`): (kind, log-odds, whether the
        positive branch was right there, judged from the gold answers)."""
        return []

    def with_thresholds(self, config: StrategyConfig, thresholds: Mapping[str, float]) -> StrategyConfig:
        """`config` deciding with `thresholds` ({decision kind: threshold on its log-odds}, as calibrated)."""
        return config


# -- the registry (knowtrace_train.methods registers the built-in methods at import) ------------------------

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
