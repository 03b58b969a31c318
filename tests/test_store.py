"""The passage store on disk (data/store.py): streamed conversion, rows, the kept fingerprint, bad input."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from knowtrace_train.data import store as store_mod
from knowtrace_train.data.corpus import CorpusError, read_corpus
from knowtrace_train.data.store import STORE_FORMAT, PassageStore, StoreIds, open_store, passages_by_id
from knowtrace_train.io import DataFileError

WORLD = Path(__file__).resolve().parents[1] / "data" / "world" / "corpus.jsonl"


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_store_rows_equal_read_corpus(tmp_path):
    st = open_store(WORLD, cache_dir=tmp_path)
    ref = read_corpus(WORLD)
    assert isinstance(st, PassageStore) and len(st) == len(ref)
    assert list(st) == ref
    assert [st[i] for i in (0, 7, len(ref) - 1, -1)] == [ref[0], ref[7], ref[-1], ref[-1]]
    assert st[3:6] == ref[3:6]
    with pytest.raises(IndexError):
        st[len(ref)]


def test_lookup_by_id_equals_the_dict_of_every_passage(tmp_path):
    st = open_store(WORLD, cache_dir=tmp_path)
    ref = {p.id: p for p in read_corpus(WORLD)}
    by_id = passages_by_id(st)
    assert isinstance(by_id, StoreIds) and len(by_id) == len(ref)
    assert {pid: by_id[pid] for pid in ref} == ref
    assert all(pid in by_id for pid in ref) and list(by_id) == list(ref)  # iteration: the ids in corpus order
    assert [st.row_of(pid) for pid in list(ref)[:5]] == [0, 1, 2, 3, 4]
    # a missing id, as the dict has it: KeyError, `in` false, get's default (and never a row of another id)
    for missing in ("no-such-id", "", str(len(ref)), 7):
        assert missing not in by_id and by_id.get(missing) is None
        with pytest.raises(KeyError):
            by_id[missing]
    assert st.row_of("no-such-id") is None
    assert passages_by_id(read_corpus(WORLD)) == ref  # a list: the dict, as before


def test_lookup_by_id_tells_apart_ids_of_one_hash(tmp_path, monkeypatch):
    """Two ids of one 8-byte hash (forced here: 4 hash values for 40 ids) are both found, each by its own id."""
    monkeypatch.setattr(store_mod, "_id_hash", lambda pid: sum(pid.encode()) % 4)
    rows = [{"id": f"p{i}", "title": f"T{i}", "text": f"text {i}"} for i in range(40)]
    st = open_store(write(tmp_path / "c.jsonl", rows), cache_dir=tmp_path / "cache")
    assert [st.by_id[f"p{i}"].text for i in range(40)] == [f"text {i}" for i in range(40)]
    assert "p40" not in st.by_id and st.row_of("p40") is None


def test_flashrag_contents_and_unicode(tmp_path):
    f = write(tmp_path / "c.jsonl", [{"id": 1, "contents": '"Zürich"\nA city — on a lake.'}, {"id": "b", "title": "", "text": "x y"}])
    st = open_store(f, cache_dir=tmp_path / "cache")
    assert [(p.id, p.title, p.text) for p in st] == [("1", "Zürich", "A city — on a lake."), ("b", "", "x y")]


def test_fingerprint_kept_and_file_not_reread(tmp_path, monkeypatch):
    f = write(tmp_path / "c.jsonl", [{"id": "a", "title": "T", "text": "one"}, {"id": "b", "title": "U", "text": "two"}])
    fp = open_store(f, cache_dir=tmp_path / "cache").fingerprint

    def boom(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(store_mod, "convert_corpus", boom)
    assert open_store(f, cache_dir=tmp_path / "cache").fingerprint == fp  # the sidecar, no re-hash
    monkeypatch.undo()
    write(f, [{"id": "a", "title": "T", "text": "one!"}, {"id": "b", "title": "U", "text": "two"}])
    os.utime(f, ns=(1, 1))  # a changed file (size and mtime_ns differ) is converted anew
    assert open_store(f, cache_dir=tmp_path / "cache").fingerprint != fp
    # the same content under another path shares the store
    g = write(tmp_path / "d.jsonl", [{"id": "a", "title": "T", "text": "one"}, {"id": "b", "title": "U", "text": "two"}])
    assert open_store(g, cache_dir=tmp_path / "cache").fingerprint == fp


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "c.jsonl:2: not valid JSON"),
        ('{"id": "z", "title": "T"}', "c.jsonl:2: missing field 'text'"),
        ('{"id": "a", "title": "T", "text": "again"}', "c.jsonl:2: field 'id': 'a' already used on line 1"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    f = write(tmp_path / "c.jsonl", [{"id": "a", "title": "T", "text": "one"}, line, {"id": "c", "title": "V", "text": "three"}])
    with pytest.raises(DataFileError, match=message):  # a CorpusError, or io's for bad JSON (as read_corpus)
        open_store(f, cache_dir=tmp_path / "cache")


def test_bad_lines_skipped_and_counted(tmp_path, caplog):
    f = write(tmp_path / "c.jsonl", [{"id": "a", "title": "T", "text": "one"}, "{not json", '{"id": "q"}', {"id": "c", "title": "V", "text": "3"}])
    with caplog.at_level(logging.WARNING):
        st = open_store(f, cache_dir=tmp_path / "cache", skip_bad=True)
    assert [p.id for p in st] == ["a", "c"] and st.meta["skipped"] == 2
    assert "skipped 2 line(s)" in caplog.text


def test_empty_corpus_is_an_error(tmp_path):
    f = write(tmp_path / "c.jsonl", [])
    with pytest.raises(CorpusError, match="the corpus is empty"):
        open_store(f, cache_dir=tmp_path / "cache")
    with pytest.raises(CorpusError, match="no such corpus file"):
        open_store(tmp_path / "absent.jsonl", cache_dir=tmp_path / "cache")


def test_store_of_another_format_is_rebuilt_with_a_warning(tmp_path, caplog):
    f = write(tmp_path / "c.jsonl", [{"id": "a", "title": "T", "text": "one"}])
    st = open_store(f, cache_dir=tmp_path / "cache")
    meta = st.folder / "meta.json"
    meta.write_text(json.dumps({**st.meta, "format": STORE_FORMAT + 99}))
    with caplog.at_level(logging.WARNING):
        again = open_store(f, cache_dir=tmp_path / "cache")
    assert "format" in caplog.text and again.meta["format"] == STORE_FORMAT and list(again) == list(st)


_RSS_CHILD = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[3])
from knowtrace_train.data.store import convert_corpus
n, folder = int(sys.argv[1]), sys.argv[2]
src = folder + "/corpus.jsonl"
with open(src, "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": f"p{i}", "title": f"T{i % 97}", "text": "word " * (20 + i % 40) + str(i)}) + "\n")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
convert_corpus(src, folder + "/store")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""


def test_conversion_memory_stays_bounded_as_the_corpus_grows(tmp_path):
    """Peak RSS of a conversion above the process's start (in a fresh process) at 20k and 200k
    passages: ten times the passages (about 35 MB more corpus) may add a few MB at most (16 bytes a
    passage at the end, the id hashes and their order sorted into the id index: 3.2 MB; measured 1.6
    and 5.3 MB over the start)."""
    grow = {}
    for n in (20_000, 200_000):
        d = tmp_path / str(n)
        d.mkdir()
        out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(n), str(d), str(Path(__file__).resolve().parents[1])],
                             capture_output=True, text=True, check=True)
        grow[n] = float(out.stdout.strip().splitlines()[-1])
    corpus_mb = (tmp_path / "200000" / "corpus.jsonl").stat().st_size / 2**20
    assert corpus_mb > 30
    assert grow[200_000] - grow[20_000] < 6, grow


def test_corpus_fingerprint_of_a_store_is_the_kept_one(tmp_path):
    from knowtrace_train.retrieval.cache import corpus_fingerprint

    st = open_store(WORLD, cache_dir=tmp_path)
    assert corpus_fingerprint(st) == st.fingerprint == st.meta["fingerprint"]
    assert corpus_fingerprint(read_corpus(WORLD)) != st.fingerprint  # a list is hashed as before


def test_a_full_disk_is_one_line_naming_the_folder_and_bytes(tmp_path, monkeypatch):
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod, "_convert_into", full)
    with pytest.raises(CorpusError, match=r"store: the disk filled while converting .* needs about [\d,]+ bytes.* are free"):
        open_store(WORLD, cache_dir=tmp_path)
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".convert")]


def test_corpus_store_option_gives_a_store_to_evaluate(tmp_path, monkeypatch):
    from knowtrace_train.data.corpus import CorpusConfig
    from knowtrace_train.evaluate import EvalConfig, load_corpus

    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path))
    st = load_corpus(EvalConfig(corpus=CorpusConfig(path=str(WORLD), store=True)), [])
    assert isinstance(st, PassageStore) and list(st) == read_corpus(WORLD)
    assert str(st.folder).startswith(str(tmp_path / "retrieval" / "store"))
    assert load_corpus(EvalConfig(corpus=CorpusConfig(path=str(WORLD))), []) == read_corpus(WORLD)  # default: as today
    with pytest.raises(ValueError, match="corpus.store needs corpus.source 'file'"):
        CorpusConfig(source="contexts", store=True)
    assert CorpusConfig(source="contexts").store == "auto"  # the default is no error where no file is read
    with pytest.raises(ValueError, match="corpus.store must be true, false or 'auto', got 'yes'"):
        CorpusConfig(store="yes")


def test_corpus_store_auto_chooses_by_the_file_size_and_says_so(tmp_path, monkeypatch, caplog):
    from knowtrace_train.data import corpus as corpus_mod
    from knowtrace_train.evaluate import EvalConfig, load_corpus

    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path))
    config = EvalConfig(corpus=corpus_mod.CorpusConfig(path=str(WORLD)))
    assert config.corpus.store == "auto"
    with caplog.at_level(logging.INFO, logger="knowtrace_train.data.corpus"):
        in_memory = load_corpus(config, [])  # the world's 1 MiB: under the crossover
        assert isinstance(in_memory, list) and in_memory == read_corpus(WORLD)
        assert "under 100 MiB: read whole into memory" in caplog.text
        monkeypatch.setattr(corpus_mod, "STORE_AUTO_BYTES", WORLD.stat().st_size)  # the file is now at the crossover
        st = load_corpus(config, [])
        assert isinstance(st, PassageStore) and list(st) == in_memory
        assert "a passage store on disk" in caplog.text
    assert load_corpus(EvalConfig(corpus=corpus_mod.CorpusConfig(path=str(WORLD), store=False)), []) == in_memory
