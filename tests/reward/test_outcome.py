"""Outcome reward: eq. (19) math, logits/top-logprobs readers, grammar and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flora.backends.base import TokenLogprob, VLMResponse
from flora.parsing import Rejection
from flora.reward.outcome import (
    ScoreProbsError,
    expected_reward,
    expected_score,
    outcome_from_probs,
    parse_outcome,
    parse_outcome_response,
    render_outcome,
    score_probs_from_logits,
    score_probs_from_top_logprobs,
)


def test_expected_reward_renormalises_before_expectation():
    # Unnormalised (sum 0.5): renormalised to [0.2, 0.2, 0.2, 0.2, 0.2] -> E = 3 -> 0.5.
    assert expected_reward([0.1] * 5) == pytest.approx(0.5)
    assert expected_score([0.1] * 5) == pytest.approx(3.0)
    assert expected_reward([1, 0, 0, 0, 0]) == 0.0
    assert expected_reward([0, 0, 0, 0, 2.0]) == 1.0
    # E = 0.5*2 + 0.5*5 = 3.5 -> 0.625 (expectation, not argmax)
    assert expected_reward([0, 0.5, 0, 0, 0.5]) == pytest.approx(0.625)


@pytest.mark.parametrize(
    "bad, msg",
    [
        ([0, 0, 0, 0, 0], "sum to 0"),
        ([0.2, 0.2, -0.1, 0.3, 0.4], "negative"),
        ([0.2, float("nan"), 0.2, 0.2, 0.2], "NaN"),
        ([0.25, 0.25, 0.25, 0.25], "exactly 5"),
        ([0.2] * 6, "exactly 5"),
        ([[0.2] * 5], "exactly 5"),
    ],
)
def test_expected_reward_refuses_bad_probabilities(bad, msg):
    with pytest.raises(ScoreProbsError, match=msg):
        expected_reward(bad)


def test_argmax_kept_separately_from_expectation():
    o = outcome_from_probs([0.4, 0.0, 0.0, 0.3, 0.3])
    assert o.argmax_score == 1
    assert o.expected_score == pytest.approx(0.4 + 1.2 + 1.5)
    assert o.reward == pytest.approx((3.1 - 1) / 4)


def test_score_probs_from_logits_numpy_and_torch_agree():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50))
    ids = [11, 12, 13, 14, 15]
    p_np = score_probs_from_logits(logits, ids)
    p_t = score_probs_from_logits(torch.tensor(logits, dtype=torch.float32), ids)
    assert p_np.shape == (3, 5)
    np.testing.assert_allclose(p_np.sum(-1), 1.0)
    np.testing.assert_allclose(p_np, p_t, atol=1e-6)
    # Equals the full softmax restricted to the five tokens, renormalised.
    full = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    sub = full[:, ids]
    np.testing.assert_allclose(p_np, sub / sub.sum(-1, keepdims=True), atol=1e-12)


def test_score_probs_from_logits_bad_input():
    with pytest.raises(ScoreProbsError, match="5 score token ids"):
        score_probs_from_logits(np.zeros(10), [1, 2, 3])
    with pytest.raises(ScoreProbsError, match="outside vocabulary"):
        score_probs_from_logits(np.zeros(10), [1, 2, 3, 4, 10])
    with pytest.raises(ScoreProbsError, match="sum to 0"):
        score_probs_from_logits(np.full(10, -np.inf), [1, 2, 3, 4, 5])


def _tokens(k: int, top: dict[str, float]) -> list[TokenLogprob]:
    return [
        TokenLogprob("score", -0.01, {"score": -0.01}),
        TokenLogprob(":", -0.01, {":": -0.01}),
        TokenLogprob(f" {k}", top.get(f" {k}", -1.0), top),
    ]


def test_top_logprobs_all_present_and_variants_summed():
    top = {
        " 4": math.log(0.5),
        "4": math.log(0.1),
        " 3": math.log(0.2),
        " 5": math.log(0.1),
        " 1": math.log(0.05),
        " 2": math.log(0.05),
        " the": math.log(0.01),
    }
    probs, missing = score_probs_from_top_logprobs(_tokens(4, top), "score: 4")
    assert missing == ()
    raw = np.array([0.05, 0.05, 0.2, 0.6, 0.1])
    np.testing.assert_allclose(probs, raw / raw.sum())


def test_top_logprobs_missing_scores_renormalise_present_ones():
    top = {" 4": math.log(0.6), " 5": math.log(0.2), "x": math.log(0.1)}
    probs, missing = score_probs_from_top_logprobs(_tokens(4, top), "score: 4")
    assert missing == (1, 2, 3)
    np.testing.assert_allclose(probs, [0, 0, 0, 0.75, 0.25])
    resp = VLMResponse(text="score: 4", logprobs=_tokens(4, top))
    o = parse_outcome_response(resp)
    assert not isinstance(o, Rejection)
    assert o.missing_scores == (1, 2, 3)
    assert o.answer_score == 4 and o.argmax_score == 4
    assert o.expected_score == pytest.approx(4.25)


def test_top_logprobs_no_score_token_is_rejection():
    toks = [TokenLogprob("score", 0.0, {}), TokenLogprob(":", 0.0, {}), TokenLogprob(" 4", 0.0, {})]
    # Only the chosen token is a score: fine (one present). Now make none present:
    toks[2] = TokenLogprob(" four", -0.1, {" four": -0.1, " many": -3.0})
    rej = score_probs_from_top_logprobs(toks, "score: four")
    assert isinstance(rej, Rejection)
    assert "no score token" in rej.reason
    rej = score_probs_from_top_logprobs([], "score: 4")
    assert isinstance(rej, Rejection) and "no logprobs" in rej.reason


def test_response_without_logprobs_is_rejected_not_filled():
    rej = parse_outcome_response(VLMResponse(text="score: 3"))
    assert isinstance(rej, Rejection)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_outcome_grammar_round_trip(k):
    assert parse_outcome(render_outcome(k)) == k


@pytest.mark.parametrize(
    "text",
    ["score: 0", "score: 6", "score 3", "Score: 3", "score: 3.5", "score: 3\nextra", "",
     "score: 05", "score: 0005", "score: 00"],
)  # fmt: skip
def test_outcome_grammar_rejects(text):
    assert isinstance(parse_outcome(text), Rejection)


def test_leading_zero_score_is_rejected_not_read_at_the_zero_token():
    """``score: 05`` once parsed as 5 and read the score distribution at the '0' token (the
    model's first-digit alternatives): a silently wrong reward. K is one digit 1..5."""
    toks = [TokenLogprob("score", -0.01), TokenLogprob(":", -0.01), TokenLogprob(" ", -0.01),
            TokenLogprob("0", -0.1, {"0": -0.1, "1": -2.5}),
            TokenLogprob("5", -0.01, {"5": -0.01, "4": -5.0})]  # fmt: skip
    rej = parse_outcome_response(VLMResponse("score: 05", toks))
    assert isinstance(rej, Rejection) and "score 05 outside 1..5" in rej.reason


def test_render_outcome_refuses_out_of_range():
    with pytest.raises(ValueError):
        render_outcome(6)
