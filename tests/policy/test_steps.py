"""The policy pipeline's evaluation step helpers (shared by the DAG and the KFP component)."""

from __future__ import annotations

import math

from flora.policy.steps import episode_ids_tag, eval_delays, flat_eval_metrics


def test_eval_delays_keep_a_postfix_of_at_least_d_actions():
    assert eval_delays(8, 3) == (0, 1, 2)
    assert eval_delays(2, 5) == (0, 1)  # d=2 would leave H - 2 = 0 actions
    assert eval_delays(16, 0) == ()


def test_flat_eval_metrics_names_and_undefined_jumps():
    report = {
        "latency_ms": {"plain": 1.5, "training_time": 2},
        "rows": [
            {"d": 0, "method": "plain", "postfix_mse": 0.25, "boundary_jump": math.nan},
            {"d": 1, "method": "training_time", "postfix_mse": 0.5, "boundary_jump": 0.125},
        ],
    }
    assert flat_eval_metrics(report) == {
        "latency_ms.plain": 1.5,
        "latency_ms.training_time": 2.0,
        "d0.plain.postfix_mse": 0.25,
        "d1.training_time.postfix_mse": 0.5,
        "d1.training_time.boundary_jump": 0.125,
    }


def test_episode_ids_tag_stays_under_the_limit():
    assert episode_ids_tag([3, 1, 7]) == "3,1,7"
    tag = episode_ids_tag(list(range(5000)), limit=50)
    assert len(tag) <= 50 and tag.endswith(",...") and tag.startswith("0,1,2,")
