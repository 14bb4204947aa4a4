"""Stitching: DESIGN §3.7 rules one by one, and the ground-truth round-trip property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flora.contract import TICK_US, US_PER_S, Event
from flora.parsing import Rejection
from flora.segment import (
    LocalSegment,
    parse_segments,
    plan_windows,
    refine,
    render_segments,
    stitch,
    stitch_detailed,
)
from flora.segment.targets import pass_targets

S = US_PER_S
T40 = 40 * S


def _ticks(seconds: float) -> int:
    return round(seconds * S / TICK_US)


def _seg(ws_s: float, a_s: float, b_s: float, lf: bool = False, rf: bool = False) -> LocalSegment:
    """A segment given in episode seconds for a window starting at ``ws_s``."""
    return LocalSegment(_ticks(a_s - ws_s), _ticks(b_s - ws_s), lf, rf)


def test_core_filter_drops_guard_only_segments() -> None:
    ws = plan_windows(T40)  # w0 [0,14) core [0,12); w1 [10,26) core [12,24)
    outs = [[_seg(0, 12.5, 13.5)], [_seg(10, 10.5, 11.5)], [], []]
    # Each lies only in its window's guard: both dropped, nothing else appears.
    assert stitch(ws, outs, T40) == []


def test_kept_segment_touching_core_from_guard() -> None:
    ws = plan_windows(T40)
    outs = [[_seg(0, 11.0, 13.5)], [], [], []]
    assert stitch(ws, outs, T40) == [Event(11 * S, 13_500_000)]


def test_merge_by_flags_even_with_low_tiou() -> None:
    ws = plan_windows(T40)  # w0 [0,14) core [0,12); w1 [10,26) core [12,24); shared [10,14)
    # w0 claims [11.5, 13) continues right, w1 claims [10, 20) continues left. Inside the
    # shared span their tIoU is 1.5/4 < 0.5, so only the flags link them. (The text parser
    # would refuse a right flag on a segment not touching the edge; stitch takes the
    # LocalSegments as given and applies the rule literally.)
    outs = [[_seg(0, 11.5, 13.0, rf=True)], [_seg(10, 10.0, 20.0, lf=True)], [], []]
    ev = stitch_detailed(ws, outs, T40)
    assert [(e.start_us, e.end_us, e.windows) for e in ev] == [(11_500_000, 20 * S, (0, 1))]
    assert (ev[0].start_from, ev[0].end_from) == (0, 1)
    # Same geometry without the flags: two separate events.
    outs = [[_seg(0, 11.5, 13.0)], [_seg(10, 10.0, 20.0)], [], []]
    assert stitch(ws, outs, T40) == [Event(10 * S, 20 * S), Event(11_500_000, 13 * S)]
    # Only one side flagged is not enough either.
    outs = [[_seg(0, 11.5, 13.0, rf=True)], [_seg(10, 10.0, 20.0)], [], []]
    assert len(stitch(ws, outs, T40)) == 2


def test_flags_required_on_both_sides_or_tiou() -> None:
    ws = plan_windows(T40)
    # Overlap [12.5, 14) only; tIoU inside the shared span [10,14): [3,14)->[10,14) = 4 s,
    # [12.5,20)->[12.5,14) = 1.5 s, inter 1.5, union 4 -> 0.375. w1 is not left-open, so
    # these are two events.
    outs = [[_seg(0, 3.0, 14.0, rf=True)], [_seg(10, 12.5, 20.0)], [], []]
    assert stitch(ws, outs, T40) == [Event(3 * S, 14 * S), Event(12_500_000, 20 * S)]


def test_merge_by_shared_span_tiou_and_select_core_boundaries() -> None:
    ws = plan_windows(T40)
    # Truth [11, 13). w0 (core [0,12)) says [11.0, 13.5): end in its guard.
    # w1 (core [12,24)) says [10.5, 13.0): start in its guard. tIoU inside the shared
    # span [10,14) is 2/3.
    outs = [[_seg(0, 11.0, 13.5)], [_seg(10, 10.5, 13.0)], [], []]
    (ev,) = stitch_detailed(ws, outs, T40)
    assert (ev.start_us, ev.end_us) == (11 * S, 13 * S)
    assert (ev.start_from, ev.end_from, ev.windows) == (0, 1, (0, 1))


def test_touching_segments_do_not_merge() -> None:
    ws = plan_windows(T40)
    outs = [[_seg(0, 8.0, 12.0, rf=False)], [_seg(10, 12.0, 18.0)], [], []]
    assert stitch(ws, outs, T40) == [Event(8 * S, 12 * S), Event(12 * S, 18 * S)]


def test_end_on_core_right_edge_belongs_to_that_core() -> None:
    ws = plan_windows(T40)
    assert ws[0].core_holds_end(12 * S) and not ws[1].core_holds_end(12 * S)
    assert ws[1].core_holds_start(12 * S) and not ws[0].core_holds_start(12 * S)
    # w0 says [9, 12.0) (end exactly on its core's right edge); w1 says [10, 11.8), whose
    # end lies in its left guard. The end is taken from w0's core: 12.0.
    outs = [[_seg(0, 9.0, 12.0)], [_seg(10, 10.0, 11.8)], [], []]
    (ev,) = stitch_detailed(ws, outs, T40)
    assert (ev.start_us, ev.end_us, ev.end_from) == (9 * S, 12 * S, 0)


def test_tie_goes_to_member_farthest_from_core_edges() -> None:
    ws = plan_windows(T40, shift=True)  # w1 [4,20) core [6,18); w2 [16,32) core [18,30)
    # Both members hold a start in their own core: w1 17.0 (1.0 s from its core edge) vs
    # w2 18.2 (0.2 s): the deeper one, w1, gives the start.
    outs = [[], [_seg(4, 17.0, 20.0)], [_seg(16, 18.2, 20.0)], []]
    (ev,) = stitch_detailed(ws, outs, T40)
    assert (ev.start_us, ev.start_from, ev.end_us, ev.end_from) == (17 * S, 1, 20 * S, 2)
    outs = [[], [_seg(4, 17.8, 20.0)], [_seg(16, 18.6, 20.0)], []]
    (ev,) = stitch_detailed(ws, outs, T40)
    assert (ev.start_us, ev.start_from) == (18_600_000, 2)


def test_fallback_to_outermost_when_no_member_qualifies() -> None:
    ws = plan_windows(T40)
    # Only w1 sees it, flagged left-open from its window start (10 s): no member can give
    # the start, so the outermost estimate (10 s) is used.
    outs = [[], [_seg(10, 10.0, 15.0, lf=True)], [], []]
    (ev,) = stitch_detailed(ws, outs, T40)
    assert (ev.start_us, ev.end_us, ev.start_from, ev.end_from) == (10 * S, 15 * S, None, 1)


def test_bimanual_overlaps_stay_separate() -> None:
    ws = plan_windows(T40)
    # Two overlapping actions in w0 and their continuations in w1: two events, not one.
    outs = [
        [_seg(0, 9.0, 14.0, rf=True), _seg(0, 10.0, 14.0, rf=True)],
        [_seg(10, 10.0, 15.0, lf=True), _seg(10, 10.0, 17.0, lf=True)],
        [],
        [],
    ]
    ev = stitch_detailed(ws, outs, T40)
    assert len(ev) == 2
    assert all(len(e.windows) == 2 for e in ev)
    assert [e.start_us for e in ev] == [9 * S, 10 * S]
    assert sorted(e.end_us for e in ev) == [15 * S, 17 * S]


def test_projection_clips_to_episode_end() -> None:
    T = 25_010_000
    ws = plan_windows(T)
    last = ws[-1]
    outs = [[] for _ in ws]
    outs[-1] = [LocalSegment(20, last.n_ticks)]
    assert stitch(ws, outs, T) == [Event(23 * S, T)]


def test_invalid_inputs_are_errors() -> None:
    ws = plan_windows(T40)
    with pytest.raises(ValueError, match="4 windows but 3 outputs"):
        stitch(ws, [[], [], []], T40)
    with pytest.raises(ValueError, match="invalid segment"):
        stitch(ws, [[LocalSegment(5, 5)], [], [], []], T40)


def test_links_are_ordered_by_tiou_not_by_flags() -> None:
    """Two touching actions at 12.05 s, next to the w0/w1 core edge (12 s); each window is
    off by 0.1 s there. w0's flagged second segment overlaps w1's flagged first one by a
    0.2 s sliver; ordered first, that link made a [11.95, 12.15) event and kept both
    good pairs (tIoU ~0.9) apart. Flags admit a link; the tIoU orders it."""
    ws = plan_windows(T40)  # w0 [0,14) core [0,12); w1 [10,26) core [12,24)
    outs = [
        [_seg(0, 8.0, 11.95), _seg(0, 11.95, 14.0, rf=True)],
        [_seg(10, 10.0, 12.15, lf=True), _seg(10, 12.2, 20.0)],
        [],
        [],
    ]
    ev = stitch_detailed(ws, outs, T40)
    assert [(e.start_us, e.end_us, e.windows) for e in ev] == [
        (8 * S, 12_150_000, (0, 1)),
        (12_200_000, 20 * S, (0, 1)),
    ]
    assert all(e.end_us - e.start_us >= 4 * S for e in ev)  # no 0.2 s sliver


def test_events_with_the_same_interval_are_one_event() -> None:
    """Segments of one window that differ only in flags are never linked (one window's
    two segments are two actions) and stitch to the same interval: one event, not two
    rows the events table refuses."""
    ws = plan_windows(T40)
    outs = [[_seg(0, 0.0, 5.0), _seg(0, 0.0, 5.0, lf=True)], [], [], []]
    (ev,) = stitch_detailed(ws, outs, T40)
    assert (ev.start_us, ev.end_us, ev.windows) == (0, 5 * S, (0,))
    assert (ev.start_from, ev.end_from) == (0, 0)
    # Two groups, {w0 [9, 13), w1 [10, 13)} and {w0 [9, 13) left-open} (w1's segment is
    # taken; its boundaries are fallbacks), select the same interval: one event, windows
    # joined, the boundary sources that are known.
    outs = [[_seg(0, 9.0, 13.0), _seg(0, 9.0, 13.0, lf=True)], [_seg(10, 10.0, 13.0)], [], []]
    (ev,) = stitch_detailed(ws, outs, T40)
    assert (ev.start_us, ev.end_us, ev.windows) == (9 * S, 13 * S, (0, 1))
    assert (ev.start_from, ev.end_from) == (0, 1)
    assert stitch(ws, outs, T40) == [Event(9 * S, 13 * S)]


def test_window_targets_give_one_segment_per_ticks() -> None:
    """Overlapping (bimanual) events that clip to the same ticks give one target segment,
    its flags OR'd, so the rendered SFT target parses back to the reference list."""
    from flora.segment import Window
    from flora.segment.targets import window_targets

    w = Window(0, 16 * S, 0, 12 * S)
    gt = [Event(2 * S, 16 * S), Event(2 * S, 20 * S), Event(3 * S, 4 * S)]
    segs = window_targets(gt, w)
    assert segs == [LocalSegment(40, 320, False, True), LocalSegment(60, 80)]
    assert parse_segments(render_segments(segs), w.n_ticks) == segs


