"""benchmarks/outcome_compare.py: outcome MAE, ρ and paired differences on hand cases."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.benchmark_scripts import load_benchmark


def _items(expected: dict[str, float | None], truth: dict[str, float]) -> pd.DataFrame:
    """Scored rewarder items: one outcome item per episode (``None``: did not parse) and a
    dense item that the comparison must ignore."""
    rows = []
    for ep, e in expected.items():
        score = math.nan if e is None else e
        rows.append({"episode_id": ep, "task_kind": "outcome", "parsed": e is not None,
                     "expected_score": score, "ref_score": truth[ep]})  # fmt: skip
        rows.append({"episode_id": ep, "task_kind": "dense", "parsed": True,
                     "expected_score": math.nan, "ref_score": math.nan})  # fmt: skip
    return pd.DataFrame(rows)


TRUTH = {"a": 1.0, "b": 2.0, "c": 4.0, "d": 5.0}


def test_mae_rho_and_pairs_over_the_episodes_both_parsed() -> None:
    oc = load_benchmark("outcome_compare")
    exact = _items({"a": 1.0, "b": 2.0, "c": 4.0, "d": None}, TRUTH)  # d did not parse
    mean = _items(dict.fromkeys(TRUTH, 3.0), TRUTH)
    off = _items({"a": 2.0, "b": 3.0, "c": 5.0, "d": 4.0}, TRUTH)  # ranks a-c right, d wrong
    res = oc.compare_outcomes(
        {"exact": exact, "off": off, "mean": mean}, baselines=("mean",), n_boot=200
    )
    src = res["sources"]
    assert src["exact"]["episodes"] == 3 and src["exact"]["parse_rate"] == pytest.approx(0.75)
    assert src["exact"]["mae"] == 0.0 and src["exact"]["rho"] == pytest.approx(1.0)
    assert src["off"]["mae"] == pytest.approx(1.0)
    assert src["mean"]["mae"] == pytest.approx(1.5)  # |3-1|, |3-2|, |3-4|, |3-5|
    assert math.isnan(src["mean"]["rho"])  # a constant answer ranks nothing
    pairs = {(p["a"], p["b"]): p for p in res["paired"]}
    # each model against the baseline, the later model against the first; never the reverse
    assert set(pairs) == {("exact", "mean"), ("off", "mean"), ("off", "exact")}
    # exact vs mean over a, b, c only (d unparsed): 0 - mean(2, 1, 1)
    assert pairs[("exact", "mean")]["episodes"] == 3
    assert pairs[("exact", "mean")]["diff"] == pytest.approx(-4 / 3)
    lo, hi = pairs[("exact", "mean")]["interval"]
    assert lo <= -4 / 3 <= hi and hi < 0  # exact is closer on every episode
    assert pairs[("off", "mean")]["diff"] == pytest.approx(-0.5)
    assert pairs[("off", "exact")]["diff"] == pytest.approx(1.0)
    table = oc.markdown(res)
    assert "| exact − mean | 3 | -1.333 [" in table
    assert "| mean | 4 | 1.000 | 1.500 [" in table and table.count("–") >= 1


def test_two_outcome_items_of_one_episode_are_refused() -> None:
    oc = load_benchmark("outcome_compare")
    items = _items({"a": 1.0}, TRUTH)
    twice = pd.concat([items, items], ignore_index=True)
    with pytest.raises(ValueError, match="more than one outcome item per episode"):
        oc.compare_outcomes({"x": twice})
