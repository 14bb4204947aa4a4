"""The curated mixture as per-step sampling weights for trainers.

A mixture row gives a segment ``[start_us, end_us)`` of an episode a weight (its share of
its split). A trainer that samples time steps spreads each segment's weight evenly over
the steps inside it, so the segment as a whole is drawn in proportion to its weight
whatever its length; a step inside no row of the split gets weight 0 (curation left it
out), and overlapping rows add up. ``flora.policy.lerobot`` uses this for
``PolicyTrainConfig.mixture``; ``training/sets.py`` reads the same table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def load_split(mixture: str | Path | pd.DataFrame, split: str = "policy") -> pd.DataFrame:
    """One split of a mixture (file validated against its suite, or a DataFrame)."""
    if isinstance(mixture, pd.DataFrame):
        df = mixture
    else:
        from flora.curate.run import read_mixture

        df = read_mixture(mixture)
    out = df[df.split == split].reset_index(drop=True)
    if not len(out):
        raise ValueError(f"mixture has no rows in split {split!r} (splits: "
                         f"{sorted(set(df.split))})")  # fmt: skip
    return out


def step_weights(rows: pd.DataFrame, episode_id: str, timestamps_us: np.ndarray) -> np.ndarray:
    """Per-step weights of one episode from its mixture rows (zeros when it has none)."""
    t = np.asarray(timestamps_us, dtype=np.int64)
    w = np.zeros(len(t), dtype=np.float64)
    for r in rows[rows.episode_id == episode_id].itertuples(index=False):
        inside = (t >= int(r.start_us)) & (t < int(r.end_us))
        n = int(inside.sum())
        if n:
            w[inside] += float(r.weight) / n
    return w


__all__ = ["load_split", "step_weights"]
