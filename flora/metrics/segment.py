"""Temporal segmentation metrics (DESIGN §3.5, §3.7; seed §6 eq. 16).

* ``tiou(a, b)``: temporal IoU of two half-open intervals.
* ``segment_precision`` / ``segment_recall`` / ``segment_f1`` at a tIoU threshold θ, with
  the one-to-one matching that maximises the number of pairs with tIoU >= θ (maximum
  bipartite matching): ``P = matched/|pred|``, ``R = matched/|ref|``,
  ``F1 = 2PR/(P+R)``. When exactly one side is empty the value is 0; when *both* are
  empty there is nothing to find and nothing was claimed, so P = R = F1 = 1.
* ``boundary_score`` B and ``r_seg`` on the ``LocalSegment`` lists of one window
  (ticks and continuation flags), ``r_seg = 0.45 F1@0.5 + 0.15 F1@0.75 + 0.25 P@0.5 + 0.15 B``.

B is defined exactly in ``docs/segmentation.md``: over the pairs M of the maximum matching
at tIoU >= 0.5 (ties between maximum matchings broken by the largest total tIoU),
``B = mean_{(p,g) in M} [ ½·E(p,g) + ½·Φ(p,g) ]`` with endpoint score
``E = ½(max(0, 1 − |u_p − u_g|/τ) + max(0, 1 − |v_p − v_g|/τ))`` (τ = 10 ticks = 0.5 s) and
flag accuracy ``Φ = ½(1[l_p = l_g] + 1[r_p = r_g])``; B = 0 when M is empty (unless both
lists are empty: B = 1).

Inputs are anything with ``start_us``/``end_us`` (Event, Interval, StitchedEvent) or
``u``/``v`` (LocalSegment, ticks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

BOUNDARY_TOLERANCE_TICKS = 10  # τ of the endpoint score: 0.5 s at 20 Hz
R_SEG_WEIGHTS = {"f1_50": 0.45, "f1_75": 0.15, "p_50": 0.25, "b": 0.15}


def _bounds(x: Any) -> tuple[int, int]:
    if hasattr(x, "start_us"):
        return int(x.start_us), int(x.end_us)
    if hasattr(x, "u"):
        return int(x.u), int(x.v)
    raise TypeError(f"expected an interval with start_us/end_us or u/v, got {type(x).__name__}")


def tiou(a: Any, b: Any) -> float:
    """Temporal IoU ``|a ∩ b| / |a ∪ b|`` of two half-open intervals (0 if the union is empty)."""
    a0, a1 = _bounds(a)
    b0, b1 = _bounds(b)
    inter = max(0, min(a1, b1) - max(a0, b0))
    union = max(0, a1 - a0) + max(0, b1 - b0) - inter
    return inter / union if union > 0 else 0.0


def tiou_matrix(pred: Sequence[Any], ref: Sequence[Any]) -> np.ndarray:
    """``|pred| x |ref|`` matrix of tIoU values (vectorised)."""
    if not pred or not ref:
        return np.zeros((len(pred), len(ref)))
    p = np.array([_bounds(x) for x in pred], dtype=np.float64)
    r = np.array([_bounds(x) for x in ref], dtype=np.float64)
    inter = np.clip(
        np.minimum(p[:, None, 1], r[None, :, 1]) - np.maximum(p[:, None, 0], r[None, :, 0]),
        0,
        None,
    )
    lp = np.clip(p[:, 1] - p[:, 0], 0, None)
    lr = np.clip(r[:, 1] - r[:, 0], 0, None)
    union = lp[:, None] + lr[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


@dataclass(frozen=True)
class Matching:
    """One-to-one matching at a threshold: ``pairs`` of (pred index, ref index)."""

    pairs: list[tuple[int, int]]
    n_pred: int
    n_ref: int
    tious: list[float]

    @property
    def matched(self) -> int:
        return len(self.pairs)

    @property
    def precision(self) -> float:
        if self.n_pred == 0:
            return 1.0 if self.n_ref == 0 else 0.0
        return self.matched / self.n_pred

    @property
    def recall(self) -> float:
        if self.n_ref == 0:
            return 1.0 if self.n_pred == 0 else 0.0
        return self.matched / self.n_ref

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0


def match(pred: Sequence[Any], ref: Sequence[Any], threshold: float) -> Matching:
    """Maximum one-to-one matching of pairs with tIoU >= ``threshold``.

    Maximises the number of pairs; among maximum matchings, the one with the largest total
    tIoU (so B is well defined). Solved as an assignment problem with weight
    ``(n+1)·1[tIoU >= θ] + tIoU·1[tIoU >= θ]`` (the count term dominates the tIoU sum).
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"tIoU threshold must be in (0, 1], got {threshold}")
    m = tiou_matrix(pred, ref)
    if m.size == 0:
        return Matching([], len(pred), len(ref), [])
    ok = m >= threshold - 1e-12
    if not ok.any():
        return Matching([], len(pred), len(ref), [])
    big = float(min(m.shape) + 1)
    weight = np.where(ok, big + m, 0.0)
    rows, cols = linear_sum_assignment(weight, maximize=True)
    pairs = [(int(i), int(j)) for i, j in zip(rows, cols, strict=True) if ok[i, j]]
    return Matching(pairs, len(pred), len(ref), [float(m[i, j]) for i, j in pairs])


