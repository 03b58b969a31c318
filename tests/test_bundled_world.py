"""The synthetic world ships inside the package: the defaults that name it as a checkout does (data/world/...) find the
packaged copy from any folder, and a built wheel carries it (CI's user install runs the wheel outside the clone)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from knowtrace_train.data.bundled import WORLD_DIR, bundled_path, world_triples
from knowtrace_train.data.corpus import CorpusConfig
from knowtrace_train.evaluate import EvalConfig
from knowtrace_train.selftrain.config import DataConfig

REPO = Path(__file__).resolve().parents[1]
FILES = ("train.jsonl", "dev.jsonl", "test.jsonl", "corpus.jsonl", "facts.jsonl")


def test_the_checkout_names_the_packaged_world():
    assert (REPO / "data" / "world").resolve() == WORLD_DIR
    for name in FILES:
        assert (WORLD_DIR / name).is_file()


def test_outside_a_checkout_the_defaults_are_the_packaged_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no data/world here
    data = DataConfig()
    assert (data.train, data.dev, data.test) == (str(WORLD_DIR / "train.jsonl"), str(WORLD_DIR / "dev.jsonl"), None)
    assert data.corpus.path == str(WORLD_DIR / "corpus.jsonl")
    assert EvalConfig().dataset.path == str(WORLD_DIR / "dev.jsonl")
    assert DataConfig(test="data/world/test.jsonl").test == str(WORLD_DIR / "test.jsonl")
    assert DataConfig(facts="data/world/facts.jsonl").facts == str(WORLD_DIR / "facts.jsonl")


def test_a_path_that_exists_or_is_not_the_worlds_is_left_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert DataConfig().train == "data/world/train.jsonl"  # in the checkout: as written (the link)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "world").mkdir(parents=True)
    (tmp_path / "data" / "world" / "dev.jsonl").write_text("")
    assert bundled_path("data/world/dev.jsonl") == "data/world/dev.jsonl"  # the user's own file of that name
    for other in ("my/dev.jsonl", "data/world/nope.jsonl", "data/world/sub/dev.jsonl", "", None, "hotpotqa:dev"):
        assert bundled_path(other) == other
    assert CorpusConfig(path="my/corpus.jsonl").path == "my/corpus.jsonl"


def test_the_worlds_triples_are_its_generators_facts(tmp_path, monkeypatch):
    """DoG's `graph: world` and a `kg` corpus of `triples: world` read the packaged facts.jsonl, from any folder: the
    very facts the generator (scripts/world/, which the package never imports) gives for seed 0, in its order."""
    from world_helpers import make_world, world_facts

    monkeypatch.chdir(tmp_path)
    triples = world_triples()
    assert len(triples) > 5000
    assert triples == world_facts(make_world(0).kb)


def test_a_built_wheel_carries_the_world(tmp_path):
    """The wheel, built from a copy of the package's sources (nothing is written into the checkout)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "knowtrace_train", src / "knowtrace_train", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True, text=True)
    [wheel] = (tmp_path / "dist").glob("knowtrace_train-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (*FILES, "README.md"):
        assert f"knowtrace_train/data/world_files/{name}" in names
    with zipfile.ZipFile(wheel) as z:
        assert z.read("knowtrace_train/data/world_files/dev.jsonl") == (WORLD_DIR / "dev.jsonl").read_bytes()
