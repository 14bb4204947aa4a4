"""Fleet monitoring: rewards by robot/policy/day, ranking, and the drift check's size."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

N_NULL = 200
ALPHA = 0.05
# Upper tolerance on false alarms in N_NULL null simulations: the 1 - 1e-4 quantile of
# Binomial(N_NULL, ALPHA). A test of the nominal level exceeds it with probability 1e-4;
# the seeds are fixed, so the count itself is deterministic.
MAX_FALSE_ALARMS = int(stats.binom.ppf(1 - 1e-4, N_NULL, ALPHA))


def _rewards(rng, n, a=5.0, b=2.0):
    # Outcome rewards are expectations of a 1..5 score: bounded, skewed, quantised to 1/4.
    return np.round(rng.beta(a, b, n) * 4) / 4 + rng.uniform(-0.01, 0.01, n)


@pytest.mark.parametrize("method", ["mannwhitney", "welch"])
def test_drift_fires_on_real_drop_and_holds_its_level(method):
    from flora.curate.fleet import drift_check

    rng = np.random.default_rng(11)
    fires = [drift_check(_rewards(rng, 40), _rewards(rng, 20), alpha=ALPHA, method=method).fired
             for _ in range(N_NULL)]  # fmt: skip
    assert sum(fires) <= MAX_FALSE_ALARMS, (sum(fires), MAX_FALSE_ALARMS)
    assert sum(fires) >= 1  # not trivially conservative either
    # A real drop (mean 0.71 -> 0.50) is caught in nearly every trial.
    hits = [drift_check(_rewards(rng, 40), _rewards(rng, 20, 3.0, 3.0), alpha=ALPHA,
                        method=method).fired for _ in range(50)]  # fmt: skip
    assert sum(hits) >= 45
    # An improvement never fires (one-sided).
    up = drift_check(_rewards(rng, 40, 3, 3), _rewards(rng, 20, 8, 1), method=method)
    assert not up.fired and up.drop < 0


def test_drift_edge_cases():
    from flora.curate.fleet import drift_check

    few = drift_check([0.9, 0.8], [0.1, 0.2, 0.1])
    assert not few.fired and "insufficient data" in few.reason
    nan = drift_check([0.9, np.nan, 0.8, 0.85], [0.1, 0.2, np.nan, 0.1])
    assert nan.n_baseline == 3 and nan.n_recent == 3
    const = drift_check([1.0] * 5, [0.5] * 5, method="welch")
    assert const.fired and const.p_value == 0.0
    with pytest.raises(ValueError, match="alpha"):
        drift_check([1.0] * 5, [0.5] * 5, alpha=0)


def test_fleet_tables_ranking_and_windows():
    from flora.curate.fleet import fleet_from_tables

    rng = np.random.default_rng(3)
    meta, out = [], []
    k = 0
    for day in range(10):
        for robot in ("r1", "r2"):
            for _ in range(6):
                eid = f"fleet/{k:06d}"
                pol = "v2" if k % 3 == 0 else "v1"
                meta.append({"episode_id": eid, "robot": robot, "policy_version": pol,
                             "day": f"2026-11-{day + 1:02d}"})  # fmt: skip
                drop = robot == "r2" and day == 9
                r = _rewards(rng, 1, 3.0, 3.0)[0] if drop else _rewards(rng, 1)[0]
                out.append({"episode_id": eid, "reward": float(np.clip(r, 0, 1))})
                k += 1
    meta.append({"episode_id": "fleet/solo", "robot": "r3", "policy_version": "v0",
                 "day": "2026-11-05"})  # fmt: skip
    out.append({"episode_id": "fleet/solo", "reward": 0.1})
    meta.append({"episode_id": "fleet/nan", "robot": "r1", "policy_version": "v1",
                 "day": "2026-11-05"})  # fmt: skip
    out.append({"episode_id": "fleet/nan", "reward": math.nan})
    rep = fleet_from_tables(pd.DataFrame(out), pd.DataFrame(meta), baseline_days=7)
    assert rep.missing_rewards == 1 and len(rep.table) == 121
    assert set(rep.by_robot.robot) == {"r1", "r2", "r3"}
    assert rep.by_day.n.sum() == 121
    rank = rep.ranking
    assert list(rank["rank"]) == [1, 2, 3] and rank.mean_reward.is_monotonic_decreasing
    solo = rank[rank.policy_version == "v0"].iloc[0]
    assert math.isnan(solo.ci_low) and solo.note == "one episode: no interval"
    for r in rank[rank.n > 1].itertuples():
        assert r.ci_low <= r.mean_reward <= r.ci_high
    drift = {d.group: d for d in rep.drift}
    assert drift["robot=r2"].fired and not drift["robot=r1"].fired
    assert "insufficient data" in drift["robot=r3"].reason
    assert rep.to_dict()["drift"][0]["group"] == "robot=r1"


def test_drift_windows_are_calendar_days_not_the_last_days_with_data():
    from flora.curate.fleet import drift_by_window

    old = [(f"2025-01-{d:02d}", 0.9) for d in range(1, 8) for _ in range(5)]  # a year ago
    near = [(f"2026-02-{d}", 0.9) for d in (23, 25) for _ in range(3)]  # 6 and 4 days before
    now = [("2026-03-01", 0.5)] * 5

    def df(rows):
        return pd.DataFrame([{"robot": "r1", "day": d, "reward": r} for d, r in rows])

    (gap,) = drift_by_window(df(old + now))
    assert not gap.fired and gap.n_baseline == 0 and "insufficient data" in gap.reason
    (r,) = drift_by_window(df(old + near + now))  # only the 7 calendar days before count
    assert r.fired and r.n_baseline == 6 and r.n_recent == 5
    (r2,) = drift_by_window(df(old + near + now), recent_days=7)  # recent: 02-23 .. 03-01
    assert r2.n_recent == 11 and r2.n_baseline == 0 and not r2.fired


def test_drift_recent_window_is_each_robots_own_last_day():
    """r2's rewards collapse on its own last day, one day before r1's last day: the check
    fires for r2 (the fleet-wide last day gave it an empty recent window)."""
    from flora.curate.fleet import drift_by_window

    rows = []
    for d in range(1, 9):
        for _ in range(5):
            rows.append({"robot": "r1", "day": f"2026-03-{d:02d}", "reward": 0.9})
            if d <= 7:
                rows.append({"robot": "r2", "day": f"2026-03-{d:02d}",
                             "reward": 0.9 if d < 7 else 0.1})  # fmt: skip
    res = {r.group: r for r in drift_by_window(pd.DataFrame(rows))}
    assert res["robot=r2"].fired and res["robot=r2"].n_recent == 5
    assert res["robot=r2"].n_baseline == 30  # 03-01 .. 03-06
    assert not res["robot=r1"].fired and res["robot=r1"].n_recent == 5
