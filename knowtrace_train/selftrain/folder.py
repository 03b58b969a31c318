"""The run folder's config.yaml: the config as run and its launch record, and the check a resume must pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knowtrace_train.config import ConfigError, config_to_dict, dump_config, read_yaml
from knowtrace_train.selftrain.config import LAUNCH_KEY, SelfTrainConfig
from knowtrace_train.train.config import gradient_accumulation_for, per_device_batch_for

#: Config keys a rerun may change without invalidating the run folder.
RESUMABLE_CHANGES = ("name", "output_dir", "iterations", "eval_every", "threads", "generator.progress", "retriever.show_progress",
                     "data.test", "data.test_questions",  # the test split is read after the run, never by it
                     "reuse", "eval_beside", "eval_beside_fixed",
                     "report_to", "run_name")  # what the run reports to changes none of its outputs


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def launch_record(config: SelfTrainConfig, processes: int) -> dict[str, Any]:
    """How the run is launched, written into its config.yaml under `launch:` (not a config key: a resume
    must match it): the process count and the effective batch (per device x accumulation x processes)."""
    def effective(tc) -> int:
        return per_device_batch_for(tc, processes) * gradient_accumulation_for(tc, processes) * processes

    return {"processes": processes,
            "effective_batch": {"train": effective(config.train), "bootstrap": effective(config.bootstrap.train)}}


def run_config_text(config: SelfTrainConfig, processes: int) -> str:
    """The run folder's config.yaml: the config as run, then its launch record."""
    import yaml

    return dump_config(config) + "# how the run was launched (a resume must launch the same way)\n" + yaml.safe_dump(
        {LAUNCH_KEY: launch_record(config, processes)}, sort_keys=False)


def check_same_config(config: SelfTrainConfig, saved: Path, processes: int | None = None) -> None:
    """A run folder is resumed only with the config it was started with (a few keys may change:
    RESUMABLE_CHANGES, e.g. more iterations) and under the same launch (process count, hence
    effective batch and each process's share of the data); otherwise raise naming what differs."""
    old_yaml = read_yaml(saved)
    launch = old_yaml.pop(LAUNCH_KEY, None)
    if processes is not None and isinstance(launch, dict) and launch.get("processes") != processes:
        raise ConfigError(
            f"{saved}: this run was launched as {launch.get('processes')} process(es) (effective batch "
            f"{launch.get('effective_batch')}) and is now resumed with {processes}; relaunch it with "
            f"{launch.get('processes')} (another count changes the effective batch and which process saw which "
            "data) or choose another --output_dir")
    old = _flatten(old_yaml)
    new = _flatten(config_to_dict(config))
    differ = sorted(k for k in set(old) | set(new)
                    if old.get(k) != new.get(k) and not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES))
    if differ:
        shown = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in differ[:6])
        raise ConfigError(f"{saved}: this run folder was started with another config: {shown}; "
                          "rerun with the same config or choose another --output_dir")
