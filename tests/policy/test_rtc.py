"""Acceptance tests for training-time / inference-time RTC (seed 002, DESIGN §3.6-3.7)."""

from __future__ import annotations

import math

import pytest
import torch

from flora.policy import rtc
from flora.policy.rtc import (
    DelayDistribution,
    SoftOverlap,
    guidance_weight,
    guided_velocity,
    prefix_weights,
    sample,
    training_loss,
)

B, H, A = 3, 8, 2


class Recorder:
    """A velocity model that records every (x, tau) it is called with.

    It returns ``out`` (a leaf tensor, so tests can inspect its gradient) or a constant.
    """

    def __init__(self, out: torch.Tensor | None = None, const: float = 0.0) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.out = out
        self.const = const

    def __call__(self, obs, x, tau):
        self.calls.append((x.detach().clone(), tau.detach().clone()))
        if self.out is not None:
            return self.out
        return torch.full_like(x, self.const)


def _data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    actions = torch.randn(B, H, A, generator=g)
    noise = torch.randn(B, H, A, generator=g)
    tau = torch.tensor([0.1, 0.5, 0.9])
    return actions, noise, tau


# ------------------------------------------------------------------ training_loss
def test_prefix_inputs_equal_ground_truth_and_carry_timestep_one():
    actions, noise, tau = _data()
    delays = torch.tensor([0, 2, 5])
    rec = Recorder()
    training_loss(rec, {}, actions, delays, tau=tau, noise=noise)
    assert len(rec.calls) == 1
    x, t = rec.calls[0]
    assert x.shape == (B, H, A) and t.shape == (B, H)
    for b, d in enumerate(delays.tolist()):
        assert torch.equal(x[b, :d], actions[b, :d])
        assert torch.all(t[b, :d] == 1.0)
        # Postfix: noised with the sample's own tau, timestep tau.
        want = tau[b] * actions[b, d:] + (1 - tau[b]) * noise[b, d:]
        torch.testing.assert_close(x[b, d:], want)
        assert torch.allclose(t[b, d:], tau[b].expand(H - d))


def test_gradients_reach_no_prefix_output():
    actions, noise, tau = _data()
    delays = torch.tensor([1, 3, 7])
    out = torch.randn(B, H, A, requires_grad=True)
    loss = training_loss(Recorder(out=out), {}, actions, delays, tau=tau, noise=noise)
    loss.backward()
    for b, d in enumerate(delays.tolist()):
        assert torch.all(out.grad[b, :d] == 0), "a prefix output received gradient"
        assert torch.all(out.grad[b, d:] != 0), "a postfix output received no gradient"


def test_loss_is_normalised_by_postfix_elements_only():
    actions, noise, tau = _data()
    delays = torch.tensor([0, 4, 6])
    out = torch.randn(B, H, A)
    loss = training_loss(Recorder(out=out), {}, actions, delays, tau=tau, noise=noise)
    err = (out - (actions - noise)) ** 2
    total = sum(err[b, d:].sum() for b, d in enumerate(delays.tolist()))
    n_post = sum(H - d for d in delays.tolist()) * A
    torch.testing.assert_close(loss, total / n_post)
    # Not the mean of per-sample means (which would weight short postfixes up).
    per_sample = torch.stack([err[b, d:].mean() for b, d in enumerate(delays.tolist())]).mean()
    assert not torch.isclose(loss, per_sample)
    # Prefix outputs do not matter at all.
    out2 = out.clone()
    out2[1, :4] += 100.0
    out2[2, :6] -= 50.0
    loss2 = training_loss(Recorder(out=out2), {}, actions, delays, tau=tau, noise=noise)
    torch.testing.assert_close(loss, loss2)


def test_zero_delay_is_plain_flow_matching():
    actions, noise, tau = _data()
    out = torch.randn(B, H, A)
    rec = Recorder(out=out)
    loss = training_loss(rec, {}, actions, None, tau=tau, noise=noise)
    x, t = rec.calls[0]
    torch.testing.assert_close(x, tau[:, None, None] * actions + (1 - tau[:, None, None]) * noise)
    torch.testing.assert_close(loss, ((out - (actions - noise)) ** 2).mean())
    assert torch.allclose(t, tau[:, None].expand(B, H))


