"""The BM25 retriever never brings JAX in: bm25s imports JAX at its own import when JAX is
installed and runs one JAX op there, which makes JAX reserve 75% of a GPU's memory (on an
H100 a second run on the same GPU then died of CUDA OOM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A stand-in `jax` that records every use of it in the file named by $FAKE_JAX_LOG; its
# `lax.top_k` works (on numpy), so a bm25s that takes it for a real JAX would go on using it.
FAKE_JAX = {
    "jax/__init__.py": """
        import os
        with open(os.environ["FAKE_JAX_LOG"], "a") as f:
            f.write("import jax\\n")
        from jax import lax
    """,
    "jax/lax.py": """
        import os
        import numpy as np
        with open(os.environ["FAKE_JAX_LOG"], "a") as f:
            f.write("import jax.lax\\n")

        def top_k(x, k):
            with open(os.environ["FAKE_JAX_LOG"], "a") as f:
                f.write("jax.lax.top_k\\n")
            x = np.asarray(x)
            idx = np.argsort(-x, kind="stable")[:k]
            return x[idx], idx
    """,
}

# Builds (in memory, into a cache and from that cache) and queries BM25 retrievers, then says
# what it found as one JSON line.
SCRIPT = """
import json, sys
jax_first = sys.argv[1] == "jax-first"
if jax_first:
    import jax  # some other library imported JAX before the retriever was built
if sys.argv[1] == "bm25s-first":
    import bm25s  # some other code imported bm25s (and with it JAX) before the retriever
from knowtrace_train.data.schema import Passage, passage_id
from knowtrace_train.retrieval import RetrieverConfig, build_retriever
from knowtrace_train.retrieval.bm25 import BM25Retriever

def P(title, text):
    return Passage(passage_id(title, text), title, text)

corpus = [
    P("Paris", "Paris is the capital and largest city of France."),
    P("Berlin", "Berlin is the capital of Germany and its largest city."),
    P("Ada Lovelace", "Ada Lovelace was an English mathematician."),
]
top = []
for r in [
    BM25Retriever(corpus, cache_dir=None),
    BM25Retriever(corpus, cache_dir=sys.argv[2]),  # builds the cached index
    BM25Retriever(corpus, cache_dir=sys.argv[2]),  # loads it
    build_retriever(RetrieverConfig(cache_dir=None), corpus),
]:
    top.append([h.passage.title for h in r.search(["capital of Germany", "mathematician"], 1)[0]])
print(json.dumps({
    "top": top,
    "jax_in_sys_modules": "jax" in sys.modules,
    "same_jax_module": (sys.modules.get("jax") is jax) if jax_first else None,
}))
"""


def fake_jax_site(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-in jax package written under tmp_path, and the log it writes its imports and calls to."""
    fake = tmp_path / "fake_site"
    for rel, body in FAKE_JAX.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(textwrap.dedent(body))
    return fake, tmp_path / "jax.log"


def run_python(tmp_path: Path, args: list[str], pythonpath: list[Path], **env_extra: str) -> subprocess.CompletedProcess:
    """`python args...` in a fresh process with `pythonpath` first on its path; asserts it exited 0."""
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in pythonpath] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def run_with_fake_jax(tmp_path: Path, mode: str) -> tuple[dict, list[str], str]:
    fake, log = fake_jax_site(tmp_path)
    proc = run_python(tmp_path, ["-c", SCRIPT, mode, str(tmp_path / "cache")], [fake, REPO], FAKE_JAX_LOG=str(log))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["top"] == [["Berlin"]] * 4, result
    return result, log.read_text().splitlines() if log.exists() else [], proc.stderr


def test_the_fake_jax_is_what_an_unguarded_bm25s_import_would_pick_up(tmp_path):
    """The stand-in is found and used by bm25s itself: otherwise the tests below prove nothing."""
    fake, log = fake_jax_site(tmp_path)
    proc = run_python(tmp_path, ["-c", "import bm25s.selection as s; print(s.JAX_IS_AVAILABLE)"], [fake],
                      FAKE_JAX_LOG=str(log))
    assert proc.stdout.strip() == "True"
    assert "jax.lax.top_k" in log.read_text().splitlines()


def test_building_and_querying_bm25_never_imports_jax(tmp_path):
    result, jax_log, stderr = run_with_fake_jax(tmp_path, "fresh")
    assert jax_log == []
    assert result["jax_in_sys_modules"] is False
    assert "JAX" not in stderr


def test_a_jax_imported_elsewhere_is_left_in_place_and_never_run(tmp_path):
    result, jax_log, stderr = run_with_fake_jax(tmp_path, "jax-first")
    # imported by the script itself, before the retriever; bm25s never ran a JAX op on it
    assert jax_log == ["import jax", "import jax.lax"]
    assert result["jax_in_sys_modules"] is True
    assert result["same_jax_module"] is True
    assert "JAX" not in stderr


def test_a_bm25s_imported_earlier_with_jax_is_reported_once(tmp_path):
    """Too late to keep JAX out then; the retriever still works and says what happened, once."""
    result, jax_log, stderr = run_with_fake_jax(tmp_path, "bm25s-first")
    assert "jax.lax.top_k" in jax_log
    assert stderr.count("bm25s was imported before knowtrace_train's BM25 retriever, with JAX available") == 1, stderr


GPU_SCRIPT = """
import json, sys, torch
from knowtrace_train.data.schema import Passage, passage_id
from knowtrace_train.retrieval.bm25 import BM25Retriever

torch.cuda.init()
torch.cuda.synchronize()
free_before, _ = torch.cuda.mem_get_info()
corpus = [Passage(passage_id(f"doc {i}", f"word{i} text {i % 7}"), f"doc {i}", f"word{i} text {i % 7}") for i in range(200)]
top = []
for cache_dir in (None, sys.argv[1], sys.argv[1]):  # in memory, build into the cache, load from it
    r = BM25Retriever(corpus, cache_dir=cache_dir)
    top.append([h.passage.title for h in r.search(["word3"], 5)[0]])
torch.cuda.synchronize()
free_after, _ = torch.cuda.mem_get_info()
print(json.dumps({"top": top, "free_before": free_before, "free_after": free_after}))
"""


def test_building_and_querying_bm25_leaves_gpu_memory_alone(tmp_path):
    """With the real environment (a real JAX where one is installed), in a fresh process so that
    no earlier test has imported bm25s already."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    proc = run_python(tmp_path, ["-c", GPU_SCRIPT, str(tmp_path / "cache")], [REPO])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["top"] == [["doc 3"]] * 3, result
    # other processes may share the GPU: allow a few MiB of drift, far below what JAX takes
    # (its CUDA context alone is hundreds of MiB, its preallocation 75% of the memory)
    drift = abs(result["free_before"] - result["free_after"])
    assert drift < 16 * 2**20, result
