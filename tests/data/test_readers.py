"""Readers: LeRobot v3.0, LeRobot v2.1 and plain mp4 folders give the same episodes."""

from __future__ import annotations

import numpy as np
import pytest

from flora.data import Episode, open_dataset
from flora.data.dataset import assign_roles, timestamps_to_us
from flora.data.episode import FloraDataError
from flora.data.frames import sample_episode_frames, sample_times
from flora.data.synth import rerender
from flora.data.world import simulate_episode

TOP, WRIST = "observation.images.top", "observation.images.wrist"
DURS = (6.0, 14.0, 26.0)


def test_v30_dataset(tiny_v30):
    ds = open_dataset(tiny_v30)
    assert ds.format == "lerobot_v3.0"
    assert ds.name == "toy_tiny" and ds.root == tiny_v30
    assert ds.fps == 20.0
    assert ds.camera_keys == [TOP, WRIST]
    assert ds.camera_roles == {TOP: "main", WRIST: "wrist"}
    assert ds.num_episodes == 3 and ds.episode_indices() == [0, 1, 2]
    for i, d in enumerate(DURS):
        ep = ds.episode(i)
        assert isinstance(ep, Episode)
        assert ep.episode_id == f"toy_tiny/{i:06d}"
        assert ep.duration_us == int(d * 1e6)
        n = int(d * 20)
        # float32 seconds on disk are snapped back to the exact 50 ms grid.
        np.testing.assert_array_equal(ep.timestamps_us, np.arange(n) * 50_000)
        r = simulate_episode(7, i, d)
        assert ep.task == r.plan.task
        np.testing.assert_array_equal(ep.state, r.state())
        np.testing.assert_array_equal(ep.action, r.action())
        top = ep.cameras[TOP]
        assert top.role == "main" and (top.width, top.height) == (96, 96)
        assert top.file_end_us - top.file_start_us == ep.duration_us
    assert ds.episode(1).cameras[TOP].file_start_us == 6_000_000  # concatenated after ep 0


def _same_frames(a: Episode, b: Episode, key_a: str, key_b: str, times) -> float:
    fa = sample_episode_frames(a, key_a, times)
    fb = sample_episode_frames(b, key_b, times)
    assert [f.t_us for f in fa] == [f.t_us for f in fb] == list(times)
    return max(
        float(np.abs(x.image.astype(int) - y.image.astype(int)).mean())
        for x, y in zip(fa, fb, strict=True)
    )


def test_v21_copy_reads_the_same_episodes(tiny_v30, tiny_v21):
    assert (tiny_v21 / "meta/episodes.jsonl").exists()
    assert (tiny_v21 / "data/chunk-000/episode_000002.parquet").exists()
    assert (tiny_v21 / f"videos/chunk-000/{WRIST}/episode_000001.mp4").exists()
    v3, v2 = open_dataset(tiny_v30), open_dataset(tiny_v21)
    assert v2.format == "lerobot_v2.1"
    assert v2.camera_keys == v3.camera_keys and v2.fps == v3.fps
    assert v2.episode_indices() == v3.episode_indices()
    for i in v3.episode_indices():
        a, b = v3.episode(i), v2.episode(i)
        assert (a.task, a.duration_us) == (b.task, b.duration_us)
        np.testing.assert_array_equal(a.timestamps_us, b.timestamps_us)
        np.testing.assert_array_equal(a.state, b.state)
        np.testing.assert_array_equal(a.action, b.action)
        assert b.cameras[TOP].file_start_us == 0
        times = sample_times(0, a.duration_us, 1)
        # Same renders, encoded separately: pixel values agree up to compression noise.
        assert _same_frames(a, b, TOP, TOP, times) < 4.0
        assert _same_frames(a, b, WRIST, WRIST, times) < 4.0


def test_mp4_folder_with_camera_pairs(tiny_v30, tiny_mp4_pairs):
    assert (tiny_mp4_pairs / "episode_000000.top.mp4").exists()
    ds = open_dataset(tiny_mp4_pairs)
    assert ds.format == "mp4_folder"
    assert ds.camera_keys == ["top", "wrist"]
    assert ds.camera_roles == {"top": "main", "wrist": "wrist"}
    assert ds.num_episodes == 3 and ds.fps == 20.0
    v3 = open_dataset(tiny_v30)
    for i, d in enumerate(DURS):
        ep = ds.episode(i)
        n = int(d * 20)
        assert ep.duration_us == int(d * 1e6)
        np.testing.assert_array_equal(ep.timestamps_us, np.arange(n) * 50_000)
        assert ep.state.shape == (n, 0) and ep.action.shape == (n, 0)
        assert ep.task == ""
        assert _same_frames(v3.episode(i), ep, WRIST, "wrist", [0, 2_000_000, 5_950_000]) < 4


def test_mp4_folder_single_camera(tiny_mp4_single):
    assert sorted(p.name for p in tiny_mp4_single.glob("*.mp4")) == [
        "episode_000000.mp4",
        "episode_000001.mp4",
    ]
    ds = open_dataset(tiny_mp4_single)
    assert ds.camera_keys == ["video"] and ds.camera_roles == {"video": "main"}
    ep = ds.episode(1)
    assert ep.duration_us == 7_000_000
    (f,) = sample_episode_frames(ep, "main", [3_000_000])
    ref = rerender(tiny_mp4_single, 1, "top", 60)
    assert f.t_us == 3_000_000
    assert np.abs(f.image.astype(int) - ref.astype(int)).mean() < 5


def test_role_assignment():
    assert assign_roles(["observation.images.wrist", "observation.images.top"]) == {
        "observation.images.wrist": "wrist",
        "observation.images.top": "main",
    }
    r = assign_roles(
        ["observation.images.side", "observation.images.front", "observation.images.left_wrist"]
    )
    assert r["observation.images.front"] == "main"
    assert r["observation.images.left_wrist"] == "wrist"
    assert r["observation.images.side"] == "side"
    assert assign_roles(["cam_high"]) == {"cam_high": "main"}


def test_timestamp_conversion():
    ts = (np.arange(3600) / 20).astype(np.float32)  # 3 min in float32 seconds
    us = timestamps_to_us(ts, 20, dataset="d", episode=0, file="f")
    np.testing.assert_array_equal(us, np.arange(3600) * 50_000)
    # Off-grid timestamps are kept (in µs) but must still increase.
    us2 = timestamps_to_us(np.array([0.0, 0.0333, 0.07]), 20, dataset="d", episode=0, file="f")
    assert list(us2) == [0, 33_300, 70_000]
    with pytest.raises(FloraDataError) as ei:
        timestamps_to_us(np.array([0.0, 0.1, 0.05]), 20, dataset="d", episode=4, file="x.pq")
    assert ei.value.field == "timestamp" and ei.value.episode == 4