def test_delay_argument_forms_and_validation():
    actions, noise, tau = _data()
    rec = Recorder()
    training_loss(rec, {}, actions, 3, tau=tau, noise=noise)
    assert torch.all(rec.calls[-1][1][:, :3] == 1) and torch.all(rec.calls[-1][1][:, 3:] < 1)
    g = torch.Generator().manual_seed(0)
    training_loss(rec, {}, actions, DelayDistribution.uniform(5), generator=g)
    with pytest.raises(ValueError):
        training_loss(rec, {}, actions, torch.tensor([0, H, 1]))
    with pytest.raises(ValueError):
        training_loss(rec, {}, actions, torch.tensor([0, -1, 1]))
    with pytest.raises(ValueError):
        training_loss(rec, {}, actions, torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        training_loss(rec, {}, actions, DelayDistribution.uniform(H + 1))


def test_delay_distributions():
    assert DelayDistribution.uniform(4).probs == pytest.approx((0.25,) * 4)
    e = DelayDistribution.exponential(5, 0.5)
    assert e.probs == pytest.approx([2**-k / sum(2**-j for j in range(5)) for k in range(5)])
    t = DelayDistribution.table([0, 0, 3, 1])
    assert t.probs == pytest.approx((0, 0, 0.75, 0.25))
    g = torch.Generator().manual_seed(1)
    draws = t.sample(4000, g)
    assert set(draws.tolist()) <= {2, 3}
    assert abs((draws == 2).float().mean().item() - 0.75) < 0.03
    d = e.sample(20000, torch.Generator().manual_seed(2))
    freq = torch.bincount(d, minlength=5).float() / d.numel()
    assert torch.all(freq[:-1] > freq[1:])  # exponentially decreasing
    with pytest.raises(ValueError):
        DelayDistribution.uniform(0)
    with pytest.raises(ValueError):
        DelayDistribution.table([-1, 2])


def test_soft_overlap_training_timesteps():
    actions, noise, tau = _data()
    rec = Recorder()
    delays = torch.tensor([0, 2, 4])
    soft = SoftOverlap(strength=0.75, schedule="exp")
    training_loss(rec, {}, actions, delays, tau=tau, noise=noise, soft_overlap=soft)
    x, t = rec.calls[0]
    for b, d in enumerate(delays.tolist()):
        s = max(d, 1)
        w = prefix_weights(d, s, H, "exp")
        base = torch.where(torch.arange(H) < d, torch.ones(H), 0.75 * w)
        want_t = base + (1 - base) * tau[b]
        torch.testing.assert_close(t[b], want_t)
        torch.testing.assert_close(
            x[b], want_t[:, None] * actions[b] + (1 - want_t[:, None]) * noise[b]
        )
        assert torch.equal(x[b, :d], actions[b, :d])


# --------------------------------------------------------------------- prefix_weights
def _design_weights(d: int, s: int, H: int, schedule: str) -> list[float]:
    """DESIGN §3.7, written out element by element."""
    out = []
    for i in range(H):
        if i < d:
            out.append(1.0)
        elif i < H - s:
            c = (H - s - i) / (H - s - d + 1)
            out.append(
                {
                    "exp": c * (math.exp(c) - 1) / (math.e - 1),
                    "linear": c,
                    "ones": 1.0,
                    "zeros": 0.0,
                }[schedule]
            )
        else:
            out.append(0.0)
    return out


@pytest.mark.parametrize("schedule", ["exp", "linear", "ones", "zeros"])
@pytest.mark.parametrize(
    ("d", "s", "H"), [(0, 1, 8), (2, 2, 8), (3, 4, 8), (4, 4, 8), (1, 3, 10), (5, 5, 50)]
)
def test_prefix_weights_match_design_formula(schedule, d, s, H):
    w = prefix_weights(d, s, H, schedule)
    assert w.shape == (H,)
    torch.testing.assert_close(w, torch.tensor(_design_weights(d, s, H, schedule)))


def test_prefix_weights_known_values():
    # d=2, s=2, H=8: c = 4/5, 3/5, 2/5, 1/5 on i = 2..5.
    w = prefix_weights(2, 2, 8, "linear")
    torch.testing.assert_close(w, torch.tensor([1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0.0]))
    w = prefix_weights(2, 2, 8, "exp")
    assert w[2].item() == pytest.approx(0.8 * (math.exp(0.8) - 1) / (math.e - 1))
    assert torch.all(w[2:6][:-1] > w[2:6][1:])
    with pytest.raises(ValueError):
        prefix_weights(2, 2, 8, "cosine")


def test_delay_beyond_h_minus_s_refused():
    with pytest.raises(ValueError, match="H - s"):
        prefix_weights(5, 4, 8)
    prefix = torch.zeros(B, H, A)
    with pytest.raises(ValueError, match="H - s"):
        sample(Recorder(), {}, prefix, 5, 4, "training_time", s=4)
    with pytest.raises(ValueError, match="H - s"):
        sample(Recorder(), {}, prefix, 3, 4, "inference_time", s=6)
    with pytest.raises(ValueError):
        sample(Recorder(), {}, prefix, -1, 4, "plain")
    with pytest.raises(ValueError):
        sample(Recorder(), {}, prefix, 1, 4, "plain", s=0)
    # d = H - s is the largest allowed delay.
    sample(Recorder(), {}, prefix, 4, 2, "training_time", s=4)


# ----------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("d", [0, 1, 3])
def test_training_time_sampling_overwrites_prefix_every_step(d):
    steps = 5
    g = torch.Generator().manual_seed(0)
    prefix = torch.randn(B, H - max(d, 1), A, generator=g)
    noise = torch.randn(B, H, A, generator=g)
    rec = Recorder(const=0.3)
    out = sample(rec, {}, prefix, d, steps, "training_time", shape=(B, H, A), noise=noise)
    assert len(rec.calls) == steps
    for k, (x, t) in enumerate(rec.calls):
        assert torch.equal(x[:, :d], prefix[:, :d])
        assert torch.all(t[:, :d] == 1.0)
        assert torch.allclose(t[:, d:], torch.full((B, H - d), k / steps))
    # Euler with a constant velocity: postfix = noise + 1 * v; prefix returned exactly.
    torch.testing.assert_close(out[:, d:], noise[:, d:] + 0.3)
    assert torch.equal(out[:, :d], prefix[:, :d])


def test_prefix_overwritten_even_if_model_moves_it():
    """A model that pushes every token still sees the committed actions at every step."""
    steps, d = 4, 2
    prefix = torch.randn(B, H - d, A)
    rec = Recorder(const=10.0)
    sample(rec, {}, prefix, d, steps, "training_time", s=2, shape=(B, H, A))
    for x, _ in rec.calls:
        assert torch.equal(x[:, :d], prefix[:, :d])


@pytest.mark.parametrize("method", ["plain", "naive_async", "synchronous"])
def test_plain_sampling_ignores_prefix(method):
    steps = 3
    rec = Recorder(const=1.0)
    noise = torch.randn(B, H, A)
    prefix = torch.randn(B, H - 2, A) + 50
    out = sample(rec, {}, prefix, 2, steps, method, shape=(B, H, A), noise=noise)
    assert len(rec.calls) == steps
    for k, (x, t) in enumerate(rec.calls):
        assert torch.allclose(t, torch.full((B, H), k / steps))
        assert not torch.equal(x[:, :2], prefix[:, :2])
    torch.testing.assert_close(out, noise + 1.0)
    out2 = sample(Recorder(const=1.0), {}, None, 0, steps, method, shape=(B, H, A), noise=noise)
    torch.testing.assert_close(out2, out)


def test_sample_argument_validation():
    with pytest.raises(ValueError, match="unknown sampling method"):
        sample(Recorder(), {}, None, 0, 2, "magic", shape=(B, H, A))
    with pytest.raises(ValueError):
        sample(Recorder(), {}, None, 0, 0, "plain", shape=(B, H, A))
    with pytest.raises(ValueError, match="shape"):
        sample(Recorder(), {}, None, 0, 2, "plain")
    with pytest.raises(ValueError, match="prefix"):
        sample(Recorder(), {}, None, 2, 2, "training_time", shape=(B, H, A))
    with pytest.raises(ValueError, match="overlap"):  # needs H - s rows
        sample(Recorder(), {}, torch.zeros(B, 2, A), 2, 2, "inference_time", shape=(B, H, A))


class SmallMLP(torch.nn.Module):
    """A small non-linear velocity model (float64) for the finite-difference checks."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.nn.Parameter(
            torch.randn(H * A + H, 32, generator=g, dtype=torch.float64) / 4
        )
        self.w2 = torch.nn.Parameter(torch.randn(32, H * A, generator=g, dtype=torch.float64) / 6)

    def forward(self, obs, x, tau):
        h = torch.tanh(torch.cat([x.flatten(1), tau], dim=1) @ self.w1)
        return (h @ self.w2).view_as(x) + obs["bias"]


def test_inference_time_guidance_matches_finite_difference_vjp():
    torch.manual_seed(0)
    model = SmallMLP()
    obs = {"bias": torch.randn(2, H, A, dtype=torch.float64)}
    x = torch.randn(2, H, A, dtype=torch.float64)
    y = torch.randn(2, H, A, dtype=torch.float64)
    d, s, tau = 2, 3, 0.4
    w = prefix_weights(d, s, H, "exp").double()
    v_g, v, g = guided_velocity(model, obs, x, tau, y, w, beta=5.0)

    def f(xx):
        t = torch.full((2, H), tau, dtype=torch.float64)
        return xx + (1 - tau) * model(obs, xx, t)

    with torch.no_grad():
        e = (y - f(x)) * w.view(1, H, 1)
        fd = torch.zeros_like(x)
        h = 1e-6
        for idx in range(x.numel()):
            dx = torch.zeros_like(x).view(-1)
            dx[idx] = h
            dx = dx.view_as(x)
            jcol = (f(x + dx) - f(x - dx)) / (2 * h)
            fd.view(-1)[idx] = (e * jcol).sum()
    torch.testing.assert_close(g, fd, rtol=1e-6, atol=1e-8)
    with torch.no_grad():
        v_ref = model(obs, x, torch.full((2, H), tau, dtype=torch.float64))
    torch.testing.assert_close(v, v_ref)
    torch.testing.assert_close(v_g, v + guidance_weight(tau, 5.0) * g)
    # Rows past H - s carry zero weight: the error there contributes nothing.
    y2 = y.clone()
    y2[:, H - s :] += 100.0
    _, _, g2 = guided_velocity(model, obs, x, tau, y2, w, beta=5.0)
    torch.testing.assert_close(g2, g)


def test_guidance_weight_clipped_at_beta():
    assert guidance_weight(0.0, 5.0) == 5.0
    # (1 - tau) / (tau r^2) with r^2 = (1-tau)^2 / (tau^2 + (1-tau)^2); at 0.5 -> 2.
    assert guidance_weight(0.5, 5.0) == pytest.approx(2.0)
    assert guidance_weight(0.1, 5.0) == 5.0
    assert guidance_weight(0.8, 5.0) == pytest.approx((0.64 + 0.04) / (0.8 * 0.2))
    assert guidance_weight(0.5, 1.5) == 1.5


def test_inference_time_sampling_pulls_towards_previous_chunk():
    model = SmallMLP(seed=3)
    obs = {"bias": torch.zeros(4, H, A, dtype=torch.float64)}
    noise = torch.randn(4, H, A, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    d, s = 2, 2
    prev = torch.full((4, H - s, A), 1.5, dtype=torch.float64)
    calls = []

    def counted(o, x, t):
        calls.append(1)
        return model(o, x, t)

    plain = sample(counted, obs, prev, d, 5, "plain", s=s, shape=(4, H, A), noise=noise)
    calls.clear()
    guided = sample(counted, obs, prev, d, 5, "inference_time", s=s, shape=(4, H, A), noise=noise)
    assert len(calls) == 5  # one forward (+ one VJP) per step
    err_plain = (plain[:, :d] - 1.5).abs().mean()
    err_guided = (guided[:, :d] - 1.5).abs().mean()
    assert err_guided < 0.5 * err_plain
    # "zeros" schedule: only the prefix is guided, so the far overlap is left freer.
    far = slice(d + 1, H - s)
    g_exp = sample(
        model, obs, prev, d, 5, "inference_time", s=s, shape=(4, H, A), noise=noise, schedule="ones"
    )
    g_zero = sample(
        model,
        obs,
        prev,
        d,
        5,
        "inference_time",
        s=s,
        shape=(4, H, A),
        noise=noise,
        schedule="zeros",
    )
    assert (g_exp[:, far] - 1.5).abs().mean() < (g_zero[:, far] - 1.5).abs().mean()


def test_soft_sampling_starts_overlap_at_intermediate_time():
    d, s, steps = 1, 1, 4
    prefix = torch.randn(B, H - s, A)
    noise = torch.randn(B, H, A)
    rec = Recorder(const=0.0)
    out = sample(
        rec,
        {},
        prefix,
        d,
        steps,
        "training_time_soft",
        s=s,
        shape=(B, H, A),
        noise=noise,
        soft_strength=0.6,
    )
    w = prefix_weights(d, s, H, "exp")
    base = torch.where(torch.arange(H) < d, torch.ones(H), 0.6 * w)
    assert len(rec.calls) == steps
    for k, (x, t) in enumerate(rec.calls):
        torch.testing.assert_close(t, (base + (1 - base) * k / steps).expand(B, H))
        assert torch.equal(x[:, :d], prefix[:, :d])
    # Zero velocity: the overlap keeps its initial hint tau0*prev + (1-tau0)*noise.
    y = torch.zeros(B, H, A)
    y[:, : H - s] = prefix
    want = base[None, :, None] * y + (1 - base[None, :, None]) * noise
    torch.testing.assert_close(out[:, d:], want[:, d:])


def test_methods_listed():
    assert set(rtc.METHODS) >= {
        "plain",
        "training_time",
        "inference_time",
        "naive_async",
        "synchronous",
        "training_time_soft",
    }
