"""GRPO pure functions on hand cases: advantages, zero-variance groups, clipping, k3 KL."""

from __future__ import annotations

import math

import pytest
import torch

from training.grpo import group_advantages, grpo_loss, k3_kl


def test_advantages_hand_case():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2]])
    adv, valid = group_advantages(r, eps=1e-4)
    std = math.sqrt(((0.5**2) * 2) / 3)  # sample std of (1, 0, .5, .5) around 0.5
    want = torch.tensor([0.5, -0.5, 0.0, 0.0]) / (std + 1e-4)
    assert torch.allclose(adv[0], want.float(), atol=1e-6)
    assert valid.tolist() == [True, False]
    assert torch.equal(adv[1], torch.zeros(4))


def test_advantages_drop_nan_groups_and_singletons():
    r = torch.tensor([[1.0, float("nan"), 0.0]])
    adv, valid = group_advantages(r)
    assert not valid[0] and torch.equal(adv[0], torch.zeros(3))
    adv1, valid1 = group_advantages(torch.tensor([[0.3]]))
    assert not valid1[0] and adv1.shape == (1, 1)
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 2.0]))


def test_advantages_are_scale_free_and_centered():
    g = torch.Generator().manual_seed(0)
    r = torch.rand((5, 8), generator=g)
    adv, valid = group_advantages(r, eps=0.0)
    assert valid.all()
    assert torch.allclose(adv.mean(dim=1), torch.zeros(5), atol=1e-6)
    adv2, _ = group_advantages(3 * r + 7, eps=0.0)
    assert torch.allclose(adv, adv2, atol=1e-5)


def test_zero_variance_group_gives_exactly_zero_gradient():
    """A batch of two groups: the all-equal group's tokens get exactly zero gradient,
    KL term included (beta > 0), while the other group's do not."""
    torch.manual_seed(0)
    rewards = torch.tensor([[0.7, 0.7, 0.7], [1.0, 0.0, 0.5]])
    adv, valid = group_advantages(rewards)
    logits = torch.randn(6, 5, requires_grad=True)  # 6 completions x 5 tokens
    logp = torch.nn.functional.logsigmoid(logits)
    ref = logp.detach() + 0.3  # reference disagrees, so KL has a gradient everywhere
    mask = torch.ones(6, 5)
    mask[:3] = 0.0  # the trainer drops invalid groups from the loss tokens
    assert valid.tolist() == [False, True]
    parts = grpo_loss(
        logp, logp.detach(), adv.flatten(), mask, clip_eps=0.2, beta=0.5, ref_logp=ref
    )
    parts.loss.backward()
    assert torch.equal(logits.grad[:3], torch.zeros(3, 5))
    assert logits.grad[3:].abs().sum() > 0
    assert parts.n_tokens == 15


def test_all_groups_dropped_is_a_zero_loss():
    logits = torch.randn(2, 3, requires_grad=True)
    parts = grpo_loss(logits, logits.detach(), torch.zeros(2), torch.zeros(2, 3), beta=0.0)
    parts.loss.backward()
    assert float(parts.loss.detach()) == 0.0 and torch.equal(logits.grad, torch.zeros(2, 3))


@pytest.mark.parametrize(
    ("shift", "adv", "zero_grad"),
    [
        (math.log(1.5), 1.0, True),  # ratio 1.5 > 1.2 and A > 0: clipped
        (math.log(1.5), -1.0, False),  # ratio 1.5, A < 0: the min keeps the unclipped term
        (math.log(0.5), -1.0, True),  # ratio 0.5 < 0.8 and A < 0: clipped
        (math.log(0.5), 1.0, False),  # ratio 0.5, A > 0: unclipped
        (math.log(1.1), 1.0, False),  # inside [0.8, 1.2]: never clipped
    ],
)
def test_clipping(shift, adv, zero_grad):
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach() - shift  # ratio = exp(shift)
    parts = grpo_loss(logp, old, torch.tensor([adv]), torch.ones(1, 2), clip_eps=0.2, beta=0.0)
    parts.loss.backward()
    if zero_grad:
        assert torch.equal(logp.grad, torch.zeros(1, 2))
        assert parts.clip_fraction == 1.0
    else:
        ratio = math.exp(shift)
        # d/dlogp of -(ratio*A)/2 per token = -ratio*A/2
        assert torch.allclose(logp.grad, torch.full((1, 2), -ratio * adv / 2), atol=1e-6)
        assert parts.clip_fraction == 0.0


def test_on_policy_gradient_is_advantage_weighted_logprob_gradient():
    logp = torch.tensor([[-0.5, -1.5, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # last token is padding
    parts = grpo_loss(logp, logp.detach(), torch.tensor([2.0]), mask, beta=0.0, n_tokens=4)
    parts.loss.backward()
    # loss = -sum(A * ratio) / n_tokens over the two real tokens; dratio/dlogp = 1
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.5, 0.0]]))
    assert parts.n_tokens == 2 and abs(parts.ratio_mean - 1.0) < 1e-7


