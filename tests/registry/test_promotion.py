"""Promotion gates, aliases, rollback, audit trail and concurrent promotions (DESIGN §3.9)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from model_registry.promotion import (
    CHAMPION,
    GatePolicy,
    MetricGate,
    audit_trail,
    evaluate_gates,
    list_versions,
    promote,
    rollback,
)
from model_registry.register import RegistryError

GOOD = {"r_cap": 0.50, "parse_rate": 0.99}


def _champion(model: str = "captioner") -> str | None:
    from mlflow import MlflowClient

    from model_registry.promotion import registered_name

    rm = MlflowClient().get_registered_model(registered_name(model))
    v = rm.aliases.get(CHAMPION)
    return None if v is None else str(v)


def test_first_passing_version_becomes_champion(make_version):
    v = make_version("captioner", GOOD)
    res = promote("captioner", v, actor="ci")
    assert res.promoted and res.champion == v and res.previous is None
    assert _champion() == v
    (ev,) = audit_trail("captioner", v)
    assert ev["event"] == "promoted" and ev["by"] == "ci" and ev["previous"] is None


def test_failing_challenger_is_refused_with_reasons_and_champion_unchanged(make_version):
    v1 = make_version("captioner", GOOD)
    promote("captioner", v1)
    v2 = make_version("captioner", {"r_cap": 0.45, "parse_rate": 0.90}, suites=False)
    res = promote("captioner", v2)
    assert not res.promoted and _champion() == v1
    text = " | ".join(res.decision.reasons)
    assert "r_cap=0.45 vs champion v1 0.5" in text
    assert "parse_rate=0.9 below 0.95" in text
    assert "table suites: failed" in text
    assert audit_trail("captioner", v2)[-1]["event"] == "refused"


@pytest.mark.parametrize(
    "metrics, reason",
    [
        ({"r_cap": 0.10, "parse_rate": 1.0}, "r_cap=0.1 below floor 0.2"),
        ({"parse_rate": 1.0}, "r_cap: no held-out value"),
        ({"r_cap": float("nan"), "parse_rate": 1.0}, "r_cap: no held-out value"),
        ({"r_cap": 0.6}, "parse_rate=None below 0.95"),
    ],
)
def test_absolute_gates(make_version, metrics, reason):
    v = make_version("captioner", metrics)
    d = evaluate_gates("captioner", v)
    assert not d.passed and any(reason in r for r in d.reasons), d.reasons
    assert not promote("captioner", v).promoted and _champion() is None


def test_lower_is_better_and_margins(make_version):
    base = {"outcome.mae": 0.8, "dense.accuracy": 0.7, "rubric.l1": 0.3, "parse_rate": 1.0}
    v1 = make_version("rewarder", base)
    assert promote("rewarder", v1).promoted
    v2 = make_version("rewarder", {**base, "outcome.mae": 0.7})
    assert promote("rewarder", v2).promoted  # lower MAE is better
    strict = GatePolicy((MetricGate("outcome.mae", higher_is_better=False, min_improvement=0.2),))
    v3 = make_version("rewarder", {**base, "outcome.mae": 0.6})
    d = evaluate_gates("rewarder", v3, strict)
    assert not d.passed and "needs lower by >= 0.2" in d.reasons[0]
    assert promote("rewarder", v3, policy=strict, force=True).promoted  # forced, recorded
    assert audit_trail("rewarder", v3)[-1]["event"] == "forced"


def test_rollback_restores_previous_and_refuses_without_one(make_version):
    v1 = make_version("captioner", GOOD)
    with pytest.raises(RegistryError, match="no champion to roll back"):
        rollback("captioner")
    promote("captioner", v1)
    with pytest.raises(RegistryError, match="no previous champion"):
        rollback("captioner")
    v2 = make_version("captioner", {**GOOD, "r_cap": 0.6})
    promote("captioner", v2)
    assert rollback("captioner", actor="oncall") == (v2, v1)
    assert _champion() == v1
    assert audit_trail("captioner", v2)[-1]["event"] == "rolled_back"
    assert audit_trail("captioner", v1)[-1] == {**audit_trail("captioner", v1)[-1],
                                                "event": "restored", "from": v2}  # fmt: skip
    rows = list_versions("captioner")
    assert [r["aliases"] for r in rows] == [["champion"], []]
    assert rows[1]["metrics"]["r_cap"] == 0.6


def test_challenger_alias_is_the_default_version(make_version):
    from mlflow import MlflowClient

    v = make_version("segmenter", {"r_seg": 0.5, "f1_at_0.5": 0.4, "parse_rate": 1.0})
    MlflowClient().set_registered_model_alias("flora-segmenter", "challenger", v)
    assert promote("segmenter").champion == v


PROMOTE = """
import sys
from model_registry.promotion import promote
r = promote("captioner", sys.argv[1], actor="p" + sys.argv[1])
print("promoted" if r.promoted else "refused")
"""


def test_two_concurrent_promotions_leave_one_consistent_champion(make_version, registry_home):
    from mlflow import MlflowClient

    from model_registry.promotion import PREVIOUS_TAG

    v1 = make_version("captioner", GOOD)
    promote("captioner", v1)
    v2 = make_version("captioner", {**GOOD, "r_cap": 0.6})
    v3 = make_version("captioner", {**GOOD, "r_cap": 0.7})
    env = {**os.environ, "FLORA_HOME": str(registry_home)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROMOTE, v],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for v in (v2, v3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    # Serialised either way: v3 (the best) ends as champion; its predecessor is v2 when v2
    # went first, else v1 and v2 was refused against v3.
    assert _champion() == v3
    client = MlflowClient()
    prev = client.get_model_version("flora-captioner", v3).tags[PREVIOUS_TAG]
    said = dict(zip((v2, v3), (o[0].strip() for o in outs), strict=True))
    assert said[v3] == "promoted"
    if prev == v2:
        assert said[v2] == "promoted"
        assert client.get_model_version("flora-captioner", v2).tags[PREVIOUS_TAG] == v1
    else:
        assert prev == v1 and said[v2] == "refused"
    promoted = [e for v in (v1, v2, v3) for e in audit_trail("captioner", v)
                if e["event"] == "promoted"]  # fmt: skip
    assert len(promoted) == (3 if prev == v2 else 2)
