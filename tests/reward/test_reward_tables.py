"""GX suites of the rewarder tables: good rows pass, each broken rule names its episode."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.validation.core import TableValidationError, assert_valid, validate_table

C = dict(dataset="toy", model="m", model_version="v1", run_id="r1")


def _outcome(i: int, probs, e=None, r=None, am=3):
    import numpy as np

    p = np.asarray(probs, dtype=float)
    e = float(np.dot(p, range(1, 6))) if e is None else e
    return dict(
        C,
        episode_id=f"toy/{i:06d}",
        score_probs=list(probs),
        expected_score=e,
        reward=(e - 1) / 4 if r is None else r,
        argmax_score=am,
    )


def test_outcome_suite():
    good = pd.DataFrame(
        [_outcome(0, [0.1, 0.2, 0.4, 0.2, 0.1]), _outcome(1, [0, 0, 0, 0, 1], am=5)]
    )
    assert validate_table("outcome", good).success
    bad = pd.DataFrame(
        [
            _outcome(0, [0.1, 0.2, 0.4, 0.2, 0.1]),
            _outcome(1, [0.25, 0.25, 0.25, 0.25], e=2.5),  # four probabilities
            _outcome(2, [0.5, 0.5, 0.5, 0.0, 0.0]),  # sum 1.5
            _outcome(3, [0.1, 0.2, 0.4, 0.2, 0.1], r=0.9),  # reward not (E-1)/4
            _outcome(4, [0.1, 0.2, 0.4, 0.2, 0.1], am=7),
            _outcome(5, [0.1, 0.2, 0.4, 0.2, 0.1], am=None),  # a set check skips a null
        ]
    )
    rep = validate_table("outcome", bad)
    assert not rep.success
    assert rep.failing_episodes == [f"toy/{i:06d}" for i in (1, 2, 3, 4, 5)]
    with pytest.raises(TableValidationError, match="outcome"):
        assert_valid("outcome", bad)


def _dense(i, t, lab, why, w=0, g=1):
    return dict(
        C, episode_id=f"toy/{i:06d}", t_us=t, label=lab, reason=why, source_window=w, source_group=g
    )


def test_dense_suite():
    good = pd.DataFrame([_dense(0, 0, 3, ""), _dense(0, 500_000, 1, "drop", g=2)])
    assert validate_table("dense_labels", good).success
    cases = {
        1: _dense(1, 0, 4, "x"),  # label outside 1..3
        2: _dense(2, 0, 1, ""),  # failure without reason
        3: _dense(3, 0, 3, "fine"),  # normal with reason
        4: _dense(4, -1, 3, ""),  # negative time
        5: _dense(5, 0, 3, "", g=33),  # group outside 1..32
        # Nulls, which GX's set and range checks skip: each must fail on its own.
        6: _dense(6, 0, None, "x"),
        7: _dense(7, 0, 3, "", w=None),
        8: _dense(8, 0, 3, "", g=None),
    }
    rep = validate_table("dense_labels", pd.concat([good, pd.DataFrame(cases.values())]))
    assert rep.failing_episodes == [f"toy/{i:06d}" for i in cases]
    dup = pd.DataFrame([_dense(0, 0, 3, ""), _dense(0, 0, 3, "")])
    assert not validate_table("dense_labels", dup).success


RUB = {
    "task": "t",
    "steps": [
        {"name": "a", "description": "", "allowed": [0, 0.5]},
        {"name": "b", "description": "", "allowed": [0, 0.25, 0.5]},
    ],
}


def _rubric(i, names, scores, total=None):
    return dict(
        C,
        episode_id=f"toy/{i:06d}",
        task="t",
        rubric_json=json.dumps(RUB),
        step_names=names,
        step_scores=scores,
        total=sum(scores) if total is None else total,
    )


def test_rubric_suite():
    good = pd.DataFrame([_rubric(0, ["a", "b"], [0.5, 0.25])])
    assert validate_table("rubric", good).success
    cases = {
        1: _rubric(1, ["a", "b"], [0.5, 0.3]),  # 0.3 not allowed for b
        2: _rubric(2, ["a"], [0.5]),  # missing step
        3: _rubric(3, ["a", "b"], [0.5, 0.25], total=0.5),  # total != sum
    }
    rep = validate_table("rubric", pd.concat([good, pd.DataFrame(cases.values())]))
    assert rep.failing_episodes == [f"toy/{i:06d}" for i in cases]
