"""The per-iteration table, summary.json, the last JSON line and the comparison figure: intervals and paired tests."""

from __future__ import annotations

import json

import pytest

from knowtrace_train.report import (
    COLUMNS,
    NO_INTERVAL,
    comparison_table,
    em_intervals,
    headline,
    plot_runs,
    summarize_run,
    table_header,
    table_row,
)
from knowtrace_train.selftrain.config import SelfTrainConfig


def _iv(mean: float, low: float | None, high: float | None, n: int) -> dict:
    return {"mean": mean, "low": low, "high": high, "n": n, "confidence": 0.95,
            "note": None if low is not None else "n < 20: too few questions for an interval"}


def _cmp(diff: float, p: float) -> dict:
    em = {"n": 24, "mean_a": 0.2, "mean_b": 0.2 + diff, "diff": diff, "low": -0.1, "high": 0.2, "p_value": p,
          "test": "mcnemar", "confidence": 0.95, "note": None}
    return {"model": "M0", "n": 24, "em": em, "f1": {**em, "test": "paired_bootstrap"}}


def _eval(em: float, n: int, low: float | None = None, high: float | None = None) -> dict:
    return {"questions": n, "em": em, "f1": em + 0.05, "em_interval": _iv(em, low, high, n),
            "f1_interval": _iv(em + 0.05, low, high, n),
            "by_kind": {"bridge": {"n": n - 4, "em": em, "interval": _iv(em, None, None, n - 4)},
                        "comparison": {"n": 4, "em": 0.5, "interval": _iv(0.5, None, None, 4)}},
            "evidence_supported": 3, "evidence_supported_em": 3 / n, "seconds": 1.0}


def _metrics(n: int = 24, bounds: bool = True) -> list[dict]:
    b = (lambda lo, hi: (lo, hi)) if bounds else (lambda lo, hi: (None, None))
    base = {"iteration": "base", "model": "base", "eval": _eval(0.0, n, *b(0.0, 0.0)), "seconds": {"eval": 1.0}}
    m0 = {"iteration": 0, "model": "M0 (bootstrapped)", "gold": {"trajectories": 8},
          "sft_records": {"explore": 10, "complete": 12, "answer": 0}, "train": {"bootstrap": {"loss": 1.5, "records": 22}},
          "eval": _eval(0.25, n, *b(0.1666, 0.3334)), "vs_base": _cmp(0.25, 0.0078), "seconds": {"train": 3.0, "eval": 1.0}}
    iters = []
    for z, em, cmp in ((1, 0.2917, _cmp(0.0417, 0.617)), (2, 0.2083, _cmp(-0.0417, 1.0))):
        iters.append({
            "iteration": z, "model": f"M{z}", "status": "trained",
            "rollout": {"questions": 6, "correct": 3, "em": 0.5},
            "rationale": {"fa_ratio": 0.21, "fa_by_role": {"explore": 0.3, "complete": 0.1, "answer": 0.0}},
            "sft_records": {"explore": 5, "complete": 6}, "train": {"explore": {"records": 5, "loss": 1.2},
                                                                    "complete": {"records": 6, "loss": 1.1}},
            "eval": _eval(em, n, *b(em - 0.12, em + 0.13)), "vs_m0": cmp, "vs_previous": cmp,
            "seconds": {"rollout": 1.0, "rationalize": 0.1, "train": 5.0, "eval": 1.0},
        })
    return [base, m0, *iters]


def _cell(row: str, name: str) -> str:
    """The text of column `name` in a row laid out by COLUMNS (two spaces between cells)."""
    start = 0
    for col, width in COLUMNS:
        if col == name:
            return row[start : start + width]
        start += width + 2
    raise KeyError(name)


