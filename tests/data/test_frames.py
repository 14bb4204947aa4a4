"""Frame sampling: exact timestamps, right frame per time, seek-aware decoding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flora.data import open_dataset
from flora.data.episode import FloraDataError
from flora.data.frames import (
    DecodeStats,
    decode_all,
    sample_episode_frames,
    sample_frames,
    sample_times,
)
from flora.data.synth import rerender

TOP, WRIST = "observation.images.top", "observation.images.wrist"


def test_sample_times():
    assert sample_times(0, 1_000_000, 4) == [0, 250_000, 500_000, 750_000]
    assert sample_times(100, 600_100, 4) == [100, 250_100, 500_100]
    assert sample_times(0, 1_000_001, 4)[-1] == 1_000_000
    assert sample_times(5, 5, 4) == []
    assert sample_times(0, 1_000_000, 3) == [0, 333_333, 666_667]
    assert len(sample_times(0, 16_000_000, 4)) == 64  # a standard segmentation window
    with pytest.raises(ValueError):
        sample_times(0, 10, 0)


@pytest.fixture(scope="module")
def ep1(tiny_dataset):
    """Episode 1 lives at [6 s, 20 s) of a concatenated v3.0 file."""
    return open_dataset(tiny_dataset).episode(1)


def test_frame_whose_interval_holds_the_time(ep1):
    req = [1_000_000, 1_030_000, 1_049_800, 1_049_950, 1_050_000, 0, 13_999_999]
    got = sample_episode_frames(ep1, TOP, req)
    # 1_049_950 is within the 100 µs rounding slack of the next frame.
    want = [1_000_000, 1_000_000, 1_000_000, 1_050_000, 1_050_000, 0, 13_950_000]
    assert [f.t_us for f in got] == want
    np.testing.assert_array_equal(got[0].image, got[1].image)
    assert got[0].image.shape == (96, 96, 3) and got[0].image.dtype == np.uint8


def test_sampled_frames_match_rerender_in_concatenated_file(tiny_dataset, ep1):
    """Decoded frames at 4 Hz are the rendered frames of *this* episode at those times:
    closest to the re-render of the same frame index, not of its neighbours."""
    times = sample_times(0, ep1.duration_us, 4)
    frames = sample_episode_frames(ep1, WRIST, times)
    assert [f.t_us for f in frames] == times  # 4 Hz lands exactly on 20 fps frames
    checked = 0
    for f in frames[::4]:
        k = f.t_us // 50_000
        err = {
            j: np.abs(
                rerender(tiny_dataset, 1, "wrist", j).astype(int) - f.image.astype(int)
            ).mean()
            for j in (k - 6, k, k + 6)
            if 0 <= j < 280
        }
        assert err[k] < 5.0
        if len(err) == 3 and min(err[k - 6], err[k + 6]) > err[k] + 3:
            checked += 1  # the neighbours look different and lose
    assert checked >= 3


def test_seek_aware_sparse_sampling_decodes_less(tiny_dataset):
    ep = open_dataset(tiny_dataset).episode(2)  # 26 s = 520 frames
    cam = ep.cameras[TOP]
    everything = decode_all(cam)
    assert len(everything) == 520 and everything[0].t_us == 0
    by_t = {f.t_us: f.image for f in everything}
    sparse = sample_times(0, ep.duration_us, 1)  # 1 Hz
    st = DecodeStats()
    got = sample_frames(cam, sparse, stats=st)
    assert st.requested == 26
    assert st.seeks > 1
    assert st.decoded < 520 * 0.5  # skipped whole GOPs instead of decoding everything
    for f in got:
        np.testing.assert_array_equal(f.image, by_t[f.t_us])  # identical pixels
    # Dense request: one pass, every frame decoded once.
    st2 = DecodeStats()
    dense = sample_frames(cam, [f.t_us for f in everything], stats=st2)
    assert st2.decoded == 520 and st2.seeks == 1
    assert all(np.array_equal(a.image, b.image) for a, b in zip(dense, everything, strict=True))


def test_request_order_and_duplicates(ep1):
    times = [3_000_000, 500_000, 3_000_000, 100_000]
    got = sample_episode_frames(ep1, "main", times)  # by role
    assert [f.t_us for f in got] == times
    np.testing.assert_array_equal(got[0].image, got[2].image)


def test_out_of_range_times(ep1):
    T = ep1.duration_us
    with pytest.raises(FloraDataError) as ei:
        sample_episode_frames(ep1, TOP, [T])
    assert ei.value.field == TOP and ei.value.episode == 1 and ei.value.file
    with pytest.raises(FloraDataError):
        sample_episode_frames(ep1, TOP, [-1])
    (f,) = sample_episode_frames(ep1, TOP, [T + 250_000], clamp_end=True)
    assert f.t_us == T - 50_000
    assert sample_episode_frames(ep1, TOP, [T, 0], missing="none")[0] is None
    with pytest.raises(FloraDataError) as ei:
        sample_episode_frames(ep1, "observation.images.side", [0])
    assert ei.value.field == "observation.images.side"


def test_float_rounded_episode_origin_snaps_to_the_frame(ep1):
    """v3.0 stores from/to_timestamp as float seconds; a few µs of rounding must not lose
    the episode's first frame or shift the returned timestamps."""
    cam = ep1.cameras[TOP]
    exact = sample_frames(cam, [0, 50_000, ep1.duration_us - 50_000])
    for off in (-3, 4):
        shifted = dataclasses.replace(
            cam, file_start_us=cam.file_start_us + off, file_end_us=cam.file_end_us + off
        )
        got = sample_frames(shifted, [0, 50_000, ep1.duration_us - 50_000])
        assert [f.t_us for f in got] == [0, 50_000, ep1.duration_us - 50_000]
        for a, b in zip(exact, got, strict=True):
            np.testing.assert_array_equal(a.image, b.image)
