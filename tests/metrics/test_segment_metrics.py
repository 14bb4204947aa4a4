"""Segmentation metrics: hand-computed tIoU, maximum matching, F1/P, B and r_seg."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flora.contract import Event, Interval
from flora.metrics import (
    boundary_score,
    mean_best_tiou,
    r_seg,
    segment_f1,
    segment_precision,
    tiou,
)
from flora.metrics.segment import match, segment_recall
from flora.segment import LocalSegment as L


def E(a: int, b: int) -> Event:
    return Event(a, b)


def test_tiou_hand_values() -> None:
    assert tiou(E(0, 10), E(5, 15)) == pytest.approx(5 / 15)
    assert tiou(E(0, 10), E(0, 10)) == 1.0
    assert tiou(E(0, 10), E(10, 20)) == 0.0  # touching half-open intervals
    assert tiou(E(0, 10), E(2, 4)) == pytest.approx(0.2)
    assert tiou(Interval(0, 4), L(2, 6)) == pytest.approx(2 / 6)
    with pytest.raises(TypeError):
        tiou((0, 1), E(0, 1))


def test_maximum_matching_beats_greedy() -> None:
    # p1-r1 is the single best pair (0.9); greedy would take it and then match nothing
    # else. The maximum matching pairs p1-r2 (0.667) and p2-r1 (0.8).
    r1, r2 = E(2, 11), E(4, 14)
    p1, p2 = E(2, 12), E(1, 10)
    assert tiou(p1, r1) == pytest.approx(0.9)
    assert tiou(p1, r2) == pytest.approx(8 / 12)
    assert tiou(p2, r1) == pytest.approx(0.8)
    assert tiou(p2, r2) < 0.5
    m = match([p1, p2], [r1, r2], 0.5)
    assert sorted(m.pairs) == [(0, 1), (1, 0)]
    assert segment_f1([p1, p2], [r1, r2], 0.5) == 1.0
    assert segment_precision([p1, p2], [r1, r2], 0.5) == 1.0
    # At 0.85 only p1-r1 qualifies.
    assert segment_f1([p1, p2], [r1, r2], 0.85) == pytest.approx(0.5)


def test_precision_recall_f1_hand_computed() -> None:
    ref = [E(0, 10), E(20, 30)]
    pred = [E(0, 9), E(12, 18), E(40, 50)]  # one hit (0.9), two misses
    assert segment_precision(pred, ref, 0.5) == pytest.approx(1 / 3)
    assert segment_recall(pred, ref, 0.5) == pytest.approx(1 / 2)
    assert segment_f1(pred, ref, 0.5) == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert segment_f1(pred, ref, 0.5) == pytest.approx(0.4)
    assert segment_f1(pred, ref, 0.95) == 0.0


def test_one_to_one_no_double_counting() -> None:
    ref = [E(0, 10)]
    pred = [E(0, 10), E(0, 10), E(1, 10)]
    assert segment_precision(pred, ref, 0.5) == pytest.approx(1 / 3)
    assert segment_recall(pred, ref, 0.5) == 1.0


def test_threshold_is_inclusive() -> None:
    assert tiou(E(0, 10), E(0, 20)) == 0.5
    assert segment_f1([E(0, 10)], [E(0, 20)], 0.5) == 1.0
    with pytest.raises(ValueError):
        segment_f1([E(0, 10)], [E(0, 20)], 0.0)


def test_empty_cases() -> None:
    assert segment_f1([], [], 0.5) == 1.0
    assert segment_precision([], [], 0.5) == 1.0
    assert segment_f1([], [E(0, 1)], 0.5) == 0.0
    assert segment_precision([], [E(0, 1)], 0.5) == 0.0
    assert segment_f1([E(0, 1)], [], 0.5) == 0.0
    assert segment_precision([E(0, 1)], [], 0.5) == 0.0
    assert mean_best_tiou([], []) == 0.0
    assert mean_best_tiou([], [E(0, 1)]) == 0.0


def test_mean_best_tiou() -> None:
    ref = [E(0, 10), E(20, 30)]
    pred = [E(0, 5), E(20, 30)]
    assert mean_best_tiou(pred, ref) == pytest.approx((0.5 + 1.0) / 2)


def test_boundary_score_hand_computed() -> None:
    pred = [L(2, 22, False, False)]
    ref = [L(0, 20, False, True)]
    # tIoU 18/22 >= 0.5; endpoints off by 2 ticks each: 1 - 2/10 = 0.8 -> E = 0.8;
    # flags: left equal, right differs -> 0.5. Pair score 0.5*0.8 + 0.5*0.5 = 0.65.
    assert boundary_score(pred, ref) == pytest.approx(0.65)
    # Endpoint error beyond tolerance scores 0 for that endpoint.
    assert boundary_score([L(0, 40)], [L(0, 25)]) == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)
    assert boundary_score(ref, ref) == 1.0
    assert boundary_score([], []) == 1.0
    assert boundary_score([L(0, 5)], [L(50, 60)]) == 0.0  # no matched pair
    assert boundary_score([], [L(0, 5)]) == 0.0


def test_boundary_score_averages_matched_pairs_only() -> None:
    ref = [L(0, 20), L(40, 60, False, True)]
    pred = [L(0, 20), L(40, 60), L(100, 120)]  # perfect, flag miss, unmatched extra
    assert boundary_score(pred, ref) == pytest.approx((1.0 + (0.5 + 0.5 * 0.5)) / 2)


def test_r_seg_hand_computed() -> None:
    pred = [L(2, 22, False, False)]
    ref = [L(0, 20, False, True)]
    # F1@.5 = F1@.75 = P@.5 = 1 (tIoU 0.818), B = 0.65.
    assert r_seg(pred, ref) == pytest.approx(0.45 + 0.15 + 0.25 + 0.15 * 0.65)
    # tIoU 0.6: passes 0.5 not 0.75; endpoint errors 0 and 8 ticks: E = (1 + 0.2)/2.
    pred = [L(0, 12)]
    ref = [L(0, 20)]
    assert tiou(pred[0], ref[0]) == pytest.approx(0.6)
    b = 0.5 * 0.6 + 0.5 * 1.0
    assert r_seg(pred, ref) == pytest.approx(0.45 + 0.0 + 0.25 + 0.15 * b)
    # Two predictions for one reference: P = 1/2, F1 = 2/3.
    pred = [L(0, 20), L(30, 40)]
    assert r_seg(pred, ref) == pytest.approx(0.45 * 2 / 3 + 0.15 * 2 / 3 + 0.25 * 0.5 + 0.15)


def test_r_seg_bounds_and_perfect() -> None:
    ref = [L(0, 40, True, False), L(50, 90), L(100, 320, False, True)]
    assert r_seg(ref, ref) == pytest.approx(1.0)
    assert r_seg([], []) == 1.0
    assert r_seg([], ref) == 0.0
    assert r_seg([L(200, 210)], [L(0, 10)]) == 0.0


seg_lists = st.lists(
    st.tuples(st.integers(0, 300), st.integers(1, 100), st.booleans(), st.booleans()).map(
        lambda t: L(t[0], t[0] + t[1], t[2], t[3])
    ),
    max_size=8,
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(seg_lists, seg_lists)
def test_metric_ranges_and_symmetry(pred, ref) -> None:
    r = r_seg(pred, ref)
    assert 0.0 <= r <= 1.0 + 1e-12
    for th in (0.5, 0.75):
        f = segment_f1(pred, ref, th)
        assert 0.0 <= f <= 1.0
        assert f == pytest.approx(segment_f1(ref, pred, th))  # F1 is symmetric
        assert segment_precision(pred, ref, th) == pytest.approx(segment_recall(ref, pred, th))
    # Higher threshold never matches more pairs.
    assert match(pred, ref, 0.75).matched <= match(pred, ref, 0.5).matched
    assert 0.0 <= boundary_score(pred, ref) <= 1.0
