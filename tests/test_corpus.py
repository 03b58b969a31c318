"""Corpus building from items' contexts, and corpus files in our and FlashRAG's forms."""

from __future__ import annotations

import json

import pytest

from knowtrace_train.data.corpus import CorpusError, build_corpus, read_corpus, split_contents, write_corpus
from knowtrace_train.data.schema import Passage, QAItem, passage_id
from knowtrace_train.io import DataFileError


def item(i: int, *context: tuple[str, str]) -> QAItem:
    return QAItem(
        id=f"q{i}",
        question=f"question {i}?",
        answers=("a",),
        context=tuple(Passage(f"local-{i}-{j}", t, x) for j, (t, x) in enumerate(context)),
    )


def test_build_corpus_dedups_by_title_and_text_and_uses_content_ids():
    items = [
        item(0, ("Paris", "Capital of France."), ("Berlin", "Capital of Germany.")),
        item(1, ("Berlin", "Capital of Germany."), ("Berlin", "A city on the Spree."), ("Rome", "Capital of Italy.")),
    ]
    corpus = build_corpus(items)
    assert [(p.title, p.text) for p in corpus] == [
        ("Paris", "Capital of France."),
        ("Berlin", "Capital of Germany."),
        ("Berlin", "A city on the Spree."),
        ("Rome", "Capital of Italy."),
    ]
    assert all(p.id == passage_id(p.title, p.text) for p in corpus)
    assert len({p.id for p in corpus}) == 4


def test_build_corpus_of_items_without_context_is_an_error():
    with pytest.raises(CorpusError, match="none of the 2 items has context passages"):
        build_corpus([item(0), item(1)])
    with pytest.raises(CorpusError, match="none of the 0 items"):
        build_corpus([])


def test_write_then_read_round_trip(tmp_path):
    corpus = build_corpus([item(0, ("Ünïcode", "naïve café — 東京"), ("", "no title here"))])
    path = tmp_path / "corpus.jsonl"
    assert write_corpus(corpus, path) == 2
    assert read_corpus(path) == corpus
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert first == {"id": corpus[0].id, "title": "Ünïcode", "text": "naïve café — 東京"}


def test_write_empty_corpus_is_an_error(tmp_path):
    with pytest.raises(CorpusError, match="empty corpus"):
        write_corpus([], tmp_path / "c.jsonl")


def test_read_flashrag_contents_forms(tmp_path):
    path = tmp_path / "flashrag.jsonl"
    rows = [
        {"id": "0", "contents": "Paris\nParis is the capital of France."},
        {"id": 1, "contents": '"Aaron"\nAaron is a prophet.\nSecond line stays in the text.'},
        {"id": "2", "contents": "A passage with no title line."},
        {"id": "3", "contents": "\nEmpty title line.", "extra": "ignored"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_corpus(path)
    assert [(p.id, p.title, p.text) for p in got] == [
        ("0", "Paris", "Paris is the capital of France."),
        ("1", "Aaron", "Aaron is a prophet.\nSecond line stays in the text."),
        ("2", "", "A passage with no title line."),
        ("3", "", "Empty title line."),
    ]


def test_split_contents_only_unquotes_a_fully_quoted_title():
    assert split_contents('"Quoted"\ntext') == ("Quoted", "text")
    assert split_contents('"Half quoted\ntext') == ('"Half quoted', "text")
    assert split_contents('"\ntext') == ('"', "text")


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "1", "title": "T"', r"c\.jsonl:2: not valid JSON"),
        ('["a list"]', r"c\.jsonl:2: expected a JSON object"),
        ('{"title": "T", "text": "x"}', r"c\.jsonl:2: missing field 'id'"),
        ('{"id": "1", "title": "T"}', r"c\.jsonl:2: missing field 'text'"),
        ('{"id": "1", "title": 3, "text": "x"}', r"c\.jsonl:2: field 'title' must be a string"),
        ('{"id": "1", "contents": null}', r"c\.jsonl:2: field 'contents' must be a string"),
        ('{"id": "1", "body": "x"}', r"c\.jsonl:2: expected fields 'title' and 'text'"),
        ('{"id": "", "title": "T", "text": "x"}', r"c\.jsonl:2: field 'id' must be a non-empty"),
        ('{"id": "1", "title": " ", "text": ""}', r"c\.jsonl:2: field 'text': the passage is empty"),
        ('{"id": "0", "title": "T", "text": "y"}', r"c\.jsonl:2: field 'id': '0' already used on line 1"),
    ],
)
def test_a_malformed_line_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "title": "T", "text": "x"}\n' + line + "\n")
    with pytest.raises(DataFileError, match=message):
        read_corpus(path)


def test_an_empty_corpus_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(CorpusError, match=r"empty\.jsonl: the corpus is empty"):
        read_corpus(path)


def test_cli_builds_a_corpus_from_item_files(tmp_path, capsys):
    from pathlib import Path

    from knowtrace_train.data.corpus import main
    from knowtrace_train.data.loaders import load_items

    fixture = Path(__file__).parent / "fixtures" / "musique_dev_mini.jsonl"
    out = tmp_path / "corpus.jsonl"
    assert main(["build", str(fixture), "--out", str(out)]) == 0
    corpus = read_corpus(out)
    assert corpus == build_corpus(load_items(fixture))
    assert f"wrote {len(corpus)} passages" in capsys.readouterr().out
    assert main(["build", str(tmp_path / "missing.json"), "--out", str(out)]) == 2  # one line, exit 2 (issue 79)


def test_the_corpus_of_real_items_holds_every_gold_passage(shared_data):
    from knowtrace_train.data.loaders import load_items

    items = load_items(shared_data / "musique" / "dev.jsonl") + load_items(shared_data / "hotpotqa" / "dev.json")
    corpus = build_corpus(items)
    ids = {p.id for p in corpus}
    assert len(ids) == len(corpus) == len({(p.title, p.text) for p in corpus})
    assert len(corpus) < sum(len(it.context) for it in items)  # some paragraphs recur across items
    for it in items:
        assert set(it.evidence.paragraph_ids) <= ids, it.id


def test_a_dpr_row_with_an_empty_text_is_skipped_and_counted_a_broken_row_named(tmp_path, caplog):
    import logging

    from knowtrace_train.data.formats import dpr_passages
    from knowtrace_train.io import DataFileError

    path = tmp_path / "psgs_w100.tsv"
    path.write_text('id\ttext\ttitle\n1\t"A text."\tA\n2\t""\tB\n3\t"C text."\tC\n', encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        got = list(dpr_passages(path))
    assert [p.title for p in got] == ["A", "C"]
    assert "skipped 1 passage(s) with an empty text (line 3)" in caplog.text
    path.write_text('id\ttext\ttitle\n1\t"A text."\tA\n2\tonly two\n', encoding="utf-8")
    with pytest.raises(DataFileError, match=r"psgs_w100\.tsv:3: field 'columns'"):
        list(dpr_passages(path))
    assert [p.title for p in dpr_passages(path, skip_bad=True)] == ["A"]
