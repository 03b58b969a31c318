"""Knowledge backtracing: target and initial entities, the evidence subgraph, the two filters,
the FA ratio and the SFT records of the self-training loop (paper, Section 3.3, Algorithm 2).

From each correct trajectory the evidence subgraph S ⊆ G is traced from the *target entities*
(graph entities named in the final thought and the answer) back to the *initial entities*
(the expansion points exploration introduced). S then filters the trajectory's generations:

- unavailing exploration: a guidance pair whose completion produced no triplet of S is
  removed, and the whole exploration record when no pair is left;
- extraneous completion: a triplet outside S is removed, and the whole completion record
  when no triplet is left.

The final answering exploration is kept. Filtered outputs are written back with
`knowtrace_train.outputs`, the texts the parser reads. `mode="star"` is the non-backtracing
variant (plain STaR: every generation of a correct trajectory is kept) behind the same
interface; the FA ratio is measured the same way in both modes, so runs compare directly.

A trajectory that cannot be backtraced (empty graph, an answer that names no graph entity,
no path to an initial entity) yields no records in backtrace mode and is counted under its
reason; nothing here raises on a trajectory's content.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from knowtrace_train import outputs
from knowtrace_train.data.schema import Passage, QAItem
from knowtrace_train.kg import GuidancePair, KnowledgeGraph, Triplet, normalize_entity
from knowtrace_train.metrics import exact_match, normalize_answer
from knowtrace_train.trajectory import ModelCall, Trajectory

log = logging.getLogger(__name__)

#: How S is traced: "backward" follows the edges back from the targets along the direction in
#: which exploration found them (the entity of the guidance pair that produced a triplet points
#: at the triplet's other entity); "shortest" takes all shortest paths between initial entities
#: and targets on the undirected graph (what the authors' code does).
PATH_RULES = ("backward", "shortest")
#: The default path rule, chosen by the gold-evidence figures of scripts/backtrace_quality.py: on
#: simulated world rollouts "backward" had precision and recall at least as high as "shortest" in
#: every setting (the undirected rule joins the branches of comparison questions through shared
#: entities, and its shortcuts can skip a hop); provisional until real rollouts are measured.
DEFAULT_PATH_RULE = "backward"
MODES = ("backtrace", "star")

EXPLORE, COMPLETE, ANSWER = "explore", "complete", "answer"
ROLES = (EXPLORE, COMPLETE, ANSWER)

#: Why a trajectory gave no backtrace.
SKIP_INCORRECT = "incorrect"
SKIP_EMPTY_GRAPH = "empty_graph"
SKIP_NO_ANSWER_ENTITY = "no_answer_entity"
SKIP_NO_TARGET = "no_target_entity"
SKIP_NO_INITIAL = "no_initial_entity"
SKIP_NO_PATH = "no_path"
SKIP_HINT_LEAK = "hint_leak"
SKIP_NO_ANSWER_CALL = "no_answer_call"
OK = "ok"

_YES_NO = ("yes", "no")
#: Steps of the backward path search per target before it gives up (keeps pathological graphs cheap).
_SEARCH_BUDGET = 200_000


def entity_key(name: str) -> str:
    """Key under which target matching and path search treat two names as one node: the
    official answer normalisation (case, punctuation, articles, spaces)."""
    return normalize_answer(name)


def _pair_key(pair: GuidancePair) -> tuple[str, str]:
    return (entity_key(pair.entity), normalize_entity(pair.guidance))


# -- target and initial entities ------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Target entities (node keys): those named in the thought and those named in the answer
    (or, where the answer names none, the entities that contain the gold answer)."""

    thought: tuple[str, ...] = ()
    answer: tuple[str, ...] = ()

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.answer + self.thought))


def graph_nodes(graph: KnowledgeGraph) -> dict[str, str]:
    """Node key -> first spelling, over the subjects and objects of the graph's triplets."""
    nodes: dict[str, str] = {}
    for t in graph.triplets:
        for name in (t.triplet.subject, t.triplet.object):
            key = entity_key(name)
            if key:
                nodes.setdefault(key, name)
    return nodes


