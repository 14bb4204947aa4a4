"""Fleet monitoring and policy evaluation from the ``outcome`` table.

- ``reward_by``: outcome reward by robot, policy version and day (mean, n, 95 % interval).
- ``rank_policies``: policies ranked by expected reward (the mean outcome reward — itself
  the expectation of the score, DESIGN §3.3) with 95 % Student-t intervals; a policy with
  one episode has no interval (NaN) and says so.
- ``drift_check``: one-sided test that the recent window's rewards are lower than the
  baseline window's, at level α — Mann-Whitney U (default: rewards are bounded and far
  from normal) or Welch's t. It fires when p < α. Too little data never fires and says
  why. ``drift_by_window`` applies it per robot / policy over day windows.

NaN rewards (and episodes without an outcome) are left out and counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

FLEET_COLUMNS = ("episode_id", "robot", "policy_version", "day", "reward")


def fleet_table(outcome: pd.DataFrame, meta: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Join rewards to episode metadata; ``(table, number of episodes without a reward)``."""
    cols = ["episode_id", "robot", "policy_version", "day"]
    m = meta[cols].copy()
    if len(outcome) and "reward" in outcome.columns:
        r = outcome[["episode_id", "reward"]].copy()
        r["reward"] = pd.to_numeric(r["reward"], errors="coerce")
        df = m.merge(r, on="episode_id", how="left")
    else:
        df = m.assign(reward=np.nan)
    ok = np.isfinite(df["reward"].to_numpy(dtype=float))
    return df[ok].reset_index(drop=True)[list(FLEET_COLUMNS)], int((~ok).sum())


def _interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    from scipy import stats

    n = len(x)
    if n < 2:
        return math.nan, math.nan
    sd = float(np.std(x, ddof=1))
    h = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    m = float(np.mean(x))
    return max(0.0, m - h), min(1.0, m + h)


def reward_by(df: pd.DataFrame, key: str | Sequence[str]) -> pd.DataFrame:
    """Mean outcome reward, count and 95 % interval per value of ``key``."""
    keys = [key] if isinstance(key, str) else list(key)
    rows = []
    for k, g in df.groupby(keys, sort=True):
        x = g["reward"].to_numpy(dtype=float)
        lo, hi = _interval(x)
        kk = k if isinstance(k, tuple) else (k,)
        rows.append({**dict(zip(keys, kk, strict=True)), "n": len(x),
                     "mean_reward": float(x.mean()), "ci_low": lo, "ci_high": hi})  # fmt: skip
    return pd.DataFrame(rows, columns=[*keys, "n", "mean_reward", "ci_low", "ci_high"])


def rank_policies(df: pd.DataFrame) -> pd.DataFrame:
    """Policies by expected reward (descending), with 95 % intervals and a note."""
    r = reward_by(df, "policy_version")
    r["note"] = np.where(r["n"] < 2, "one episode: no interval", "")
    r = r.sort_values(["mean_reward", "ci_low"], ascending=False, na_position="last")
    r.insert(0, "rank", range(1, len(r) + 1))
    return r.reset_index(drop=True)


@dataclass(frozen=True)
class DriftResult:
    """One drift test: recent vs baseline rewards."""

    fired: bool
    p_value: float
    statistic: float
    drop: float  # baseline mean - recent mean
    n_baseline: int
    n_recent: int
    method: str
    alpha: float
    reason: str
    group: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def drift_check(
    baseline: Sequence[float] | np.ndarray,
    recent: Sequence[float] | np.ndarray,
    *,
    alpha: float = 0.05,
    method: Literal["mannwhitney", "welch"] = "mannwhitney",
    min_n: int = 3,
    group: str = "",
) -> DriftResult:
    """One-sided test of "recent rewards are lower than baseline" at level ``alpha``."""
    from scipy import stats

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    b = np.asarray(baseline, dtype=float)
    r = np.asarray(recent, dtype=float)
    nb, nr = int(np.isfinite(b).sum()), int(np.isfinite(r).sum())
    b, r = b[np.isfinite(b)], r[np.isfinite(r)]
    drop = float(b.mean() - r.mean()) if nb and nr else math.nan
    if nb < min_n or nr < min_n:
        return DriftResult(False, math.nan, math.nan, drop, nb, nr, method, alpha,
                           f"insufficient data (baseline {nb}, recent {nr}; need {min_n} each)",
                           group)  # fmt: skip
    if method == "mannwhitney":
        res = stats.mannwhitneyu(r, b, alternative="less")
    elif method == "welch":
        if np.ptp(b) == 0 and np.ptp(r) == 0:  # no variance: the means decide exactly
            p = 0.0 if r.mean() < b.mean() else 1.0
            res = type("R", (), {"statistic": math.copysign(math.inf, -drop), "pvalue": p})()
        else:
            res = stats.ttest_ind(r, b, equal_var=False, alternative="less")
    else:
        raise ValueError(f"unknown drift method {method!r} (mannwhitney, welch)")
    p = float(res.pvalue)
    fired = bool(p < alpha)
    reason = (f"recent mean {r.mean():.3f} vs baseline {b.mean():.3f} "
              f"(drop {drop:+.3f}), one-sided {method} p={p:.4g} "
              f"{'<' if fired else '>='} α={alpha}")  # fmt: skip
    return DriftResult(fired, p, float(res.statistic), drop, nb, nr, method, alpha, reason, group)


