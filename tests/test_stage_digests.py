"""Corruption detected (issue 64 item 4): a DONE marker records the SHA-256 of each file its stage wrote, taken once
as the marker is written; a finished stage whose file changed (same size included) or is gone is refused with the
file named, never used; the program's figures are unchanged by the record."""

from __future__ import annotations

import hashlib
import json

import pytest

from knowtrace_train.errors import RunError, UserError
from knowtrace_train.stages import FILES_KEY, StageRunner, read_done, read_marker


def _stage(folder):
    def body():
        (folder / "model").mkdir(parents=True, exist_ok=True)
        (folder / "model" / "weights.safetensors").write_bytes(b"w" * 64)
        (folder / "eval.jsonl").write_text('{"q": 1}\n')
        (folder / ".eval.jsonl.tmp").write_text("half")  # a temporary file: never recorded
        return {"em": 0.5}
    return body


def test_a_marker_records_what_its_stage_wrote_and_a_changed_file_is_refused(tmp_path):
    folder = tmp_path / "iter_1"
    folder.mkdir()
    (folder / "earlier.json").write_text("{}")  # there before the stage: not its file
    runner = StageRunner()
    assert runner.run(folder, "eval", _stage(folder)) == {"em": 0.5, "seconds": pytest.approx(0, abs=5)}
    done = read_marker(folder, "eval")
    assert FILES_KEY not in read_done(folder, "eval")  # the figures only
    assert done[FILES_KEY] == {"eval.jsonl": hashlib.sha256(b'{"q": 1}\n').hexdigest(),
                               "model/weights.safetensors": hashlib.sha256(b"w" * 64).hexdigest()}
    # a rerun skips it, its figures as before and without the record
    assert runner.run(folder, "eval", lambda: pytest.fail("redone")) == {k: v for k, v in done.items() if k != FILES_KEY}

    (folder / "earlier.json").write_text('{"edited": 1}')  # not the stage's file: no matter
    assert runner.run(folder, "eval", lambda: pytest.fail("redone"))["em"] == 0.5

    w = folder / "model" / "weights.safetensors"
    w.write_bytes(b"x" * 64)  # the same size, other bytes
    with pytest.raises(RunError) as e:
        runner.run(folder, "eval", lambda: pytest.fail("redone"))
    assert isinstance(e.value, UserError)
    assert str(e.value).startswith(f"{w} no longer has the SHA-256 its marker recorded")
    assert f"remove {folder / 'DONE.eval'} to redo the stage" in str(e.value)
    w.unlink()
    with pytest.raises(RunError, match=f"{w} is gone"):
        runner.run(folder, "eval", lambda: pytest.fail("redone"))
    (folder / "DONE.eval").unlink()  # as the line says: the stage is redone
    assert runner.run(folder, "eval", _stage(folder))["em"] == 0.5 and w.read_bytes() == b"w" * 64


def test_a_marker_written_before_the_record_is_still_read(tmp_path):
    """Run folders from before the record: nothing to check, the figures as they were."""
    folder = tmp_path / "iter_1"
    folder.mkdir()
    (folder / "DONE.eval").write_text(json.dumps({"em": 0.25, "seconds": 1.0}))
    assert StageRunner().run(folder, "eval", lambda: pytest.fail("redone")) == {"em": 0.25, "seconds": 1.0}
