"""Rewarder metrics (flora.metrics.reward), exported from flora.metrics."""

from __future__ import annotations

import math

import pytest

from flora.metrics import dense_group_accuracy, failure_recall, outcome_mae, rubric_l1


def test_outcome_mae():
    assert outcome_mae([1, 5, 3.5], [2, 5, 3]) == pytest.approx((1 + 0 + 0.5) / 3)
    assert math.isnan(outcome_mae([], []))
    with pytest.raises(ValueError, match="2 predictions but 1"):
        outcome_mae([1, 2], [1])


def test_dense_accuracy_and_failure_recall():
    ref = [3, 3, 1, 1, 2, 3]
    pred = [3, 2, 1, 3, 2, 3]
    assert dense_group_accuracy(pred, ref) == pytest.approx(4 / 6)
    assert failure_recall(pred, ref) == pytest.approx(0.5)
    assert failure_recall(pred, ref, level=2) == pytest.approx(1.0)
    assert math.isnan(failure_recall([1, 3], [3, 3]))  # no reference failure: undefined


def test_failure_recall_does_not_count_suboptimal_as_a_hit():
    # a reference failure predicted as "suboptimal" (2) is missed, not found
    assert failure_recall([2, 2, 1], [1, 1, 1]) == pytest.approx(1 / 3)
    assert failure_recall([2, 2], [1, 1]) == 0.0
    assert failure_recall([1, 1], [2, 2], level=2) == 0.0


def test_rubric_l1():
    ref = {"a": 0.5, "b": 0.25, "c": 0.25}
    assert rubric_l1({"a": 0.5, "b": 0.0, "c": 0.25}, ref) == pytest.approx(0.25)
    assert rubric_l1(ref, ref) == 0.0
    with pytest.raises(ValueError, match="lacks steps"):
        rubric_l1({"a": 0.5}, ref)
