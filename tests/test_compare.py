"""scripts/compare_methods.py: methods x datasets through evaluate, the Table 1 and Table 5 layouts, resume and paired tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from knowtrace_train.compare import CompareConfig, compare, figures, format_tables, load_compare_config
from knowtrace_train.config import ConfigError
from knowtrace_train.data.loaders import load_items
from knowtrace_train.generation.base import Completion

REPO = Path(__file__).resolve().parents[1]
DEV = REPO / "data" / "world" / "dev.jsonl"


def _config(tmp_path: Path, methods: str, limit: int = 20) -> Path:
    f = tmp_path / "compare.yaml"
    f.write_text(f"methods:\n{methods}\nlimit: {limit}\noutput_dir: {tmp_path / 'out'}\n")
    return f


class Oracle:
    """RA-CoT answers right on the even questions of the dev file; IRCoT on every third."""

    def __init__(self) -> None:
        self.items = {it.question: (i, it.answer) for i, it in enumerate(load_items(DEV))}

    def generate(self, requests):
        out = []
        for r in requests:
            q = (r.prompt + r.prefix).rsplit("Question:", 1)[-1].split("\n", 1)[0].strip()
            i, answer = self.items[q]
            right = i % 2 == 0 if r.prefix == "Answer:" and "Documents" in r.prompt and r.max_new_tokens == 96 else i % 3 == 0
            text = f" So the answer is: {answer if right else 'nobody'}."
            out.append(Completion(text=text, prompt_tokens=3, output_tokens=3, finish_reason="stop"))
        return out

    def count_tokens(self, text):
        return len(text.split())

    def close(self):
        pass


def test_compare_pairs_each_method_with_the_reference_and_resumes(tmp_path):
    cfg_file = _config(tmp_path, "  - name: ra_cot\n  - name: ircot\n    max_rounds: 2", limit=24)
    cfg = load_compare_config(cfg_file)
    cells = compare(cfg, generator=Oracle(), progress=False)
    ra, ir = cells
    assert (ra.method, ir.method) == ("ra_cot", "ircot") and ra.summary.questions == ir.summary.questions == 24
    assert ra.summary.em == 12 / 24 and ir.summary.em == 8 / 24
    # the same 24 questions, paired: right only by RA-CoT are the even ones not divisible by 3 (8), only IRCoT 4
    assert ra.vs_reference is None and ir.vs_reference["n"] == 24
    em = ir.vs_reference["em"]
    assert em["test"] == "mcnemar" and em["diff"] == pytest.approx(-4 / 24)
    from knowtrace_train.metrics import mcnemar_p_value

    assert em["p_value"] == pytest.approx(mcnemar_p_value(8, 4))
    text = format_tables(cells)
    assert "| ra_cot | 0.500 |" in text and "Table 5 layout" in text and "-0.167 p=0.39" in text
    assert "bridge (n=" in text and "comparison (n=" in text
    fig = figures(cells, cfg)
    assert fig["cells"]["ircot"]["world"]["vs_reference"]["em_diff"] == -0.1667 and fig["reference"] == "ra_cot"
    # a rerun resumes: nothing runs again (a generator that would fail proves it)
    again = compare(cfg, generator=None, progress=False)
    assert [c.summary.new for c in again] == [0, 0] and again[1].summary.em == ir.summary.em
    # settings that change no output (progress bars) do not stop a resume
    quiet = load_compare_config(cfg_file, ["--generator.progress", "false"])
    assert [c.summary.new for c in compare(quiet, generator=None, progress=False)] == [0, 0]
    # other settings into the same folder are refused, naming the cell file
    with pytest.raises(ConfigError, match=r"ircot.cell.json: the cell was run with other strategy settings"):
        compare(load_compare_config(_config(tmp_path, "  - name: ra_cot\n  - name: ircot\n    max_rounds: 3")),
                generator=Oracle(), progress=False)


def test_compare_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"methods\[1\].name.*unknown method 'nope'"):
        load_compare_config(_config(tmp_path, "  - name: ra_cot\n  - name: nope"))
    with pytest.raises(ConfigError, match=r"unknown key 'methods\[0\].max_pairs' for RACoTConfig"):
        load_compare_config(_config(tmp_path, "  - name: ra_cot\n    max_pairs: 3"))
    assert [m.name for m in CompareConfig().methods] == ["knowtrace", "ra_cot", "react", "ircot", "self_ask", "iter_retgen"]


def test_the_script_runs_end_to_end_on_the_tiny_model(tmp_path, tiny_model_dir):
    f = _config(tmp_path, "  - name: knowtrace\n    max_rounds: 1\n  - name: self_ask\n    max_rounds: 1", limit=2)
    cmd = [sys.executable, "scripts/compare_methods.py", "--config", str(f), "--quiet",
           "--generator.model", str(tiny_model_dir), "--generator.prompt_format", "plain"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    fig = json.loads(lines[-1])
    assert set(fig["cells"]) == {"knowtrace", "self_ask"} and fig["cells"]["self_ask"]["world"]["questions"] == 2
    assert fig["cells"]["self_ask"]["world"]["vs_reference"]["n"] == 2
    assert any(line.startswith("| knowtrace |") for line in lines) and "Table 1 layout: EM and F1" in lines
    rows = [json.loads(x) for x in (tmp_path / "out" / "world" / "self_ask.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["strategy"] == "self_ask" and r["calls"] for r in rows)


def test_compare_prints_each_method_s_mechanism_statistics(tmp_path):
    from scripted import Scripted

    def script(role, prompt):
        task = prompt.rsplit("\n\n", 1)[-1]
        if role == "decompose":  # one sub-question, then finish
            return " finish" if "Answer 1:" in task else " Who founded it?"
        if role == "selfanswer":
            return " Nobody\nConfidence: certain"
        return " nobody"

    cfg = load_compare_config(_config(tmp_path, "  - name: mintqa_parametric\n  - name: mintqa_dynamic", limit=3))
    cells = compare(cfg, generator=Scripted(script), progress=False)
    par, dyn = cells
    assert par.mechanism == {} and dyn.summary.questions == 3
    assert {k: s.cell() for k, s in dyn.mechanism.items()} == {"subquestions_per_question": "3/3 = 1.000",
                                                               "certain_share": "3/3 = 1.000"}
    text = format_tables(cells)
    assert "| world | mintqa_dynamic | subquestions_per_question: 3/3 = 1.000 | certain_share: 3/3 = 1.000 |" in text
    assert "| world | mintqa_parametric | none (the method records no mechanism statistic) |  |" in text
    fig = figures(cells, cfg)["cells"]
    assert fig["mintqa_dynamic"]["world"]["mechanism"]["certain_share"] == {"numerator": 3, "denominator": 3, "value": 1.0,
                                                                             "note": None}
    # a resumed comparison reads the statistics back from the cell's file
    again = compare(cfg, generator=None, progress=False)
    assert again[1].mechanism == dyn.mechanism
