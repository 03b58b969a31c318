"""Behaviour pinned byte for byte: a tiny-model run's trajectories and SFT records equal the frozen ones.

The files in tests/fixtures/pinned were written by `python tests/pin_run.py` before the methods
registry moved the code; a refactor must leave them unchanged. A change meant to alter behaviour
re-pins on purpose (run the script, and say so in the commit).
"""

from __future__ import annotations

import pytest

from pin_run import PINNED, pinned_files


@pytest.fixture(scope="module")
def produced(tmp_path_factory, tiny_model_dir):
    return pinned_files(tmp_path_factory.mktemp("pinned"), tiny_model_dir)


def test_the_pinned_run_writes_the_same_files(produced):
    assert sorted(produced) == sorted(p.name for p in PINNED.iterdir())


@pytest.mark.parametrize("name", sorted(p.name for p in PINNED.iterdir()))
def test_pinned_file_is_byte_identical(produced, name):
    expected = (PINNED / name).read_text(encoding="utf-8")
    assert produced[name] == expected, f"{name} differs from the pinned behaviour"


def test_the_pinned_run_trains_on_something():
    # the pin must cover records, not only empty files
    assert (PINNED / "iter_1_sft_explore.jsonl").read_text().count("\n") > 0
    assert (PINNED / "gold_sft_complete.jsonl").read_text().count("\n") > 0