def test_table_row_prints_em_with_its_interval_and_the_paired_test_against_m0():
    rows = [table_row(m) for m in _metrics()]
    header = table_header()
    assert "dev EM [95% CI]" in header and "EM vs M0" in header
    assert all(len(r) == len(header) for r in rows)  # aligned: every cell fills its column
    assert _cell(rows[1], "dev EM [95% CI]") == " 0.250 [0.17,0.33]"
    assert _cell(rows[2], "dev EM [95% CI]") == " 0.292 [0.17,0.42]"
    assert _cell(rows[2], "EM vs M0") == "+0.042 p=0.62" and _cell(rows[3], "EM vs M0") == "-0.042 p=1.00"
    assert _cell(rows[1], "EM vs M0").strip() == "-"  # M0 is not compared with itself
    assert _cell(rows[2], "dev F1").strip() == "0.342"
    assert not any(NO_INTERVAL in r for r in rows)


def test_under_20_dev_questions_the_row_says_no_interval():
    rows = [table_row(m) for m in _metrics(n=12, bounds=False)]
    assert all(r.endswith("  (n<20: no interval)") for r in rows)
    assert _cell(rows[2], "dev EM [95% CI]").strip() == "0.292"
    assert _cell(rows[2], "EM vs M0") == "+0.042 p=0.62"  # McNemar's p holds at any n
    assert all(len(r) == len(table_header()) + len("  " + NO_INTERVAL) for r in rows)


def test_rows_of_a_run_without_intervals_and_of_an_empty_iteration():
    old = _metrics()[2]
    for k in ("em_interval", "f1_interval", "by_kind"):
        old["eval"].pop(k)
    old.pop("vs_m0")
    row = table_row(old)
    assert _cell(row, "dev EM [95% CI]").strip() == "0.292" and _cell(row, "EM vs M0").strip() == "-"
    assert not row.endswith(NO_INTERVAL)
    empty = {**_metrics()[2], "status": "empty", "eval": None, "vs_m0": None}
    row = table_row(empty)
    assert _cell(row, "dev EM [95% CI]").strip() == "empty" and _cell(row, "EM vs M0").strip() == "-"


def test_summary_and_headline_carry_intervals_kinds_evidence_and_paired_tests(tmp_path):
    metrics = _metrics()
    s = json.loads(json.dumps(summarize_run(SelfTrainConfig(), tmp_path, metrics)))
    for entry, m in ((s["base"], metrics[0]), (s["bootstrap"], metrics[1]), *zip(s["iterations"], metrics[2:])):
        ev = m["eval"]
        assert entry["em"] == ev["em"] and entry["em_interval"] == ev["em_interval"] and entry["by_kind"] == ev["by_kind"]
        assert entry["evidence_supported_em"] == ev["evidence_supported_em"] and entry["evidence_supported"] == 3
    assert s["bootstrap"]["vs_base"] == metrics[1]["vs_base"]
    assert [r["vs_m0"] for r in s["iterations"]] == [m["vs_m0"] for m in metrics[2:]]
    assert [r["vs_previous"] for r in s["iterations"]] == [m["vs_previous"] for m in metrics[2:]]
    line = headline(s)
    assert line["base_em_interval"] == [0.0, 0.0] and line["m0_em_interval"] == [0.1666, 0.3334]
    assert line["em_interval"] == [[0.1717, 0.4217], [0.0883, 0.3383]]
    assert line["p_vs_m0"] == [0.617, 1.0] and line["em_diff_vs_m0"] == [0.0417, -0.0417]
    assert line["m0_p_vs_base"] == 0.0078
    small = headline(summarize_run(SelfTrainConfig(), tmp_path, _metrics(n=12, bounds=False)))
    assert small["em_interval"] == [None, None] and small["m0_em_interval"] is None
    assert small["p_vs_m0"] == [0.617, 1.0]


