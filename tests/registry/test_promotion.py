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


# ------------------------------------------------- one evaluation set, one evaluation


def test_challenger_scored_on_other_episodes_is_refused(make_version):
    """Metrics of different held-out episodes do not compare: a challenger scored on other
    (or fewer) episodes is refused however good its figures, and so is a pair where either
    has no eval-set fingerprint; the first version has no champion to pair with."""
    from model_registry.promotion import eval_set_tags, record_evaluation
    from tests.registry.conftest import EPISODES

    v1 = make_version("captioner", GOOD, episodes=None)
    assert promote("captioner", v1).promoted  # first registration: nothing to compare
    v2 = make_version("captioner", {**GOOD, "r_cap": 0.9})
    res = promote("captioner", v2)
    assert not res.promoted and _champion() == v1
    (reason,) = res.decision.reasons  # not compared metric by metric
    assert "champion v1 (no eval-set fingerprint recorded)" in reason
    assert f"flora eval model --model captioner --version {v2} --set SET" in reason
    assert "--episodes" in reason and f"--version {v1}" in reason
    # the champion re-evaluated on the challenger's episodes: compared, promoted
    record_evaluation("captioner", v1, GOOD, eval_set=eval_set_tags(EPISODES))
    assert promote("captioner", v2).promoted and _champion() == v2
    v3 = make_version("captioner", {**GOOD, "r_cap": 0.95}, episodes=EPISODES[:2])
    d = evaluate_gates("captioner", v3)
    assert not d.passed and "not scored on the same held-out episodes" in d.reasons[0]
    assert "2 episodes" in d.reasons[0] and "3 episodes" in d.reasons[0]
    assert not promote("captioner", v3).promoted and _champion() == v2
    v4 = make_version("captioner", {**GOOD, "r_cap": 0.95}, episodes=None)
    assert "v4 (no eval-set fingerprint recorded)" in evaluate_gates("captioner", v4).reasons[0]


def test_policy_refused_for_other_episodes_gets_the_policys_own_advice(make_version):
    """The advice for a refused flora-policy challenger was `flora eval model --model
    policy ...`, which refuses policies: it names the function that re-scores registered
    policies (exercised end to end in tests/policy/test_lerobot_train.py)."""
    from mlflow import MlflowClient

    from model_registry.promotion import POLICY_NAME

    v1 = make_version("policy", {"postfix_mse": 0.5}, episodes=("toy_world/000002",))
    MlflowClient().set_model_version_tag(POLICY_NAME, v1, "flora.dataset", "/data/toy_world")
    assert promote("policy", v1).promoted
    v2 = make_version("policy", {"postfix_mse": 0.1}, episodes=("toy_world/000003",))
    d = evaluate_gates("policy", v2)
    (reason,) = d.reasons
    assert not d.passed and "not scored on the same held-out episodes" in reason
    assert "flora eval model" not in reason
    want = f"evaluate_versions([{v2!r}, {v1!r}], '/data/toy_world')"
    assert "from flora.policy.registry import evaluate_versions" in reason and want in reason


def _seg_eval(examples, answers):
    """The project's scorer on hand answers (window id -> text) for ``examples``."""
    import pandas as pd

    from training.evaluate import score_outputs

    out = pd.DataFrame([{"example_id": e.example_id, "text": answers[e.example_id]}
                        for e in examples])  # fmt: skip
    return score_outputs("segmenter", examples, out, n_boot=0)


