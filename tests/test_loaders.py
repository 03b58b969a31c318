import json
import logging
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowtrace_train.data.loaders import (
    FORMATS,
    LoadReport,
    detect_format,
    load_items,
    load_items_report,
    split_from_name,
)
from knowtrace_train.data.schema import QAItem, passage_id
from knowtrace_train.io import DataFileError

FIX = Path(__file__).parent / "fixtures"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _jsonl(tmp_path: Path, name: str, rows) -> Path:
    return _write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in rows))


# -- detection ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("hotpot_dev_mini.json", "hotpotqa"),
        ("2wiki_dev_mini.json", "2wikimultihopqa"),
        ("musique_dev_mini.jsonl", "musique"),
        ("mintqa.json", "mintqa"),
        ("generic.jsonl", "generic"),
        ("flashrag.jsonl", "flashrag"),
    ],
)
def test_detect_format_by_content(tmp_path, name, fmt):
    assert detect_format(FIX / name) == fmt
    # the file name plays no part
    renamed = _write(tmp_path, "data.txt", (FIX / name).read_text())
    assert detect_format(renamed) == fmt
    assert load_items_report(renamed).format == fmt


def test_format_can_be_forced_and_unknown_format_is_rejected():
    items = load_items(FIX / "hotpot_dev_mini.json", format="2wikimultihopqa")
    assert [it.dataset for it in items] == ["2wikimultihopqa"] * 2
    with pytest.raises(DataFileError, match=r"hotpot_dev_mini\.json: unknown format 'hotpot'"):
        load_items(FIX / "hotpot_dev_mini.json", format="hotpot")


def test_undetectable_format_names_file_and_keys(tmp_path):
    p = _jsonl(tmp_path, "x.jsonl", [{"q": "Who?", "a": "me"}])
    with pytest.raises(DataFileError, match=r"x\.jsonl: cannot tell the format .*\['a', 'q'\]"):
        load_items(p)
    with pytest.raises(DataFileError, match="cannot tell the format"):
        detect_format(p)


def test_a_missing_data_file_names_the_path_and_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataFileError, match=r"data/world/dev\.jsonl: no such data file \(relative to the working directory"):
        load_items("data/world/dev.jsonl")
    with pytest.raises(DataFileError, match=r"nowhere\.jsonl: no such data file$"):
        load_items(tmp_path / "nowhere.jsonl")


def test_split_from_name():
    assert split_from_name("hotpot_dev_distractor_v1.json") == "dev"
    assert split_from_name("musique_ans_v1.0_train.jsonl") == "train"
    assert split_from_name("data/test.jsonl") == "test"
    assert split_from_name("validation.json") == "dev"
    assert split_from_name("train_and_dev.json") == "unknown"  # ambiguous
    assert split_from_name("mintqa.json") == "unknown"
    assert split_from_name("contest.json") == "unknown"  # whole words only


# -- HotpotQA ------------------------------------------------------------------------


def test_hotpotqa_item():
    bridge, comparison = load_items(FIX / "hotpot_dev_mini.json")
    assert (bridge.id, bridge.answers, bridge.type, bridge.hops) == ("hp-bridge-1", ("Port Aster",), "bridge", 2)
    assert (bridge.dataset, bridge.split) == ("hotpotqa", "dev")
    # sentences carry their own leading spaces: joined with ""
    hollen = bridge.context[1]
    assert hollen.title == "Mira Hollen"
    assert hollen.text == "Mira Hollen (born 1961) is a Veldish novelist. She was born in Port Aster. She lives in Orvane."
    assert hollen.id == passage_id("Mira Hollen", hollen.text)
    ev = bridge.evidence
    assert ev.titles == ("The Glass Orchard", "Mira Hollen")  # ordered, unique
    assert ev.sentences == (("The Glass Orchard", 0), ("Mira Hollen", 1), ("Mira Hollen", 0))
    assert ev.paragraph_ids == (bridge.context[0].id, bridge.context[1].id)
    assert ev.triples == () and ev.sub_questions == ()
    assert comparison.answers == ("yes",) and comparison.type == "comparison"


# -- 2WikiMultihopQA -----------------------------------------------------------------


