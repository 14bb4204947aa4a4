"""A Flora export is served the way it was trained (stamped images), on any host.

Flora's trainers render frames as stamped images (``TRAINING_VISION_INPUT``); on a GPU pod
with torchvision the processor could also take video, which lays a dense group's two frames
into one temporal patch — input a Flora model never saw. The export's manifest records the
input, and ``TransformersBackend(vision_input="auto")`` follows it; other checkpoints keep
the processor's choice. Torchvision is simulated as present, since it is not installed here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers
import transformers.utils

from flora.backends.processing import (
    MODEL_FORMAT,
    MODEL_MANIFEST,
    TRAINING_VISION_INPUT,
    RequestError,
    trained_vision_input,
)


def _export(root: Path, **fields) -> Path:
    root.mkdir(parents=True)
    (root / MODEL_MANIFEST).write_text(json.dumps({"format": MODEL_FORMAT, **fields}))
    return root


def test_the_manifest_says_how_an_export_saw_frames(tmp_path):
    assert TRAINING_VISION_INPUT == "images"
    # Before the field existed every export was trained on images.
    old = _export(tmp_path / "old", model="rewarder")
    (old / "model").mkdir()
    assert trained_vision_input(old / "model") == "images"
    assert trained_vision_input(old) == "images"
    vid = _export(tmp_path / "vid", vision_input="video")
    (vid / "adapter").mkdir()
    assert trained_vision_input(None, vid / "adapter", "Qwen/Qwen3-VL-2B") == "video"
    # Not a Flora export: a hub id, a raw checkpoint, another tool's manifest.
    assert trained_vision_input("Qwen/Qwen3-VL-2B") is None
    (tmp_path / "raw").mkdir()
    assert trained_vision_input(tmp_path / "raw") is None
    other = tmp_path / "other"
    other.mkdir()
    (other / MODEL_MANIFEST).write_text(json.dumps({"format": "something-else/2"}))
    assert trained_vision_input(other) is None


def test_a_bad_manifest_is_named(tmp_path):
    bad = _export(tmp_path / "bad", vision_input="frames")
    (bad / "model").mkdir()
    with pytest.raises(RequestError, match=r"flora_model\.json: field 'vision_input' is 'frames'"):
        trained_vision_input(bad / "model")
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / MODEL_MANIFEST).write_text("{not json")
    with pytest.raises(RequestError, match="not a readable model manifest"):
        trained_vision_input(garbled)


def test_auto_serves_an_export_as_trained_where_video_is_available(
    tiny_vlm_dir, tmp_path, monkeypatch
):
    from flora.backends.transformers_backend import TransformersBackend

    export = _export(tmp_path / "export", model="captioner")
    shutil.copytree(tiny_vlm_dir(), export / "model")
    raw = tmp_path / "raw"
    shutil.copytree(tiny_vlm_dir(), raw)

    # A GPU pod: torchvision importable, AutoProcessor would bring the video half.
    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: True)
    asked: list[str] = []

    def video_processor(path, *a, **k):
        asked.append(str(path))
        raise RuntimeError("the video processor was asked for")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", video_processor)

    b = TransformersBackend(export / "model", device="cpu")
    assert b.vision_input == "images"
    assert asked == []
    # A checkpoint that is not a Flora export still takes the processor's choice (video).
    with pytest.raises(RuntimeError, match="video processor was asked for"):
        TransformersBackend(raw, device="cpu")
    assert asked == [str(raw)]


def test_evaluation_loads_an_export_as_trained(tiny_vlm_dir, tmp_path, monkeypatch):
    import hashlib

    from training.evaluate import backend_for

    root = tmp_path / "export"
    shutil.copytree(tiny_vlm_dir(), root / "model")
    files = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip
    man = {"format": MODEL_FORMAT, "model": "captioner", "kind": "full", "files": files}
    (root / MODEL_MANIFEST).write_text(json.dumps(man))

    def video_processor(*a, **k):
        pytest.fail("the video processor was asked for")

    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: True)
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", video_processor)
    assert backend_for(root).vision_input == "images"
