"""Writers in a child process: same bytes as in-process, and failures that name the file."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from flora.data.encoder_process import EncoderProcess, VideoEncodeError
from flora.data.video import VideoWriter, probe
from tests.flips import repeated_difference


def _frames(n: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(4)
    base = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)
    return [np.roll(base, k, axis=1) for k in range(n)]


def _sha(p) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _in_process_and_child(out) -> tuple[dict[str, str], dict[str, str]]:
    """The same clip encoded in this process and by two interleaved writers of a child:
    ({"child_a": in-process sha, "child_b": in-process sha}, {each child file's sha})."""
    out.mkdir()
    with VideoWriter(out / "here.mp4", 20, 48, 32, gop=5) as w:
        for i, f in enumerate(_frames()):
            w.add(f, keyframe=i == 0)
    with EncoderProcess() as enc:
        a = enc.writer(out / "child_a.mp4", 20, 48, 32, gop=5)
        b = enc.writer(out / "child_b.mp4", 20, 48, 32, gop=5)
        for i, f in enumerate(_frames()):  # two writers open at once, interleaved
            a.add(f, keyframe=i == 0)
            b.add(f, keyframe=i == 0)
        a.close()
        b.close()
    assert probe(out / "child_a.mp4").n_frames == 12
    here = _sha(out / "here.mp4")
    return {"child_a": here, "child_b": here}, {
        k: _sha(out / f"{k}.mp4") for k in ("child_a", "child_b")
    }


def test_child_writes_the_bytes_an_in_process_writer_writes(tmp_path):
    # The rare byte flip reached this small clip once, in a busy test worker (2026-12-03):
    # a difference counts when a second encoding repeats it (tests/flips.py).
    first = _in_process_and_child(tmp_path / "1")
    again = lambda: _in_process_and_child(tmp_path / "2")  # noqa: E731
    assert repeated_difference(first, again, "in-process vs child encoder") == []


def test_a_bad_frame_is_refused_in_the_caller(tmp_path):
    with EncoderProcess() as enc:
        w = enc.writer(tmp_path / "v.mp4", 20, 48, 32)
        with pytest.raises(ValueError, match="frame is 32x32, stream is 48x32"):
            w.add(np.zeros((32, 32, 3), np.uint8))
        with pytest.raises(ValueError, match="uint8 RGB"):
            w.add(np.zeros((32, 48, 3), np.float32))
        w.add(_frames(1)[0])  # the writer is still usable
        w.close()
    assert probe(tmp_path / "v.mp4").n_frames == 1


def test_an_unwritable_path_names_the_file(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    with EncoderProcess() as enc:
        with pytest.raises(VideoEncodeError) as e:
            enc.writer(blocker / "v.mp4", 20, 48, 32)
        assert str(blocker / "v.mp4") in str(e.value)
        w = enc.writer(tmp_path / "ok.mp4", 20, 48, 32)  # the child keeps serving
        w.add(_frames(1)[0])
        w.close()
    assert (tmp_path / "ok.mp4").stat().st_size > 0


def test_a_dead_child_is_an_error_naming_the_file(tmp_path):
    with EncoderProcess() as enc:
        w = enc.writer(tmp_path / "v.mp4", 20, 48, 32)
        enc._proc.kill()
        enc._proc.wait()
        with pytest.raises(VideoEncodeError, match="encoder process exited") as e:
            for f in _frames(200):  # a send may be buffered; the close reply cannot be
                w.add(f)
            w.close()
        assert e.value.file == str(tmp_path / "v.mp4")
