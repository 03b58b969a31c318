"""The generated open-domain corpus (data/generated.py): the world's passages among generated distractors,
deterministic by seed, generated once into the cache home and opened as a passage store; the corpus source
`generated` of the configs."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from knowtrace_train.data import generated as gen_mod
from knowtrace_train.data.corpus import CorpusError, read_corpus
from knowtrace_train.data.generated import generate_corpus, generated_key, open_generated
from knowtrace_train.data.store import PassageStore

REPO = Path(__file__).resolve().parents[1]
WORLD = REPO / "data" / "world" / "corpus.jsonl"
N = 2000


def test_generated_corpus_holds_the_world_among_n_distractors(tmp_path):
    st = open_generated(N, seed=0, cache_dir=tmp_path)
    world = read_corpus(WORLD)
    assert isinstance(st, PassageStore) and len(st) == N + len(world)
    assert str(st.folder).startswith(str(tmp_path / "store"))
    assert [st.by_id[p.id] for p in world] == world  # every world passage, as it is
    rows = [st.row_of(p.id) for p in world]
    assert rows == sorted(rows) and rows != list(range(len(world)))  # in their order, at rows drawn by the seed
    syn = [p for p in st if p.id.startswith("syn-")]
    assert len(syn) == N and syn[0].id == "syn-00000000" and syn[-1].id == f"syn-{N - 1:08d}"
    assert all(30 <= len(p.text.split()) <= 90 and len(p.title.split()) == 2 for p in syn)
    # the distractors speak the world's words (Zipf over its vocabulary, then the coined words)
    world_words = {w for p in world for w in p.text.split()}
    assert sum(w in world_words for p in syn[:50] for w in p.text.rstrip(".").split()) > 500


def test_same_seed_same_corpus_other_seed_another(tmp_path):
    a = open_generated(N, seed=0, cache_dir=tmp_path / "a")
    b = open_generated(N, seed=0, cache_dir=tmp_path / "b")  # generated afresh in another cache
    assert a.fingerprint == b.fingerprint and list(a)[:50] == list(b)[:50]
    c = open_generated(N, seed=1, cache_dir=tmp_path / "a")
    assert c.fingerprint != a.fingerprint and len(c) == len(a)
    assert generated_key(N, 0) == generated_key(N, 0) != generated_key(N, 1) != generated_key(N + 1, 1)


def test_generated_once_then_found_by_its_key(tmp_path, monkeypatch):
    first = open_generated(N, seed=0, cache_dir=tmp_path)
    record = tmp_path / "store" / "generated" / f"{generated_key(N, 0)}.json"
    assert json.loads(record.read_text())["fingerprint"] == first.fingerprint
    # only the store and the record stay: the corpus file was a temporary one
    assert not [p for p in (tmp_path / "store" / "generated").iterdir() if p.name.startswith(".generate")]

    def boom(*a, **k):
        raise AssertionError("generated again")

    monkeypatch.setattr(gen_mod, "generate_corpus", boom)
    monkeypatch.setattr(gen_mod, "convert_corpus", boom)
    again = open_generated(N, seed=0, cache_dir=tmp_path)
    assert again.folder == first.folder and again.fingerprint == first.fingerprint
    monkeypatch.undo()
    # a store gone from the cache (cleaned) is generated anew, to the same content
    import shutil

    shutil.rmtree(first.folder)
    assert open_generated(N, seed=0, cache_dir=tmp_path).fingerprint == first.fingerprint


def test_two_at_once_generate_it_once(tmp_path, monkeypatch):
    """Two openers at once (threads here; the flock is per open file, so processes alike): one generates, the
    other waits for its lock and then opens what the first wrote."""
    calls = []
    real = gen_mod.generate_corpus

    def slow(*a, **k):
        calls.append(1)
        time.sleep(0.5)
        return real(*a, **k)

    monkeypatch.setattr(gen_mod, "generate_corpus", slow)
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(open_generated(N, seed=0, cache_dir=tmp_path).fingerprint))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(out) == 2 and out[0] == out[1]


def test_the_base_is_any_corpus_file_and_keys_the_name(tmp_path):
    base = tmp_path / "base.jsonl"
    base.write_text("".join(json.dumps({"id": f"b{i}", "contents": f"T{i}\nalpha beta gamma {i}"}) + "\n" for i in range(5)))
    st = open_generated(300, seed=0, base=base, cache_dir=tmp_path / "cache")
    assert len(st) == 305 and st.by_id["b3"].title == "T3" and st.by_id["b3"].text == "alpha beta gamma 3"
    assert generated_key(300, 0, base) != generated_key(300, 0)
    with pytest.raises(CorpusError, match="no such corpus file"):
        open_generated(300, base=tmp_path / "absent.jsonl", cache_dir=tmp_path / "cache")
    with pytest.raises(CorpusError, match="at least one distractor"):
        open_generated(0, cache_dir=tmp_path / "cache")


def test_generate_corpus_writes_a_file_the_bench_reads(tmp_path):
    n = generate_corpus(tmp_path / "c.jsonl", 500, seed=3)
    passages = read_corpus(tmp_path / "c.jsonl")
    assert n == len(passages) == 500 + len(read_corpus(WORLD))
    assert generate_corpus(tmp_path / "d.jsonl", 500, seed=3) == n
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "d.jsonl").read_bytes()
