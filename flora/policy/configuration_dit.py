"""Configuration of the DiT action expert (kept beside ``modeling_dit.py``, HF-style).

The config is a plain dataclass so that it round-trips through JSON inside checkpoints
and MLflow params without a transformers dependency.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


@dataclass
class DiTConfig:
    """Shape and size of a :class:`flora.policy.modeling_dit.DiTActionExpert`.

    Observation inputs (all optional except ``state_dim`` > 0 or another source):

    * ``state_dim``: proprioceptive / low-dimensional state vector.
    * ``image_dim`` x ``image_tokens``: precomputed image features (any frozen encoder).
    * ``lang_vocab``: hashed-token language embedding of the task / caption
      (``lang_max_tokens`` tokens, mean-pooled); 0 disables it.
    * ``lang_emb_dim``: instead of hashed tokens, a precomputed sentence embedding
      (e.g. all-MiniLM-L6-v2, 384) of this size.

    ``per_token_time`` switches between the training-time-RTC expert (one flow timestep per
    action token, scale/shift/gate computed per token) and a standard DiT that shares one
    timestep over the chunk. Both have exactly the same parameters.
    """

    action_dim: int = 2
    horizon: int = 8
    state_dim: int = 0
    image_dim: int = 0
    image_tokens: int = 1
    lang_vocab: int = 0
    lang_max_tokens: int = 16
    lang_emb_dim: int = 0
    hidden: int = 128
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0
    time_freq_dim: int = 64
    per_token_time: bool = True

    def __post_init__(self) -> None:
        if self.action_dim <= 0 or self.horizon <= 0:
            raise ValueError(
                f"DiTConfig: action_dim and horizon must be > 0, got "
                f"action_dim={self.action_dim}, horizon={self.horizon}"
            )
        if self.hidden % self.heads != 0:
            raise ValueError(
                f"DiTConfig: hidden={self.hidden} must be divisible by heads={self.heads}"
            )
        if self.time_freq_dim % 2 != 0:
            raise ValueError(f"DiTConfig: time_freq_dim={self.time_freq_dim} must be even")
        if self.state_dim <= 0 and self.image_dim <= 0 and not self.has_language:
            raise ValueError("DiTConfig: the observation needs state, image or language input")
        if self.lang_vocab > 0 and self.lang_emb_dim > 0:
            raise ValueError("DiTConfig: choose hashed tokens (lang_vocab) or lang_emb_dim")

    @property
    def has_language(self) -> bool:
        """Whether the expert reads a task/caption embedding."""
        return self.lang_vocab > 0 or self.lang_emb_dim > 0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DiTConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error (they mean a version skew)."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"DiTConfig: unknown fields {sorted(unknown)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        """Write as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> DiTConfig:
        """Read a JSON written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))
