"""benchmarks/frame_signal.py: the activity path, frame change and 4 Hz snapping."""

from __future__ import annotations

import numpy as np

from flora.segment import Window
from flora.segment.kinematic import KinematicConfig, kinematic_window_segments
from tests.benchmark_scripts import load_benchmark


def test_change_is_per_frame_mean_absolute_difference() -> None:
    fs = load_benchmark("frame_signal")
    frames = [np.zeros((2, 2, 3), np.uint8), np.full((2, 2, 3), 4, np.uint8)]
    frames.append(frames[1].copy())
    assert fs.change(frames).tolist() == [0.0, 4.0, 0.0]


def test_an_activity_valley_splits_two_actions_on_the_frame_grid() -> None:
    # 4 Hz activity: still 1 s, a 2 s motion, a dip, a 2 s motion, still 1 s.
    fs = load_benchmark("frame_signal")
    bump = np.sin(np.linspace(0, np.pi, 10))[1:-1]  # 8 frames of motion
    act = np.concatenate([np.zeros(4), bump, [0.02], bump, np.zeros(4)])
    t = np.arange(len(act), dtype=np.int64) * fs.SLOT_US
    end = len(act) * fs.SLOT_US
    kin = fs.path_kinematics(t, end, act)
    w = Window(0, end, 0, end)
    segs = kinematic_window_segments(None, w, KinematicConfig(smooth_frames=1), kin=kin, fps=4.0)
    # frame i carries the change from i-1: motion frames 4-11, the dip 12, motion 13-20
    assert [(s.u, s.v) for s in segs] == [(20, 60), (60, 105)]


def test_snapped_reference_moves_boundaries_to_frames_and_keeps_open_edges() -> None:
    fs = load_benchmark("frame_signal")
    ref = {"n_ticks": 100, "segments": [[0, 23, 1, 0], [23, 61, 0, 0], [61, 100, 0, 1]]}
    snapped = [(s.u, s.v, s.left_open, s.right_open) for s in fs.snapped_reference(ref)]
    assert snapped == [(0, 25, True, False), (25, 60, False, False), (60, 100, False, True)]