def drift_by_window(
    df: pd.DataFrame,
    *,
    by: str = "robot",
    recent_days: int = 1,
    baseline_days: int = 7,
    alpha: float = 0.05,
    method: Literal["mannwhitney", "welch"] = "mannwhitney",
) -> list[DriftResult]:
    """Per value of ``by``: recent rewards against the baseline's, in calendar-day windows.

    Recent: the ``recent_days`` calendar days ending at that value's own last day with data
    (a robot that stopped reporting a day early is judged on its own last days, not on an
    empty fleet-wide window); baseline: the ``baseline_days`` calendar days just before
    them (however sparse the data, never older days). A baseline window without data
    reports insufficient data (not fired).
    Days are the ``day`` column (``YYYY-MM-DD``); rows with day ``unknown`` (or any value
    that is not such a date) are not windowed.
    """
    d = df[df["day"] != "unknown"]
    d = d.assign(_date=pd.to_datetime(d["day"], format="%Y-%m-%d", errors="coerce"))
    d = d[d["_date"].notna()]
    n_days = d["_date"].nunique()
    if n_days < 2:
        return [DriftResult(False, math.nan, math.nan, math.nan, 0, 0, method, alpha,
                            f"need at least two days of outcomes, have {n_days}")]  # fmt: skip
    out = []
    for k, g in d.groupby(by, sort=True):
        recent_start = g["_date"].max() - pd.Timedelta(days=recent_days - 1)
        base_start = recent_start - pd.Timedelta(days=baseline_days)
        base = g[(g["_date"] >= base_start) & (g["_date"] < recent_start)]
        out.append(drift_check(base.reward, g[g["_date"] >= recent_start].reward,
                               alpha=alpha, method=method, group=f"{by}={k}"))  # fmt: skip
    return out


@dataclass
class FleetReport:
    """Everything the fleet section of a report shows."""

    table: pd.DataFrame
    missing_rewards: int
    by_robot: pd.DataFrame
    by_policy: pd.DataFrame
    by_day: pd.DataFrame
    ranking: pd.DataFrame
    drift: list[DriftResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        rec = lambda d: d.replace({np.nan: None}).to_dict("records")  # noqa: E731
        return {
            "episodes": int(len(self.table)), "missing_rewards": self.missing_rewards,
            "by_robot": rec(self.by_robot), "by_policy": rec(self.by_policy),
            "by_day": rec(self.by_day), "ranking": rec(self.ranking),
            "drift": [d.to_dict() for d in self.drift],
        }  # fmt: skip


def fleet_from_tables(
    outcome: pd.DataFrame, meta: pd.DataFrame, *, baseline_days: int = 7, alpha: float = 0.05
) -> FleetReport:
    """The fleet report from an outcome table and episode metadata."""
    t, missing = fleet_table(outcome, meta)
    drift = drift_by_window(t, baseline_days=baseline_days, alpha=alpha) if len(t) else []
    return FleetReport(t, missing, reward_by(t, "robot"), reward_by(t, "policy_version"),
                       reward_by(t, "day"), rank_policies(t), drift)  # fmt: skip


def fleet_report(
    dataset: str | Path, tables: Any, *, baseline_days: int = 7, alpha: float = 0.05
) -> FleetReport:
    """The fleet report of a dataset's ``outcome`` table (``tables``: a TableStore root)."""
    from flora.curate.sources import episode_meta, load_annotations

    ann = load_annotations(tables, ("outcome",))
    return fleet_from_tables(ann.table("outcome"), episode_meta(dataset),
                             baseline_days=baseline_days, alpha=alpha)  # fmt: skip


__all__ = [
    "DriftResult",
    "FleetReport",
    "drift_by_window",
    "drift_check",
    "fleet_from_tables",
    "fleet_report",
    "fleet_table",
    "rank_policies",
    "reward_by",
]
