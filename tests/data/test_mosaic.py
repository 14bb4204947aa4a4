"""Mosaic layout: main left, wrist right, same size; black tile for an absent camera."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flora.data import open_dataset
from flora.data.frames import sample_episode_frames
from flora.data.mosaic import MOSAIC_ROLES, episode_roles, make_mosaic, sample_mosaics


def _solid(h, w, rgb):
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = rgb
    return img


def test_layout_order_and_size():
    assert MOSAIC_ROLES == ("main", "wrist")
    main, wrist = _solid(48, 64, (200, 0, 0)), _solid(48, 64, (0, 0, 200))
    m = make_mosaic({"wrist": wrist, "main": main})  # dict order does not matter
    assert m.shape == (48, 128, 3) and m.dtype == np.uint8
    np.testing.assert_array_equal(m[:, :64], main)
    np.testing.assert_array_equal(m[:, 64:], wrist)


def test_other_sizes_are_resized_to_the_main_tile():
    m = make_mosaic({"main": _solid(48, 64, (10, 20, 30)), "wrist": _solid(96, 96, (0, 255, 0))})
    assert m.shape == (48, 128, 3)
    assert (m[:, 64:] == (0, 255, 0)).all()


def test_missing_camera_is_a_black_tile():
    m = make_mosaic({"main": _solid(32, 32, (9, 9, 9)), "wrist": None})
    assert m.shape == (32, 64, 3) and not m[:, 32:].any()
    m2 = make_mosaic({"wrist": _solid(32, 32, (9, 9, 9))})
    assert not m2[:, :32].any() and (m2[:, 32:] == 9).all()
    with pytest.raises(ValueError):
        make_mosaic({})
    with pytest.raises(ValueError):
        make_mosaic({"main": np.zeros((4, 4), np.uint8)})


def test_sample_mosaics_on_toy_episode(tiny_dataset):
    ep = open_dataset(tiny_dataset).episode(0)
    assert episode_roles(ep) == ("main", "wrist")
    times = [0, 1_250_000, 5_950_000]
    ms = sample_mosaics(ep, times)
    top = sample_episode_frames(ep, "main", times)
    wrist = sample_episode_frames(ep, "wrist", times)
    for m, a, b in zip(ms, top, wrist, strict=True):
        assert m.image.shape == (96, 192, 3)
        assert m.roles == ("main", "wrist") and m.present == ("main", "wrist")
        np.testing.assert_array_equal(m.image[:, :96], a.image)
        np.testing.assert_array_equal(m.image[:, 96:], b.image)
        assert m.frame_t_us == {"main": a.t_us, "wrist": b.t_us}


def test_camera_absent_at_an_instant(tiny_dataset):
    ep = open_dataset(tiny_dataset).episode(0)
    # The wrist stream stops after 2 s (e.g. a dropped camera): black tile afterwards.
    w = ep.cameras["observation.images.wrist"]
    short = dataclasses.replace(w, file_end_us=w.file_start_us + 2_000_000)
    ep2 = dataclasses.replace(ep, cameras={**ep.cameras, w.key: short})
    a, b = sample_mosaics(ep2, [1_000_000, 3_000_000])
    assert a.present == ("main", "wrist") and a.image[:, 96:].any()
    assert b.present == ("main",) and b.roles == ("main", "wrist")
    assert b.image.shape == (96, 192, 3) and not b.image[:, 96:].any()
    assert b.image[:, :96].any()


def test_single_camera_dataset_is_unchanged(tiny_mp4_single):
    ep = open_dataset(tiny_mp4_single).episode(0)
    assert episode_roles(ep) == ("main",)
    (m,) = sample_mosaics(ep, [2_000_000])
    (f,) = sample_episode_frames(ep, "main", [2_000_000])
    assert m.roles == ("main",) and m.present == ("main",)
    np.testing.assert_array_equal(m.image, f.image)
