"""Shifted-pass refinement of boundaries near primary core edges."""

from __future__ import annotations

from flora.contract import TICK_US, US_PER_S, Event
from flora.segment import LocalSegment, plan_windows, refine, stitch

S = US_PER_S
T = 40 * S


def _seg(ws_s: float, a_s: float, b_s: float, lf: bool = False, rf: bool = False) -> LocalSegment:
    return LocalSegment(
        round((a_s - ws_s) * S / TICK_US), round((b_s - ws_s) * S / TICK_US), lf, rf
    )


def _shifted_outputs(*segs: tuple[int, LocalSegment]) -> list[list[LocalSegment]]:
    outs: list[list[LocalSegment]] = [[] for _ in plan_windows(T, shift=True)]
    for k, seg in segs:
        outs[k].append(seg)
    return outs


def test_start_near_core_edge_is_replaced_by_shifted_estimate() -> None:
    primary = plan_windows(T)  # cores [0,12) [12,24) [24,36) [36,40)
    shifted = plan_windows(T, shift=True)  # cores [0,6) [6,18) [18,30) [30,40)
    # Truth [11.5, 15). w0 misjudges the start as 11.0 (0.5 s inside its core edge).
    p_out = [[_seg(0, 11.0, 14.0, rf=True)], [_seg(10, 11.6, 15.0)], [], []]
    prim = stitch(primary, p_out, T)
    assert prim == [Event(11 * S, 15 * S)]
    s_out = _shifted_outputs((1, _seg(4, 11.5, 15.0)))
    assert refine(prim, shifted, s_out, T) == [Event(11_500_000, 15 * S)]
    # Same result when the primary windows are passed explicitly.
    assert refine(prim, shifted, s_out, T, primary_windows=primary) == [Event(11_500_000, 15 * S)]
    # With a guard smaller than the 0.5 s distance, the boundary counts as safe.
    assert refine(prim, shifted, s_out, T, guard_us=400_000) == prim


def test_end_near_core_edge_is_replaced() -> None:
    shifted = plan_windows(T, shift=True)
    prim = [Event(20 * S, 24_500_000)]
    s_out = _shifted_outputs((2, _seg(16, 20.0, 25.0)))
    assert refine(prim, shifted, s_out, T) == [Event(20 * S, 25 * S)]


def test_boundaries_far_from_core_edges_are_kept() -> None:
    shifted = plan_windows(T, shift=True)
    prim = [Event(3 * S, 8 * S)]
    s_out = _shifted_outputs((1, _seg(4, 4.0, 8.5)), (0, _seg(0, 3.4, 8.0, rf=True)))
    assert refine(prim, shifted, s_out, T) == prim


def test_no_matching_shifted_event_keeps_primary() -> None:
    shifted = plan_windows(T, shift=True)
    prim = [Event(11 * S, 13 * S)]
    s_out = _shifted_outputs((1, _seg(4, 14.0, 17.0)))
    assert refine(prim, shifted, s_out, T) == prim


def test_fallback_shifted_boundary_is_not_used() -> None:
    shifted = plan_windows(T, shift=True)
    # Shifted w2 [16,32) only sees the action as continuing from its left edge: its start
    # is an outermost fallback, not an estimate, so the primary start 22.5 s stays.
    prim = [Event(22_500_000, 29 * S)]
    s_out = _shifted_outputs((2, _seg(16, 16.0, 29.0, lf=True)))
    assert refine(prim, shifted, s_out, T) == prim


def test_episode_edges_are_not_refined_and_captions_kept() -> None:
    shifted = plan_windows(T, shift=True)
    prim = [Event(0, 5 * S, "pick"), Event(38 * S, T, "place")]
    s_out = _shifted_outputs((0, _seg(0, 0.5, 5.0)), (3, _seg(28, 38.5, 40.0)))
    assert refine(prim, shifted, s_out, T) == prim


def test_fragments_adopting_same_boundaries_collapse() -> None:
    shifted = plan_windows(T, shift=True)
    # A primary pass that split one action at the core edge 12 s: both halves match the
    # shifted event (tIoU exactly 0.5), both adopt its boundaries, and collapse into one.
    prim = [Event(10_500_000, 12 * S), Event(12 * S, 13_500_000)]
    s_out = _shifted_outputs((1, _seg(4, 10.5, 13.5)))
    assert refine(prim, shifted, s_out, T) == [Event(10_500_000, 13_500_000)]


def test_both_boundaries_near_one_edge_are_replaced() -> None:
    shifted = plan_windows(T, shift=True)
    prim = [Event(11 * S, 12_500_000)]
    s_out = _shifted_outputs((1, _seg(4, 11.2, 12.6)))
    assert refine(prim, shifted, s_out, T) == [Event(11_200_000, 12_600_000)]
