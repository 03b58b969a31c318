"""What a self-training run checks in its first seconds, before any work and before its config.yaml is written
(issue 79): a start that fails leaves no config behind to refuse the corrected command.

`preflight(run)`: the run folder and the cache home can be written, the generator's device is present, the model
resolves and its files parse (generation.models.check_model_files), the corpus file's first passages read, the data
files read with enough questions
for the counts asked (loop.select_questions), no dev question is one the run trains on unless `data.allow_overlap`.
`check_inputs(run_dir, config)`: the run folder's inputs.json records the content fingerprints (SHA-256) of its
data files and corpus file; a rerun after any of them changed is refused in one line, unless `--resume_anyway`
(then logged).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from knowtrace_train.errors import RunError, UserError
from knowtrace_train.io import cache_home, file_sha256, read_json, write_json

log = logging.getLogger(__name__)

#: the run folder's record of its inputs' fingerprints
INPUTS_FILE = "inputs.json"


class PreflightError(UserError, ValueError):
    """What the run needs is not there or not usable; found before any work."""

    label = "preflight"


def check_writable(folder: Path, what: str) -> None:
    """A file can be written in `folder`, or, where it does not exist yet, in the nearest folder above it (which must
    be a folder all the way up); else one line naming it. Nothing is left behind."""
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise PreflightError(f"{what} {folder}: {probe} is a file, not a folder: name another folder (or remove the "
                             "file)")
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".knowtrace_preflight_"):
            pass
    except OSError as e:
        raise PreflightError(f"{what} {folder} cannot be written ({probe}: {e.strerror}): choose a writable folder "
                             "or change its permissions") from e


def check_device(device: str) -> None:
    """A CUDA device named (`cuda`, `cuda:1`) is present; `auto` and `cpu` always are."""
    if not device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.split(":", 1)[1]) if ":" in device and device.split(":", 1)[1].isdigit() else 0
    if index >= count:
        raise PreflightError(f"generator.device is {device!r} but this machine has {count} CUDA device(s): "
                             "pass --generator.device cpu (or auto)")


def check_overlap(questions, allow: bool) -> None:
    """No dev question is one the run trains on (the same id: the same file named twice, or splits that share
    rows) unless `allow`. A dev question whose text alone repeats a train question's (real benchmarks hold a few
    such pairs) is counted in a warning, not refused."""
    def norm(text: str) -> str:
        return " ".join(text.lower().split())

    used = [*questions.rollout, *questions.bootstrap, *questions.calibration]
    ids = {it.id for it in used}
    texts = {norm(it.question) for it in used}
    shared = [it for it in questions.dev if it.id in ids]
    same_text = [it for it in questions.dev if it.id not in ids and norm(it.question) in texts]
    if same_text:
        log.warning("%d of the %d dev questions repeat the text of a train question of this run under another id "
                    "(first: %r)", len(same_text), len(questions.dev), same_text[0].id)
    if not shared:
        return
    if not allow:
        raise PreflightError(f"{len(shared)} of the {len(questions.dev)} dev questions are also train questions of "
                             f"this run (first: {shared[0].id!r}): name another data.dev, or pass "
                             "--data.allow_overlap true to evaluate on them all the same")
    log.warning("%d of the %d dev questions are also train questions of this run (data.allow_overlap)", len(shared),
                len(questions.dev))


def preflight(run) -> None:
    """The checks of a fresh start or a resume (`run`: a SelfTrain whose questions are selected)."""
    cfg = run.config
    check_writable(run.run_dir, "output_dir")
    if cfg.reuse:
        check_writable(cache_home(), "the cache home ($KNOWTRACE_CACHE)")
    check_device(cfg.generator.device)
    check_overlap(run.questions, cfg.data.allow_overlap)
    corpus = cfg.data.corpus
    if corpus.source == "file" and corpus.path:  # in memory or as a store, the file is JSON Lines
        from knowtrace_train.data.corpus import check_corpus_head

        check_corpus_head(corpus.path)
    _ = run.base_path  # the model resolves and its files parse


def input_files(config) -> dict[str, Path]:
    """The run's input files that are plain files on disk: data.train, data.dev and the corpus file."""
    out = {"data.train": config.data.train, "data.dev": config.data.dev}
    corpus = config.data.corpus
    if corpus.source in ("file", "generated") and corpus.path:
        out["data.corpus.path"] = corpus.path
    return {k: Path(v) for k, v in out.items() if v and Path(v).is_file()}


def _fingerprint(path: Path, had: dict[str, Any] | None) -> dict[str, Any]:
    st = path.stat()
    if had and had.get("size") == st.st_size and had.get("mtime_ns") == st.st_mtime_ns and had.get("sha256"):
        return had  # unchanged since it was hashed: not read again (a large corpus)
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(path)}


def check_inputs(run_dir: Path, config, is_main: bool) -> None:
    """Record the inputs' fingerprints at a fresh start; on a resume refuse changed contents (one line naming the
    file) unless `config.resume_anyway` (logged)."""
    record = run_dir / INPUTS_FILE
    had: dict[str, Any] = read_json(record) if record.is_file() else {}
    if not isinstance(had, dict):
        raise RunError(f"{record}: expected a JSON object: restore it, or remove it to record the inputs anew")
    now = {key: _fingerprint(path, had.get(key) if isinstance(had.get(key), dict) else None)
           for key, path in input_files(config).items()}
    changed = [k for k in now if isinstance(had.get(k), dict) and had[k].get("sha256") != now[k]["sha256"]]
    if changed:
        shown = ", ".join(f"{k} ({now[k]['path']})" for k in changed)
        if not config.resume_anyway:
            raise RunError(f"{record}: the content of {shown} changed since this run started: its finished stages "
                           "used the old; restore it, choose another --output_dir, or pass --resume_anyway to go on "
                           "with the new")
        log.warning("%s: the content of %s changed since this run started; going on with the new (--resume_anyway)",
                    record, shown)
    if is_main and now != had:
        write_json(record, now)


def pid_stopped(pid: int) -> bool:
    """Whether process `pid` on this machine is stopped (Ctrl-Z, SIGSTOP: state T in /proc/<pid>/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] in ("T", "t")