# --------------------------------------------------------------------- property (acceptance)


@st.composite
def episode_with_events(draw) -> tuple[int, list[Event]]:
    """Random duration (any µs) and non-overlapping events on the 50 ms grid.

    Gaps may be zero (touching events); some events are long enough to span several
    windows; the last event may end exactly at a non-aligned ``T``.
    """
    T = draw(
        st.one_of(
            st.integers(1, 200 * S),
            st.integers(1, 4000).map(lambda k: k * TICK_US),
            st.integers(1, 15).map(lambda k: k * 6 * S),  # exactly on (shifted) core edges
        )
    )
    last_tick = T // TICK_US
    events: list[Event] = []
    cursor = 0
    for _ in range(draw(st.integers(0, 40))):
        gap = draw(st.sampled_from([0, 0, 1, 3, 10, 40, 120, 240, 260]))
        length = draw(
            st.one_of(st.integers(1, 80), st.integers(80, 700), st.sampled_from([120, 240, 480]))
        )
        a, b = cursor + gap, min(cursor + gap + length, last_tick)  # last one may be cut
        if b <= a:
            break
        events.append(Event(a * TICK_US, b * TICK_US))
        cursor = b
    start_tick = cursor + draw(st.sampled_from([0, 2]))
    if draw(st.booleans()) and start_tick * TICK_US < T:
        events.append(Event(start_tick * TICK_US, T))
    return T, events


