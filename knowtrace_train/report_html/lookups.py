"""What the report looks up beside the trajectories: question hops and kinds, passage texts, each method's explanation.

The run's config.yaml names its data files and corpus (read when they can be found: as written, beside
the run folder, or in the checkout); `--data` and `--corpus` add more. A corpus the run read as a passage store
(`store: true`, `auto` over a file of 100 MiB or more, or the source `generated`) is looked up through the store's id index, whatever its size (a
generated corpus only where it is in the cache already: the report never generates one). A method explains a trajectory
through `Method.explain` with the run's own strategy settings (the method's defaults for a bare file).
Nothing here raises on what it reads: trouble becomes a note.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from knowtrace_train.trajectory import Trajectory

log = logging.getLogger(__name__)

#: the checkout a relative data path of a run config may be relative to
CHECKOUT = Path(__file__).resolve().parents[2]
MAX_CORPUS_BYTES = 200 * 1024 * 1024


def _resolve(raw: Any, run_dir: Path | None) -> Path | None:
    if not isinstance(raw, str) or not raw:
        return None
    from knowtrace_train.data.bundled import bundled_path

    p = Path(raw)
    # as written, beside the run folder, in the checkout, and the world's default from an installed package
    for cand in [p] + ([] if p.is_absolute() else [*(c / p for c in ([run_dir] if run_dir else [])), CHECKOUT / p,
                                                    Path(bundled_path(raw))]):
        if cand.is_file():
            return cand
    return None


def _read_as_store(store: Any, path: Path) -> bool:
    """Whether the run read its corpus file as a passage store: `store` true, or 'auto' and the file at least the
    size `corpus.use_store` chose the store at (a config written before 'auto' has no key: false)."""
    from knowtrace_train.data.corpus import use_store

    return use_store(store, path) if store in (True, False, "auto") else False


class Lookups:
    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.corpora: list[Path] = []
        self.stores: list[Any] = []  # data.store.PassageStore, looked up by id
        self.notes: list[str] = []
        self._data_seen: set[Path] = set()
        self._configs: dict[tuple[int, str], Any] = {}

    # -- question hops and kinds ---------------------------------------------------------------------
    def add_run_inputs(self, run_dir: Path) -> None:
        """The data files and the file corpus the run's config.yaml names."""
        import yaml

        try:
            config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
        except Exception:  # noqa: BLE001 - collect has noted it already
            return
        data = config.get("data") if isinstance(config, dict) and isinstance(config.get("data"), dict) else {}
        from knowtrace_train.data.registry import parse_ref

        for key in ("train", "dev", "test"):
            raw = data.get(key)
            path = raw if isinstance(raw, str) and parse_ref(raw) else _resolve(raw, run_dir)  # a fetched split by name
            if path is not None:
                self.add_data(path, data.get("format"))
        corpus = data.get("corpus") if isinstance(data.get("corpus"), dict) else {}
        source = corpus.get("source", "file")
        if source in ("file", "generated"):
            path = _resolve(corpus.get("path") or ("data/world/corpus.jsonl" if source == "generated" else None), run_dir)
            if path is None:
                return
            if source == "generated":
                self._add_generated(corpus, path)
            elif _read_as_store(corpus.get("store", False), path):
                self._add_store(path)
            else:
                self.add_corpus(path)

    def _add_store(self, path: Path) -> None:
        from knowtrace_train.data.store import open_store

        try:
            store = open_store(path)  # the run converted it: found by its sidecar, not read
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"{path}: passage store not opened, passages shown by id only ({str(e)[:200]})")
            return
        if store.folder not in [s.folder for s in self.stores]:
            self.stores.append(store)

    def _add_generated(self, corpus: dict[str, Any], base: Path) -> None:
        from knowtrace_train.data.generated import find_generated

        try:
            store = find_generated(int(corpus["passages"]), int(corpus.get("seed", 0)), base)
        except Exception as e:  # noqa: BLE001
            self.notes.append(f"generated corpus around {base}: not opened, passages shown by id only ({str(e)[:200]})")
            return
        if store is None:
            self.notes.append(f"generated corpus ({corpus.get('passages')} distractors around {base}, seed "
                              f"{corpus.get('seed', 0)}) is not in this cache home: passages shown by id only")
        elif store.folder not in [s.folder for s in self.stores]:
            self.stores.append(store)

    def add_data(self, path: Path | str, fmt: str | None = None) -> None:
        """Hops and kind (bridge/comparison) of every question in a data file (or a fetched split, "hotpotqa:dev")."""
        path = path.resolve() if isinstance(path, Path) else path
        if path in self._data_seen:
            return
        self._data_seen.add(path)
        from knowtrace_train.data.loaders import load_items_report

        try:
            report = load_items_report(path, fmt if isinstance(fmt, str) else None, skip_bad=True)
        except Exception as e:  # noqa: BLE001 - a data file the report cannot read only loses the filters
            self.notes.append(f"{path}: questions not read, no hop counts from it ({str(e)[:200]})")
            return
        for item in report.items:
            self.items.setdefault(item.id, {"hops": item.hops, "kind": item.type})

    def question(self, question_id: str) -> dict[str, Any]:
        return self.items.get(question_id, {"hops": None, "kind": None})

    # -- passages ------------------------------------------------------------------------------------
    def add_corpus(self, path: Path) -> None:
        if path.resolve() not in [c.resolve() for c in self.corpora]:
            self.corpora.append(path)

    def passages(self, wanted: set[str]) -> dict[str, dict[str, str]]:
        """id -> {"title", "text"} of the wanted passages found in the corpora."""
        from knowtrace_train.data.corpus import read_corpus

        out: dict[str, dict[str, str]] = {}
        for store in self.stores:
            for pid in wanted - set(out):
                try:
                    p = store.by_id.get(pid)
                except Exception as e:  # noqa: BLE001
                    self.notes.append(f"{store.folder}: passages not read, shown by id only ({str(e)[:200]})")
                    break
                if p is not None:
                    out[pid] = {"title": p.title, "text": p.text}
        for path in self.corpora:
            if not wanted - set(out):
                break
            try:
                if path.stat().st_size > MAX_CORPUS_BYTES:
                    self.notes.append(f"{path}: corpus over {MAX_CORPUS_BYTES >> 20} MB, passages shown by id only")
                    continue
                for p in read_corpus(path):
                    if p.id in wanted:
                        out[p.id] = {"title": p.title, "text": p.text}
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"{path}: corpus not read, passages shown by id only ({str(e)[:200]})")
        return out

    # -- the method's explanation --------------------------------------------------------------------
    def _strategy_config(self, run: dict[str, Any], method) -> Any:
        key = (run.get("index", -1), method.name)
        if key not in self._configs:
            section = run.get("strategy_config") or {}
            cfg = None
            if isinstance(section, dict) and section.get("name") == method.name:
                from knowtrace_train.config import load_config

                try:
                    cfg = load_config(method.config_class, Path(run["dir"]) / "config.yaml", data=section)
                except Exception as e:  # noqa: BLE001
                    self.notes.append(f"{run['dir']}: strategy settings not read, {method.name} defaults used ({e})")
            self._configs[key] = cfg if cfg is not None else method.config_class(name=method.name)
        return self._configs[key]

    def explain(self, traj: Trajectory, run: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """(the method's explanation of `traj`, or None; why there is none, where that is worth saying)."""
        from knowtrace_train.methods import get_method

        try:
            method = get_method(traj.strategy)
        except ValueError:
            return None, f"method {traj.strategy!r} is not registered here: the graph and calls as recorded"
        mode = run.get("mode")
        rationalizers = method.rationalizers()
        why = None
        if mode and mode in rationalizers and mode != "backtrace" and "backtrace" in rationalizers:
            why = (f"this run's mode is {mode}: it trains on what its {mode} rationalizer keeps; the highlights "
                   "are what backtracing would keep and drop")
        try:
            return method.explain(traj, self._strategy_config(run, method)), why
        except Exception as e:  # noqa: BLE001 - one trajectory's trouble never stops the report
            log.warning("explaining %s failed: %s", traj.id, e)
            return None, f"{method.name} could not explain this trajectory ({type(e).__name__}: {str(e)[:200]})"
