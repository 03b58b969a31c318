"""Reuse across runs: stage outputs that no run setting but their own inputs shapes, kept in the cache home by content.

The raw base's dev evaluation and probe, M0 (the bootstrap's LoRA training and merge), M0's dev
evaluation and the first iteration's rollouts depend neither on `mode`, `iterations` nor any `train.*`
key: the STaR comparison run, a rerun with other iteration settings and every point of a grid would
redo them. With `reuse: true` (the default) each of them is looked up, before it runs, under a key
= SHA-256 of a JSON of exactly the inputs its output depends on (`key.json` lists them), in

    <cache home>/runs/<stage>/<key[:24]>/     stage: eval, probe, rollout (a model over questions), m0
        eval.jsonl | probe.jsonl | rollouts.jsonl     the stage's file, as the run folder holds it
        model/, bootstrap_adapters/<a>/               M0 (and its merged adapters), for stage m0
        key.json                                      written last: key, stage, inputs, files (name ->
                                                      bytes), sha256 (name -> SHA-256 of its bytes, taken
                                                      as it is stored), info (the stage's figures), made_by

(`<cache home>` is $KNOWTRACE_CACHE, else ~/.cache/knowtrace-train: `knowtrace_train.io.cache_home`).
A hit needs a key.json whose key and inputs equal this run's and every file it lists present with its size and
SHA-256 (a same-size corrupt or edited file is caught; checking reads each file once, which the stage then
reads anyway: the trajectories copied, M0 loaded); anything else is logged as a warning naming what is wrong
and the stage is rebuilt (and the entry replaced), never used. On a hit the run folder still gets its files
(the JSONL files copied; M0's files hard-linked, no extra disk, or where links cannot be made m0.json points
at the cache folder) and the stage's DONE marker says `"reused_from": "<cache folder>"`. Under several
processes the main process decides hit or miss and tells the others; only it reads and writes the cache.

Runs side by side (the STaR comparison beside the backtracing run, with one cache home) share an entry through
its lock, `<cache home>/runs/locks/<stage>/<key[:24]>.lock` (selftrain/entry_lock.py): an OS file lock (flock)
that a run holds from its lookup until it has stored what it computed, or copied what it reused. A run that
needs an entry another live run holds waits for it (logging every `KNOWTRACE_REUSE_WAIT_LOG_S` seconds, 60 by
default, which run holds it: its folder, pid, host and since when) and then reuses it; the kernel releases the
lock of a process that dies, so a killed run's lock is simply taken and its stage computed anew. An entry is
removed or replaced only under its lock, so no reader sees it half-written or being replaced.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from knowtrace_train.config import config_to_dict
from knowtrace_train.errors import installed_version
from knowtrace_train.io import atomic_dir, cache_home, disk_space, file_sha256, model_identity, read_json, write_json
from knowtrace_train.selftrain.entry_lock import EntryLock
from knowtrace_train.selftrain.models import generator_config, m0_path, sampling
from knowtrace_train.stages import LEFTOVER

log = logging.getLogger(__name__)

#: the cache home's folder for stage outputs
CACHE_FOLDER = "runs"
KEY_FILE = "key.json"
#: the folder under the cache's root that holds one lock file per entry (kept apart: a stage's folder lists entries only)
LOCKS = "locks"
#: part of every key: raise it when what a stage stores changes in a way its inputs do not show
FORMAT = 1

#: generator settings that cannot change an output: batching (the transformers backend decodes the same
#: greedy tokens whatever the batch, see generation/hf.py), where models are cached, progress bars, memory
GENERATOR_NOT_IN_KEY = ("model", "batch_size", "progress", "cache_dir", "prefix_cache_size",
                        "gpu_memory_utilization", "cpu_kvcache_gib")
#: retriever settings that cannot change a result: where indexes are cached, progress bars, the timeout, a search
#: server's index layout (over several shards a search gathers corpus-wide statistics first) and waiting for it
RETRIEVER_NOT_IN_KEY = ("cache_dir", "show_progress", "timeout_s", "recreate", "shards", "replicas", "index_wait_s")
#: libraries whose version can change a model's outputs or training
LIBRARIES = ("torch", "transformers", "peft", "trl", "accelerate", "bm25s", "vllm", "sentence-transformers")


# -- what a key is made of --------------------------------------------------------------------------------


def digest(obj: Any) -> str:
    """SHA-256 of `obj` as canonical JSON (sorted keys)."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=1)
