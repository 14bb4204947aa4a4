"""Raw-video checks that must be able to fail (issues 9 item 5 and 15 finding 6).

Each test damages one camera file of episode 2 of the tiny toy dataset (its videos hold
that episode alone: 26 s, 520 frames at 20 fps, a keyframe every 10 frames) and checks
that exactly the intended check names that episode, camera and file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest

from flora.validation.raw import validate_dataset

CAMERA = "observation.images.top"
FLORA = str(Path(sys.executable).parent / "flora")
COVERS_END = "video covers the episode end (±1 frame)"
FRAMES_MATCH = "video frames = data frames (±1)"
DECODES = "every frame decodes"


def _video_of_episode_2(root: Path) -> Path:
    import pandas as pd

    meta = pd.read_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
    m = meta[meta.episode_index == 2].iloc[0]
    shared = meta[meta[f"videos/{CAMERA}/file_index"] == m[f"videos/{CAMERA}/file_index"]]
    assert len(shared) == 1, "episode 2 must have its video file to itself"
    return (
        root
        / "videos"
        / CAMERA
        / "chunk-000"
        / f"file-{int(m[f'videos/{CAMERA}/file_index']):03d}.mp4"
    )


def _remux(path: Path, keep: Callable[[float], bool]) -> None:
    """Rewrite ``path`` keeping only the packets whose pts (seconds) ``keep`` accepts."""
    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(path)) as inp, av.open(str(tmp), "w", format="mp4") as out:
        ist = inp.streams.video[0]
        ost = out.add_stream_from_template(ist)
        for pkt in inp.demux(ist):
            if pkt.dts is None:  # the demuxer's flush packet
                continue
            if keep(float(pkt.pts * ist.time_base)):
                pkt.stream = ost
                out.mux(pkt)
    tmp.replace(path)


@pytest.fixture
def copy_of(tiny_dataset, tmp_path):
    def make(name: str) -> tuple[Path, Path]:
        root = tmp_path / name / tiny_dataset.name
        shutil.copytree(tiny_dataset, root)
        return root, _video_of_episode_2(root)

    return make


def _checks(report, episode: int = 2) -> dict[str, set[tuple[str | None, str | None]]]:
    out: dict[str, set[tuple[str | None, str | None]]] = {}
    for i in report.issues_of(episode):
        out.setdefault(i.check, set()).add((i.field, i.file))
    return out


def test_truncated_video_fails_coverage_and_frame_count(copy_of):
    """The last 6 s of episode 2's top camera are cut: the video no longer covers the end."""
    root, video = copy_of("truncated")
    _remux(video, lambda t: t < 20.0)
    report = validate_dataset(root, progress=False)
    assert report.invalid_episodes == [2] and report.valid_episodes == [0, 1]
    checks = _checks(report)
    assert checks[COVERS_END] == {(CAMERA, str(video))}
    assert checks[FRAMES_MATCH] == {(CAMERA, str(video))}
    assert DECODES not in checks  # what is there decodes fine
    (cover,) = [i for i in report.issues_of(2) if i.check == COVERS_END]
    assert "[0, 20000000) µs of [0, 26000000) µs" in cover.reason
    (count,) = [i for i in report.issues_of(2) if i.check == FRAMES_MATCH]
    assert "400 frames" in count.reason and "520 rows" in count.reason


def test_dropped_frames_mid_video_fail_the_frame_count_only(copy_of):
    """One second (two whole GOPs) missing in the middle: ends are fine, the count is not.

    The old ``frames_match_duration`` compared the data's rows with ``duration × fps``,
    which the reader derives from those same rows, so it could not see this.
    """
    root, video = copy_of("gap")
    _remux(video, lambda t: not (10.0 <= t < 11.0))
    report = validate_dataset(root, progress=False)
    assert report.invalid_episodes == [2]
    checks = _checks(report)
    assert set(checks) == {FRAMES_MATCH}, checks
    assert checks[FRAMES_MATCH] == {(CAMERA, str(video))}


def test_random_bytes_mid_file_fail_flora_validate(copy_of, tmp_path):
    """The middle half of the mp4 overwritten: first and last frame still decode (the old
    check passed), but most packets in between do not."""
    root, video = copy_of("mid_corrupt")
    data = bytearray(video.read_bytes())
    n = len(data)
    rng = np.random.default_rng(0)
    data[n // 4 : 3 * n // 4] = rng.integers(0, 256, 3 * n // 4 - n // 4, dtype=np.uint8).tobytes()
    video.write_bytes(bytes(data))
    out = tmp_path / "report.json"
    p = subprocess.run(
        [FLORA, "validate", str(root), "-q", "--json", str(out), "--no-docs"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 3, p.stdout + p.stderr  # episodes 0 and 1 are still valid
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("error ")]
    assert lines and all(f"{root.name}/2 {CAMERA} {DECODES}: " in ln for ln in lines), lines
    assert all(ln.endswith(f"[{video}]") for ln in lines)
    saved = json.loads(out.read_text())
    assert saved["invalid_episodes"] == [2]
    cams = saved["tables"]["raw_cameras"]
    assert not cams["success"]


# --------------------------------------------------------------------------- metadata


def _edit_info(root: Path, **changes) -> None:
    p = root / "meta" / "info.json"
    info = json.loads(p.read_text())
    info.update(changes)
    p.write_text(json.dumps(info))


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"fps": float("nan")}, "fps", "positive finite"),
        ({"fps": "inf"}, "fps", "positive finite"),
        ({"data_path": "data/{chunk}/{file_index}.parquet"}, "data_path", "['chunk']"),
        ({"video_path": "videos/{camera}/{file_index}.mp4"}, "video_path", "['camera']"),
        ({"data_path": "../../outside/{chunk_index}-{file_index}.parquet"}, "data_path", "leaves"),
        ({"data_path": "/etc/{chunk_index}{file_index}"}, "data_path", "leaves"),
        (
            {"video_path": "videos/../../{video_key}{chunk_index}{file_index}"},
            "video_path",
            "leaves",
        ),
    ],
    ids=[
        "nan_fps",
        "inf_fps",
        "data_placeholder",
        "video_placeholder",
        "dotdot",
        "absolute",
        "video_dotdot",
    ],
)
def test_bad_info_json_is_a_named_dataset_error(tiny_dataset, tmp_path, change, field, words):
    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    _edit_info(root, **change)
    report = validate_dataset(root, progress=False)
    assert not report.success and report.valid_episodes == []
    (issue,) = report.issues
    assert issue.episode is None and issue.check == "load"
    assert issue.field == field and words in issue.reason
    assert issue.file == str(root / "meta" / "info.json")


def test_non_utf8_info_json_and_cli_line(tiny_dataset, tmp_path):
    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    info = root / "meta" / "info.json"
    info.write_bytes(info.read_bytes().replace(b'"fps"', b'"fps\xff"', 1))
    p = subprocess.run([FLORA, "validate", str(root), "-q"], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr  # nothing usable
    assert "Traceback" not in p.stdout + p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("error ")]
    assert line.startswith(f"error {root.name}/- info.json load: meta/info.json is not UTF-8")
    assert line.endswith(f"[{info}]")