def test_k3_kl_hand_case_and_beta_paths():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.25)]])
    kl = k3_kl(logp, ref)
    # d = ref - logp = (log 0.5, 0): e^d - d - 1 = (0.5 - log 0.5 - 1, 0)
    assert torch.allclose(kl, torch.tensor([[0.5 + math.log(2.0) - 1.0, 0.0]]), atol=1e-7)
    assert (k3_kl(torch.randn(4, 4), torch.randn(4, 4)) >= 0).all()

    x = logp.clone().requires_grad_(True)
    mask = torch.ones(1, 2)
    with_kl = grpo_loss(x, x.detach(), torch.tensor([0.0]), mask, beta=0.1, ref_logp=ref)
    # advantage 0: the loss is beta * mean k3
    assert abs(float(with_kl.loss.detach()) - 0.1 * float(kl.mean())) < 1e-7
    assert abs(with_kl.kl - float(kl.mean())) < 1e-7
    with_kl.loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp)
    assert torch.allclose(x.grad, 0.1 * (1 - torch.exp(ref - logp)) / 2, atol=1e-7)

    # beta = 0: no reference needed, KL logged as 0, loss is the policy term only
    y = logp.clone().requires_grad_(True)
    no_kl = grpo_loss(y, y.detach(), torch.tensor([1.0]), mask, beta=0.0)
    assert no_kl.kl == 0.0 and abs(float(no_kl.loss.detach()) + 1.0) < 1e-7
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(y, y.detach(), torch.tensor([1.0]), mask, beta=0.02)


def test_token_normalisation_is_invariant_to_micro_batching():
    torch.manual_seed(1)
    logits = torch.randn(4, 6, requires_grad=True)
    mask = (torch.rand(4, 6) > 0.3).float()
    adv = torch.randn(4)
    ref = torch.randn(4, 6)
    full = grpo_loss(logits, logits.detach(), adv, mask, beta=0.02, ref_logp=ref)
    full.loss.backward()
    g_full = logits.grad.clone()
    logits.grad = None
    n = int(mask.sum())
    total = 0.0
    for rows in ([0], [1, 2], [3]):
        part = grpo_loss(
            logits[rows],
            logits[rows].detach(),
            adv[rows],
            mask[rows],
            beta=0.02,
            ref_logp=ref[rows],
            n_tokens=n,
        )
        part.loss.backward()
        total += float(part.loss)
    assert abs(total - float(full.loss)) < 1e-6
    assert torch.allclose(logits.grad, g_full, atol=1e-7)


def test_bounded_k3_is_k3_below_the_bound_and_linear_above():
    c = 3.0
    d = torch.tensor([-2.0, 0.0, 1.0, c, c + 2.0, 1000.0])
    logp = torch.zeros_like(d, requires_grad=True)
    kl = k3_kl(logp, d, bound=c)  # ref - logp = d
    plain = torch.exp(d[:4]) - d[:4] - 1.0
    assert torch.allclose(kl[:4], plain, atol=1e-6)  # unchanged up to the bound
    # beyond it: the value at the bound plus its slope times the excess
    at_c = math.exp(c) - c - 1.0
    want = torch.tensor([at_c + math.expm1(c) * 2.0, at_c + math.expm1(c) * (1000.0 - c)])
    assert torch.allclose(kl[4:], want, rtol=1e-6)
    kl.sum().backward()
    # d k3 / d logp = 1 - e^d below the bound; the slope's value, finite, above it
    g_below = 1.0 - torch.exp(d[:3])
    assert torch.allclose(logp.grad[:3], g_below, atol=1e-6)
    assert torch.allclose(logp.grad[4:], torch.full((2,), -math.expm1(c)), rtol=1e-6)
    assert torch.isfinite(logp.grad).all()
    # the unbounded estimator overflows on the same token
    assert not torch.isfinite(k3_kl(torch.zeros(1), torch.tensor([1000.0]))).all()


def test_one_rare_token_swamps_plain_k3_but_not_the_bounded_step_kl():
    """A spike from a single sampled token the policy moved away from (d = 15 among 99
    tokens where the two agree): the step's mean KL reads ~3·10^4 with plain k3, a few
    units bounded; the logged max log-ratio names the token either way."""
    ref = torch.zeros(1, 100)
    ref[0, 37] = 15.0
    mask = torch.ones(1, 100)
    logp = torch.zeros(1, 100)
    plain = grpo_loss(logp, logp, torch.tensor([0.0]), mask, beta=0.02, ref_logp=ref)
    bounded = grpo_loss(
        logp, logp, torch.tensor([0.0]), mask, beta=0.02, ref_logp=ref, kl_bound=3.0
    )
    assert plain.kl > 3e4 and bounded.kl < 3.0  # (e^3 - 4 + (e^3 - 1) * 12) / 100 = 2.45
    assert plain.log_ratio_max == bounded.log_ratio_max == 15.0
    # masked-out tokens do not count towards the max
    mask[0, 37] = 0.0
    hidden = grpo_loss(logp, logp, torch.tensor([0.0]), mask, beta=0.02, ref_logp=ref)
    assert hidden.log_ratio_max == 0.0 and hidden.kl == 0.0
    with pytest.raises(ValueError, match="kl_bound"):
        grpo_loss(logp, logp, torch.tensor([0.0]), mask, beta=0.02, ref_logp=ref, kl_bound=0.0)
