"""Knowledge backtracing (paper, Section 3.3): evidence subgraphs, the two filters, the FA ratio, SFT records.

    targets.py            target and initial entities
    paths.py              the evidence subgraph S under a path rule; `backtrace(traj)`
    filters.py            unavailing explorations and extraneous completions, token accounting
    training_prompts.py   the prompts of the records (unhinted, without exemplars, re-rendered)
    records.py            `backtrace_trajectories`: records per role and the FA ratio (KnowTrace's rationalizer)
    explain.py            one trajectory as a report draws it (`Method.explain`)
"""

from knowtrace_train.methods.knowtrace.backtrace.filters import FilteredCall, filter_trajectory, generated_triplets
from knowtrace_train.methods.knowtrace.backtrace.paths import TrajectoryBacktrace, backtrace, evidence_subgraph
from knowtrace_train.methods.knowtrace.backtrace.records import (
    MODES,
    BacktraceResult,
    RoleStats,
    backtrace_trajectories,
)
from knowtrace_train.methods.knowtrace.backtrace.targets import Targets, find_target_entities, initial_entity_keys
from knowtrace_train.methods.knowtrace.config import DEFAULT_PATH_RULE, PATH_RULES

__all__ = [
    "DEFAULT_PATH_RULE", "MODES", "PATH_RULES", "BacktraceResult", "FilteredCall", "RoleStats", "Targets",
    "TrajectoryBacktrace", "backtrace", "backtrace_trajectories", "evidence_subgraph", "filter_trajectory",
    "find_target_entities", "generated_triplets", "initial_entity_keys",
]