def test_comparison_table_shows_intervals(tmp_path):
    big = summarize_run(SelfTrainConfig(name="big"), tmp_path, _metrics())
    small = summarize_run(SelfTrainConfig(name="small"), tmp_path, _metrics(n=12, bounds=False))
    lines = comparison_table([big, small]).splitlines()
    assert "dev EM [95% CI]" in lines[0] and "EM vs M0" in lines[0]
    mine = [x for x in lines if x.startswith("big ")]
    assert len(mine) == 4 and "0.250 [0.17,0.33]" in mine[1] and mine[2].endswith("+0.042 p=0.62")
    theirs = [x for x in lines if x.startswith("small ")]
    assert all(x.endswith(NO_INTERVAL) for x in theirs) and "[" not in "".join(theirs)


def test_plot_draws_em_intervals_as_error_bars(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    drawn = []
    errorbar = Axes.errorbar

    def record(self, x, y, *args, **kw):
        drawn.append((list(x), list(y), kw.get("yerr")))
        return errorbar(self, x, y, *args, **kw)

    monkeypatch.setattr(Axes, "errorbar", record)
    big = summarize_run(SelfTrainConfig(name="big"), tmp_path, _metrics())
    small = summarize_run(SelfTrainConfig(name="small"), tmp_path, _metrics(n=12, bounds=False))
    assert em_intervals(big) == [[0.1666, 0.3334], [0.1717, 0.4217], [0.0883, 0.3383]]
    assert em_intervals(small) == [None, None, None]
    out = plot_runs([big, small], tmp_path / "fig.png")
    assert out.stat().st_size > 1000
    assert len(drawn) == 1  # the run without intervals draws none
    x, y, (below, above) = drawn[0]
    assert x == [0, 1, 2] and y == [0.25, 0.2917, 0.2083]
    assert below == pytest.approx([0.0834, 0.12, 0.12]) and above == pytest.approx([0.0834, 0.13, 0.13])


def _run_folder(root, name: str, evals: dict[int, list[tuple[str, float]]]):
    """A finished run folder as load_run reads it: summary.json and each model's eval.jsonl (M0 in
    iter_0), rows written in the given order."""
    d = root / name
    for z, rows in evals.items():
        (d / f"iter_{z}").mkdir(parents=True)
        with open(d / f"iter_{z}" / "eval.jsonl", "w") as f:
            for qid, em in rows:
                f.write(json.dumps({"question_id": qid, "answers": ["x"], "prediction": "x" if em else "y",
                                    "em": em, "f1": em}) + "\n")
    mean = lambda z: sum(e for _, e in evals[z]) / len(evals[z])  # noqa: E731
    summary = {"run_dir": "/elsewhere/" + name, "name": "same_config", "mode": "backtrace",
               "bootstrap": {"em": mean(0), "f1": mean(0)},
               "iterations": [{"iteration": z, "em": mean(z), "f1": mean(z)} for z in sorted(evals) if z > 0]}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_runs_are_paired_question_by_question_whatever_the_files_order(tmp_path):
    from knowtrace_train.report import between_runs_table, load_run, paired_between_runs

    ids = [f"q{i:02d}" for i in range(30)]
    m0 = [(q, 1.0 if i < 6 else 0.0) for i, q in enumerate(ids)]
    # iteration 1: run a right on q00-q09, run b on q07-q17
    a1 = [(q, 1.0 if i < 10 else 0.0) for i, q in enumerate(ids)]
    b1 = [(q, 1.0 if 7 <= i < 18 else 0.0) for i, q in enumerate(ids)]
    a = _run_folder(tmp_path, "a", {0: m0, 1: a1})
    b = _run_folder(tmp_path, "b", {0: list(reversed(m0)), 1: b1[::-1]})  # another order: matched by id
    ra, rb = load_run(a), load_run(b)
    assert ra["run_dir"] == str(a)  # where it was read from, not where it ran
    rows = paired_between_runs([ra, rb])
    assert [r["iteration"] for r in rows] == [0, 1] and all("refused" not in r for r in rows)
    assert rows[0]["em"]["diff"] == 0 and rows[0]["em"]["p_value"] == 1.0 and (rows[0]["only_a"], rows[0]["only_b"]) == (0, 0)
    # only a: q00-q06 (7), only b: q10-q17 (8); exact McNemar: min 7 of 15 -> 2 * sum C(15, i<=7) / 2^15 = 1.0
    assert (rows[1]["only_a"], rows[1]["only_b"]) == (7, 8)
    assert rows[1]["n"] == 30 and rows[1]["em"]["diff"] == pytest.approx(1 / 30)
    assert rows[1]["em"]["p_value"] == 1.0 and rows[1]["em"]["test"] == "mcnemar"
    # a clearer case: b right on 3 more questions than a and wrong on none a got: p = 2 / 2^3 = 0.25
    c = _run_folder(tmp_path, "c", {0: m0, 1: [(q, 1.0 if i < 13 else 0.0) for i, q in enumerate(ids)]})
    rows = paired_between_runs([ra, load_run(c)])
    assert (rows[1]["only_a"], rows[1]["only_b"]) == (0, 3) and rows[1]["em"]["p_value"] == 0.25
    table = between_runs_table(rows).splitlines()
    assert table[2].split()[:4] == ["c", "-", "a", "1"] and "+0.100" in table[2] and "p=0.25" in table[2]
    assert table[2].endswith("0/3")
    # runs of the same config are told apart by their folders in the comparison table
    assert [line.split()[0] for line in comparison_table([ra, load_run(c)]).splitlines()[1:]] == ["a", "a", "c", "c"]


def test_runs_over_other_questions_are_not_paired(tmp_path):
    from knowtrace_train.report import between_runs_table, load_run, paired_between_runs

    ids = [f"q{i:02d}" for i in range(24)]
    a = _run_folder(tmp_path, "a", {0: [(q, 1.0) for q in ids], 1: [(q, 0.0) for q in ids]})
    b = _run_folder(tmp_path, "b", {0: [(q, 1.0) for q in ids[:20]] + [("other", 1.0)]})
    rows = paired_between_runs([load_run(a), load_run(b)])
    assert len(rows) == 1 and rows[0]["iteration"] == 0  # iteration 1 is in run a alone
    assert "other questions" in rows[0]["refused"]
    assert "not paired: cannot pair" in between_runs_table(rows)
    (b / "iter_0" / "eval.jsonl").unlink()
    rows = paired_between_runs([load_run(a), load_run(b)])
    assert "eval.jsonl" in rows[0]["refused"]


def test_small_dev_note_says_when_the_dev_set_cannot_show_a_difference():
    from knowtrace_train.report import HEADLINE_COMMAND, small_dev_note

    def iv(low, high, n):
        return {"mean": (low + high) / 2, "low": low, "high": high, "n": n}

    wide = {"bootstrap": {"em_interval": iv(0.08, 0.42, 24)}, "iterations": [{"iteration": 1, "em_interval": iv(0.1, 0.3, 24)}]}
    note = small_dev_note(wide)
    assert note.startswith("24 dev questions cannot show the differences above: M0's 95% EM interval is 0.34 wide")
    assert "one question is 0.042 of EM" in note and HEADLINE_COMMAND in note
    narrow = {"bootstrap": {"em_interval": iv(0.2, 0.4, 200)}, "iterations": [{"iteration": 1, "em_interval": iv(0.15, 0.33, 200)}]}
    assert small_dev_note(narrow) is None
    low_em = {"bootstrap": {"em_interval": iv(0.04, 0.33, 24)}, "iterations": [{"iteration": 1, "em_interval": iv(0.0, 0.25, 24)}]}
    assert small_dev_note(low_em).startswith("24 dev questions cannot show the differences above: they are fewer than "
                                             "100 (M0's 95% EM interval is 0.29 wide)")
    few = {"bootstrap": {"em_interval": {"mean": 0.5, "low": None, "high": None, "n": 8}}, "iterations": []}
    assert "8 dev questions cannot show the differences above: they are too few for an interval" in small_dev_note(few)