def _match_longest_first(text: str, names: Sequence[str]) -> list[str]:
    """The names (node keys, longest first) that occur as whole-token runs in `text`; a run
    already taken by a longer name is not matched again by a name inside it."""
    tokens = normalize_answer(text).split()
    taken = [False] * len(tokens)
    found: list[str] = []
    for name in names:
        nt = name.split()
        n = len(nt)
        for i in range(len(tokens) - n + 1):
            if tokens[i : i + n] == nt and not any(taken[i : i + n]):
                for j in range(i, i + n):
                    taken[j] = True
                if name not in found:
                    found.append(name)
    return found


def _contains(outer: str, inner: str) -> bool:
    """Whether the token run `inner` occurs in `outer` (both normalised keys)."""
    return bool(inner) and f" {inner} " in f" {outer} "


def find_target_entities(graph: KnowledgeGraph, thought: str | None, answers: Sequence[str]) -> Targets:
    """Graph entities named in the final thought and in the answers (normalised matching,
    longest names first); where the answers name none, the entities containing an answer."""
    nodes = graph_nodes(graph)
    names = sorted(nodes, key=lambda k: (-len(k.split()), -len(k), k))
    in_thought = _match_longest_first(thought or "", names)
    in_answer: list[str] = []
    for a in answers:
        for k in _match_longest_first(a, names):
            if k not in in_answer:
                in_answer.append(k)
    if not in_answer:
        for a in answers:
            ak = entity_key(a)
            if ak in _YES_NO:
                continue
            for k in names:
                if _contains(k, ak) and k not in in_answer:
                    in_answer.append(k)
    return Targets(thought=tuple(in_thought), answer=tuple(in_answer))


def initial_entity_keys(graph: KnowledgeGraph) -> list[str]:
    """The graph nodes of the initial entities the engine recorded. A name that is no node
    resolves to the nodes whose name it contains or is contained in ("The Zone (2017 film)"
    and "The Zone")."""
    nodes = graph_nodes(graph)
    out: list[str] = []
    for e in graph.initial_entities:
        key = entity_key(e.name)
        if not key:
            continue
        if key in nodes:
            hits = [key]
        else:
            hits = [k for k in nodes if _contains(key, k) or _contains(k, key)]
        for k in hits:
            if k not in out:
                out.append(k)
    return out


# -- the evidence subgraph ---------------------------------------------------------------


def _edges(graph: KnowledgeGraph) -> list[tuple[str, str, int]]:
    """(from, to, triplet index), oriented the way exploration found each triplet: from the
    guidance pair's entity to the other entity; subject -> object where the pair is unknown
    or names neither entity. Self-loops are left out."""
    edges = []
    for i, tt in enumerate(graph.triplets):
        s, o = entity_key(tt.triplet.subject), entity_key(tt.triplet.object)
        if not s or not o or s == o:
            continue
        pe = entity_key(tt.pair.entity) if tt.pair is not None else None
        edges.append((o, s, i) if pe == o else (s, o, i))
    return edges


def _backward_paths(graph: KnowledgeGraph, targets: Sequence[str], initials: Sequence[str]) -> set[int]:
    """Triplets on the simple paths that lead from each target back (against the edges) to an
    initial entity; a path stops at the first initial entity it meets."""
    into: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for u, v, i in _edges(graph):
        into[v].append((u, i))
    initial = set(initials)
    found: set[int] = set()
    for t in targets:
        if t in initial:
            continue
        budget = _SEARCH_BUDGET
        # DFS over (node, nodes on path, triplets on path)
        stack: list[tuple[str, frozenset[str], tuple[int, ...]]] = [(t, frozenset([t]), ())]
        while stack:
            budget -= 1
            if budget < 0:
                log.warning("backward path search from %r stopped after %d steps", t, _SEARCH_BUDGET)
                break
            node, seen, path = stack.pop()
            if node in initial and path:
                found.update(path)
                continue
            for u, i in into.get(node, ()):
                if u not in seen:
                    stack.append((u, seen | {u}, path + (i,)))
    return found