def segment_precision(pred: Sequence[Any], ref: Sequence[Any], threshold: float = 0.5) -> float:
    """Precision at tIoU ``threshold``: matched / |pred| (1.0 when both are empty)."""
    return match(pred, ref, threshold).precision


def segment_recall(pred: Sequence[Any], ref: Sequence[Any], threshold: float = 0.5) -> float:
    """Recall at tIoU ``threshold``: matched / |ref| (1.0 when both are empty)."""
    return match(pred, ref, threshold).recall


def segment_f1(pred: Sequence[Any], ref: Sequence[Any], threshold: float = 0.5) -> float:
    """F1 at tIoU ``threshold`` with maximum one-to-one matching (1.0 when both empty)."""
    return match(pred, ref, threshold).f1


def mean_best_tiou(pred: Sequence[Any], ref: Sequence[Any]) -> float:
    """Mean over reference intervals of the best tIoU with any prediction (0 if no ref)."""
    if not ref:
        return 0.0
    m = tiou_matrix(pred, ref)
    if m.size == 0:
        return 0.0
    return float(m.max(axis=0).mean())


def boundary_score(
    pred: Sequence[Any],
    ref: Sequence[Any],
    tolerance_ticks: float = BOUNDARY_TOLERANCE_TICKS,
) -> float:
    """Boundary term B over pairs matched at tIoU >= 0.5 (see module doc / docs).

    Works on LocalSegment lists (ticks + flags). Items without flags (events) count flag
    accuracy as 1 only if neither side carries flags, so B then measures endpoints only.
    """
    if tolerance_ticks <= 0:
        raise ValueError("tolerance_ticks must be > 0")
    if not pred and not ref:
        return 1.0
    mt = match(pred, ref, 0.5)
    if not mt.pairs:
        return 0.0
    total = 0.0
    for i, j in mt.pairs:
        p0, p1 = _bounds(pred[i])
        g0, g1 = _bounds(ref[j])
        endpoint = 0.5 * (
            max(0.0, 1.0 - abs(p0 - g0) / tolerance_ticks)
            + max(0.0, 1.0 - abs(p1 - g1) / tolerance_ticks)
        )
        lp, rp = getattr(pred[i], "left_open", None), getattr(pred[i], "right_open", None)
        lg, rg = getattr(ref[j], "left_open", None), getattr(ref[j], "right_open", None)
        flags = 0.5 * (float(bool(lp) == bool(lg)) + float(bool(rp) == bool(rg)))
        total += 0.5 * endpoint + 0.5 * flags
    return total / len(mt.pairs)


def r_seg(pred: Sequence[Any], ref: Sequence[Any]) -> float:
    """Segmenter GRPO reward (eq. 16) on one window's LocalSegment lists.

    ``0.45·F1@0.5 + 0.15·F1@0.75 + 0.25·P@0.5 + 0.15·B``; in ``[0, 1]``, 1 for a perfect
    answer (including a correct empty answer).
    """
    m50 = match(pred, ref, 0.5)
    m75 = match(pred, ref, 0.75)
    w = R_SEG_WEIGHTS
    return (
        w["f1_50"] * m50.f1
        + w["f1_75"] * m75.f1
        + w["p_50"] * m50.precision
        + w["b"] * boundary_score(pred, ref)
    )
