"""Every third-party import is declared: a core dependency, or an extra's package imported through `import_extra`.

The README's main command installs `pip install -e .` and nothing more, so a package that only the dev extra
brings (scipy came in through sentence-transformers) crashes a user's first run while every test passes here.
This reads every `import`/`from` in knowtrace_train/, recipes/ and scripts/, at module level and inside
functions, maps each third-party top-level module to its distribution through the installed distributions'
metadata, and fails on one that `[project.dependencies]` does not name; an extra's package must come
through `knowtrace_train.errors.import_extra(module, extra, feature)`, whose error names
`pip install 'knowtrace-train[<extra>]'`, and the extra it names must be the one that provides the module.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

from knowtrace_train.errors import MissingExtraError, import_extra

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("knowtrace_train", "recipes", "scripts")
# Scripts that run under another environment's python, never ours: {script: the packages that environment
# brings}. Each must import nothing from knowtrace_train (checked below), so that environment needs none of ours.
SEPARATE_ENVIRONMENT = {
    "scripts/bench/bench_lucene.py": {"pyserini", "jnius"},  # the Pyserini venv of bench_retrieval.py --pyserini PYTHON
}


def dist_name(requirement: str) -> str:
    """The normalized distribution name of a requirement string ('PyYAML>=6.0' -> 'pyyaml')."""
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[;\s]", requirement.strip(), maxsplit=1)[0]).lower()


def declared(pyproject: Path = ROOT / "pyproject.toml") -> tuple[set[str], dict[str, set[str]]]:
    """(core distributions, {extra: its distributions}) as pyproject.toml declares them."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    core = {dist_name(r) for r in project.get("dependencies", [])}
    extras = {e: {dist_name(r) for r in reqs} for e, reqs in project.get("optional-dependencies", {}).items()}
    return core, extras


_PACKAGES = importlib.metadata.packages_distributions()


def distributions_of(top: str) -> set[str]:
    """The distributions that install top-level module `top` (installed metadata; the module's own name,
    normalized, for one not installed here, such as vllm or bitsandbytes)."""
    return {dist_name(d) for d in _PACKAGES.get(top, [])} or {dist_name(top)}


def _local(top: str, path: Path) -> bool:
    """A sibling module of a script (`from bench_prompts import ...` in scripts/bench/), a helper module of the lab
    (scripts/lab/fair.py, which scripts/compare_methods.py reads `runs:` configs with), a package of scripts/ (the
    synthetic world's generator, scripts/world/), or a module of the repository's tests/ (scripts/lab/chaos.py, a
    development tool, runs the tests' helpers)."""
    return (top == "knowtrace_train" or (path.parent / f"{top}.py").is_file() or (path.parent / top).is_dir()
            or (ROOT / "scripts" / "lab" / f"{top}.py").is_file() or (ROOT / "scripts" / top / "__init__.py").is_file()
            or (ROOT / "tests" / f"{top}.py").is_file())


def _extra_call(node: ast.AST) -> ast.Call | None:
    if isinstance(node, ast.Call):
        f = node.func
        if (isinstance(f, ast.Name) and f.id == "import_extra") or (isinstance(f, ast.Attribute) and f.attr == "import_extra"):
            return node
    return None