def test_2wiki_item_triples_and_duplicate_paragraph():
    (item,) = load_items(FIX / "2wiki_dev_mini.json")
    assert (item.dataset, item.type, item.hops, item.answers) == ("2wikimultihopqa", "bridge_comparison", 2, ("Lantern Drift",))
    # the repeated "Salt Meridian" paragraph is kept once
    assert [p.title for p in item.context] == ["Salt Meridian", "Anouk Bregman", "Lantern Drift", "Tomas Reel"]
    # 2Wiki sentences carry no whitespace: joined with " "
    assert item.context[0].text == "Salt Meridian is a 2004 film directed by Anouk Bregman. It was shot in Orvane."
    assert item.evidence.triples[0] == ("Salt Meridian", "director", "Anouk Bregman")
    assert len(item.evidence.triples) == 4
    assert item.evidence.titles == ("Salt Meridian", "Lantern Drift", "Anouk Bregman", "Tomas Reel")
    by_title = {p.title: p.id for p in item.context}
    assert item.evidence.paragraph_ids == tuple(by_title[t] for t in item.evidence.titles)


# -- MuSiQue -------------------------------------------------------------------------


def test_musique_items():
    two, three = load_items(FIX / "musique_dev_mini.jsonl")
    assert two.answers == ("Port Aster", "Aster")
    assert (two.type, two.hops, two.split) == ("2hop", 2, "dev")
    assert [p.title for p in two.context] == ["Port Aster", "The Glass Orchard", "Mira Hollen"]
    subs = two.evidence.sub_questions
    assert [s.question for s in subs] == ["The Glass Orchard >> author", "Where was #1 born?"]  # "#1" kept
    assert [s.answer for s in subs] == ["Mira Hollen", "Port Aster"]
    assert subs[0].paragraph_ids == (two.context[1].id,)
    assert two.evidence.paragraph_ids == (two.context[1].id, two.context[2].id)
    assert two.evidence.titles == ("The Glass Orchard", "Mira Hollen")
    # supporting paragraphs in decomposition (chain) order, not paragraph order
    assert (three.type, three.hops) == ("3hop1", 3)
    assert three.evidence.titles == ("Salt Meridian", "Anouk Bregman", "Netherlands")


def test_musique_json_array_loads_like_jsonl(tmp_path):
    rows = [json.loads(line) for line in (FIX / "musique_dev_mini.jsonl").read_text().splitlines()]
    p = _write(tmp_path, "musique_dev.json", json.dumps(rows, indent=1))
    assert load_items(p) == load_items(FIX / "musique_dev_mini.jsonl")


def test_musique_bad_support_index_names_field(tmp_path):
    row = json.loads((FIX / "musique_dev_mini.jsonl").read_text().splitlines()[0])
    row["question_decomposition"][1]["paragraph_support_idx"] = 7
    p = _jsonl(tmp_path, "m.jsonl", [row])
    with pytest.raises(DataFileError, match=r"m\.jsonl:1: field 'question_decomposition'\[1\].*7"):
        load_items(p)


# -- MINTQA --------------------------------------------------------------------------


def test_mintqa_items():
    items = {it.id: it for it in load_items(FIX / "mintqa.json")}
    assert len(items) == 6
    assert Counter(it.hops for it in items.values()) == {1: 2, 2: 2, 3: 1, 4: 1}
    one = items["invented-pop-1hop"]
    assert (one.dataset, one.type, one.hops) == ("mintqa", "unpopular", 1)
    assert one.evidence.triples == (("Lake Orvane", "country", "Veldmark"),)
    # a 1-hop item's knowledge type rides on one sub-question: the main question itself
    assert [(s.question, s.answer, s.knowledge_type) for s in one.evidence.sub_questions] == [
        ("In which country is Lake Orvane located?", "Veldmark", "unpopular")
    ]
    assert items["invented-ti-1hop"].answers == ("Northgate Observatory", "the Northgate Observatory of Veldmark")
    four = items["invented-ti-4hop"]
    assert four.type == "new-new-new-old"
    assert [s.knowledge_type for s in four.evidence.sub_questions] == ["new", "new", "new", "old"]
    assert four.evidence.triples[-1] == ("United Kingdom", "highest point", "Ben Nevis")
    assert four.evidence.sub_questions[2].answer == "United Kingdom"
    assert items["invented-pop-2hop"].type == "popular-unpopular"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hops": 3}, r"field 'hops' is 3 but 'triplets' has 2"),
        ({"sub_questions": None}, r"missing required field 'sub_questions'"),
        ({"triplets": [["a", "b"]] * 2}, r"field 'triplets'\[0\]"),
        ({"answer": None}, r"missing required field 'answer'"),
    ],
)
def test_mintqa_bad_rows(tmp_path, change, message):
    row = json.loads((FIX / "mintqa.json").read_text())[2]
    row.update(change)
    with pytest.raises(DataFileError, match=r"bad\.json: item 0: " + message):
        load_items(_write(tmp_path, "bad.json", json.dumps([row])))