def test_subset_scored_challenger_is_not_promoted_over_a_better_champion(make_version):
    """Review repro: v2 is worse than v1 on every held-out episode but was scored on the
    first episode only. Its evaluation, written by the project's writers (log_eval tagging
    the version; tag_version reading the fingerprint off the eval run, as the pipeline's
    register does), is not compared with v1's; once re-evaluated on v1's episodes it is,
    and it loses."""
    from model_registry.promotion import record_evaluation
    from tests.training.test_eval_model import SEG
    from training.evaluate import flat_metrics, log_eval, tag_version

    v1_answers = {"w0": "0 40 1 0\n60 200 0 0", "w1": "none", "w2": "10 30 0 0", "w3": "none"}
    v2_answers = {**v1_answers, "w2": "none", "w3": "none"}  # misses w2's segment too
    v1 = make_version("segmenter", {}, episodes=None)
    r1 = _seg_eval(SEG, v1_answers)
    tag_version("segmenter", v1, flat_metrics(r1), log_eval(r1))  # the pipeline's way
    record_evaluation("segmenter", v1, {}, suites_passed=True)
    assert promote("segmenter", v1).promoted
    v2 = make_version("segmenter", {}, episodes=None)
    easy = [e for e in SEG if e.episode_id == "toy/000000"]
    r2 = _seg_eval(easy, v2_answers)
    assert r2.metrics["r_seg"] > r1.metrics["r_seg"]  # better figures, easier episodes
    log_eval(r2, registered_version=v2)  # `flora eval model --version 2 --episodes 1`
    record_evaluation("segmenter", v2, {}, suites_passed=True)
    res = promote("segmenter", v2)
    assert not res.promoted and _champion("segmenter") == v1
    assert any("not scored on the same held-out episodes" in r for r in res.decision.reasons)
    r2_all = _seg_eval(SEG, v2_answers)  # re-evaluated on the champion's episodes
    log_eval(r2_all, registered_version=v2)
    res = promote("segmenter", v2)
    assert not res.promoted and _champion("segmenter") == v1
    assert [r for r in res.decision.reasons if r.startswith("r_seg=")], res.decision.reasons
    assert not any("eval set" in r for r in res.decision.reasons)


def test_a_new_evaluation_replaces_every_earlier_eval_tag(make_version):
    """Whichever writer is newer is what the gates read (never ``flora.eval.*`` over a newer
    ``eval.*``), and a metric the newer evaluation did not produce does not survive it."""
    from mlflow import MlflowClient

    from model_registry.promotion import (
        EVAL_SET_TAG,
        eval_set_tags,
        record_evaluation,
        version_metrics,
    )
    from tests.registry.conftest import EPISODES
    from training.evaluate import tag_version

    fp = eval_set_tags(EPISODES)
    v = make_version("segmenter", {"r_seg": 0.9, "f1_at_0.5": 0.9, "parse_rate": 1.0})
    tag_version("segmenter", v, {"eval.r_seg": 0.05, "eval.f1_at_0.5": 0.02,
                                 "eval.parse_rate": 0.1}, "newer", eval_set=fp)  # fmt: skip
    assert version_metrics("segmenter", v) == {"r_seg": 0.05, "f1_at_0.5": 0.02, "parse_rate": 0.1}
    assert not evaluate_gates("segmenter", v).passed

    full = {"eval.outcome.mae": 0.2, "eval.outcome.mae.ci_low": 0.1, "eval.dense.accuracy": 0.9,
            "eval.rubric.l1": 0.1, "eval.parse_rate": 1.0}  # fmt: skip
    w = make_version("rewarder", {}, episodes=None)
    tag_version("rewarder", w, full, "eval-1", eval_set=fp)
    less = eval_set_tags(EPISODES[:1])
    tag_version("rewarder", w, {"eval.dense.accuracy": 0.9, "eval.parse_rate": 0.96}, "eval-2",
                eval_set=less)  # fmt: skip
    tags = MlflowClient().get_model_version("flora-rewarder", w).tags
    assert version_metrics("rewarder", w) == {"dense.accuracy": 0.9, "parse_rate": 0.96}
    assert tags["eval.run_id"] == "eval-2" and tags[EVAL_SET_TAG] == less[EVAL_SET_TAG]
    assert "eval.outcome.mae.ci_low" not in tags
    reasons = evaluate_gates("rewarder", w).reasons
    assert any(r.startswith("outcome.mae: no held-out value") for r in reasons), reasons

    # record_evaluation replaces tag_version's evaluation too; a suites-only record keeps it
    record_evaluation("rewarder", w, {"outcome.mae": 0.3}, eval_run_id="eval-3", eval_set=fp)
    record_evaluation("rewarder", w, {}, suites_passed=True, eval_run_id="eval-3")
    tags = MlflowClient().get_model_version("flora-rewarder", w).tags
    assert not [k for k in tags if k.startswith("eval.")]
    assert version_metrics("rewarder", w) == {"outcome.mae": 0.3}
    assert tags[EVAL_SET_TAG] == fp[EVAL_SET_TAG] and tags["flora.suites"] == "passed"
    # an evaluation without a fingerprint leaves none behind (its run has none either)
    tag_version("rewarder", w, {"eval.outcome.mae": 0.3}, "no-such-run")
    tags = MlflowClient().get_model_version("flora-rewarder", w).tags
    assert EVAL_SET_TAG not in tags and tags["eval.run_id"] == "no-such-run"
    with pytest.raises(ValueError, match="with its metrics"):
        record_evaluation("rewarder", w, {}, eval_set=fp)