def _bfs(adj: Mapping[str, list[tuple[str, int]]], start: str) -> dict[str, int]:
    dist = {start: 0}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v, _ in adj.get(u, ()):
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def _shortest_paths(graph: KnowledgeGraph, targets: Sequence[str], initials: Sequence[str]) -> set[int]:
    """Triplets on all shortest paths between each initial entity and each target, on the
    undirected graph (parallel triplets between two entities are all on the path)."""
    adj: dict[str, list[tuple[str, int]]] = defaultdict(list)
    edge_list = []
    for u, v, i in _edges(graph):
        adj[u].append((v, i))
        adj[v].append((u, i))
        edge_list.append((u, v, i))
    found: set[int] = set()
    from_target = {t: _bfs(adj, t) for t in targets}
    for a in initials:
        da = _bfs(adj, a)
        for t in targets:
            if t == a or t not in da:
                continue
            dt, d = from_target[t], da[t]
            for u, v, i in edge_list:
                for x, y in ((u, v), (v, u)):
                    if x in da and y in dt and da[x] + 1 + dt[y] == d:
                        found.add(i)
    return found


def evidence_subgraph(
    graph: KnowledgeGraph, targets: Sequence[str], initials: Sequence[str], path_rule: str = DEFAULT_PATH_RULE
) -> list[int]:
    """S ⊆ G as sorted indices into `graph.triplets`: the triplets on the paths that lead
    from the target entities back to the initial entities (node keys) under `path_rule`."""
    if path_rule == "backward":
        found = _backward_paths(graph, targets, initials)
    elif path_rule == "shortest":
        found = _shortest_paths(graph, targets, initials)
    else:
        raise ValueError(f"path_rule must be one of {PATH_RULES}, got {path_rule!r}")
    return sorted(found)


@dataclass(frozen=True)
class TrajectoryBacktrace:
    """What backtracing found for one trajectory: `status` is "ok" or the skip reason."""

    trajectory_id: str
    question_id: str
    dataset: str
    status: str
    targets: Targets = Targets()
    initial_entities: tuple[str, ...] = ()
    #: indices into the trajectory graph's triplets
    evidence: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == OK


def _answer_strings(traj: Trajectory) -> list[str]:
    """The answer side of [t, â]: the prediction and the gold answers it matches."""
    out = []
    if traj.prediction:
        out.append(traj.prediction)
    matched = [a for a in traj.answers if traj.prediction and exact_match(traj.prediction, a)]
    for a in matched or list(traj.answers[:1]):
        if a not in out:
            out.append(a)
    return out


def backtrace(traj: Trajectory, path_rule: str = DEFAULT_PATH_RULE) -> TrajectoryBacktrace:
    """Trace the evidence subgraph of one (correct) trajectory. Never raises on its content."""
    base = dict(trajectory_id=traj.id, question_id=traj.question_id, dataset=traj.dataset)
    if path_rule not in PATH_RULES:
        raise ValueError(f"path_rule must be one of {PATH_RULES}, got {path_rule!r}")
    if not traj.graph.triplets:
        return TrajectoryBacktrace(status=SKIP_EMPTY_GRAPH, **base)
    answers = _answer_strings(traj)
    targets = find_target_entities(traj.graph, traj.thought, answers)
    yes_no = any(entity_key(a) in _YES_NO for a in answers)
    if not targets.answer and not yes_no:
        return TrajectoryBacktrace(status=SKIP_NO_ANSWER_ENTITY, targets=targets, **base)
    if not targets.all:
        return TrajectoryBacktrace(status=SKIP_NO_TARGET, targets=targets, **base)
    initials = initial_entity_keys(traj.graph)
    if not initials:
        return TrajectoryBacktrace(status=SKIP_NO_INITIAL, targets=targets, **base)
    evidence = evidence_subgraph(traj.graph, targets.all, initials, path_rule)
    status = OK if evidence else SKIP_NO_PATH
    return TrajectoryBacktrace(
        status=status, targets=targets, initial_entities=tuple(initials), evidence=tuple(evidence), **base
    )