def test_mintqa_unknown_knowledge_type_and_default_id(tmp_path):
    rows = json.loads((FIX / "mintqa.json").read_text())
    rows[3]["sub_questions"][1]["type"] = "recent"
    with pytest.raises(DataFileError, match=r"item 3: field 'sub_questions\[1\]\.type' must be one of new, old"):
        load_items(_write(tmp_path, "m.json", json.dumps(rows)))
    one = dict(rows[0])
    del one["id"]
    (item,) = load_items(_write(tmp_path, "m2.json", json.dumps([one])))
    assert item.id == "mintqa-0"


# -- generic / FlashRAG --------------------------------------------------------------


def test_generic_native_and_minimal_rows():
    g1, g2 = load_items(FIX / "generic.jsonl")
    assert g1 == QAItem("g1", "Who founded Acme?", ("Ida Venn", "I. Venn"), dataset="generic", split="unknown")
    # a native to_dict() line round-trips (its own dataset/split kept)
    native = json.loads((FIX / "generic.jsonl").read_text().splitlines()[2])
    assert g2 == QAItem.from_dict(native)
    assert (g2.dataset, g2.split, g2.evidence.triples[1]) == ("world", "train", ("Ida Venn", "born in", "Lorvale"))


def test_generic_round_trip_of_loaded_benchmark(tmp_path):
    items = load_items(FIX / "musique_dev_mini.jsonl") + load_items(FIX / "mintqa.json")
    p = _jsonl(tmp_path, "all.jsonl", [it.to_dict() for it in items])
    assert load_items(p) == items


def test_flashrag_rows_and_dataset_from_folder(tmp_path):
    a, b = load_items(FIX / "flashrag.jsonl")
    assert a.answers == ("Mira Hollen", "M. Hollen") and b.answers == ("yes",)
    assert a.dataset == "flashrag"  # the file stem
    folder = tmp_path / "hotpotqa"
    folder.mkdir()
    p = _write(folder, "dev.jsonl", (FIX / "flashrag.jsonl").read_text())
    assert {(it.dataset, it.split) for it in load_items(p)} == {("hotpotqa", "dev")}


def test_dataset_and_split_overrides():
    items = load_items(FIX / "generic.jsonl", dataset="mine", split="test")
    assert {(it.dataset, it.split) for it in items} == {("mine", "test")}
    items = load_items(FIX / "hotpot_dev_mini.json", dataset="hp", split="train")
    assert {(it.dataset, it.split) for it in items} == {("hp", "train")}


