"""DiT-style flow-matching action expert with per-token adaLN-zero.

The expert maps ``(obs, x, tau) -> velocity`` with ``x`` (B, H, A) the noisy action chunk and
``tau`` (B, H) one flow-matching timestep per action token (0 = noise, 1 = data). This is
change 1 of training-time RTC (seed 002 §4): the adaLN-zero scale/shift/gate of every block
is computed from each token's own timestep, so committed prefix tokens (tau = 1) and noisy
postfix tokens (tau < 1) are modulated differently. The same modules applied to one shared
timestep give the standard DiT, hence the parameter count does not change.

Observation encoder: a state token, optional precomputed image-feature tokens and a
language token (hashed word tokens of the task/caption, or a precomputed sentence
embedding). Action tokens self-attend, cross-attend to the observation tokens, and the
pooled observation is added to every token's conditioning vector (DiT class conditioning).
All gates and the output layer are zero-initialised, so every block starts as the identity
and the untrained expert outputs zero velocity.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flora.policy.configuration_dit import DiTConfig

Obs = Mapping[str, torch.Tensor]
_WORD = re.compile(r"[a-z0-9]+")


def hash_tokens(texts: Sequence[str], vocab: int, max_tokens: int) -> torch.Tensor:
    """Hash lower-cased words of each text into ``[1, vocab)`` (0 is padding).

    A stable hash (blake2b, not Python's salted ``hash``) keeps ids identical across
    processes, so checkpoints stay valid. Returns a LongTensor (len(texts), max_tokens).
    """
    if vocab < 2:
        raise ValueError(f"hash_tokens: vocab must be >= 2, got {vocab}")
    out = torch.zeros(len(texts), max_tokens, dtype=torch.long)
    for row, text in enumerate(texts):
        words = _WORD.findall(str(text).lower())[:max_tokens]
        for col, w in enumerate(words):
            h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
            out[row, col] = 1 + h % (vocab - 1)
    return out


def timestep_features(tau: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal features of flow timesteps ``tau`` (any shape) -> (*tau.shape, dim)."""
    half = dim // 2
    dtype = tau.dtype if tau.is_floating_point() else torch.float32
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=dtype, device=tau.device) / half
    )
    # Scale tau in [0, 1] to [0, 1000] as DiT does, so low frequencies still resolve it.
    args = (tau.to(dtype) * 1000.0)[..., None] * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.kv = nn.Linear(hidden, 2 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads
        q = self.q(x).view(b, n, h, d // h).transpose(1, 2)
        k, v = self.kv(ctx).view(b, ctx.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class DiTBlock(nn.Module):
    """Self-attention, cross-attention to observation tokens and MLP, each adaLN-zero
    modulated by a per-token conditioning vector ``c`` (B, H or 1, D)."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = _Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.cross = _Attention(hidden, heads)
        self.norm3 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        inner = int(hidden * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, inner), nn.GELU(approximate="tanh"), nn.Linear(inner, hidden)
        )
        # shift/scale/gate for the three sub-layers, computed from each token's conditioning.
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 9 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        sh1, sc1, g1, sh2, sc2, g2, sh3, sc3, g3 = self.ada(c).chunk(9, dim=-1)
        h = _modulate(self.norm1(x), sh1, sc1)
        x = x + g1 * self.attn(h, h)
        x = x + g2 * self.cross(_modulate(self.norm2(x), sh2, sc2), ctx)
        x = x + g3 * self.mlp(_modulate(self.norm3(x), sh3, sc3))
        return x


class DiTActionExpert(nn.Module):
    """Flow-matching action expert; ``forward(obs, x, tau) -> velocity`` (B, H, A).

    ``obs`` is a mapping with any of: ``state`` (B, Ds), ``image`` (B, Ni, Di) or (B, Di),
    ``lang_ids`` (B, L) hashed token ids (see :func:`hash_tokens` / :meth:`encode_text`),
    ``lang_emb`` (B, Dl) precomputed sentence embedding. :meth:`prepare_obs` may be called
    once per chunk to cache the encoded observation across denoising steps.
    """

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        cfg = config
        d = cfg.hidden
        self.action_in = nn.Linear(cfg.action_dim, d)
        self.pos = nn.Parameter(torch.zeros(1, cfg.horizon, d))
        self.time_mlp = nn.Sequential(nn.Linear(cfg.time_freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        # Observation encoder: one token per source, each with its own small MLP.
        self.state_in = (
            nn.Sequential(nn.Linear(cfg.state_dim, d), nn.SiLU(), nn.Linear(d, d))
            if cfg.state_dim > 0
            else None
        )
        self.image_in = nn.Linear(cfg.image_dim, d) if cfg.image_dim > 0 else None
        self.lang_tok = nn.Embedding(cfg.lang_vocab, d, padding_idx=0) if cfg.lang_vocab else None
        self.lang_in = nn.Linear(cfg.lang_emb_dim, d) if cfg.lang_emb_dim > 0 else None
        n_ctx = (
            int(self.state_in is not None)
            + (cfg.image_tokens if self.image_in is not None else 0)
            + int(cfg.has_language)
        )
        self.ctx_type = nn.Parameter(torch.zeros(1, n_ctx, d))
        self.ctx_norm = nn.LayerNorm(d)
        self.cond_proj = nn.Linear(d, d)
        self.blocks = nn.ModuleList(
            [DiTBlock(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth)]
        )
        self.final_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.out = nn.Linear(d, cfg.action_dim)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.ctx_type, std=0.02)
        if self.lang_tok is not None:
            nn.init.normal_(self.lang_tok.weight, std=0.02)
            with torch.no_grad():
                self.lang_tok.weight[0].zero_()
        # adaLN-zero: gates (and shifts/scales) start at 0 so each block is the identity;
        # the output layer starts at 0 so the initial velocity is 0.
        for blk in self.blocks:
            nn.init.zeros_(blk.ada[-1].weight)
            nn.init.zeros_(blk.ada[-1].bias)
        nn.init.zeros_(self.final_ada[-1].weight)
        nn.init.zeros_(self.final_ada[-1].bias)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    # ----------------------------------------------------------------- observation
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        """Hashed token ids for ``obs["lang_ids"]`` (requires ``lang_vocab`` > 0)."""
        if self.lang_tok is None:
            raise ValueError("encode_text: this expert has no hashed-token language input")
        return hash_tokens(texts, self.config.lang_vocab, self.config.lang_max_tokens)

    def encode_obs(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Observation tokens (B, N, D) and the pooled conditioning vector (B, D)."""
        toks: list[torch.Tensor] = []
        dt = self.action_in.weight.dtype
        if self.state_in is not None:
            toks.append(self.state_in(_req(obs, "state").to(dt))[:, None])
        if self.image_in is not None:
            img = _req(obs, "image").to(dt)
            if img.dim() == 2:
                img = img[:, None]
            if img.shape[1] != self.config.image_tokens:
                raise ValueError(
                    f"obs['image'] has {img.shape[1]} tokens, config.image_tokens="
                    f"{self.config.image_tokens}"
                )
            toks.append(self.image_in(img))
        if self.lang_tok is not None:
            ids = _req(obs, "lang_ids").long()
            emb = self.lang_tok(ids)  # padding rows are zero
            n = (ids > 0).sum(dim=1, keepdim=True).clamp(min=1).to(emb.dtype)
            toks.append((emb.sum(dim=1) / n)[:, None])
        if self.lang_in is not None:
            toks.append(self.lang_in(_req(obs, "lang_emb").to(dt))[:, None])
        ctx = self.ctx_norm(torch.cat(toks, dim=1) + self.ctx_type)
        return ctx, self.cond_proj(ctx.mean(dim=1))

    def prepare_obs(self, obs: Obs) -> dict[str, Any]:
        """Encode ``obs`` once; the result can be passed as ``obs`` to every denoising step."""
        ctx, cond = self.encode_obs(obs)
        return {"_ctx": ctx, "_cond": cond}

    # ---------------------------------------------------------------------- forward
    def forward(self, obs: Obs, x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """Velocity (B, H, A) for noisy chunk ``x`` (B, H, A) at per-token times ``tau``."""
        cfg = self.config
        if x.dim() != 3 or x.shape[1:] != (cfg.horizon, cfg.action_dim):
            raise ValueError(
                f"x must be (B, {cfg.horizon}, {cfg.action_dim}), got {tuple(x.shape)}"
            )
        if tau.shape != x.shape[:2]:
            raise ValueError(f"tau must be (B, H) = {tuple(x.shape[:2])}, got {tuple(tau.shape)}")
        if not cfg.per_token_time:
            # Standard DiT: one timestep per chunk; per-token timesteps cannot be expressed.
            if not torch.equal(tau, tau[:, :1].expand_as(tau)):
                raise ValueError("a shared-timestep DiT (per_token_time=False) got per-token tau")
            tau = tau[:, :1]
        if "_ctx" in obs:
            ctx, cond = obs["_ctx"], obs["_cond"]
        else:
            ctx, cond = self.encode_obs(obs)
        tau = tau.to(x.dtype)
        c = self.time_mlp(timestep_features(tau, cfg.time_freq_dim)) + cond[:, None]
        h = self.action_in(x) + self.pos
        for blk in self.blocks:
            h = blk(h, c, ctx)
        shift, scale = self.final_ada(c).chunk(2, dim=-1)
        return self.out(_modulate(self.final_norm(h), shift, scale))


def _req(obs: Obs, key: str) -> torch.Tensor:
    if key not in obs:
        raise ValueError(f"observation is missing {key!r} (has {sorted(obs)})")
    return obs[key]


def count_parameters(model: nn.Module) -> int:
    """Number of learnable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
