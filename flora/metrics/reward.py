"""Rewarder metrics: outcome MAE, dense per-group accuracy and failure recall, rubric L1."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def _pair(pred: Sequence[float], ref: Sequence[float], what: str) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(list(pred), dtype=np.float64)
    r = np.asarray(list(ref), dtype=np.float64)
    if p.shape != r.shape:
        raise ValueError(f"{what}: {p.size} predictions but {r.size} references")
    return p, r


def outcome_mae(pred: Sequence[float], ref: Sequence[float]) -> float:
    """Mean absolute error between predicted and reference scores on the 1–5 scale.

    ``pred`` may be continuous (E[s]) or integer (argmax). NaN when there are no items.
    """
    p, r = _pair(pred, ref, "outcome_mae")
    return float(np.mean(np.abs(p - r))) if p.size else math.nan


def dense_group_accuracy(pred: Sequence[int], ref: Sequence[int]) -> float:
    """Fraction of 0.5 s groups whose stitched label equals the reference label."""
    p, r = _pair(pred, ref, "dense_group_accuracy")
    return float(np.mean(p == r)) if p.size else math.nan


def failure_recall(pred: Sequence[int], ref: Sequence[int], level: int = 1) -> float:
    """Recall of reference groups labelled ``level`` (1 = failure) by the prediction.

    NaN when the reference has no such group (recall undefined, not perfect).
    """
    p, r = _pair(pred, ref, "failure_recall")
    pos = r == level
    return float(np.mean(p[pos] == level)) if pos.any() else math.nan


def rubric_l1(pred: Mapping[str, float], ref: Mapping[str, float]) -> float:
    """Per-episode L1 agreement ``Σ_j |ŷ_j - y_j|`` over the reference rubric's steps.

    A step missing from ``pred`` is an error (a failed parse is recorded, not scored).
    """
    missing = sorted(set(ref) - set(pred))
    if missing:
        raise ValueError(f"rubric_l1: prediction lacks steps {missing}")
    return math.fsum(abs(float(pred[s]) - float(ref[s])) for s in ref)
