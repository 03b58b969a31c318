"""The private functions of TRL and bm25s that the code overrides or calls, checked against what it expects of them.

pyproject.toml bounds trl below its next major and bm25s below its next minor, but a minor or patch release may still
move a private function: where one does, these tests fail naming the function, the parameters the code passes, what
the installed version has, and the file of ours that depends on it, so a new release is checked here before the pin
is raised, not in the middle of a run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect

import pytest

#: (distribution, module, attribute path, the parameters our code passes or overrides in this order, our file)
PRIVATE = [
    ("bm25s", "bm25s.scoring", "_build_idf_array",
     ("doc_frequencies", "n_docs", "compute_idf_fn", "dtype"), "knowtrace_train/retrieval/bm25_shards.py"),
    ("bm25s", "bm25s.scoring", "_select_idf_scorer", ("method",), "knowtrace_train/retrieval/bm25_shards.py"),
    ("bm25s", "bm25s.scoring", "_build_scores_and_indices_for_matrix",
     ("corpus_token_ids", "idf_array", "avg_doc_len", "doc_frequencies", "k1", "b", "delta", "nonoccurrence_array",
      "method", "dtype", "int_dtype", "show_progress"), "knowtrace_train/retrieval/bm25_shards.py"),
    ("trl", "trl", "GRPOTrainer._prepare_inputs", ("self", "generation_batch"), "knowtrace_train/train/grpo.py"),
    ("trl", "trl", "GRPOTrainer._get_per_token_logps_and_entropies",
     ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
      "compute_aux_loss"), "knowtrace_train/train/grpo.py"),
]

#: private attributes our trainers read or set, that TRL's trainer classes must themselves use (their source names them)
ATTRIBUTES = [("GRPOTrainer", ("self._step", "self._buffered_inputs", "self.num_iterations", "steps_per_generation"),
               "knowtrace_train/train/grpo.py"),
              ("SFTTrainer", ("self._metrics",), "knowtrace_train/train/trainer.py")]


def _resolve(module: str, path: str):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def check(dist: str, module: str, path: str, expected: tuple[str, ...], ours: str) -> str | None:
    """None where `module.path` takes `expected` as its leading parameters (by name, in order), else why not."""
    version = importlib.metadata.version(dist)
    fn = _resolve(module, path)
    if fn is None:
        return f"{dist} {version}: {module}.{path} is gone; {ours} relies on it: adapt it before allowing this {dist}"
    params = list(inspect.signature(fn).parameters)
    if params[: len(expected)] != list(expected):
        return (f"{dist} {version}: {module}.{path} changed its signature: {ours} expects ({', '.join(expected)}), "
                f"the installed one has ({', '.join(params)}); adapt {ours} before allowing this {dist}")
    return None


@pytest.mark.parametrize("dist, module, path, expected, ours", PRIVATE, ids=[f"{p[1]}.{p[2]}" for p in PRIVATE])
def test_a_private_function_the_code_relies_on_has_the_signature_it_expects(dist, module, path, expected, ours):
    pytest.importorskip(module)
    problem = check(dist, module, path, expected, ours)
    assert problem is None, problem


def test_the_check_names_a_changed_signature():
    """The check itself: a signature that lost or reordered a parameter is named with both lists."""
    problem = check("bm25s", "bm25s.scoring", "_build_idf_array", ("n_docs", "doc_frequencies"), "ours.py")
    assert problem is not None and "_build_idf_array changed its signature" in problem
    assert "expects (n_docs, doc_frequencies)" in problem and "has (doc_frequencies, n_docs" in problem
    gone = check("bm25s", "bm25s.scoring", "_no_such_function", (), "ours.py")
    assert gone is not None and "is gone" in gone


@pytest.mark.parametrize("cls, names, ours", ATTRIBUTES, ids=[a[0] for a in ATTRIBUTES])
def test_trl_trainers_still_use_the_attributes_our_code_reads(cls, names, ours):
    trl = pytest.importorskip("trl")
    source = inspect.getsource(getattr(trl, cls))
    missing = [name for name in names if name not in source]
    assert not missing, (f"trl {importlib.metadata.version('trl')}: {cls} no longer uses {missing}; "
                         f"{ours} reads them: adapt it before allowing this trl")
