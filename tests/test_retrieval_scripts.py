"""The retrieval scripts run end to end on small inputs and end with their JSON line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


def run_script(*args: str) -> tuple[list[str], dict]:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_eval_retrieval_reports_recall_of_titles_and_paragraphs(tmp_path):
    hotpot, musique = FIXTURES / "hotpot_dev_mini.json", FIXTURES / "musique_dev_mini.jsonl"
    lines, summary = run_script(
        "scripts/eval_retrieval.py", "--data", str(hotpot), "--data", str(musique),
        "--retriever", "bm25", "--k", "5", "--cache-dir", str(tmp_path),
    )
    assert set(summary) >= {"recall@5", "queries", "per_file"}
    assert 0.0 <= summary["recall@5"] <= 1.0
    per_file = summary["per_file"]
    assert summary["queries"] == sum(v["queries"] for v in per_file.values()) > 0
    assert "recall@5 of titles" in lines[0] and "recall@5 of paragraphs" in lines[1]


def test_eval_retrieval_with_k_as_large_as_the_corpus_finds_everything(tmp_path):
    _, summary = run_script(
        "scripts/eval_retrieval.py", "--data", str(FIXTURES / "musique_dev_mini.jsonl"),
        "--k", "1000", "--cache-dir", "none",
    )
    # every gold paragraph shares a word with its question in these items
    assert summary["recall@1000"] == pytest.approx(1.0)


def test_eval_retrieval_on_the_real_samples(shared_data, tmp_path):
    _, summary = run_script(
        "scripts/eval_retrieval.py", "--data", str(shared_data / "2wikimultihopqa" / "dev.json"),
        "--cache-dir", str(tmp_path),
    )
    assert summary["queries"] == 64 and summary["unit"] == "titles"
    assert 0.3 < summary["recall@5"] <= 1.0


def test_bench_retrieval_runs_small():
    pytest.importorskip("rank_bm25")
    pytest.importorskip("psutil")
    _, summary = run_script("scripts/bench/bench_retrieval.py", "--passages", "3000", "--queries", "300", "--ref-queries", "30")
    assert summary["passages"] >= 3000 and summary["queries"] == 300
    assert set(summary) >= {"qps", "reference_qps", "ratio", "top5_agreement"}
    assert summary["top5_agreement"] >= 0.9


def test_bench_retrieval_scale_mode_runs_small(tmp_path):
    pytest.importorskip("psutil")
    lines, summary = run_script("scripts/bench/bench_retrieval.py", "--scale", "3000", "--shard-passages", "1500",
                                "--queries", "300", "--workdir", str(tmp_path))
    assert summary["passages"] == 3000 + 2413 and summary["shards"] == 4
    assert summary["recall_at_5"] >= 0.9 and summary["qps_batched"] > 0 and summary["build_peak_mb"] > 0
    # MaxScore and the exhaustive search side by side: the same top k
    assert set(summary["pruning"]) == {"none", "maxscore"} and summary["same_results"] is True
    assert summary["pruning"]["none"]["qps_one_query_per_call"] > 0 and summary["maxscore_speedup_batched"] > 0
    # without --pyserini the Lucene side is skipped, with a line that says so
    assert summary["lucene"] is None
    assert any(line.startswith("lucene: skipped") for line in lines)


@pytest.mark.skipif(not os.environ.get("KNOWTRACE_PYSERINI_PYTHON"),
                    reason="set KNOWTRACE_PYSERINI_PYTHON to the python of an environment with Pyserini (and a JDK)")
def test_bench_retrieval_scale_mode_against_lucene(tmp_path):
    pytest.importorskip("psutil")
    _, summary = run_script("scripts/bench/bench_retrieval.py", "--scale", "3000", "--queries", "300", "--workdir", str(tmp_path),
                            "--pyserini", os.environ["KNOWTRACE_PYSERINI_PYTHON"])
    lucene = summary["lucene"]
    assert lucene["documents"] == summary["passages"] and lucene["build_s"] > 0 and lucene["build_peak_mb"] > 0
    for name in ("bm25_k1_0.9_b_0.4", "bm25_k1_1.2_b_0.75"):
        assert lucene[name]["num_docs"] == summary["passages"] and lucene[name]["qps_batched"] > 0
    # Lucene at our k1 and b ranks nearly as we do on this small corpus
    assert summary["lucene_overlap_at_k"] >= 0.9 and summary["lucene_recall_at_5"] >= 0.9


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_retrieval", REPO / "scripts" / "bench" / "bench_retrieval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_topk_overlap_counts_shared_passages_per_query():
    bench = _bench_module()
    ours = [["a", "b", "c", "d", "e"], ["a", "b"], [], ["x", "y", "z", "w", "v", "extra"]]
    theirs = [["e", "d", "c", "b", "a"], ["b", "c", "d"], [], ["x", "q", "r", "s", "t"]]
    # order inside the top k does not matter; fewer hits than k divide by the longer list; two empty lists agree
    assert bench.topk_overlap(ours, theirs, 5) == [1.0, 1 / 3, 1.0, 0.2]
    with pytest.raises(ValueError):
        bench.topk_overlap(ours, theirs[:2], 5)


def test_pyserini_collection_holds_the_text_our_index_gets(tmp_path):
    bench = _bench_module()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "title": "Drelovia", "text": "The capital is Vamay."}) + "\n\n"
                      + json.dumps({"id": "p2", "title": "", "text": "No title here."}) + "\n")
    assert bench.write_pyserini_collection(corpus, tmp_path / "lucene_input") == 2
    rows = [json.loads(line) for line in (tmp_path / "lucene_input" / "docs.jsonl").read_text().splitlines()]
    assert rows == [{"id": "p1", "contents": "Drelovia\nThe capital is Vamay."}, {"id": "p2", "contents": "No title here."}]


def test_analysis_differences_name_the_terms_on_one_side_only():
    bench = _bench_module()
    ours = [["capit", "drelovia"], ["technologi", "institut"], ["found"]]
    lucene = [["drelovia", "capit"], ["technolog", "institut"], ["found"]]
    got = bench.analysis_differences(ours, lucene, [1.0, 0.6, 0.8])
    assert got["queries_tokenized_alike"] == pytest.approx(2 / 3)
    assert got["overlap_tokenized_alike"] == pytest.approx(0.9) and got["overlap_tokenized_differently"] == pytest.approx(0.6)
    assert got["terms_only_ours"] == [("technologi", 1)] and got["terms_only_lucene"] == [("technolog", 1)]