def problems(paths: list[Path], core: set[str], extras: dict[str, set[str]],
             separate: dict[str, set[str]] = SEPARATE_ENVIRONMENT) -> list[str]:
    """What is wrong with the imports of `paths`: an undeclared package, an extra's package imported
    without `import_extra`, an `import_extra` naming the wrong extra or not in literal strings."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{getattr(node, 'lineno', 0)}"
            call = _extra_call(node)
            if call is not None:
                args = call.args[:2]
                if len(args) < 2 or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
                    found.append(f"{where}: import_extra needs the module and the extra as literal strings")
                    continue
                module, extra = args[0].value, args[1].value
                if extra not in extras:
                    found.append(f"{where}: import_extra names extra {extra!r}, which pyproject.toml does not declare")
                elif not distributions_of(module.split(".")[0]) & extras[extra]:
                    found.append(f"{where}: {module} is not provided by the extra {extra!r} ({sorted(extras[extra])})")
                continue
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
            else:
                continue
            rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
            for module in modules:
                top = module.split(".")[0]
                if rel in separate:
                    if top == "knowtrace_train" or _local(top, path):
                        found.append(f"{where}: `import {module}`: {rel} runs under another environment's python "
                                     "and must import nothing of ours")
                    elif top not in sys.stdlib_module_names and top not in separate[rel]:
                        found.append(f"{where}: `import {module}` is not among the packages {rel}'s environment brings "
                                     f"({sorted(separate[rel])})")
                    continue
                if top in sys.stdlib_module_names or _local(top, path):
                    continue
                dists = distributions_of(top)
                if dists & core:
                    continue
                in_extras = sorted(e for e, ds in extras.items() if dists & ds)
                if in_extras:
                    found.append(f"{where}: `import {module}` comes from the extra {in_extras[0]!r}; import it with "
                                 f"import_extra({module!r}, {in_extras[0]!r}, ...) so a user without it gets a clear error")
                else:
                    found.append(f"{where}: `import {module}` ({'/'.join(sorted(dists))}) is declared neither in "
                                 "[project.dependencies] nor in an extra")
    return found


def scanned_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def test_every_runtime_import_is_declared():
    core, extras = declared()
    assert not problems(scanned_files(), core, extras)


def test_the_check_catches_a_function_level_import_of_an_undeclared_package(tmp_path):
    """The test of the test: what the project's files do right, a new file doing it wrong is caught."""
    core, extras = declared()
    bad = tmp_path / "pkg" / "mod.py"
    bad.parent.mkdir()
    bad.write_text(
        "import json\nimport numpy\n\n"
        "def f():\n    import surely_not_a_declared_package  # noqa\n\n"
        "def g():\n    import faiss  # an extra's package, unguarded\n\n"
        "def h():\n    return import_extra('faiss', 'plot', 'x')  # the wrong extra\n\n"
        "def k(name):\n    return import_extra(name, 'dense', 'x')  # not literal\n",
        encoding="utf-8",
    )
    found = problems([bad], core, extras)
    assert len(found) == 4, found
    assert any("mod.py:5" in f and "surely_not_a_declared_package" in f and "declared neither" in f for f in found)
    assert any("mod.py:8" in f and "'dense'" in f and "import_extra" in f for f in found)
    assert any("mod.py:11" in f and "not provided by the extra 'plot'" in f for f in found)
    assert any("mod.py:14" in f and "literal strings" in f for f in found)


def test_a_script_of_another_environment_may_import_only_that_environments_packages(tmp_path):
    """bench_lucene.py runs under the Pyserini venv's python: its pyserini is allowed, ours and others' are not."""
    core, extras = declared()
    script = tmp_path / "bench_other.py"
    script.write_text("import json\nimport pyserini\nfrom knowtrace_train.data import corpus\nimport numpy\n")
    found = problems([script], core, extras, separate={str(script): {"pyserini"}})
    assert len(found) == 2, found
    assert "import nothing of ours" in found[0] and "knowtrace_train" in found[0]
    assert "`import numpy` is not among the packages" in found[1]
    assert not problems([ROOT / "scripts" / "bench" / "bench_lucene.py"], core, extras)


def test_scipy_numpy_and_the_hub_client_are_core_dependencies():
    """The fresh-machine crash: BM25's sparse matrix needs scipy, which only the dev extra brought."""
    core, _ = declared()
    assert {"scipy", "numpy", "huggingface-hub"} <= core


@pytest.mark.parametrize("extra", ["dense", "vllm", "elasticsearch", "opensearch", "qlora", "plot", "kg"])
def test_a_missing_extra_is_one_clear_error(extra):
    with pytest.raises(MissingExtraError) as info:
        import_extra("surely_absent_module_xyz.sub", extra, "this feature")
    message = str(info.value)
    assert message == (f"this feature needs surely_absent_module_xyz (not installed: surely_absent_module_xyz): "
                       f"pip install 'knowtrace-train[{extra}]'")
    assert isinstance(info.value, ImportError)  # code that tolerates an absent optional module still does


def test_every_user_facing_extra_is_declared():
    _, extras = declared()
    assert {"dense", "vllm", "elasticsearch", "opensearch", "qlora", "plot", "kg", "dev"} <= set(extras)