def code_identity() -> dict[str, Any]:
    """The code that computes every stage: SHA-256 of the knowtrace_train package's files (prompts
    included) and the versions of the libraries that run the models. Any change is another key."""
    import knowtrace_train

    root = Path(knowtrace_train.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            h.update(str(p.relative_to(root)).encode("utf-8") + b"\0")
            h.update(p.read_bytes() + b"\0")
    return {"package": h.hexdigest(), "libraries": {lib: installed_version(lib) for lib in LIBRARIES}}


def settings(obj: Any, leave_out: Sequence[str] = ()) -> dict[str, Any]:
    """A config dataclass as key input, without the fields that cannot change an output."""
    return {k: v for k, v in config_to_dict(obj).items() if k not in leave_out}


# -- the cache ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One stage output's place in the cache: its key and the inputs it was computed from."""

    stage: str
    key: str
    inputs: Mapping[str, Any]
    path: Path

    def problem(self) -> str | None:
        """Why the folder cannot be used (None: it can): no or another key.json, or a file missing."""
        kf = self.path / KEY_FILE
        if not kf.is_file():
            return f"it has no {KEY_FILE} (an unfinished or foreign folder)"
        try:
            saved = read_json(kf)
        except (OSError, ValueError) as e:
            return f"its {KEY_FILE} cannot be read ({e})"
        if not isinstance(saved, dict):
            return f"its {KEY_FILE} is not a JSON object"
        if saved.get("key") != self.key or saved.get("stage") != self.stage:
            return f"its {KEY_FILE} names key {saved.get('key')!r} of stage {saved.get('stage')!r}, not {self.key!r}"
        if saved.get("inputs") != self.inputs:
            old = saved.get("inputs") if isinstance(saved.get("inputs"), dict) else {}
            differ = sorted(k for k in set(old) | set(self.inputs) if old.get(k) != self.inputs.get(k))
            return f"its {KEY_FILE} lists other inputs than this key's ({', '.join(differ) or 'not a mapping'})"
        files = saved.get("files")
        if not isinstance(files, dict) or not files:
            return f"its {KEY_FILE} lists no files"
        for rel, size in files.items():
            p = self.path / rel
            if not p.is_file():
                return f"{rel} is missing"
            if p.stat().st_size != size:
                return f"{rel} has {p.stat().st_size} bytes, {KEY_FILE} says {size}"
        sums = saved.get("sha256")
        if not isinstance(sums, dict) or set(sums) != set(files):
            return f"its {KEY_FILE} lists no SHA-256 of every file"
        for rel, want in sums.items():  # read once here; the run reads these files next anyway
            try:
                got = file_sha256(self.path / rel)
            except OSError as e:  # removed meanwhile by a run that holds the entry's lock (RunCache.served peeks)
                return f"{rel} cannot be read ({e.strerror})"
            if got != want:
                return f"{rel} no longer has the SHA-256 {KEY_FILE} recorded (a corrupt or edited file)"
        return None

    def info(self) -> dict[str, Any]:
        """The figures the stage recorded when it was computed."""
        return dict(read_json((self.path / KEY_FILE)).get("info") or {})


class ReuseCache:
    """Stage outputs by content key under `root` (<cache home>/runs)."""

    def __init__(self, root: str | Path | None = None, wait_minutes: float | None = None) -> None:
        #: the longest wait for another run's lock before giving up (None: no bound)
        self.wait_minutes = wait_minutes
        self.root = Path(root) if root is not None else cache_home() / CACHE_FOLDER
        self._held: dict[Path, list] = {}  # entry folder -> [its lock, how many claims of this process]
        self._held_lock = threading.Lock()  # the evaluation beside the rollouts claims from another thread

    def lock_path(self, entry: Entry) -> Path:
        return self.root / LOCKS / entry.stage / f"{entry.path.name}.lock"

    def claim(self, entry: Entry, label: str, made_by: str | Path) -> None:
        """Hold `entry`'s lock (waiting while another run holds it) until `release(entry)`; claims of one
        process nest (a second claim of an entry this process holds does not wait for itself)."""
        with self._held_lock:
            held = self._held.get(entry.path)
            if held is not None:
                held[1] += 1
                return
        lock = EntryLock(self.lock_path(entry))
        lock.acquire(label, made_by, limit=None if self.wait_minutes is None else 60.0 * self.wait_minutes)
        with self._held_lock:
            self._held[entry.path] = [lock, 1]

    def release(self, entry: Entry | None) -> None:
        """Give up a claim of `entry` (nothing where it holds none)."""
        if entry is None:
            return
        with self._held_lock:
            held = self._held.get(entry.path)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                return
            del self._held[entry.path]
        held[0].release()

    def entry(self, stage: str, inputs: Mapping[str, Any]) -> Entry:
        # as JSON reads it back (tuples as lists), so that key.json's inputs compare equal
        full = {"format": FORMAT, "stage": stage, **inputs, "code": code_identity()}
        full = json.loads(json.dumps(full, default=str))
        key = digest(full)
        return Entry(stage=stage, key=key, inputs=full, path=self.root / stage / key[:24])

    def lookup(self, entry: Entry, label: str) -> dict[str, Any] | None:
        """The entry's figures when it can be used; None when it is absent or unusable (then the
        reason is logged as a warning and the folder removed, so the rebuilt output replaces it)."""
        if not entry.path.exists():
            log.info("%s: not in the reuse cache (%s); computing it", label, entry.path)
            return None
        why = entry.problem()
        if why is None:
            return entry.info()
        log.warning("%s: the cached copy %s cannot be used: %s; rebuilding it", label, entry.path, why)
        shutil.rmtree(entry.path, ignore_errors=True)
        return None

    def store(self, entry: Entry, files: Mapping[str, Path], info: Mapping[str, Any], made_by: str | Path,
              link: bool = False) -> bool:
        """Put `files` (name in the entry -> a file or folder of the run; copied, or with `link` hard-linked
        where the file system allows) and the stage's figures in the cache; key.json last. A failure is
        logged, never raised (the run does not depend on the cache), but for a full disk (`DiskFullError`,
        exit 2: the run folder is most often on that disk too; the rerun computes the stage again). Called under the
        entry's lock, it first removes the temporary folder a killed store of the entry left."""
        try:
            if entry.path.parent.is_dir():
                for old in entry.path.parent.glob(f".{entry.path.name}.*"):
                    if LEFTOVER.match(old.name):
                        shutil.rmtree(old, ignore_errors=True)
            with atomic_dir(entry.path, done=KEY_FILE, what=f"the reuse cache's {entry.stage} entry") as tmp:
                for name, src in files.items():
                    copy_tree(Path(src), tmp / name, link)
                stored = [p for p in sorted(tmp.rglob("*")) if p.is_file()]
                manifest = {str(p.relative_to(tmp)): p.stat().st_size for p in stored}
                sums = {str(p.relative_to(tmp)): file_sha256(p) for p in stored}  # once, as the entry is written
                write_json(tmp / KEY_FILE, {"key": entry.key, "stage": entry.stage, "inputs": entry.inputs,
                                            "files": manifest, "sha256": sums, "info": dict(info),
                                            "made_by": str(made_by)})
        except OSError as e:
            log.warning("could not store %s in the reuse cache (%s): %s", entry.stage, entry.path, e)
            return False
        log.info("stored %s in the reuse cache: %s", entry.stage, entry.path)
        return True


# -- files in and out ---------------------------------------------------------------------------------------


def copy_tree(src: Path, dst: Path, link: bool = False) -> None:
    """`src` (a file or folder) at `dst`: copied, or with `link` every file hard-linked (copied where it
    cannot be). Model files are linked (nothing edits them in place); JSONL files, which a person may
    open in an editor, are copied."""
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        for p in sorted(src.iterdir()):
            copy_tree(p, dst / p.name, link)
        return
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def link_tree(src: Path, dst: Path) -> bool:
    """`src`'s files hard-linked into a new folder `dst` (replacing it); False, and `dst` left as it was,
    where the file system refuses a link (another device, no hard links)."""
    try:
        with atomic_dir(dst) as tmp:
            for p in sorted(src.rglob("*")):
                target = tmp / p.relative_to(src)
                if p.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.link(p, target)
    except OSError as e:
        log.info("cannot hard-link %s into %s (%s)", src, dst, e)
        return False
    return True


def copy_file(src: Path, dst: Path) -> None:
    """A copy of `src` at `dst`, written beside it and renamed (readers never see half a file)."""
    with disk_space(dst.parent, f"{dst.name} (copied from the reuse cache)"):
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


# -- the loop's side ----------------------------------------------------------------------------------------


class RunCache:
    """A run's side of the reuse cache: each shareable stage's key inputs, and a stage run through the cache. Built
    with the run's context (context.py); the bootstrap sets `m0_key` once it knows M0's inputs."""

    def __init__(self, run) -> None:
        self.run = run
        self._cache: ReuseCache | None = None
        self._corpus_fp: str | None = None
        #: M0's own key: what the keys of its evaluation and of iteration 1's rollouts know of it
        self.m0_key: str | None = None

    @property
    def cache(self) -> ReuseCache | None:
        """The cache of stage outputs; None with `reuse: false`."""
        if not self.run.config.reuse:
            return None
        if self._cache is None:
            self._cache = ReuseCache(wait_minutes=self.run.config.reuse_wait_minutes)
        return self._cache

    def corpus_fingerprint(self) -> str:
        if self._corpus_fp is None:
            from knowtrace_train.retrieval.cache import corpus_fingerprint

            self._corpus_fp = corpus_fingerprint(self.run.corpus)
        return self._corpus_fp

    def weights_identity(self, state) -> dict[str, Any] | None:
        """What a key knows of `state`'s weights: the raw base's folder, M0's own key, or None for a
        model with adapters (its outputs depend on the iteration's training: never shared)."""
        if state.adapters:
            return None
        if state.model == self.run.config.generator.model:
            return {"base": model_identity(self.run.base_path)}
        if self.m0_key is not None and Path(state.model) == Path(m0_path(self.run.run_dir)):
            return {"m0": self.m0_key}
        return None

    def generation_inputs(self, model: Mapping[str, Any], items, state, seed: int,
                          iteration: int | None, rollout: bool = False) -> dict[str, Any]:
        """What a model's trajectories over `items` depend on. Left out: batch sizes, chunk_size and
        the processes count (they change batching only), the run's name, mode, iterations, train.*."""
        import torch

        from knowtrace_train.generation.hf import pick_device, pick_dtype

        run = self.run
        factory = run.make_generator
        gen = generator_config(run.config, state)
        strategy, samples = sampling(run.config, state, seed, rollout)
        return {
            "model": dict(model),
            "questions": {"count": len(items), "sha256": digest([it.to_dict() for it in items])},
            "iteration": iteration,
            "strategy": config_to_dict(strategy),
            "samples": samples,
            "generator": settings(gen, GENERATOR_NOT_IN_KEY),
            # what "auto" resolves to here: CPU and GPU decode in other precisions, CPUs with and without bf16 too
            "device": gen.device if gen.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"),
            "dtype": str(pick_dtype(gen.dtype, pick_device(gen.device))),  # as the generator picks it
            "retriever": settings(run.config.retriever, RETRIEVER_NOT_IN_KEY),
            "corpus": self.corpus_fingerprint(),
            # a generator given to SelfTrain (tests' oracle) answers otherwise than the configured one
            "generator_factory": None if factory is None else _qualified_name(factory),
        }

    def m0_inputs(self, groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
        """What M0 depends on: the raw base, the bootstrap's records per adapter (their content), its
        training settings and seed, and the processes count (data-parallel training batches across them)."""
        from knowtrace_train.train.precision import resolve_precision, training_device

        cfg = self.run.config
        device = training_device()
        return {
            "base": model_identity(self.run.base_path),
            "records": {a: {"count": len(r), "sha256": digest(list(r))} for a, r in groups.items()},
            "joint": cfg.bootstrap.joint,
            "train": config_to_dict(cfg.bootstrap.train),
            "seed": cfg.seed,
            "processes": self.run.procs.world,
            "device": device,
            "precision": resolve_precision(cfg.bootstrap.train.precision, device)[0],
        }

    def lookup(self, stage: str, inputs: Callable[[], Mapping[str, Any] | None], label: str):
        """(entry, the cached figures or None), decided on the main process and told to the others (whose
        entry is None); (None, None) with reuse off or where `inputs()` is None (not shareable). The main
        process then holds the entry's lock (waiting first while another run holds it) until the caller's
        `release(entry)`: after storing what it computed, or copying what it reused."""
        cache = self.cache
        if cache is None:
            return None, None
        procs = self.run.procs
        entry = cached = None
        if procs.is_main:
            got = inputs()
            if got is not None:
                entry = cache.entry(stage, got)
                cache.claim(entry, label, self.run.run_dir)
                try:
                    cached = cache.lookup(entry, label)
                except BaseException:
                    cache.release(entry)
                    raise
                if cached is not None:
                    log.info("reused %s from %s", label, entry.path)
        return entry, procs.broadcast(cached)

    def release(self, entry: Entry | None) -> None:
        """The end of a `lookup`'s claim (on the main process; nothing elsewhere or with reuse off)."""
        if entry is not None and self._cache is not None:
            self._cache.release(entry)

    def served(self, stage: str, inputs: Callable[[], Mapping[str, Any] | None]) -> bool:
        """Whether `stage` would take the stage from the cache (looked at only: nothing logged or removed)."""
        cache = self.cache
        got = inputs() if cache is not None and self.run.procs.is_main else None
        if got is None:
            return False
        return cache.entry(stage, got).problem() is None  # what lookup would use (an absent folder has no key.json)

    def stage(self, folder: Path, name: str, stage: str, inputs: Callable[[], Mapping[str, Any] | None],
              body: Callable[[], dict[str, Any]], files: Sequence[str]) -> dict[str, Any]:
        """`run.stages.run(folder, name, body)`, where `files` (names in `folder`) are taken from the
        cache when `inputs()` has an entry there, and stored there when computed. `inputs()` None: the
        stage is not shareable (a model with adapters)."""
        procs = self.run.procs

        def run() -> dict[str, Any]:
            entry, cached = self.lookup(stage, inputs, f"{folder.name}/{name}")
            try:
                if cached is not None:
                    if procs.is_main:
                        from knowtrace_train.selftrain.rollout import parts_dir

                        for f in files:
                            copy_file(entry.path / f, folder / f)
                            shutil.rmtree(parts_dir(folder / f), ignore_errors=True)  # a killed attempt's chunks
                    return reused(cached, entry.path if entry else None, procs)
                t0 = time.perf_counter()
                info = dict(body() or {})
                info.setdefault("seconds", round(time.perf_counter() - t0, 3))
                if entry is not None:
                    self.cache.store(entry, {f: folder / f for f in files}, info, self.run.run_dir)
                return info
            finally:
                self.release(entry)

        return self.run.stages.run(folder, name, run)


def _qualified_name(fn: Any) -> str:
    """module.qualname of a function (of its class for other callables, e.g. functools.partial)."""
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


def reused(cached: Mapping[str, Any], path: Path | None, procs) -> dict[str, Any]:
    """A stage's figures taken from the cache: its own, with `reused_from` (the cache folder, known
    on every process) and the seconds it took when computed (`reused_seconds`); `seconds` is this run's."""
    info = {k: v for k, v in cached.items() if k != "seconds"}
    info["reused_from"] = procs.broadcast(str(path) if path is not None else None)
    info["reused_seconds"] = cached.get("seconds")
    return info
