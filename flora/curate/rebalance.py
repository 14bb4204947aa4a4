"""Rebalancing: mixture weights over tasks, action verbs (or caption clusters) and robots.

Within each split the weight is assigned top-down over the strata (default task → verb →
robot): at each level the values present under the parent get shares

    p_k ∝ n_k^(1/T)          (n_k: rows with value k; T: temperature)

then no value may exceed ``max_share`` of its parent's mass (water-filling: capped values
are fixed at the cap and the rest renormalised until none exceeds it). When the cap is
infeasible (K values with ``K * max_share < 1``) the level falls back to uniform shares
and says so in the notes. A leaf's mass is split uniformly over its rows. T = 1 keeps the
natural frequencies, larger T flattens them, ``inf`` is uniform. Weights sum to 1 per split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from flora.curate.rules import CurationRules, RebalanceRule

#: The curated mixture table (DESIGN §3.8) plus the common columns and provenance.
MIXTURE_COLUMNS = ("episode_id", "start_us", "end_us", "caption", "weight", "split", "reason",
                   "source_run_ids")  # fmt: skip
MIXTURE_DTYPES: dict[str, str] = {
    "episode_id": "object", "start_us": "int64", "end_us": "int64", "caption": "object",
    "weight": "float64", "split": "object", "reason": "object", "source_run_ids": "object",
    "dataset": "object", "model": "object", "model_version": "object", "run_id": "object",
    "event_index": "int64", "duration_us": "int64", "task": "object", "verb": "object",
    "robot": "object", "source_tables": "object",
}  # fmt: skip


class EmptyMixtureError(ValueError):
    """Every item was filtered out: an empty mixture is an error, never an empty file."""


def _softmax(logw: np.ndarray) -> np.ndarray:
    """``exp(logw)`` normalised to sum 1, the max subtracted first (no overflow)."""
    w = np.exp(logw - logw.max())
    return w / w.sum()


def temperature_shares(
    counts: Mapping[str, int], temperature: float, max_share: float = 1.0
) -> tuple[dict[str, float], str | None]:
    """Shares ∝ count^(1/T), capped at ``max_share`` by water-filling; ``(shares, note)``."""
    keys = [k for k, n in counts.items() if n > 0]
    if not keys:
        return {}, None
    # Weights in log space: count ** (1/T) overflows to inf for a small T (NaN shares).
    if math.isinf(temperature):
        logw = np.zeros(len(keys))
    else:
        logw = np.log(np.array([float(counts[k]) for k in keys])) / temperature
    p = _softmax(logw)
    note = None
    cap = max_share
    if cap * len(keys) < 1.0 - 1e-12:
        # One value always holds its parent's whole mass: not worth a note.
        if len(keys) > 1:
            note = f"cap {max_share} infeasible for {len(keys)} values: uniform"
        return {k: 1.0 / len(keys) for k in keys}, note
    fixed = np.zeros(len(keys), bool)
    for _ in range(len(keys)):
        over = (p > cap + 1e-12) & ~fixed
        if not over.any():
            break
        fixed |= over
        free = ~fixed
        rest = 1.0 - cap * fixed.sum()
        p = np.where(fixed, cap, p)
        if free.any():
            p[free] = _softmax(logw[free]) * rest
    return {k: float(v) for k, v in zip(keys, p, strict=True)}, note


def _assign(
    df: pd.DataFrame,
    strata: Sequence[str],
    rule: RebalanceRule,
    mass: float,
    notes: list[str],
    path: str,
) -> pd.Series:
    if not strata:
        return pd.Series(mass / len(df), index=df.index)
    col = strata[0]
    counts = df[col].astype(str).value_counts().to_dict()
    shares, note = temperature_shares(counts, rule.temperature, rule.max_share)
    if note:
        notes.append(f"{path or 'split'} / {col}: {note}")
    parts = [
        _assign(g, strata[1:], rule, mass * shares[str(k)], notes, f"{path}{col}={k} ")
        for k, g in df.groupby(df[col].astype(str), sort=True)
    ]
    return pd.concat(parts)


def mixture_weights(
    df: pd.DataFrame, rule: RebalanceRule, strata_columns: Mapping[str, str] | None = None
) -> tuple[pd.Series, list[str]]:
    """Weights (sum 1) for the rows of one split; ``strata_columns`` maps stratum -> column."""
    if len(df) == 0:
        return pd.Series(dtype="float64"), []
    cols = [dict(strata_columns or {}).get(s, s) for s in rule.strata]
    notes: list[str] = []
    w = _assign(df, cols, rule, 1.0, notes, "")
    return w.reindex(df.index), notes


def build_mixture(
    decisions: pd.DataFrame, rules: CurationRules, *, clusters: pd.Series | None = None
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The curated mixture (one row per item and split it belongs to) and a summary.

    ``clusters``: caption-cluster labels aligned with ``decisions`` (``verb_source:
    cluster``). Raises :class:`EmptyMixtureError` when no split has a row.
    """
    d = decisions.copy()
    if clusters is not None:
        d["cluster"] = clusters.reindex(d.index).fillna("unclustered").astype(str)
    verb_col = "cluster" if rules.rebalance.verb_source == "cluster" and "cluster" in d else "verb"
    parts = []
    summary: dict[str, Any] = {"splits": {}, "notes": []}
    for split in rules.splits:
        rows = d[d[split]] if split in d.columns else d.iloc[0:0]
        if len(rows) == 0:
            summary["splits"][split] = {"rows": 0}
            continue
        w, notes = mixture_weights(rows, rules.rebalance, {"verb": verb_col})
        summary["notes"] += [f"{split}: {n}" for n in notes]
        reason_col = rows.failure_reason if split == "failures" else rows.reason
        part = rows.assign(weight=w.to_numpy(), split=split, reason=reason_col.to_numpy())
        parts.append(part)
        top = part.groupby("task")["weight"].sum().sort_values(ascending=False)
        raw = rows.task.value_counts(normalize=True)
        summary["splits"][split] = {
            "rows": int(len(part)),
            "episodes": int(part.episode_id.nunique()),
            "top_task": str(top.index[0]),
            "top_task_share": float(top.iloc[0]),
            "top_task_raw_share": float(raw.max()),
        }
    if not parts:
        reasons = decisions.drop_reason.dropna().str.split(":").str[0].value_counts().to_dict()
        fails = int(decisions.failures.sum()) if len(decisions) else 0
        raise EmptyMixtureError(
            f"curated mixture is empty: {len(decisions)} items over "
            f"{decisions.episode_id.nunique() if len(decisions) else 0} episodes, none kept "
            f"in splits {list(rules.splits)} (drop rules hit: {reasons or 'none'}; "
            f"failures: {fails}); loosen the rules or check the annotation tables"
        )
    mix = pd.concat(parts, ignore_index=True)
    mix["source_tables"] = mix["source_tables"].map(list)
    mix["source_run_ids"] = mix["source_run_ids"].map(list)
    return mix[list(MIXTURE_DTYPES)].astype(MIXTURE_DTYPES), summary


def task_shares(mixture: pd.DataFrame, split: str) -> pd.Series:
    """Weight share per task inside one split (descending)."""
    m = mixture[mixture.split == split]
    return m.groupby("task")["weight"].sum().sort_values(ascending=False)


def episode_weights(mixture: pd.DataFrame, split: str = "policy") -> dict[str, float]:
    """Per-episode weight of one split (sum of its segments' weights): what trainers sample."""
    m = mixture[mixture.split == split]
    return {str(k): float(v) for k, v in m.groupby("episode_id")["weight"].sum().items()}


__all__ = [
    "MIXTURE_COLUMNS",
    "MIXTURE_DTYPES",
    "EmptyMixtureError",
    "build_mixture",
    "episode_weights",
    "mixture_weights",
    "task_shares",
    "temperature_shares",
]