# -- reading a trajectory's calls ----------------------------------------------------------


def _as_triplet(x: Any) -> Triplet | None:
    if isinstance(x, Triplet):
        return x
    if isinstance(x, (list, tuple)) and len(x) == 3:
        return Triplet(*(str(v) for v in x))
    if isinstance(x, dict) and {"subject", "relation", "object"} <= set(x):
        return Triplet(str(x["subject"]), str(x["relation"]), str(x["object"]))
    return None


def _as_pair(x: Any) -> GuidancePair | None:
    if isinstance(x, GuidancePair):
        return x
    if isinstance(x, (list, tuple)) and len(x) == 2:
        return GuidancePair(str(x[0]), str(x[1]))
    if isinstance(x, dict) and {"entity", "guidance"} <= set(x):
        return GuidancePair(str(x["entity"]), str(x["guidance"]))
    return None


def generated_triplets(call: ModelCall, graph: KnowledgeGraph) -> list[Triplet]:
    """The triplets a completion call generated: its parsed triplets (duplicates of graph
    triplets included), else the graph triplets it added."""
    out: list[Triplet] = []
    seen: set[tuple[str, str, str]] = set()
    parsed = (call.parsed or {}).get("triplets") if isinstance(call.parsed, dict) else None
    rows = list(parsed or ())
    rows += [graph.triplets[i].triplet for i in call.triplets if 0 <= i < len(graph.triplets)]
    for row in rows:
        t = _as_triplet(row)
        if t is not None and t.key() not in seen:
            seen.add(t.key())
            out.append(t)
    return out


def _is_answer_call(call: ModelCall) -> bool:
    if call.role == ANSWER:
        return True
    p = call.parsed if isinstance(call.parsed, dict) else {}
    return call.role == EXPLORE and bool(p.get("answer")) and p.get("sufficient") is not False


def exploration_pairs(call: ModelCall, traj: Trajectory) -> list[GuidancePair]:
    """The guidance pairs of an exploration call: the parsed ones, else the pairs of the
    completion calls that followed it (up to the next exploration)."""
    p = call.parsed if isinstance(call.parsed, dict) else {}
    pairs = [q for q in (_as_pair(x) for x in p.get("pairs") or ()) if q is not None]
    if pairs:
        return pairs
    return [c.pair for c in _served_completions(call, traj) if c.pair is not None]


def _served_completions(call: ModelCall, traj: Trajectory) -> list[ModelCall]:
    """Completion calls between this exploration and the next exploration or answer call."""
    out = []
    after = False
    for c in sorted(traj.calls, key=lambda c: c.index):
        if c.index == call.index:
            after = True
            continue
        if not after:
            continue
        if c.role in (EXPLORE, ANSWER):
            break
        if c.role == COMPLETE:
            out.append(c)
    return out


# -- the two filters ---------------------------------------------------------------------


@dataclass
class FilteredCall:
    """One model call after the filters: the output to train on (None: record dropped),
    and its token accounting (`tokens_filtered` + `tokens_kept` == `tokens_all`)."""

    call: ModelCall
    role: str
    output: str | None
    #: the unfiltered content written in the same canonical format (what STaR trains on)
    full_output: str | None
    items_all: int
    items_kept: int
    tokens_all: int
    tokens_filtered: int

    @property
    def tokens_kept(self) -> int:
        return self.tokens_all - self.tokens_filtered

    @property
    def kept(self) -> bool:
        return self.output is not None


