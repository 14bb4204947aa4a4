"""Window planning: exact DESIGN §3.7 layout for both profiles and both passes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flora.contract import US_PER_S
from flora.segment import LocalSegment, Window, plan_windows

S = US_PER_S


def _spans(ws: list[Window]) -> list[tuple[float, float, float, float]]:
    return [(w.start_us / S, w.end_us / S, w.core_start_us / S, w.core_end_us / S) for w in ws]


def test_standard_primary_layout_40s() -> None:
    ws = plan_windows(40 * S)
    assert _spans(ws) == [
        (0, 14, 0, 12),
        (10, 26, 12, 24),
        (22, 38, 24, 36),
        (34, 40, 36, 40),
    ]
    assert [w.index for w in ws] == [0, 1, 2, 3]
    assert not any(w.shifted for w in ws)
    # Full windows have 64 frames at 4 Hz; edge windows fewer (outside guard is absent).
    assert [len(w.frame_times_us()) for w in ws] == [56, 64, 64, 24]
    assert ws[1].frame_times_us()[:3] == [10 * S, 10 * S + 250_000, 10 * S + 500_000]
    assert ws[1].frame_times_us()[-1] == 10 * S + 63 * 250_000
    assert ws[1].n_ticks == 320


def test_standard_shifted_layout_40s() -> None:
    ws = plan_windows(40 * S, shift=True)
    assert _spans(ws) == [
        (0, 8, 0, 6),
        (4, 20, 6, 18),
        (16, 32, 18, 30),
        (28, 40, 30, 40),
    ]
    assert all(w.shifted for w in ws)


def test_long_horizon_layout() -> None:
    ws = plan_windows(70 * S, "long_horizon")
    assert _spans(ws) == [(0, 28, 0, 24), (20, 52, 24, 48), (44, 70, 48, 70)]
    assert len(ws[1].frame_times_us()) == 128
    assert ws[1].n_ticks == 640
    sh = plan_windows(70 * S, "long_horizon", shift=True)
    assert _spans(sh) == [(0, 16, 0, 12), (8, 40, 12, 36), (32, 64, 36, 60), (56, 70, 60, 70)]


def test_short_episode_one_window_both_passes() -> None:
    for shift in (False, True):
        ws = plan_windows(7_300_000, shift=shift)
        assert len(ws) == 1
        assert (ws[0].start_us, ws[0].end_us, ws[0].core_start_us, ws[0].core_end_us) == (
            0,
            7_300_000,
            0,
            7_300_000,
        )
        # 7.3 s at 4 Hz: frames at 0, .25, ..., 7.25 s -> 30 frames; 146 ticks.
        assert len(ws[0].frame_times_us()) == 30
        assert ws[0].n_ticks == 146
    assert len(plan_windows(12 * S)) == 1  # exactly one core
    assert len(plan_windows(12 * S + 1)) == 2


def test_non_aligned_end_has_partial_last_tick() -> None:
    ws = plan_windows(25_010_000)
    last = ws[-1]
    assert (last.start_us, last.end_us) == (22 * S, 25_010_000)
    assert last.n_ticks == 61  # 3.01 s -> 60 full ticks + 1 partial


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "10"])
def test_rejects_bad_duration(bad) -> None:
    with pytest.raises(ValueError, match="duration_us"):
        plan_windows(bad)


def test_rejects_unknown_profile() -> None:
    with pytest.raises(ValueError, match="unknown segmentation profile 'huge'"):
        plan_windows(10 * S, "huge")


def test_local_segment_fields() -> None:
    seg = LocalSegment(3, 9, True, False)
    assert (seg.u, seg.v, seg.left_open, seg.right_open) == (3, 9, True, False)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    T=st.integers(1, 400 * S),
    profile=st.sampled_from(["standard", "long_horizon"]),
    shift=st.booleans(),
)
def test_cores_tile_episode_and_windows_follow_formula(T: int, profile: str, shift: bool) -> None:
    ws = plan_windows(T, profile, shift)
    C = 12 * S if profile == "standard" else 24 * S
    G = 2 * S if profile == "standard" else 4 * S
    # Cores tile [0, T) without gaps or overlap.
    assert ws[0].core_start_us == 0 and ws[-1].core_end_us == T
    for a, b in zip(ws, ws[1:], strict=False):
        assert a.core_end_us == b.core_start_us
    for k, w in enumerate(ws):
        assert w.index == k
        assert w.start_us == max(0, w.core_start_us - G)
        assert w.end_us == min(T, w.core_end_us + G)
        assert w.start_us % S == 0  # windows start on whole seconds -> tick grid aligned
        frames = w.frame_times_us()
        assert 1 <= len(frames) <= (64 if profile == "standard" else 128)
        assert frames[0] == w.start_us and frames[-1] < w.end_us
    if T > C:
        first = C // 2 if shift else C
        assert ws[0].core_end_us == first
        assert all(w.core_start_us == first + (k - 1) * C for k, w in enumerate(ws) if k >= 1)
    else:
        assert len(ws) == 1
