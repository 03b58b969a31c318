"""Model resolution: aliases, folders, GGUF files converted once and atomically, clear errors."""

from __future__ import annotations

import os

import pytest

from knowtrace_train.generation import GenerationError, resolve_model
from knowtrace_train.generation import models


def test_model_folder_resolves_to_itself(tiny_model_dir):
    assert resolve_model(tiny_model_dir) == tiny_model_dir
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir


@pytest.mark.parametrize("name", ["smollm-9000", "no such model", "./missing-folder"])
def test_unknown_model_is_an_error_naming_it(name, tmp_path):
    with pytest.raises(GenerationError, match=f"unknown model {name!r}"):
        resolve_model(name, cache_dir=tmp_path)


def test_folder_without_a_model_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(GenerationError, match="holds no loadable model"):
        resolve_model(tmp_path, cache_dir=tmp_path / "cache")


def test_cache_dir_follows_argument_then_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "env"))
    assert models.cache_dir() == tmp_path / "env"
    assert models.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.cache_dir() == models.Path.home() / ".cache" / "knowtrace-train"


def test_missing_alias_package_is_an_error_naming_it(monkeypatch):
    monkeypatch.setitem(models.ALIASES, "ghost", "knowtrace_no_such_package")
    with pytest.raises(GenerationError, match="knowtrace-no-such-package"):
        resolve_model("ghost")


@pytest.fixture
def fake_gguf(tmp_path, tiny_model_dir, monkeypatch):
    """A .gguf path whose 'dequantization' loads the tiny model (the conversion logic runs for real)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = tmp_path / "src" / "tiny.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF-placeholder")
    calls = []
    real_model, real_tok = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def load_model(path, gguf_file=None, **kw):
        assert gguf_file == gguf.name
        calls.append(path)
        return real_model(str(tiny_model_dir), **kw)

    def load_tok(path, gguf_file=None, **kw):
        return real_tok(str(tiny_model_dir), **kw)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load_model)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", load_tok)
    return gguf, calls


def test_gguf_is_converted_once_into_the_cache(fake_gguf, tmp_path):
    gguf, calls = fake_gguf
    out = resolve_model(gguf, cache_dir=tmp_path / "cache")
    assert out.parent == tmp_path / "cache" / "models"
    assert models.is_model_folder(out)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    again = resolve_model(str(gguf), cache_dir=tmp_path / "cache")
    assert again == out and len(calls) == 1
    # a folder holding just the .gguf resolves through the same conversion
    assert resolve_model(gguf.parent, cache_dir=tmp_path / "cache") == out and len(calls) == 1
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary folder left behind


def test_a_gguf_rewritten_in_place_is_converted_again(fake_gguf, tmp_path, monkeypatch):
    """The converted folder is named by the file's content (knowtrace_train.io.model_identity), not its size."""
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "home"))
    gguf, calls = fake_gguf
    out = resolve_model(gguf, cache_dir=tmp_path / "cache")
    gguf.write_bytes(b"GGUF-placeholdeR")  # other bytes, the same size
    again = resolve_model(gguf, cache_dir=tmp_path / "cache")
    assert again != out and len(calls) == 2 and again.name.startswith("tiny.Q4_1-")



def test_an_alias_is_identified_by_the_gguf_file_its_package_ships(tmp_path, monkeypatch):
    """What caches key a configured model by (TRACE's): an alias by its GGUF file's content, so an upgraded package
    is another model; a hub id by its name."""
    from knowtrace_train.io import model_identity

    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "home"))
    gguf = tmp_path / "pkg" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF-v1")
    monkeypatch.setattr(models, "package_gguf", lambda package: gguf)
    first = models.configured_model_identity("smollm2-135m")
    assert first == model_identity(gguf) != {"hub_id": "smollm2-135m"}
    gguf.write_bytes(b"GGUF-v2")
    assert models.configured_model_identity("smollm2-135m") != first
    assert models.configured_model_identity("owner/name") == {"hub_id": "owner/name"}


def test_failed_conversion_leaves_nothing_behind(fake_gguf, tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    gguf, _ = fake_gguf

    def broken_save(self, *a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        resolve_model(gguf, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


@pytest.mark.slow
def test_default_alias_converts_the_smollm2_gguf(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert models.is_model_folder(smollm2_dir)
    assert resolve_model("default") == resolve_model("smollm2-135m") == smollm2_dir
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir))
    assert not hasattr(model.config, "quantization_config")
    assert next(model.parameters()).dtype == torch.float32
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])
    assert os.access(smollm2_dir / "model.safetensors", os.R_OK)


def test_conversion_parses_a_gguf_once_and_puts_gguf_back(tmp_path):
    """Inside `gguf_parsed_once` (the conversion) one reader per file and one tensor-name table per
    (architecture, layers) serve every read; after it, also after an error, gguf's own functions are back.
    (The conversion of the real GGUF wrote the same seven files byte for byte with and without it.)"""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with models.gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and gguf.GGUFReader(path, "c") is not first
        assert first.fields["llama.block_count"].contents() == 2
        table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is table
        assert table.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    with pytest.raises(RuntimeError, match="broke"), models.gguf_parsed_once():
        raise RuntimeError("broke")
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)