def _answer_texts(call: ModelCall, traj: Trajectory) -> tuple[str, str] | None:
    p = call.parsed if isinstance(call.parsed, dict) else {}
    thought = p.get("thought") or traj.thought
    answer = p.get("answer") or traj.prediction
    if not answer:
        return None
    return (thought or "").strip(), str(answer)


def answer_output(thought: str, answer: str) -> str:
    """The canonical answering output, of an exploration that answers and of the forced
    answering call alike (whose output starts with the answer prefix it was sent)."""
    return outputs.exploration_answer(thought, answer)


def _bounded(n: int, limit: int) -> int:
    return max(0, min(n, limit))


def filter_trajectory(
    traj: Trajectory, evidence: Iterable[int] | None, count_tokens: Callable[[str], int]
) -> list[FilteredCall]:
    """Apply the two filters to every explore/complete/answer call of a trajectory.
    `evidence` None means the trajectory has no backtrace: every record is dropped."""
    s_keys = None if evidence is None else {traj.graph.triplets[i].triplet.key() for i in evidence}
    calls = sorted(traj.calls, key=lambda c: c.index)
    completion_triplets = {c.index: generated_triplets(c, traj.graph) for c in calls if c.role == COMPLETE}
    out: list[FilteredCall] = []
    for call in calls:
        if call.role not in ROLES:
            continue
        n_all = count_tokens(call.output or "")
        if _is_answer_call(call):
            texts = _answer_texts(call, traj)
            full = None if texts is None else answer_output(*texts)
            keep = full is not None and s_keys is not None
            out.append(FilteredCall(call, call.role, full if keep else None, full, 1, int(keep), n_all,
                                    0 if keep else n_all))
        elif call.role == COMPLETE:
            gen = completion_triplets.get(call.index, [])
            full = outputs.completion(gen)
            kept = [] if s_keys is None else [t for t in gen if t.key() in s_keys]
            out.append(_partial(call, COMPLETE, full, kept, gen, outputs.completion(kept),
                                [t.render() for t in gen if t not in kept], n_all, count_tokens))
        elif call.role == EXPLORE:
            pairs = exploration_pairs(call, traj)
            full = outputs.exploration_guidance(pairs) if pairs else None
            served = _served_completions(call, traj)
            kept = []
            if s_keys is not None:
                for p in pairs:
                    produced = [t for c in served if c.pair is not None and _pair_key(c.pair) == _pair_key(p)
                                for t in completion_triplets.get(c.index, [])]
                    if any(t.key() in s_keys for t in produced):
                        kept.append(p)
            out.append(_partial(call, EXPLORE, full, kept, pairs, outputs.exploration_guidance(kept),
                                [p.render() for p in pairs if p not in kept], n_all, count_tokens))
    return out


def _partial(call, role, full, kept, all_items, kept_text, removed_lines, n_all, count_tokens) -> FilteredCall:
    if not kept:
        return FilteredCall(call, role, None, full, len(all_items), 0, n_all, n_all)
    removed = _bounded(count_tokens("\n".join(removed_lines)), n_all) if removed_lines else 0
    return FilteredCall(call, role, kept_text, full, len(all_items), len(kept), n_all, removed)


# -- training prompts ----------------------------------------------------------------------


def _prompts():
    from knowtrace_train import prompts

    return prompts


def _head_swap(fewshot_text: str, plain_text: str) -> tuple[str, str]:
    """The differing prefixes of the same prompt with and without exemplars."""
    n = 0
    while n < min(len(fewshot_text), len(plain_text)) and fewshot_text[-1 - n] == plain_text[-1 - n]:
        n += 1
    return fewshot_text[: len(fewshot_text) - n], plain_text[: len(plain_text) - n]