@settings(max_examples=250, derandomize=True, deadline=None)
@given(case=episode_with_events(), profile=st.sampled_from(["standard", "long_horizon"]))
def test_ground_truth_outputs_stitch_back_exactly(
    case: tuple[int, list[Event]], profile: str
) -> None:
    T, gt = case
    primary = plan_windows(T, profile)
    shifted = plan_windows(T, profile, shift=True)
    p_out = pass_targets(gt, primary)
    s_out = pass_targets(gt, shifted)
    # Through the real text path: render each window's target, parse it back.
    for w, segs in zip(primary, p_out, strict=True):
        parsed = parse_segments(render_segments(segs), w.n_ticks)
        assert not isinstance(parsed, Rejection), parsed
        assert parsed == segs
    assert stitch(primary, p_out, T) == gt
    assert stitch(shifted, s_out, T) == gt
    assert refine(stitch(primary, p_out, T), shifted, s_out, T) == gt


def test_ground_truth_round_trip_one_hour() -> None:
    T = 3600 * S + 12_345
    gt, t = [], 0
    k = 0
    while True:
        a = t + (k % 7) * TICK_US
        b = a + (20 + (k * 37) % 900) * TICK_US  # 1 s .. 46 s actions
        if b > T:
            break
        gt.append(Event(a, b))
        t, k = b, k + 1
    for profile in ("standard", "long_horizon"):
        primary = plan_windows(T, profile)
        shifted = plan_windows(T, profile, shift=True)
        p_out, s_out = pass_targets(gt, primary), pass_targets(gt, shifted)
        assert stitch(primary, p_out, T) == gt
        assert refine(stitch(primary, p_out, T), shifted, s_out, T) == gt
