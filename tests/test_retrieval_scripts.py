"""The retrieval scripts run end to end on small inputs and end with their JSON line."""

from __future__ import annotations

import json
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
    try:
        import knowtrace_train.data.world  # noqa: F401
    except ImportError:
        pytest.skip("the synthetic world (knowtrace_train.data.world) is not in this checkout")
    _, summary = run_script("scripts/bench_retrieval.py", "--passages", "3000", "--queries", "300", "--ref-queries", "30")
    assert summary["passages"] >= 3000 and summary["queries"] == 300
    assert set(summary) >= {"qps", "reference_qps", "ratio", "top5_agreement"}
    assert summary["top5_agreement"] >= 0.9


def test_bench_retrieval_scale_mode_runs_small(tmp_path):
    pytest.importorskip("psutil")
    _, summary = run_script("scripts/bench_retrieval.py", "--scale", "3000", "--shard-passages", "1500",
                            "--queries", "300", "--workdir", str(tmp_path))
    assert summary["passages"] == 3000 + 2413 and summary["shards"] == 4
    assert summary["recall_at_5"] >= 0.9 and summary["qps_batched"] > 0 and summary["build_peak_mb"] > 0
