"""Raw validation of ``dtype: image`` cameras (LIBERO-style: PNG cells in the data parquet).

Every image cell of the episode is decoded, like every packet of a video span.
"""

from __future__ import annotations

import io
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flora.validation.raw import validate_dataset
from tests.data.test_lerobot_input import WRIST, _make_libero_style

DURS = (6.0, 14.0, 26.0)  # the session's tiny dataset (tests/conftest.py)


@pytest.fixture
def libero(tiny_dataset, tmp_path):
    """A copy of the tiny dataset whose wrist camera is a ``dtype: image`` feature."""
    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    # Flat frames (cheap to encode); the checks only need decodable 96x96 images.
    frames = {i: [np.full((96, 96, 3), f % 251, np.uint8) for f in range(int(d * 20))]
              for i, d in enumerate(DURS)}  # fmt: skip
    _make_libero_style(root, frames)
    return root


def _damage_cell(root, episode: int, frame: int, data: bytes) -> str:
    for p in sorted((root / "data").rglob("*.parquet")):
        t = pq.read_table(p)
        eps, fis = t.column("episode_index").to_pylist(), t.column("frame_index").to_pylist()
        rows = [
            k for k, (e, f) in enumerate(zip(eps, fis, strict=True)) if (e, f) == (episode, frame)
        ]
        if rows:
            cells = t.column(WRIST).to_pylist()
            cells[rows[0]] = {"bytes": data, "path": "broken.png"}
            i = t.column_names.index(WRIST)
            t = t.set_column(i, WRIST, pa.array(cells, t.schema.field(WRIST).type))
            pq.write_table(t, p)
            return str(p)
    raise AssertionError("frame not found")


def test_image_camera_is_validated_frame_by_frame(libero):
    report = validate_dataset(libero, progress=False)
    assert report.success, [i.describe() for i in report.issues]
    cams = report.tables["raw_cameras"]
    assert cams.row_count == 6  # 3 episodes x (top video + wrist images)


def test_one_broken_image_mid_episode_fails_every_frame_decodes(libero):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((96, 96, 3), np.uint8)).save(buf, format="PNG")
    file = _damage_cell(libero, episode=1, frame=100, data=buf.getvalue()[:40])  # truncated
    report = validate_dataset(libero, progress=False)
    assert report.invalid_episodes == [1] and report.valid_episodes == [0, 2]
    (issue,) = report.issues
    assert issue.check == "every frame decodes" and issue.field == WRIST
    assert issue.file == file
    assert issue.reason.startswith("1 of 280 frames fail: decode error at 5000000 µs")
