"""The run folder's config.yaml: the config as run and its launch record, and the check a resume must pass.

The launch record names the code that made the folder (`launch.version`): the package's version
(`knowtrace_train.__version__`) and, when the package runs from a git checkout, its commit. A resume under another
package version is refused naming both (its stages would mix outputs of two versions), unless `--resume_anyway`;
under another commit of the same version it is only warned about, so a developer's edits and commits do not
refuse every resume. A folder whose record names no version (made before versions were recorded) is resumed with
a warning.
"""

from __future__ import annotations

import functools
import logging
import subprocess
from pathlib import Path
from typing import Any

from knowtrace_train.config import ConfigError, config_to_dict, dump_config, read_yaml
from knowtrace_train.errors import RunError
from knowtrace_train.selftrain.config import LAUNCH_KEY, SelfTrainConfig
from knowtrace_train.train.config import gradient_accumulation_for, per_device_batch_for

#: Config keys a rerun may change without invalidating the run folder.
RESUMABLE_CHANGES = ("name", "output_dir", "iterations", "eval_every", "threads", "generator.progress", "retriever.show_progress",
                     "resume_anyway", "data.allow_overlap", "reuse_wait_minutes",
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


log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """The code that runs: {"package": knowtrace_train.__version__, "commit": the checkout's HEAD, or None where the
    package does not run from a git checkout (an installed wheel) or git is absent}."""
    import knowtrace_train

    root = Path(knowtrace_train.__file__).resolve().parents[1]
    commit = None
    if (root / ".git").exists():  # a folder in a clone, a file in a worktree; never a repository further up
        try:
            out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=10)
            commit = out.stdout.strip() or None if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"package": knowtrace_train.__version__, "commit": commit}


def launch_record(config: SelfTrainConfig, processes: int) -> dict[str, Any]:
    """How the run is launched, written into its config.yaml under `launch:` (not a config key: a resume
    must match it): the process count, the effective batch (per device x accumulation x processes) and the
    code's version (`code_version`)."""
    def effective(tc) -> int:
        return per_device_batch_for(tc, processes) * gradient_accumulation_for(tc, processes) * processes

    return {"processes": processes,
            "effective_batch": {"train": effective(config.train), "bootstrap": effective(config.bootstrap.train)},
            "version": code_version()}


def check_same_version(launch: Any, saved: Path, resume_anyway: bool = False) -> None:
    """Refuse a run folder made by another package version (naming both) unless `resume_anyway`; warn where only
    the commit differs, or where the folder names no version."""
    old = launch.get("version") if isinstance(launch, dict) else None
    new = code_version()
    if not isinstance(old, dict) or "package" not in old:
        log.warning("%s names no version of the code that made it (made before versions were recorded); resuming "
                    "it with knowtrace-train %s", saved, new["package"])
        return
    def shown(v: dict[str, Any]) -> str:
        return f"knowtrace-train {v.get('package')}" + (f" (commit {str(v['commit'])[:12]})" if v.get("commit") else "")

    if old.get("package") != new["package"]:
        if not resume_anyway:
            raise RunError(f"{saved}: this run folder was made by {shown(old)} and this is {shown(new)}: its "
                           "finished stages would mix with another version's; resume it with that version, choose "
                           "another --output_dir, or pass --resume_anyway to go on all the same")
        log.warning("%s: made by %s, resumed by %s (--resume_anyway)", saved, shown(old), shown(new))
    elif old.get("commit") and new["commit"] and old["commit"] != new["commit"]:
        log.warning("%s: made by %s, resumed by %s: the same package version, another commit; resuming", saved,
                    shown(old), shown(new))


def run_config_text(config: SelfTrainConfig, processes: int) -> str:
    """The run folder's config.yaml: the config as run, then its launch record."""
    import yaml

    return dump_config(config) + "# how the run was launched (a resume must launch the same way)\n" + yaml.safe_dump(
        {LAUNCH_KEY: launch_record(config, processes)}, sort_keys=False)


def check_same_config(config: SelfTrainConfig, saved: Path, processes: int | None = None) -> None:
    """A run folder is resumed only with the config it was started with (a few keys may change:
    RESUMABLE_CHANGES, e.g. more iterations), under the same launch (process count, hence effective
    batch and each process's share of the data) and by the same package version (`check_same_version`;
    `config.resume_anyway` lets another one go on); otherwise raise naming what differs."""
    old_yaml = read_yaml(saved)
    launch = old_yaml.pop(LAUNCH_KEY, None)
    check_same_version(launch, saved, bool(getattr(config, "resume_anyway", False)))
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