def _heads(role: str) -> list[tuple[str, str, str]]:
    """(kg_format, few-shot head, plain head) of a role's prompt: the exemplars are a fixed
    block, so removing them is a prefix swap that keeps the rest of the prompt exactly."""
    p = _prompts()
    if role == COMPLETE:
        pair = GuidancePair("E", "G")
        return [("", *_head_swap(p.render_completion_prompt(pair, [], fewshot=True),
                                 p.render_completion_prompt(pair, [], fewshot=False)))]
    out = []
    for fmt in p.KG_FORMATS:
        kw = dict(kg_format=fmt, kg_text=None)
        out.append((fmt, *_head_swap(p.render_exploration_prompt("Q", [], fewshot=True, **kw),
                                     p.render_exploration_prompt("Q", [], fewshot=False, **kw))))
    # a longer head first: "paths"/"text" heads extend the "triplets" one
    return sorted(out, key=lambda h: -len(h[1]))


def _detect_kg_format(prompt: str) -> str | None:
    for fmt, with_shots, plain in _heads(EXPLORE):
        if prompt.startswith(with_shots) or prompt.startswith(plain):
            return fmt
    return None


def _without_fewshot(prompt: str, role: str) -> str | None:
    """The same prompt without the exemplars; None where it matches no known head."""
    for _, with_shots, plain in _heads(role):
        if prompt.startswith(with_shots):
            return plain + prompt[len(with_shots) :]
    for _, with_shots, plain in _heads(role):
        if prompt.startswith(plain):
            return prompt
    return None


@dataclass(frozen=True)
class PromptOptions:
    """How training prompts are made. `fewshot=False` drops the exemplars (cheaper training
    and rollouts); `rerender=True` shows later explorations only the surviving triplets."""

    fewshot: bool = True
    rerender: bool = False
    #: graph rendering for re-rendered exploration prompts; None: as the rollout prompt used
    kg_format: str | None = None


def _render_exploration(
    question: str, triplets: list[Triplet], opts: PromptOptions, seen: str, recorded: str | None = None
) -> str | None:
    p = _prompts()
    fmt = opts.kg_format or recorded or _detect_kg_format(seen) or "triplets"
    if fmt == "text" and triplets:
        return None  # needs a KG-to-Text model call
    return p.render_exploration_prompt(question, triplets, fewshot=opts.fewshot, kg_format=fmt)


def training_prompt(
    fc: FilteredCall,
    traj: Trajectory,
    question: str,
    s_keys: set[tuple[str, str, str]] | None,
    opts: PromptOptions,
    passages: Mapping[str, Passage],
) -> str | None:
    """The prompt of an SFT record: the one the model saw, with the plain question where the
    rollout was hinted, without exemplars or with only surviving triplets as `opts` asks.
    None where it cannot be made (a passage of a completion prompt is unknown)."""
    from knowtrace_train.rationalization import unhint_prompt

    call = fc.call
    prompt = call.prompt
    hinted = question.strip() != traj.question.strip()
    if fc.role in (EXPLORE, ANSWER):
        if opts.rerender and s_keys is not None:
            shown = [t.triplet for t in traj.graph.triplets if t.call < call.index and t.triplet.key() in s_keys]
            return _render_exploration(question, shown, opts, prompt, traj.meta.get("kg_format"))
        if hinted:
            plain = unhint_prompt(prompt, traj.question, question)
            if plain is None:
                shown = [t.triplet for t in traj.graph.triplets if t.call < call.index]
                return _render_exploration(question, shown, opts, prompt, traj.meta.get("kg_format"))
            prompt = plain
        if not opts.fewshot:
            stripped = _without_fewshot(prompt, fc.role)
            if stripped is None:
                shown = [t.triplet for t in traj.graph.triplets if t.call < call.index]
                return _render_exploration(question, shown, opts, prompt, traj.meta.get("kg_format"))
            prompt = stripped
        return prompt
    if not opts.fewshot:
        stripped = _without_fewshot(prompt, COMPLETE)
        if stripped is not None:
            return stripped
        if call.pair is None or any(pid not in passages for pid in call.passage_ids):
            return None
        return _prompts().render_completion_prompt(
            call.pair, [passages[pid] for pid in call.passage_ids], fewshot=False
        )
    return prompt


# -- the public entry point ------------------------------------------------------------------


