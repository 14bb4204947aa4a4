"""r_cap (seed eq. 17) and the structured scorer on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from flora.metrics import r_cap
from flora.metrics.caption import (
    FactualError,
    Judgment,
    Requirement,
    as_requirements,
    score_judgment,
)

REQS = [
    Requirement("action", "grasp", 1.0),
    Requirement("object", "red block", 1.0),
    Requirement("spatial", "on the blue plate", 0.5),
    Requirement("outcome", "miss the object", 0.5),
]  # R = 3.0


def test_r_cap_formula_and_edges():
    assert r_cap(3.0, 3.0, 0.0) == 1.0  # perfect
    assert r_cap(3.0, 0.0, 0.0) == 0.0  # empty caption
    assert math.isclose(r_cap(3.0, 2.0, 1.0), 2 * 2 / (3 + 2 + 1))
    assert r_cap(0.0, 0.0, 0.0) == 1.0  # nothing asked, nothing wrong
    assert r_cap(0.0, 0.0, 0.7) == 0.0  # nothing asked, something false said
    for bad in [(-1, 0, 0), (1, 2, 0), (1, 0, -0.1), (float("nan"), 0, 0), (1, 1, math.inf)]:
        with pytest.raises(ValueError):
            r_cap(*bad)


def test_perfect_judgment_scores_one():
    s = score_judgment(REQS, Judgment(covered=(0, 1, 2, 3)))
    assert (s.R, s.M, s.F, s.reward) == (3.0, 3.0, 0.0, 1.0)


def test_partial_coverage_hand_computed():
    s = score_judgment(REQS, Judgment(covered=(0, 1)))
    assert (s.R, s.M, s.F) == (3.0, 2.0, 0.0)
    assert math.isclose(s.reward, 4 / 5)


def test_repeated_error_family_penalised_once():
    # the caption names the wrong colour twice (object family, two requirements hit) and
    # also re-explains it as an unsupported claim: one object penalty = the largest mass
    errors = (
        FactualError("object", "blue block", requirement=1),
        FactualError("object", "the blue block on the plate", requirement=2),
        FactualError("object", "a blue cube", requirement=None),
    )
    s = score_judgment(REQS, Judgment(covered=(0, 1, 2, 3), errors=errors))
    assert s.contradicted == (1, 2) and s.covered == (0, 3)  # contradicted != covered
    assert s.family_penalty == {"object": 1.0}
    assert (s.M, s.F) == (1.5, 1.0)
    assert math.isclose(s.reward, 2 * 1.5 / (3 + 1.5 + 1))
    # a second family costs separately
    s2 = score_judgment(
        REQS, Judgment(covered=(0, 3), errors=errors + (FactualError("action", "push"),))
    )
    assert s2.family_penalty == {"action": 0.75, "object": 1.0}  # unsupported: mean mass
    assert math.isclose(s2.F, 1.75)


def test_hallucinated_claim_weighs_mean_requirement_mass():
    s = score_judgment(
        REQS, Judgment(covered=(0, 1, 2, 3), errors=(FactualError("action", "then lift it"),))
    )
    assert (s.M, s.F) == (3.0, 0.75)
    assert math.isclose(s.reward, 6 / 6.75)
    # R = 0: a hallucination drives the reward to 0
    assert score_judgment([], Judgment(errors=(FactualError("action", "lift"),))).reward == 0.0
    assert score_judgment([], Judgment()).reward == 1.0


def test_judgment_indices_checked_and_requirements_coerced():
    with pytest.raises(ValueError, match="requirement 7"):
        score_judgment(REQS, Judgment(covered=(7,)))
    reqs = as_requirements('[{"family": "action", "text": "grasp", "mass": 1.0}]')
    assert reqs == [Requirement("action", "grasp", 1.0)]
    with pytest.raises(ValueError, match="family"):
        Requirement("colour", "red", 1.0)
    with pytest.raises(ValueError, match="mass"):
        Requirement("action", "grasp", -1.0)


def test_zero_mass_reference_scores_zero_as_soon_as_a_claim_is_an_error():
    """Review finding: with every requirement of mass 0, errors weighed 0 and any error
    still gave 1.0 (docs: R = 0 gives 0 as soon as any claim is an error)."""
    reqs = [Requirement("action", "grasp", 0.0), Requirement("object", "red block", 0.0)]
    tied = score_judgment(reqs, Judgment((1,), (FactualError("action", "push it", 0),)))
    assert (tied.R, tied.M, tied.F, tied.reward) == (0.0, 0.0, 1.0, 0.0)
    loose = score_judgment(reqs, Judgment((), (FactualError("object", "a blue cube", None),)))
    assert (loose.F, loose.reward) == (1.0, 0.0)
    assert score_judgment(reqs, Judgment((0, 1))).reward == 1.0  # nothing false said
    assert score_judgment([], Judgment((), (FactualError("object", "x", None),))).reward == 0.0
