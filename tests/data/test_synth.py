"""Toy-world generator: LeRobot v3.0 layout, determinism, signals and video content."""

from __future__ import annotations

import hashlib
import json

import av
import numpy as np
import pandas as pd
import pytest

from flora.data import open_dataset
from flora.data.frames import sample_episode_frames
from flora.data.synth import SynthConfig, default_durations, generate
from flora.data.world import (
    COLORS,
    DEFAULT_DURATIONS_S,
    FPS,
    PROFILES,
    US_PER_FRAME,
    WORLD_VERSION,
    profile_for,
    simulate_episode,
)
from tests.flips import repeated_difference

TOP, WRIST = "observation.images.top", "observation.images.wrist"


def test_info_json_is_lerobot_v30(tiny_dataset):
    info = json.loads((tiny_dataset / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["fps"] == 20
    assert info["total_episodes"] == 3
    assert info["total_frames"] == (6 + 14 + 26) * 20
    assert info["chunks_size"] == 1000
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert "{video_key}" in info["video_path"] and "{file_index:03d}" in info["video_path"]
    f = info["features"]
    for key in (TOP, WRIST):
        assert f[key]["dtype"] == "video"
        assert f[key]["shape"] == [96, 96, 3]
        vi = f[key]["info"]
        assert vi["video.fps"] == 20 and vi["video.codec"] == "h264"
        assert vi["video.pix_fmt"] == "yuv420p"
    assert f["observation.state"]["names"] == ["ee_x", "ee_y", "ee_z", "gripper_opening"]
    assert f["action"]["shape"] == [4]


def test_episode_meta_and_concatenated_video_files(tiny_dataset):
    eps = pd.read_parquet(tiny_dataset / "meta/episodes/chunk-000/file-000.parquet")
    assert list(eps.episode_index) == [0, 1, 2]
    assert list(eps.length) == [120, 280, 520]
    for col in (
        "tasks",
        "data/chunk_index",
        "data/file_index",
        "dataset_from_index",
        "dataset_to_index",
        f"videos/{TOP}/from_timestamp",
        f"videos/{WRIST}/to_timestamp",
        f"videos/{TOP}/file_index",
    ):
        assert col in eps.columns, col
    # Episodes 0 and 1 share file-000 (1 starts where 0 ends); episode 2 is in file-001.
    assert list(eps[f"videos/{TOP}/file_index"]) == [0, 0, 1]
    assert list(eps[f"videos/{TOP}/from_timestamp"]) == [0.0, 6.0, 0.0]
    assert list(eps[f"videos/{TOP}/to_timestamp"]) == [6.0, 20.0, 26.0]
    assert list(eps.dataset_from_index) == [0, 120, 400]
    # LeRobot's shape: indexed by the task string, one task_index column.
    tasks = pd.read_parquet(tiny_dataset / "meta/tasks.parquet")
    assert list(tasks.columns) == ["task_index"]
    assert set(tasks.index) == {t[0] for t in eps.tasks}
    assert sorted(tasks.task_index) == list(range(len(tasks)))
    data = pd.read_parquet(tiny_dataset / "data/chunk-000/file-000.parquet")
    assert set(data.columns) >= {
        "index",
        "episode_index",
        "frame_index",
        "timestamp",
        "task_index",
        "observation.state",
        "action",
    }
    assert sorted(set(data.episode_index)) == [0, 1]
    # The shared video file holds both episodes: 120 + 280 frames, keyframe at each start.
    path = tiny_dataset / f"videos/{TOP}/chunk-000/file-000.mp4"
    with av.open(str(path)) as c:
        vs = c.streams.video[0]
        assert vs.codec_context.name == "h264"
        assert vs.codec_context.pix_fmt == "yuv420p"
        assert (vs.codec_context.width, vs.codec_context.height) == (96, 96)
        assert vs.average_rate == 20
        pk = [
            (round(float(p.pts * p.time_base) * 1e6), p.is_keyframe)
            for p in c.demux(vs)
            if p.pts is not None
        ]
    assert len(pk) == 400
    keys = {t for t, k in pk if k}
    assert 0 in keys and 6_000_000 in keys


def test_generation_is_deterministic(tmp_path):
    def digest(root):
        h = {}
        for p in sorted(root.rglob("*")):
            if p.is_file():
                h[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        return h

    def pair(tag: str) -> tuple[dict[str, str], dict[str, str]]:
        return tuple(
            digest(
                generate(tmp_path / f"{tag}{k}", 2, seed=11, durations_s=[5, 6], progress=False)
            )  # fmt: skip
            for k in (1, 2)
        )

    a = tmp_path / "a1"
    first = pair("a")
    da = first[0]
    # Names any file whose bytes differ in two pairs of generations (tests/flips.py).
    assert repeated_difference(first, lambda: pair("b"), "generate(seed=11)") == []
    c = generate(tmp_path / "c", 2, seed=12, durations_s=[5, 6], progress=False)
    dc = digest(c)
    assert len(da) > 10
    vid = f"videos/{TOP}/chunk-000/file-000.mp4"
    assert da[vid] != dc[vid]
    with pytest.raises(FileExistsError):
        generate(a, 1, seed=11, durations_s=[5], progress=False)


def test_a_default_length_does_not_fix_the_failure_profile():
    # World 1 paired each of the 12 cycling lengths with one profile for ever, so the
    # outcome could be read off the length in the prompt; world 2 gives every length
    # every profile over six cycles, and keeps the first cycle as it was.
    n = len(DEFAULT_DURATIONS_S)
    lengths = default_durations(6 * n)
    for world, want in ((1, 1), (2, len(PROFILES))):
        seen: dict[float, set] = {}
        for i, d in enumerate(lengths):
            seen.setdefault(d, set()).add(profile_for(i, world))
        assert {len(v) for v in seen.values()} == {want}, world
    assert all(profile_for(i, 1) == profile_for(i, 2) == PROFILES[i % 6] for i in range(n))
    assert profile_for(n, 2) != profile_for(n, 1)
    fails = [[(s.kind, s.fail) for s in simulate_episode(0, n, 8.0, world=w).plan.steps]
             for w in (1, 2)]  # fmt: skip
    assert fails[0] != fails[1]


def test_world_version_is_recorded_and_unknown_ones_refused(tmp_path):
    with pytest.raises(ValueError, match="toy-world version 7"):
        generate(tmp_path / "w", 1, seed=3, durations_s=[2], world=7, progress=False)
    assert not (tmp_path / "w").exists()  # refused before anything is written
    root = generate(tmp_path / "v", 1, seed=3, durations_s=[2], progress=False)
    meta = json.loads((root / "meta/flora_synth.json").read_text())
    assert meta["world"] == WORLD_VERSION
    # Metadata written before versions existed describes world 1.
    del meta["world"]
    assert SynthConfig.from_json(meta).world == 1


def test_default_lengths_span_short_to_long_horizon():
    d = default_durations(12)
    assert min(d) == 5.0 and max(d) == 180.0
    assert d == DEFAULT_DURATIONS_S
    families = set()
    for i, dur in enumerate(d):
        r = simulate_episode(0, i, dur)
        families.add(r.plan.family)
        assert r.n_frames == round(dur * FPS)
        # Events are ordered, non-overlapping, at least 4 frames, inside the episode.
        prev = 0
        for e in r.events:
            assert prev <= e.start_frame < e.end_frame <= r.n_frames
            assert e.end_frame - e.start_frame >= 4
            prev = e.end_frame
    assert {"pick_up", "push", "pick_place", "stack", "multi_pick_place"} & families
    assert families & {"clear", "sort"}  # long-horizon tasks occur
    assert len(families) >= 5


def test_state_and_action_signals(tiny_dataset):
    ds = open_dataset(tiny_dataset)
    ep = ds.episode(0)  # clean episode
    r = simulate_episode(7, 0, 6.0)
    np.testing.assert_array_equal(ep.state, r.state())
    np.testing.assert_array_equal(ep.action, r.action())
    assert ep.state_names == ["ee_x", "ee_y", "ee_z", "gripper_opening"]
    # Without obstruction the commanded delta is exactly the next measured move.
    np.testing.assert_allclose(ep.state[:-1, :3] + ep.action[:-1, :3], ep.state[1:, :3], atol=1e-5)
    # The gripper command is binary and the opening stays in [0, 1].
    assert set(np.unique(ep.action[:, 3])) <= {0.0, 1.0}
    assert ep.state[:, 3].min() >= 0 and ep.state[:, 3].max() <= 1
    # A collision shows in the signals: command and measured motion disagree there.
    r2 = simulate_episode(7, 2, 26.0)
    col = [a for a in r2.anomalies if a.reason.startswith("collision")]
    assert col
    mismatch = np.abs(r2.state()[:-1, :3] + r2.action()[:-1, :3] - r2.state()[1:, :3]).max(1)
    inside = np.zeros(len(mismatch), bool)
    inside[col[0].start_frame - 1 : col[0].end_frame] = True
    assert mismatch[inside].max() > 0.01
    assert mismatch[~inside].max() < 1e-5


def _between_fingers(img: np.ndarray) -> str:
    """Colour probe: name of the palette colour nearest the region between the fingers."""
    h, w = img.shape[:2]
    mean = img[int(0.72 * h) : int(0.95 * h), int(0.42 * w) : int(0.58 * w)].reshape(-1, 3).mean(0)
    palette = {**COLORS, "table": (150, 110, 70), "finger": (38, 38, 44)}
    return min(palette, key=lambda k: float(np.linalg.norm(mean - np.array(palette[k]))))


def test_missed_grasp_is_visible_in_wrist_video_and_state(tiny_dataset):
    """After a successful grasp the object fills the wrist view between the fingers; after
    the missed grasp the fully closed fingers meet there, and the state shows it too."""
    ds = open_dataset(tiny_dataset)
    ep = ds.episode(1)
    r = simulate_episode(7, 1, 14.0)
    miss = next(e for e in r.events if e.action == "grasp" and not e.success)
    ok = next(e for e in r.events if e.action == "grasp" and e.success)
    assert miss.caption.startswith("attempt to grasp the") and "miss" in miss.caption
    obj = next(o for o in r.plan.scene.objects if o.name == ok.object)
    t_miss = (miss.end_frame - 1) * US_PER_FRAME
    t_ok = (ok.end_frame - 1) * US_PER_FRAME
    t_lift = (ok.end_frame + 10) * US_PER_FRAME
    f_miss, f_ok, f_lift = sample_episode_frames(ep, WRIST, [t_miss, t_ok, t_lift])
    assert _between_fingers(f_ok.image) == obj.color
    assert _between_fingers(f_lift.image) == obj.color  # still held while lifting
    assert _between_fingers(f_miss.image) == "finger"  # fingers closed on nothing
    assert ep.state[miss.end_frame - 1, 3] < 0.05  # closed on nothing
    assert 0.4 < ep.state[ok.end_frame - 1, 3] < 0.6  # closed on the object