@dataclass
class RoleStats:
    """Counts of one role over the correct trajectories (records and tokens as backtracing
    filters them, whatever the mode) and the records this run wrote."""

    calls: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    items_all: int = 0
    items_kept: int = 0
    tokens_all: int = 0
    tokens_filtered: int = 0
    records_written: int = 0

    @property
    def tokens_kept(self) -> int:
        return self.tokens_all - self.tokens_filtered

    @property
    def fa_ratio(self) -> float:
        return self.tokens_filtered / self.tokens_all if self.tokens_all else 0.0

    def add(self, fc: FilteredCall) -> None:
        self.calls += 1
        self.records_kept += int(fc.kept)
        self.records_dropped += int(not fc.kept)
        self.items_all += fc.items_all
        self.items_kept += fc.items_kept
        self.tokens_all += fc.tokens_all
        self.tokens_filtered += fc.tokens_filtered

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "records_kept": self.records_kept,
            "records_dropped": self.records_dropped,
            "items_all": self.items_all,
            "items_kept": self.items_kept,
            "tokens_all": self.tokens_all,
            "tokens_kept": self.tokens_kept,
            "tokens_filtered": self.tokens_filtered,
            "fa_ratio": self.fa_ratio,
            "records_written": self.records_written,
        }


@dataclass
class BacktraceResult:
    """SFT records per role, the JSON-able statistics (FA ratio overall and per role, and the
    counts behind it) and each correct trajectory's backtrace."""

    records_by_role: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any]
    traces: list[TrajectoryBacktrace] = field(default_factory=list)

    def write(self, folder: str | Path) -> dict[str, Path]:
        """Write `sft_<role>.jsonl` for every role (empty files included) and
        `backtrace_stats.json` into `folder`, each atomically; returns the record files."""
        from knowtrace_train.io import write_json, write_jsonl

        folder = Path(folder)
        paths = {}
        for role in ROLES:
            paths[role] = folder / f"sft_{role}.jsonl"
            write_jsonl(paths[role], self.records_by_role.get(role, []))
        write_json(folder / "backtrace_stats.json", self.stats)
        return paths


def is_correct(traj: Trajectory) -> bool:
    """Exact match of the prediction (the trajectory's own `em` where scoring filled it)."""
    if traj.em is not None:
        return traj.em >= 1.0
    return bool(traj.prediction) and any(exact_match(traj.prediction or "", a) for a in traj.answers)