def test_limit():
    assert [it.id for it in load_items(FIX / "mintqa.json", limit=2)] == ["invented-pop-1hop", "invented-ti-1hop"]
    assert load_items(FIX / "mintqa.json", limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        load_items(FIX / "mintqa.json", limit=-1)


# -- bad input -----------------------------------------------------------------------


def test_malformed_jsonl_names_file_and_line():
    with pytest.raises(DataFileError, match=r"malformed\.jsonl:2: not valid JSON"):
        load_items(FIX / "malformed.jsonl")


def test_missing_field_names_item_index_and_field():
    with pytest.raises(DataFileError, match=r"hotpot_missing_answer\.json: item 1: missing required field 'answer'"):
        load_items(FIX / "hotpot_missing_answer.json")


def test_skip_bad_counts_and_reports(caplog):
    with caplog.at_level(logging.WARNING, logger="knowtrace_train.data.loaders"):
        report = load_items_report(FIX / "malformed.jsonl", skip_bad=True)
    assert isinstance(report, LoadReport)
    assert [it.id for it in report.items] == ["m1", "m4"]
    assert [w.rsplit(":", 1)[-1] for w, _ in report.skipped] == ["2", "3"]
    assert "not valid JSON" in report.skipped[0][1]
    assert "missing required field 'answers'" in report.skipped[1][1]
    assert "skipped 2 bad record(s)" in caplog.text
    report = load_items_report(FIX / "hotpot_missing_answer.json", skip_bad=True)
    assert [it.id for it in report.items] == ["a"]
    assert report.skipped == [(f"{FIX / 'hotpot_missing_answer.json'}: item 1", "missing required field 'answer'")]


def test_empty_and_whitespace_files(tmp_path):
    for name, text in [("e.jsonl", ""), ("w.jsonl", "\n  \n"), ("a.json", "[]")]:
        p = _write(tmp_path, name, text)
        with pytest.raises(DataFileError, match=rf"{name}: empty file"):
            load_items(p, skip_bad=True)
    with pytest.raises(DataFileError, match="empty file"):
        detect_format(_write(tmp_path, "e2.jsonl", ""))


def test_all_bad_with_skip_bad_still_raises(tmp_path):
    p = _write(tmp_path, "bad.jsonl", "{oops\n[1, 2]\n")
    with pytest.raises(DataFileError, match=r"every record is bad \(2 skipped"):
        load_items(p, skip_bad=True)


def test_broken_json_array_names_line(tmp_path):
    p = _write(tmp_path, "b.json", '[\n {"_id": "x",\n  "answer": }\n]')
    with pytest.raises(DataFileError, match=r"b\.json:3: not valid JSON"):
        load_items(p, skip_bad=True)


def test_single_json_object_file(tmp_path):
    p = _write(tmp_path, "o.json", json.dumps({"data": [{"id": "1"}]}, indent=2))
    with pytest.raises(DataFileError, match=r"o\.json: one JSON object; expected a JSON array"):
        load_items(p)


def test_non_object_record_and_wrong_types(tmp_path):
    p = _write(tmp_path, "n.json", json.dumps([{"id": "a", "question": "Q?", "answers": ["x"]}, 5]))
    with pytest.raises(DataFileError, match=r"n\.json: item 1: expected a JSON object, got int"):
        load_items(p)
    p = _jsonl(tmp_path, "t.jsonl", [{"id": "a", "question": "Q?", "answers": "x"}])
    with pytest.raises(DataFileError, match=r"t\.jsonl:1: field 'answers' must be a list"):
        load_items(p)
    p = _jsonl(tmp_path, "q.jsonl", [{"id": "a", "question": "  ", "answers": ["x"]}])
    with pytest.raises(DataFileError, match=r"q\.jsonl:1: field 'question' is empty"):
        load_items(p)
    hp = json.loads((FIX / "hotpot_dev_mini.json").read_text())
    hp[1]["context"][0] = ["Lake Orvane", "not a list"]
    with pytest.raises(DataFileError, match=r"item 1: field 'context'\[0\] must be \[title, \[sentences\]\]"):
        load_items(_write(tmp_path, "hp.json", json.dumps(hp)))


def test_duplicate_ids_are_rejected(tmp_path):
    p = _jsonl(tmp_path, "d.jsonl", [{"id": "a", "question": "Q?", "answers": ["x"]}] * 2)
    with pytest.raises(DataFileError, match=r"d\.jsonl:2: duplicate id 'a' \(first at .*d\.jsonl:1\)"):
        load_items(p)


def test_errors_are_value_errors():
    assert issubclass(DataFileError, ValueError)
    assert set(FORMATS) == {"hotpotqa", "2wikimultihopqa", "musique", "mintqa", "generic", "flashrag"}


# -- the real samples ----------------------------------------------------------------


@pytest.mark.parametrize(
    "rel, fmt, count, split",
    [
        ("hotpotqa/dev.json", "hotpotqa", 100, "dev"),
        ("hotpotqa/train.json", "hotpotqa", 100, "train"),
        ("musique/dev.jsonl", "musique", 80, "dev"),
        ("musique/train.json", "musique", 100, "train"),
        ("2wikimultihopqa/dev.json", "2wikimultihopqa", 64, "dev"),
    ],
)
def test_shared_data_loads_with_readme_counts(shared_data, rel, fmt, count, split):
    report = load_items_report(shared_data / rel)
    assert (report.format, len(report.items), report.skipped) == (fmt, count, [])
    assert {(it.dataset, it.split) for it in report.items} == {(fmt, split)}
    for it in report.items:
        ids = {p.id for p in it.context}
        assert it.evidence.paragraph_ids and set(it.evidence.paragraph_ids) <= ids
        assert all(p.id == passage_id(p.title, p.text) for p in it.context)
        assert all(p.text and p.text == p.text.strip() for p in it.context)


def test_shared_data_kinds_match_readme(shared_data):
    hp = load_items(shared_data / "hotpotqa/dev.json")
    assert Counter(it.type for it in hp) == {"bridge": 70, "comparison": 30}
    wiki = load_items(shared_data / "2wikimultihopqa/dev.json")
    assert set(Counter(it.type for it in wiki)) == {"compositional", "comparison", "bridge_comparison", "inference"}
    assert all(it.evidence.triples for it in wiki)
    mus = load_items(shared_data / "musique/train.json") + load_items(shared_data / "musique/dev.jsonl")
    assert {it.hops for it in mus} == {2, 3, 4}
    assert all(len(it.evidence.sub_questions) == it.hops for it in mus)
    assert all(len(it.context) == 20 for it in mus)


# -- the CLI -------------------------------------------------------------------------


def test_cli_stats_last_line_is_json(capsys):
    from knowtrace_train.data.__main__ import main

    assert main(["stats", str(FIX / "mintqa.json")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "by hops:" in out
    last = json.loads(out[-1])
    assert last["items"] == 6
    assert last["by_hops"] == {"1": 2, "2": 2, "3": 1, "4": 1}
    assert list(last["by_hops"]) == ["1", "2", "3", "4"]
    assert last["by_type"]["new-old"] == 1
    assert last["by_dataset"] == {"mintqa": 6}


def test_cli_stats_several_files_format_and_skip_bad(capsys):
    from knowtrace_train.data.__main__ import main

    assert main(["stats", str(FIX / "malformed.jsonl"), str(FIX / "flashrag.jsonl"), "--skip-bad"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any("skipped" in line and "malformed.jsonl:3" in line for line in out)
    assert json.loads(out[-1]) == {
        "items": 4,
        "by_dataset": {"flashrag": 2, "malformed": 2},
        "by_type": {"unknown": 4},
        "by_hops": {"unknown": 4},
        "skipped": 2,
    }
    assert main(["stats", str(FIX / "hotpot_dev_mini.json"), "--format", "2wikimultihopqa"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["by_dataset"] == {"2wikimultihopqa": 2}


def test_cli_stats_bad_file_exits_2_with_located_error(capsys):
    from knowtrace_train.data.__main__ import main

    assert main(["stats", str(FIX / "malformed.jsonl")]) == 2  # a user error: one line, exit 2 (issue 79)
    assert "malformed.jsonl:2: not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["stats", str(FIX / "mintqa.json"), "--format", "nope"])


def test_cli_runs_as_module():
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "knowtrace_train.data", "stats", str(FIX / "hotpot_dev_mini.json")],
        cwd=repo, capture_output=True, text=True, check=True,
    )
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last == {
        "items": 2,
        "by_dataset": {"hotpotqa": 2},
        "by_type": {"bridge": 1, "comparison": 1},
        "by_hops": {"2": 2},
        "skipped": 0,
    }


# -- the streamed JSON array reader ------------------------------------------------------------


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=8)


def test_the_streamed_array_reader_gives_what_json_loads_gives_at_any_read_size(tmp_path, monkeypatch):
    from knowtrace_train import io

    @settings(max_examples=150, deadline=None)
    @given(st.lists(_JSON, max_size=5), st.integers(1, 9), st.booleans())
    def check(values, read, indent):
        monkeypatch.setattr(io, "ARRAY_READ", read)
        p = tmp_path / "a.json"
        p.write_text(json.dumps(values, indent=1 if indent else None, ensure_ascii=False) + "\n", encoding="utf-8")
        got = list(io.iter_json_array(p))
        assert [v for _, _, v in got] == values and [i for i, _, _ in got] == list(range(len(values)))

    check()


@pytest.mark.parametrize("text, line, what", [
    ('[\n{"a": 1},\n{"a": 2}\n{"a": 3}]', 4, "expected ',' or ']' after item 1"),
    ('[\n{"a": 1},\n', 3, "the array is not closed"),
    ('[{"a": 1}] x', 1, "extra data after the closing ']'"),
    ('[{"a": 12', 1, "Expecting ',' delimiter"),
])
def test_the_streamed_array_reader_names_the_line_of_a_break(tmp_path, monkeypatch, text, line, what):
    from knowtrace_train import io

    monkeypatch.setattr(io, "ARRAY_READ", 4)
    p = _write(tmp_path, "b.json", text)
    with pytest.raises(DataFileError, match=rf"b\.json:{line}: not valid JSON \({what}"):
        list(io.iter_json_array(p))
