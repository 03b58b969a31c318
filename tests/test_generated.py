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


# -- the corpus source `generated` ---------------------------------------------------------------------------


def test_corpus_source_generated_runs_through_load_corpus_and_bm25(tmp_path, monkeypatch):
    from knowtrace_train.data.corpus import CorpusConfig
    from knowtrace_train.evaluate import EvalConfig, load_corpus
    from knowtrace_train.retrieval import RetrieverConfig, build_retriever
    from knowtrace_train.retrieval.bm25_shards import ShardedBM25Retriever

    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path))
    st = load_corpus(EvalConfig(corpus=CorpusConfig(source="generated", passages=N)), [])
    assert isinstance(st, PassageStore) and len(st) == N + len(read_corpus(WORLD))
    assert str(st.folder).startswith(str(tmp_path / "retrieval" / "store"))  # the cache home's, as `store: true`
    assert st.fingerprint == open_generated(N, seed=0, cache_dir=tmp_path / "retrieval").fingerprint
    retriever = build_retriever(RetrieverConfig(), st)
    assert isinstance(retriever, ShardedBM25Retriever)
    dev = [json.loads(line) for line in (REPO / "data" / "world" / "dev.jsonl").read_text().splitlines()[:20]]
    hits = retriever.search([it["question"] for it in dev], 5)
    found = [bool(set(it["evidence"]["paragraph_ids"]) & {h.passage.id for h in hs}) for it, hs in zip(dev, hits)]
    assert sum(found) >= 15, found


@pytest.mark.parametrize("overrides, message", [
    (["--corpus.source", "generated"], "corpus.source is 'generated' but corpus.passages is not set"),
    (["--corpus.source", "generated", "--corpus.passages", "0"], "corpus.passages must be an integer >= 1, got 0"),
    (["--corpus.passages", "1000"], "corpus.passages needs corpus.source 'generated', got 'file'"),
    (["--corpus.seed", "3"], "corpus.seed needs corpus.source 'generated', got 'file'"),
    (["--corpus.source", "generated", "--corpus.passages", "10", "--corpus.path", ""], "corpus.path .* is empty"),
    (["--corpus.source", "contexts", "--corpus.store", "true"], "corpus.store needs corpus.source 'file' or 'generated'"),
])
def test_generated_config_errors_are_one_line_naming_the_field(overrides, message):
    from knowtrace_train.config import ConfigError, load_config
    from knowtrace_train.evaluate import EvalConfig

    with pytest.raises(ConfigError, match=message) as e:
        load_config(EvalConfig, None, overrides)
    assert "\n" not in str(e.value)


def test_the_open_world_config_is_the_default_run_on_a_million_distractors(tmp_path):
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain.config import SelfTrainConfig

    cfg = load_config(SelfTrainConfig, REPO / "recipes" / "configs" / "selftrain_world_open.yaml")
    c = cfg.data.corpus
    assert (c.source, c.passages, c.seed, c.path) == ("generated", 1_000_000, 0, "data/world/corpus.jsonl")
    default = SelfTrainConfig()
    assert cfg.data.train == default.data.train and cfg.data.dev == default.data.dev and cfg.strategy == default.strategy
    cfg.validate()  # the world's corpus, the base, is there (validating generates nothing)
    bad = load_config(SelfTrainConfig, None, ["--data.corpus.source", "generated", "--data.corpus.passages", "10",
                                              "--data.corpus.path", str(tmp_path / "absent.jsonl")])
    with pytest.raises(ValueError, match="data.corpus.path: no such file"):
        bad.validate()


def test_selftrain_on_a_generated_corpus_rationalizes_through_the_store(tmp_path, tiny_model_dir, monkeypatch):
    """A tiny run of one iteration (the oracle: tests/selftrain_helpers.py) on the world among 2,000 distractors:
    rationalization gets the store's id index, not a dict of every passage, and its records are those the dict
    gives."""
    from selftrain_helpers import oracle_factory, tiny_overrides

    from knowtrace_train.config import load_config
    from knowtrace_train.data import store as store_mod
    from knowtrace_train.data.store import StoreIds
    from knowtrace_train.methods.knowtrace.backtrace import backtrace_trajectories
    from knowtrace_train.selftrain import SelfTrain
    from knowtrace_train.selftrain.config import SelfTrainConfig
    from knowtrace_train.trajectory import read_trajectories

    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    cfg = load_config(SelfTrainConfig, None, tiny_overrides(
        tmp_path, tiny_model_dir, iterations=1, fewshot_trained=True,  # no bootstrap: the raw model, exemplars on
        **{"bootstrap.mode": "never", "eval_base": False, "data.corpus.source": "generated", "data.corpus.passages": N,
           "retriever.cache_dir": ""}))
    given = []
    real = store_mod.passages_by_id
    monkeypatch.setattr(store_mod, "passages_by_id", lambda corpus: given.append(real(corpus)) or given[-1])
    run = SelfTrain(cfg, progress=False)
    run.make_generator = oracle_factory(run)
    run.run()
    assert isinstance(run.corpus, PassageStore) and len(run.corpus) == N + len(read_corpus(WORLD))
    assert len(given) == 1 and isinstance(given[0], StoreIds)
    m = json.loads((run.run_dir / "iter_1" / "metrics.json").read_text())
    assert m["rollout"]["correct"] >= 1 and m["sft_records"]["complete"] > 0
    trajs = read_trajectories(run.run_dir / "iter_1" / "rollouts.jsonl")
    kw = dict(count_tokens=run.count_tokens, fewshot=cfg.fewshot_trained, iteration=1)
    by_store = backtrace_trajectories(trajs, run.items_by_id, passages=run.corpus.by_id, **kw)
    by_dict = backtrace_trajectories(trajs, run.items_by_id, passages={p.id: p for p in run.corpus}, **kw)
    assert by_store.records_by_role == by_dict.records_by_role and by_store.stats == by_dict.stats
    assert sum(len(v) for v in by_store.records_by_role.values()) > 0
    # every passage the rollouts read, looked up both ways
    read = {pid for t in trajs for c in t.calls for pid in c.passage_ids}
    as_dict = {p.id: p for p in run.corpus}
    assert read and all(run.corpus.by_id[pid] == as_dict[pid] for pid in read)
