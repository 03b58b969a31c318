"""KnowTrace (the paper's method): exploration and completion over a traced graph, backtracing, gold trajectories.

    config.py      KnowTraceConfig and the call kinds
    engine.py      Algorithm 1 as a batched rollout engine (`KnowTrace`)
    prompts/       the Appendix D prompts as data files; outputs.py: the canonical output texts
    parsing.py     tolerant parsing of model outputs
    backtrace/     targets, paths, filters, training prompts, records: the "backtrace" rationalizer
    gold.py        gold trajectories (the bootstrap's records)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from knowtrace_train.data.schema import QAItem
from knowtrace_train.methods.base import Method, Rationalizer
from knowtrace_train.methods.knowtrace.config import (
    ANSWER,
    COMPLETE,
    EXPLORE,
    KG_TO_TEXT,
    RECORD_KINDS,
    STRATEGY_NAME,
    FewShotConfig,
    KnowTraceConfig,
    MaxNewTokensConfig,
    RoleConfig,
)
from knowtrace_train.methods.knowtrace.engine import KnowTrace
from knowtrace_train.retrieval.base import Retriever
from knowtrace_train.trajectory import Trajectory, is_correct


#: a judgement threshold no log-odds reach: the calibration's probe scores every judgement and says No
PROBE_THRESHOLD = 1e9


def backtrace_records(trajectories, items_by_id, *, strategy: KnowTraceConfig, count_tokens, fewshot, iteration,
                      passages, mode: str = "backtrace", undesirable=()):
    """The rationalizer of mode "backtrace" (and KnowTrace's "star": the same accounting, nothing filtered)."""
    from knowtrace_train.methods.knowtrace.backtrace.records import backtrace_trajectories

    return backtrace_trajectories(trajectories, items_by_id, count_tokens=count_tokens, mode=mode,
                                  path_rule=strategy.path_rule, fewshot=fewshot, iteration=iteration, passages=passages,
                                  undesirable=undesirable, prompt_set=strategy.prompts)


def star_records(trajectories, items_by_id, **kw):
    """KnowTrace's STaR: every generation of a correct trajectory, written in the canonical output texts,
    with the FA ratio measured as backtracing would filter (so the two modes compare directly)."""
    return backtrace_records(trajectories, items_by_id, mode="star", **kw)


class KnowTraceMethod(Method):
    name = STRATEGY_NAME
    config_class = KnowTraceConfig

    def strategy(self, config: KnowTraceConfig) -> KnowTrace:
        return KnowTrace(config)

    def record_roles(self, config: KnowTraceConfig) -> dict[str, str]:
        r = config.roles
        return {EXPLORE: r.explore, COMPLETE: r.complete, ANSWER: r.answer}

    def generator_roles(self, config: KnowTraceConfig) -> set[str]:
        used = set(self.record_roles(config).values())
        if config.kg_format == "text":
            used.add(config.roles.kg_to_text)
        return used

    def rationalizers(self) -> dict[str, Rationalizer]:
        return {"backtrace": backtrace_records, "star": star_records}

    def credited_calls(self, trajectories, *, strategy: KnowTraceConfig, count_tokens) -> dict[str, set[int]]:
        """Backtracing's credit: per correct trajectory, the calls whose outputs reached the evidence subgraph."""
        from knowtrace_train.methods.knowtrace.backtrace.records import evidence_calls

        return evidence_calls(trajectories, count_tokens=count_tokens, path_rule=strategy.path_rule)

    def for_model(self, config: KnowTraceConfig, trained: frozenset[str], fewshot_trained: bool) -> KnowTraceConfig:
        """Prompts of trained roles follow `fewshot_trained`; untrained roles keep the configured exemplars."""

        def shots(role: str, configured: bool) -> bool:
            return fewshot_trained if role in trained else configured

        r, f = config.roles, config.fewshot
        return dataclasses.replace(config, fewshot=FewShotConfig(
            explore=shots(r.explore, f.explore), complete=shots(r.complete, f.complete),
            kg_to_text=shots(r.kg_to_text, f.kg_to_text)))

    def gold_records(self, config: KnowTraceConfig, items: Sequence[QAItem], retriever: Retriever, *, fewshot: bool,
                     require_support: bool, count_tokens: Callable[[str], int], iteration: int | None,
                     make_generator=None, facts=None):
        from knowtrace_train.methods.knowtrace.gold import gold_trajectory_records

        return gold_trajectory_records(items, retriever, k=config.passages, fewshot=fewshot, kg_format=config.kg_format,
                                       require_support=require_support, count_tokens=count_tokens, iteration=iteration,
                                       prefill_judgement=config.prefill_judgement, prompt_set=config.prompts,
                                       facts=facts, noise=config.gold_noise, seed=config.seed,
                                       max_pairs=config.max_pairs)

    def evidence_supported(self, traj: Trajectory, config: KnowTraceConfig) -> bool:
        """Correct, and backtracing finds the evidence subgraph in the trajectory's own graph: a path
        from the answer entity (for a yes/no answer, the entities of the final thought) back to an
        initial entity under `config.path_rule`."""
        from knowtrace_train.methods.knowtrace.backtrace.paths import backtrace

        return is_correct(traj) and backtrace(traj, config.path_rule).ok

    def explain(self, traj: Trajectory, config: KnowTraceConfig) -> dict:
        """The backtrace of `traj` under `config.path_rule` and what the filters drop (backtrace/explain.py)."""
        from knowtrace_train.methods.knowtrace.backtrace.explain import explain_trajectory

        return explain_trajectory(traj, config.path_rule)

    def mechanism(self, trajectories: Sequence[Trajectory], config: KnowTraceConfig, items_by_id) -> dict:
        """Rounds per question (exploration rounds run, summed over the questions) and the evidence-supported
        EM (questions answered right whose own graph backtracing finds the evidence for, `evidence_supported`,
        over the questions): how much of the EM the traced graph backs rather than a guess."""
        from knowtrace_train.methods.base import MechanismStat
        from knowtrace_train.metrics import exact_match

        n = len(trajectories)
        note = None if n else "no trajectories"
        rounds = sum(t.rounds for t in trajectories if isinstance(t.rounds, int) and t.rounds >= 0)
        supported = sum(1 for t in trajectories if self.evidence_supported(t, config)
                        and t.prediction is not None and any(exact_match(t.prediction, a) for a in t.answers))
        return {"rounds_per_question": MechanismStat(rounds, n, note),
                "evidence_supported_em": MechanismStat(supported, n, note)}

    def decision_prompts(self, config: KnowTraceConfig, items: Sequence[QAItem], *, retriever=None,
                         make_generator=None) -> list:
        """The sufficiency judgement's held-out gold prompts: per item with a gold chain of n hops, the n + 1
        exploration prompts of its gold trajectory (No while a hop is missing, Yes once the chain is in the
        graph), as `config` renders them (its exemplars, its graph format)."""
        from knowtrace_train.methods.knowtrace.judgement import as_decision_prompt, gold_judgement_prompts

        if not config.prefill_judgement:
            return []
        prompts, _ = gold_judgement_prompts(items, fewshot=config.fewshot.explore, kg_format=config.kg_format,
                                            prompt_set=config.prompts)
        return [as_decision_prompt(p, config.roles.explore) for p in prompts]

    def threshold_decisions(self, config: KnowTraceConfig) -> frozenset[str]:
        """The sufficiency judgement, where the engine feeds the judgement words (and so can score what follows)."""
        from knowtrace_train.methods.knowtrace.outputs import SUFFICIENCY

        return frozenset({SUFFICIENCY}) if config.prefill_judgement else frozenset()

    def probe_decisions(self, config: KnowTraceConfig) -> KnowTraceConfig | None:
        """Every judgement scored, none Yes (a threshold no log-odds reach): each question explores until it stops
        (no progress, L rounds), through every graph a run of the model could judge."""
        return dataclasses.replace(config, judgement_threshold=PROBE_THRESHOLD) if config.prefill_judgement else None

    def decision_outcomes(self, trajectories, items_by_id) -> list[tuple[str, float, bool]]:
        """Each scored exploration: Yes was right where the graph it was shown names a gold answer
        (`judgement.graph_names_answer`, the criterion docs/decisions.md measures the judgement by)."""
        from knowtrace_train.methods.knowtrace.judgement import graph_names_answer
        from knowtrace_train.methods.knowtrace.outputs import SUFFICIENCY

        return [(SUFFICIENCY, float(c.parsed["judgement_log_odds"]), graph_names_answer(t, c))
                for t in trajectories for c in t.calls
                if c.role == EXPLORE and isinstance(c.parsed, dict) and c.parsed.get("judgement_log_odds") is not None]

    def with_thresholds(self, config: KnowTraceConfig, thresholds) -> KnowTraceConfig:
        from knowtrace_train.methods.knowtrace.outputs import SUFFICIENCY

        t = thresholds.get(SUFFICIENCY)
        return config if t is None else dataclasses.replace(config, judgement_threshold=float(t))

    def validate_for_training(self, config: KnowTraceConfig) -> None:
        roles = config.roles
        if roles.explore == roles.complete:
            raise ValueError("strategy.roles.explore and strategy.roles.complete must name two adapters")
        if roles.answer not in (roles.explore, roles.complete):
            raise ValueError("strategy.roles.answer must be the exploration or the completion role")
        if config.kg_format == "text" and roles.kg_to_text in (roles.explore, roles.complete):
            raise ValueError("strategy.roles.kg_to_text must be a role of its own (it runs on M0)")


__all__ = [
    "ANSWER", "COMPLETE", "EXPLORE", "KG_TO_TEXT", "RECORD_KINDS", "STRATEGY_NAME", "FewShotConfig", "KnowTrace",
    "KnowTraceConfig", "KnowTraceMethod", "MaxNewTokensConfig", "RoleConfig",
]
