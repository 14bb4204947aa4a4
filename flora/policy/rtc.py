"""Real-time chunking for flow-matching action experts (seed 002, DESIGN §3.6/§3.7).

Flow convention everywhere: tau = 0 is noise, tau = 1 is data, ``x_tau = tau*A + (1-tau)*eps``,
velocity target ``A - eps``, Euler integration from 0 to 1.

* :func:`training_loss` — training-time RTC (Algorithm 1 of the paper): a per-sample delay
  ``d``; the first ``d`` tokens get the ground-truth actions with timestep 1, the postfix is
  noised with the sample's tau, and the loss is taken on the postfix only, normalised by the
  number of postfix elements.
* :func:`sample` — ``plain`` flow sampling, ``training_time`` (prefix and its timesteps are
  overwritten before every denoising step), ``inference_time`` (RTC pseudoinverse guidance,
  Black et al. 2025, arXiv 2506.07339: one VJP per step, soft prefix weights, guidance
  weight clipped at beta) and ``training_time_soft`` (beyond the paper: the overlap after
  the prefix is fed as a partially-noised hint at an intermediate timestep; see
  ``docs/policy.md``). ``naive_async`` and ``synchronous`` are execution strategies of the
  runtime/benchmark that sample with ``plain``; they are accepted here as aliases.

Any callable ``model(obs, x, tau) -> velocity`` works, with ``x`` (B, H, A) and ``tau`` (B, H).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

VelocityModel = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]
Schedule = Literal["exp", "linear", "ones", "zeros"]
SCHEDULES: tuple[str, ...] = ("exp", "linear", "ones", "zeros")
METHODS: tuple[str, ...] = (
    "plain",
    "training_time",
    "inference_time",
    "training_time_soft",
    "naive_async",
    "synchronous",
)
DEFAULT_BETA = 5.0  # RTC's maximum guidance weight
DEFAULT_SOFT_STRENGTH = 0.75  # beyond-paper variant: overlap hint timestep = strength * W_i


def check_delay(d: int, s: int, H: int) -> None:
    """Raise ValueError unless ``0 <= d <= H - s`` and ``1 <= s <= H`` (seed 002 Fig. 1)."""
    if not 1 <= s <= H:
        raise ValueError(f"execution horizon s={s} must satisfy 1 <= s <= H={H}")
    if d < 0:
        raise ValueError(f"delay d={d} must be >= 0")
    if d > H - s:
        raise ValueError(
            f"delay d={d} exceeds H - s = {H} - {s} = {H - s}: the prefix would need actions "
            "the previous chunk does not have"
        )


def prefix_weights(d: int, s: int, H: int, schedule: str = "exp") -> torch.Tensor:
    """RTC soft-mask weights W (H,) over the new chunk (RTC eq. 5, DESIGN §3.7).

    ``W_i = 1`` for ``i < d`` (committed prefix); for ``d <= i < H - s`` (the rest of the
    overlap with the previous chunk) ``c_i (e^{c_i} - 1)/(e - 1)`` with
    ``c_i = (H - s - i)/(H - s - d + 1)`` ("exp"), or ``c_i`` ("linear"), or 1 ("ones": the
    whole overlap as a hard mask), or 0 ("zeros": a hard mask on the prefix only); ``W_i = 0``
    for ``i >= H - s``.
    """
    check_delay(d, s, H)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown prefix-weight schedule {schedule!r}; expected {SCHEDULES}")
    i = torch.arange(H, dtype=torch.float64)
    end = H - s
    c = (end - i) / (end - d + 1)
    if schedule == "exp":
        mid = c * torch.expm1(c) / (math.e - 1)
    elif schedule == "linear":
        mid = c
    elif schedule == "ones":
        mid = torch.ones_like(c)
    else:
        mid = torch.zeros_like(c)
    w = torch.where(i < d, torch.ones_like(c), torch.where(i < end, mid, torch.zeros_like(c)))
    return w.float()


# --------------------------------------------------------------------------- delays
@dataclass(frozen=True)
class DelayDistribution:
    """A distribution over integer delays ``0 .. len(probs)-1`` for training-time RTC."""

    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.probs or any(p < 0 for p in self.probs) or sum(self.probs) <= 0:
            raise ValueError(f"DelayDistribution: invalid weights {self.probs}")

    @classmethod
    def uniform(cls, max_delay: int) -> DelayDistribution:
        """Uniform on ``[0, max_delay)`` (the paper's real-robot setting, max_delay=10)."""
        if max_delay < 1:
            raise ValueError(f"max_delay must be >= 1, got {max_delay}")
        return cls(tuple([1.0 / max_delay] * max_delay))

    @classmethod
    def exponential(cls, max_delay: int, ratio: float = 0.5) -> DelayDistribution:
        """Exponentially decreasing weights ``ratio**d`` on ``[0, max_delay)`` (the paper's
        simulated setting; higher delays need less supervision)."""
        if max_delay < 1 or not 0 < ratio <= 1:
            raise ValueError("exponential: need max_delay >= 1 and 0 < ratio <= 1")
        w = [ratio**k for k in range(max_delay)]
        z = sum(w)
        return cls(tuple(x / z for x in w))

    @classmethod
    def table(cls, weights: Sequence[float]) -> DelayDistribution:
        """Any given table of (unnormalised) weights for delays 0, 1, 2, ..."""
        z = float(sum(weights))
        return cls(tuple(float(x) / z if z > 0 else float(x) for x in weights))

    @property
    def max_delay(self) -> int:
        """Exclusive upper bound of the support."""
        return len(self.probs)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` iid delays as a LongTensor."""
        p = torch.tensor(self.probs, dtype=torch.float64)
        return torch.multinomial(p, n, replacement=True, generator=generator)


@dataclass(frozen=True)
class SoftOverlap:
    """Beyond-paper training-time variant: also condition softly on the overlap.

    Tokens ``d <= i < H - s`` (previous chunk's plan beyond the committed prefix) are fed at
    an intermediate timestep ``strength * W_i`` (W from :func:`prefix_weights`), i.e. as a
    partially-noised hint that the model learns to trust only as far as it is consistent
    with the observation. ``execution_horizon`` is the s used to place the overlap end for
    a sampled delay: ``None`` means ``max(d, 1)`` (the benchmark rule), an int fixes it.
    """

    strength: float = DEFAULT_SOFT_STRENGTH
    schedule: str = "exp"
    execution_horizon: int | None = None

    def s_for(self, d: int, H: int) -> int:
        """Execution horizon used with delay ``d``."""
        s = max(d, 1) if self.execution_horizon is None else self.execution_horizon
        check_delay(d, s, H)
        return s


def token_time_offsets(
    delays: torch.Tensor, H: int, soft: SoftOverlap | None = None
) -> torch.Tensor:
    """Per-token base timestep ``tau0`` (B, H): 1 on the prefix, ``strength*W_i`` on the soft
    overlap (only with ``soft``), 0 elsewhere. A token's timestep is ``tau0 + (1-tau0)*tau``."""
    H_idx = torch.arange(H, device=delays.device)
    if soft is None:
        return (H_idx[None, :] < delays[:, None]).float()
    if not 0.0 <= soft.strength <= 1.0:
        raise ValueError(f"SoftOverlap.strength must lie in [0, 1], got {soft.strength}")
    table = {}
    for d in sorted(set(int(v) for v in delays.tolist())):
        w = soft.strength * prefix_weights(d, soft.s_for(d, H), H, soft.schedule)
        w[:d] = 1.0  # the committed prefix is exact data
        table[d] = w
    return torch.stack([table[int(v)] for v in delays.tolist()]).to(delays.device)


# --------------------------------------------------------------------------- training
def training_loss(
    model: VelocityModel,
    obs: Any,
    actions: torch.Tensor,
    delays: torch.Tensor | DelayDistribution | int | None = None,
    *,
    tau: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    soft_overlap: SoftOverlap | None = None,
) -> torch.Tensor:
    """Training-time RTC flow-matching loss (seed 002 Algorithm 1).

    ``actions`` (B, H, A) ground-truth chunks. ``delays``: explicit per-sample LongTensor
    (B,), one int for all, a :class:`DelayDistribution` to sample from, or ``None`` (= 0,
    plain flow matching). Prefix tokens ``i < d`` get the ground truth and timestep 1; the
    postfix is ``tau*A + (1-tau)*eps`` with the sample's tau ~ U(0, 1). The squared error to
    ``A - eps`` is summed over postfix elements and divided by their number.
    """
    if actions.dim() != 3:
        raise ValueError(f"actions must be (B, H, A), got {tuple(actions.shape)}")
    B, H, A = actions.shape
    dev = actions.device
    if delays is None:
        delays = torch.zeros(B, dtype=torch.long, device=dev)
    elif isinstance(delays, DelayDistribution):
        if delays.max_delay > H:
            raise ValueError(f"delay distribution reaches {delays.max_delay - 1} >= H={H}")
        delays = delays.sample(B, generator).to(dev)
    elif isinstance(delays, int):
        delays = torch.full((B,), delays, dtype=torch.long, device=dev)
    delays = delays.to(dev).long()
    if delays.shape != (B,):
        raise ValueError(f"delays must be (B,) = ({B},), got {tuple(delays.shape)}")
    if (delays < 0).any() or (delays >= H).any():
        raise ValueError(f"delays must lie in [0, H) = [0, {H}), got {delays.tolist()}")
    gdev = generator.device if generator is not None else dev  # a CPU generator may drive
    if tau is None:  # GPU training: draw on the generator's device, then move
        tau = torch.rand(B, generator=generator, device=gdev).to(dev)
    if noise is None:
        noise = torch.randn(
            actions.shape, generator=generator, device=gdev, dtype=actions.dtype
        ).to(dev)
    tau0 = token_time_offsets(delays, H, soft_overlap).to(actions.dtype)
    tau_tok = tau0 + (1 - tau0) * tau[:, None].to(actions.dtype)  # prefix -> exactly 1
    prefix = torch.arange(H, device=dev)[None, :] < delays[:, None]
    x = tau_tok[..., None] * actions + (1 - tau_tok[..., None]) * noise
    # Prefix tokens are the ground truth itself (tau=1 already gives that; make it exact).
    x = torch.where(prefix[..., None], actions, x)
    tau_tok = torch.where(prefix, torch.ones_like(tau_tok), tau_tok)
    v = model(obs, x, tau_tok)
    err = (v - (actions - noise)) ** 2
    post = (~prefix)[..., None].to(err.dtype)
    return (err * post).sum() / (post.sum() * A + 1e-8)


# --------------------------------------------------------------------------- sampling
def guidance_weight(tau: float, beta: float = DEFAULT_BETA) -> float:
    """RTC/ΠGDM guidance weight ``min(beta, (1-tau)/(tau*r^2))``,
    ``r^2 = (1-tau)^2/(tau^2 + (1-tau)^2)``; infinite at tau=0, hence clipped."""
    if tau <= 0:
        return beta
    if tau >= 1:
        raise ValueError("guidance_weight: tau must be < 1")
    r2 = (1 - tau) ** 2 / (tau**2 + (1 - tau) ** 2)
    return min(beta, (1 - tau) / (tau * r2))


def guided_velocity(
    model: VelocityModel,
    obs: Any,
    x: torch.Tensor,
    tau: float,
    target: torch.Tensor,
    weights: torch.Tensor,
    beta: float = DEFAULT_BETA,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One inference-time RTC step: returns ``(v + w*g, v, g)``.

    ``f(x) = x + (1 - tau) v(x)`` is the one-step denoised estimate and
    ``g = (target - f(x))^T diag(W) df/dx`` its VJP (one backward pass), which moves ``x`` so
    that the predicted clean chunk matches the previous chunk where W > 0.
    """
    B, H, _ = x.shape
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        tau_tok = torch.full((B, H), float(tau), dtype=x.dtype, device=x.device)
        v = model(obs, xg, tau_tok)
        f = xg + (1 - tau) * v
        e = (target - f).detach() * weights.view(1, H, 1).to(x.dtype)
        (g,) = torch.autograd.grad(f, xg, grad_outputs=e)
    return (v + guidance_weight(tau, beta) * g).detach(), v.detach(), g.detach()


def _model_device(model: Any) -> torch.device:
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


def _model_horizon(model: Any, default: int) -> int:
    cfg = getattr(model, "config", None)
    return int(getattr(cfg, "horizon", default))


def sample(
    model: VelocityModel,
    obs: Any,
    prefix: torch.Tensor | None,
    d: int,
    steps: int,
    method: str = "training_time",
    *,
    s: int | None = None,
    shape: tuple[int, int, int] | None = None,
    schedule: str = "exp",
    beta: float = DEFAULT_BETA,
    soft_strength: float = DEFAULT_SOFT_STRENGTH,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Generate an action chunk (B, H, A) by Euler integration of ``model`` over ``steps``.

    ``prefix`` (B, L, A): the previous chunk's remaining actions aligned to the new chunk's
    time (``prev[s:]``, zero-padded to H); its first ``d`` rows are the committed actions.
    Methods using the whole overlap (``inference_time``, ``training_time_soft``) need
    ``L >= H - s``. ``s`` defaults to ``max(d, 1)``; ``d <= H - s`` is enforced (ValueError).
    H is ``shape[1]`` if given, else ``model.config.horizon`` if the model has one, else
    the prefix length (a prefix zero-padded to H, as in the paper's Algorithm 1).
    ``shape`` gives (B, H, A) when ``prefix`` is None (plain sampling).
    For ``training_time``/``training_time_soft`` the returned chunk's first ``d`` rows
    equal the prefix exactly; the caller executes the postfix.
    """
    if method not in METHODS:
        raise ValueError(f"unknown sampling method {method!r}; expected one of {METHODS}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if prefix is None:
        if shape is None:
            raise ValueError("sample: pass `prefix` or `shape=(B, H, A)`")
        B, H, A = shape
        if noise is not None:
            dev, dtype = noise.device, noise.dtype
        else:
            dev, dtype = _model_device(model), torch.float32
        y = torch.zeros(B, H, A, device=dev, dtype=dtype)
        L = 0
    else:
        if prefix.dim() != 3:
            raise ValueError(f"prefix must be (B, L, A), got {tuple(prefix.shape)}")
        B, L, A = prefix.shape
        H = shape[1] if shape is not None else _model_horizon(model, L)
        if L > H:
            raise ValueError(f"prefix length {L} exceeds horizon H={H}")
        y = torch.zeros(B, H, A, device=prefix.device, dtype=prefix.dtype)
        y[:, :L] = prefix
    s = max(d, 1) if s is None else s
    check_delay(d, s, H)
    if method in ("plain", "naive_async", "synchronous"):
        d_eff = 0
    else:
        d_eff = d
    if d_eff > L:
        raise ValueError(f"method {method!r} with d={d} needs a prefix of >= {d} actions, got {L}")
    if method in ("inference_time", "training_time_soft") and L < H - s:
        raise ValueError(
            f"method {method!r} uses the whole overlap: prefix needs >= H - s = {H - s} rows, "
            f"got {L}"
        )
    if noise is None:
        gdev = generator.device if generator is not None else y.device
        noise = torch.randn(B, H, A, generator=generator, device=gdev, dtype=y.dtype).to(y.device)
    prepare = getattr(model, "prepare_obs", None)
    with torch.no_grad():
        ctx_obs = prepare(obs) if callable(prepare) else obs
    dt = 1.0 / steps

    if method == "inference_time":
        w = prefix_weights(d, s, H, schedule).to(y.device)
        x = noise.clone()
        for k in range(steps):
            v, _, _ = guided_velocity(model, ctx_obs, x, k * dt, y, w, beta)
            x = x + dt * v
        return x

    delays = torch.full((B,), d_eff, dtype=torch.long, device=y.device)
    soft = (
        SoftOverlap(strength=soft_strength, schedule=schedule, execution_horizon=s)
        if method == "training_time_soft"
        else None
    )
    tau0 = token_time_offsets(delays, H, soft).to(y.dtype)[..., None]  # (B, H, 1)
    pre = (torch.arange(H, device=y.device) < d_eff)[None, :, None]
    # Start every token at its own base time: noise for the postfix, the (noised) hint on
    # the soft overlap, the committed actions on the prefix.
    x = tau0 * y + (1 - tau0) * noise
    with torch.no_grad():
        for k in range(steps):
            x = torch.where(pre, y, x)  # overwrite the prefix before every step
            tau_tok = (tau0 + (1 - tau0) * (k * dt)).squeeze(-1)
            v = model(ctx_obs, x, tau_tok)
            x = x + (1 - tau0) * dt * v
        x = torch.where(pre, y, x)
    return x