def backtrace_trajectories(
    trajectories: Iterable[Trajectory],
    items_by_id: Mapping[str, QAItem] | None = None,
    *,
    count_tokens: Callable[[str], int],
    mode: str = "backtrace",
    path_rule: str = DEFAULT_PATH_RULE,
    fewshot: bool = True,
    rerender: bool = False,
    kg_format: str | None = None,
    iteration: int | None = None,
    passages: Mapping[str, Passage] | None = None,
) -> BacktraceResult:
    """Algorithm 2, lines 6-11: keep the correct trajectories, backtrace each, filter its
    generations (mode "backtrace") or keep them all (mode "star"), and write SFT records
    {"prompt", "completion", "role", "trajectory_id", "iteration"} per role.

    `items_by_id` gives the plain question of hinted (rationalization) rollouts and the
    passages for re-rendered completion prompts (with `passages`). FA counts every output
    token of the correct trajectories with `count_tokens` (the model's tokenizer)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if path_rule not in PATH_RULES:
        raise ValueError(f"path_rule must be one of {PATH_RULES}, got {path_rule!r}")
    from knowtrace_train.rationalization import mentions_hint

    items_by_id = items_by_id or {}
    if passages is None:
        passages = {p.id: p for it in items_by_id.values() for p in it.context}
    opts = PromptOptions(fewshot=fewshot, rerender=rerender, kg_format=kg_format)
    records: dict[str, list[dict[str, Any]]] = {r: [] for r in ROLES}
    roles = {r: RoleStats() for r in ROLES}
    reasons: dict[str, int] = defaultdict(int)
    traces: list[TrajectoryBacktrace] = []
    n_traj = n_correct = n_ok = n_hinted = prompt_unavailable = 0
    ok_all = ok_filtered = 0  # tokens of the backtraced trajectories alone
    graph_triplets = evidence_triplets = 0

    for traj in trajectories:
        n_traj += 1
        if not is_correct(traj):
            reasons[SKIP_INCORRECT] += 1
            continue
        n_correct += 1
        item = items_by_id.get(traj.question_id)
        question = item.question if item is not None else traj.question
        hinted = question.strip() != traj.question.strip()
        n_hinted += int(hinted)
        bt = backtrace(traj, path_rule)
        if bt.ok and not any(_is_answer_call(c) for c in traj.calls):
            bt = TrajectoryBacktrace(bt.trajectory_id, bt.question_id, bt.dataset, SKIP_NO_ANSWER_CALL,
                                     bt.targets, bt.initial_entities, ())
        leak = hinted and (mentions_hint(traj.thought) or any(
            mentions_hint((_answer_texts(c, traj) or ("", ""))[0]) for c in traj.calls if _is_answer_call(c)))
        if bt.ok and leak:
            bt = TrajectoryBacktrace(bt.trajectory_id, bt.question_id, bt.dataset, SKIP_HINT_LEAK,
                                     bt.targets, bt.initial_entities, ())
        traces.append(bt)
        if bt.ok:
            n_ok += 1
            graph_triplets += len(traj.graph.triplets)
            evidence_triplets += len(bt.evidence)
        else:
            reasons[bt.status] += 1
        filtered = filter_trajectory(traj, bt.evidence if bt.ok else None, count_tokens)
        s_keys = {traj.graph.triplets[i].triplet.key() for i in bt.evidence} if bt.ok else None
        star = mode == "star"
        star_ok = not leak  # never train on a rationale that needs the hint
        for fc in filtered:
            roles[fc.role].add(fc)
            if bt.ok:
                ok_all += fc.tokens_all
                ok_filtered += fc.tokens_filtered
            target = fc.full_output if star else fc.output
            if target is None or (star and not star_ok):
                continue
            prompt = training_prompt(fc, traj, question, None if star else s_keys, opts, passages)
            if prompt is None:
                prompt_unavailable += 1
                continue
            records[fc.role].append({
                "prompt": prompt,
                "completion": target,
                "role": fc.role,
                "trajectory_id": traj.id,
                "iteration": iteration if iteration is not None else traj.iteration,
            })
            roles[fc.role].records_written += 1

    tokens_all = sum(r.tokens_all for r in roles.values())
    tokens_filtered = sum(r.tokens_filtered for r in roles.values())
    stats: dict[str, Any] = {
        "mode": mode,
        "path_rule": path_rule,
        "fewshot": fewshot,
        "rerender": rerender,
        "trajectories": n_traj,
        "correct": n_correct,
        "backtraced": n_ok,
        "hinted": n_hinted,
        "skipped": dict(sorted(reasons.items())),
        "graph_triplets": graph_triplets,
        "evidence_triplets": evidence_triplets,
        "tokens_all": tokens_all,
        "tokens_kept": tokens_all - tokens_filtered,
        "tokens_filtered": tokens_filtered,
        "fa_ratio": tokens_filtered / tokens_all if tokens_all else 0.0,
        # the same ratio over the trajectories that backtraced (skipped ones count as all filtered above)
        "fa_ratio_backtraced": ok_filtered / ok_all if ok_all else 0.0,
        "roles": {r: s.to_dict() for r, s in roles.items()},
        "records": {r: len(v) for r, v in records.items()},
        "prompt_unavailable": prompt_unavailable,
    }
    log.info("backtracing: %d/%d correct trajectories backtraced, FA %.3f", n_ok, n_correct, stats["fa_ratio"])
    return BacktraceResult(records_by_role=records, stats=stats, traces=traces)
