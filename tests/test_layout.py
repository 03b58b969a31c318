"""The package's three bands: shared parts know no method, a method never imports the loops, no module is long."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "knowtrace_train"
SHARED = ("trajectory", "kg", "kg_store", "metrics", "pairing", "io", "config", "errors", "stages", "threads", "data", "retrieval", "generation",
          "decisions", "progress")
LOOPS = ("selftrain", "train", "evaluate", "report", "report_html", "compare", "arms", "tracking")


def _band(module: str) -> str:
    top = module.split(".")[1] if module.count(".") else ""
    if top in SHARED:
        return "shared"
    if top == "methods":
        return "methods"
    if top in LOOPS:
        return "loops"
    return "package"


def _modules() -> list[tuple[str, Path]]:
    out = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), p))
    return out


def _imports(path: Path) -> set[str]:
    """Every knowtrace_train module the file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("knowtrace_train")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("knowtrace_train"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


ALLOWED = {"shared": {"shared"}, "methods": {"shared", "methods"}, "loops": {"shared", "methods", "loops"},
           "package": {"shared", "methods", "loops", "package"}}


@pytest.mark.parametrize("module,path", _modules(), ids=[m for m, _ in _modules()])
def test_a_lower_band_never_imports_a_higher_one(module, path):
    band = _band(module)
    wrong = sorted(i for i in _imports(path) if _band(i) not in ALLOWED[band] and i != "knowtrace_train")
    assert not wrong, f"{module} ({band}) imports {wrong}"


#: the methods band's own shared modules: what a method is, generic STaR, hinted reruns, batched calls, the engines'
#: plumbing, the gold hop chain and what the methods' gold trajectories share beyond it
METHODS_SHARED = ("base", "star", "hints", "calls", "engine", "gold_chain", "gold_records")


def test_only_the_registry_names_a_method_among_the_methods():
    """A method's folder touches nothing outside itself but the registry line (and the shared bands)."""
    for module, path in _modules():
        parts = module.split(".")
        if len(parts) > 2 and parts[1] == "methods" and parts[2] not in METHODS_SHARED:
            own = ".".join(parts[:3])
            others = {i for i in _imports(path) if i.startswith("knowtrace_train.methods.")
                      and not i.startswith(own) and i.split(".")[2] not in METHODS_SHARED}
            assert not others, f"{module} imports another method: {sorted(others)}"


def test_no_module_over_500_lines_without_a_reason_in_its_first_line():
    for module, path in _modules():
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > 500:
            assert "over 500 lines" in lines[0], f"{module} has {len(lines)} lines and its first line gives no reason"


def _import_graph() -> dict[str, set[str]]:
    """module -> the package modules it names in an import, at the top or inside a function: `import a.b.c` names
    a.b.c; `from a.b import c` names a.b, and a.b.c where c is a module."""
    modules = dict(_modules())
    graph = {}
    for module, path in modules.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                named.add(node.module)
                named |= {f"{node.module}.{a.name}" for a in node.names}
        graph[module] = {n for n in named if n in modules and n != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_import_cycles_are_found_lazy_imports_included():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(import_cycles(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    """No module reaches itself again through the package's imports, function-level (lazy) ones included: a method
    package's __init__ imports its engine, so the engine imports the modules it needs, never the package."""
    cycles = import_cycles(_import_graph())
    assert not cycles, f"{len(cycles)} import cycle(s): " + "; ".join(" <-> ".join(c) for c in cycles)


SCRIPTS = PKG.parent / "scripts"
#: the calls that load a module by name or by file, and the ones that put a folder on the import path
_LOADERS = {"import_module", "spec_from_file_location", "run_path", "run_module", "__import__"}
_PATH_EDITS = {"insert", "append", "extend"}


def script_imports(source: str, script_modules: set[str]) -> list[str]:
    """Where `source` imports a script or a script's helper module: an import of a module named as a file under
    scripts/ is, a loader call (`importlib.import_module`, `spec_from_file_location`, `runpy`) naming one or a path
    under scripts/, and a `sys.path` edit naming scripts/."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module.split(".")[0]]
        found += [f"line {node.lineno}: import {n}" for n in names if n in script_modules]
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            text = ast.unparse(node)
            on_path = name in _PATH_EDITS and isinstance(func, ast.Attribute) and ast.unparse(func.value) == "sys.path"
            if (name in _LOADERS or on_path) and ("scripts" in text or any(
                    isinstance(a, ast.Constant) and a.value in script_modules for a in node.args)):
                found.append(f"line {node.lineno}: {text[:120]}")
    return found


def test_the_script_import_check_finds_each_way_in():
    mods = {"bench_train", "fair"}
    assert script_imports("import json\nfrom knowtrace_train import io\n", mods) == []
    assert len(script_imports("import bench_train\n", mods)) == 1
    assert len(script_imports("def f():\n    from fair import FairConfig\n", mods)) == 1
    assert len(script_imports("importlib.import_module('bench_train')\n", mods)) == 1
    assert len(script_imports("sys.path.insert(0, str(REPO / 'scripts'))\n", mods)) == 1
    assert len(script_imports("spec_from_file_location('x', REPO / 'scripts' / 'lab' / 'x.py')\n", mods)) == 1
    assert script_imports("sys.path.insert(0, str(REPO))\n", mods) == []


def test_no_package_module_imports_a_script():
    """The package is what a user's run calls; the benchmarks and the project's measurements (scripts/bench/,
    scripts/lab/) and the scripts a user runs stand outside it and import it, never the other way round."""
    script_modules = {p.stem for p in SCRIPTS.rglob("*.py")}
    assert "bench_train" in script_modules and "fair" in script_modules
    wrong = {module: found for module, path in _modules()
             if (found := script_imports(path.read_text(encoding="utf-8"), script_modules))}
    assert not wrong, f"package modules that import a script: {wrong}"


def mode_name_comparisons(source: str, names: set[str]) -> list[str]:
    """Where `source` compares something with a training mode's name: `x == "grpo"`, `x != "kto"`, `x in ("sft",
    ...)`, a name string on either side."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        strings = set()
        for side in sides:
            if isinstance(side, ast.Constant) and isinstance(side.value, str):
                strings.add(side.value)
            elif isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                strings |= {e.value for e in side.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if strings & names:
            found.append(f"line {node.lineno}: {ast.unparse(node)[:120]}")
    return found


def test_the_mode_name_check_finds_each_comparison():
    names = {"sft", "kto", "grpo"}
    assert len(mode_name_comparisons("if trainer == 'grpo':\n    pass\n", names)) == 1
    assert len(mode_name_comparisons("x = 1 if 'kto' != mode else 2\n", names)) == 1
    assert len(mode_name_comparisons("ok = mode in ('sft', 'kto')\n", names)) == 1
    assert mode_name_comparisons("ok = credit == 'backtrace'\nrun(trainer='grpo')\n", names) == []


def test_only_the_training_band_compares_a_training_modes_name():
    """The self-training loop and its config ask the registry (knowtrace_train/train/modes.py) what a mode does; a
    mode's name is compared only inside knowtrace_train/train/, where the registry and the modes' own modules are."""
    from knowtrace_train.train.modes import MODES

    names = set(MODES)
    assert {"sft", "kto", "grpo"} <= names
    wrong = {module: found for module, path in _modules() if not module.startswith("knowtrace_train.train")
             and (found := mode_name_comparisons(path.read_text(encoding="utf-8"), names))}
    assert not wrong, f"modules that compare a training mode's name: {wrong}"


#: words that name one machine's processor: a measurement on it belongs in the docs, not in the code
MACHINE_WORDS = ("epyc", "xeon", "sapphire rapids", "2-core")


def _machine_findings(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if any(w in line.lower() for w in MACHINE_WORDS)]


def test_the_machine_check_finds_a_processor_named_in_a_docstring():
    assert _machine_findings('"""On the project\'s 2-core EPYC this took 3 s."""') != []
    assert _machine_findings('"""bf16 where the CPU has AVX512-BF16 (docs/training.md)."""') == []


def test_no_package_module_names_a_machine_it_was_measured_on():
    found = {str(p.relative_to(PKG.parent)): _machine_findings(p.read_text()) for p in sorted(PKG.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
