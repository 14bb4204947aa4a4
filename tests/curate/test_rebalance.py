"""Mixture weights: temperature, caps (water-filling), hierarchy, sums; the mixture suite."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest


def test_temperature_shares_and_caps():
    from flora.curate.rebalance import temperature_shares

    counts = {"a": 80, "b": 15, "c": 5}
    p1, _ = temperature_shares(counts, 1.0)
    assert p1 == pytest.approx({"a": 0.8, "b": 0.15, "c": 0.05})
    p2, _ = temperature_shares(counts, 2.0)
    raw = np.sqrt([80, 15, 5])
    assert p2 == pytest.approx(dict(zip("abc", raw / raw.sum(), strict=True)))
    pu, _ = temperature_shares(counts, math.inf)
    assert pu == pytest.approx({k: 1 / 3 for k in "abc"})
    # Cap 0.5 at T=1: a is fixed at 0.5, b and c share the rest 15:5.
    pc, note = temperature_shares(counts, 1.0, 0.5)
    assert pc == pytest.approx({"a": 0.5, "b": 0.375, "c": 0.125}) and note is None
    # Water-filling twice: after capping a, b exceeds the cap too.
    pw, _ = temperature_shares({"a": 50, "b": 45, "c": 5}, 1.0, 0.4)
    assert pw == pytest.approx({"a": 0.4, "b": 0.4, "c": 0.2})
    # Infeasible cap (2 values, cap 0.3): uniform, with a note.
    pi, note = temperature_shares({"a": 9, "b": 1}, 1.0, 0.3)
    assert pi == pytest.approx({"a": 0.5, "b": 0.5}) and "infeasible" in note
    # One value holds everything; no note for that.
    assert temperature_shares({"a": 3}, 1.0, 0.3) == ({"a": 1.0}, None)


def test_temperature_shares_small_temperature_is_finite_and_unchanged_at_1_and_2():
    from flora.curate.rebalance import temperature_shares

    # T=1 and T=2 give what count ** (1/T) normalised gives (exact small counts).
    assert temperature_shares({"a": 3, "b": 1}, 1.0)[0] == pytest.approx(
        {"a": 0.75, "b": 0.25}, rel=1e-12)  # fmt: skip
    assert temperature_shares({"a": 9, "b": 4}, 2.0)[0] == pytest.approx(
        {"a": 0.6, "b": 0.4}, rel=1e-12)  # fmt: skip
    # An allowed small T: 2000 ** 100 overflows a float; the shares stay finite and sum to 1.
    p, _ = temperature_shares({"a": 2000, "b": 40, "c": 5}, 0.01)
    assert p["a"] == pytest.approx(1.0) and 0.0 <= p["b"] < 1e-100 and 0.0 <= p["c"] <= p["b"]
    # Capped: a is fixed at 0.5 and the rest goes (almost all) to b, the next largest.
    pc, _ = temperature_shares({"a": 2000, "b": 40, "c": 5}, 0.01, 0.5)
    assert all(math.isfinite(v) for v in pc.values())
    assert pc == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.0}, abs=1e-12)


def test_hierarchical_weights_sum_to_one_and_respect_caps():
    from flora.curate.rebalance import mixture_weights
    from flora.curate.rules import RebalanceRule

    rows = (
        [{"task": "t1", "verb": "grasp", "robot": "r1"}] * 60
        + [{"task": "t1", "verb": "lift", "robot": "r2"}] * 20
        + [{"task": "t2", "verb": "push", "robot": "r1"}] * 15
        + [{"task": "t3", "verb": "grasp", "robot": "r1"}] * 5
    )
    df = pd.DataFrame(rows)
    rule = RebalanceRule(temperature=1.0, max_share=0.5)
    w, _ = mixture_weights(df, rule)
    assert w.sum() == pytest.approx(1.0) and (w > 0).all()
    share = w.groupby(df.task).sum()
    assert share["t1"] == pytest.approx(0.5)  # raw 0.8, capped
    assert share["t2"] == pytest.approx(0.375) and share["t3"] == pytest.approx(0.125)
    inside = w[df.task == "t1"].groupby(df.verb[df.task == "t1"]).sum() / 0.5
    assert inside["grasp"] == pytest.approx(0.5)  # 0.75 inside t1, capped at 0.5
    # Rows inside a leaf share its mass equally.
    assert w[(df.task == "t1") & (df.verb == "grasp")].nunique() == 1


def test_single_episode_task_gets_its_share():
    from flora.curate.rebalance import mixture_weights
    from flora.curate.rules import RebalanceRule

    df = pd.DataFrame({"task": ["big"] * 9 + ["solo"], "verb": "v", "robot": "r"})
    w, _ = mixture_weights(df, RebalanceRule(strata=("task",), temperature=math.inf))
    assert w[df.task == "solo"].sum() == pytest.approx(0.5)


def _mixture_row(**kw):
    base = {"episode_id": "toy/000000", "dataset": "toy", "model": "flora-curate",
            "model_version": "x", "run_id": "r", "start_us": 0, "end_us": 1_000_000,
            "duration_us": 2_000_000, "caption": "grasp the cube", "weight": 1.0,
            "split": "pretrain", "reason": "ok", "source_run_ids": ["a"],
            "source_tables": ["events"], "event_index": 0}  # fmt: skip
    return {**base, **kw}


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"weight": 0.5}, "_chk_weights_sum_1_per_split"),
        ({"end_us": 3_000_000}, "duration_us,end_us"),
        ({"start_us": 1_000_000}, "end_us,start_us"),
        ({"source_run_ids": []}, "_chk_traces_to_runs"),
        ({"source_tables": []}, "_chk_traces_to_tables"),
        ({"caption": None}, "_chk_pretrain_captioned"),
        ({"split": "train"}, "split"),
    ],
)
def test_mixture_suite_rejects_bad_rows(change, check):
    from flora.validation.core import validate_table

    good = validate_table("mixture", pd.DataFrame([_mixture_row()]))
    assert good.success, good.summary()
    rep = validate_table("mixture", pd.DataFrame([_mixture_row(**change)]))
    assert not rep.success and check in {r.column for r in rep.failures}, rep.summary()
