"""Training loop for flow-matching action experts (plain and training-time RTC).

One loop serves the simulated benchmark and ``flora policy train`` on LeRobot data: epochs
over a :class:`ChunkDataset`, AdamW with warmup + cosine decay defined over the *whole*
epoch budget (so a run resumed at epoch 24 for RTC fine-tuning continues the same schedule
as the plain run it branched from — equal compute, as in seed 002 §5.1), gradient clipping,
and checkpoints that hold model, optimiser, config and epoch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from flora.policy.configuration_dit import DiTConfig
from flora.policy.modeling_dit import DiTActionExpert
from flora.policy.rtc import DelayDistribution, SoftOverlap, training_loss


@dataclass
class ChunkDataset:
    """Aligned training tensors: ``obs[key][i]`` is the observation of chunk ``chunks[i]``."""

    obs: dict[str, torch.Tensor]
    chunks: torch.Tensor  # (N, H, A)
    # Per-row sampling weights (a curated mixture, flora.curate.weights); None: uniform.
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.chunks.shape[0]
        for k, v in self.obs.items():
            if v.shape[0] != n:
                raise ValueError(f"ChunkDataset: obs[{k!r}] has {v.shape[0]} rows, chunks {n}")
        if self.weights is not None and (self.weights.shape != (n,) or self.weights.sum() <= 0):
            raise ValueError(f"ChunkDataset: weights must be ({n},) with a positive sum")

    def __len__(self) -> int:
        return int(self.chunks.shape[0])

    def batch(self, idx: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Rows ``idx`` of every tensor."""
        return {k: v[idx] for k, v in self.obs.items()}, self.chunks[idx]


@dataclass
class TrainConfig:
    """Optimisation settings; ``total_epochs`` defines the LR schedule."""

    total_epochs: int = 32
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 200
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "cpu"  # "cpu", "cuda", "cuda:1", or "auto" (cuda when available)
    max_steps: int | None = None  # stop after this many optimiser steps (recipes count steps)


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@dataclass
class TrainState:
    """Model + optimiser + position in the schedule; snapshot with :meth:`clone`."""

    model: DiTActionExpert
    optimizer: torch.optim.Optimizer
    epoch: int = 0
    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)

    def clone(self) -> TrainState:
        """Deep copy (used to branch RTC fine-tuning off the epoch-24 plain run)."""
        model = copy.deepcopy(self.model)
        opt = make_optimizer(
            model, self.optimizer.defaults["lr"], self.optimizer.defaults["weight_decay"]
        )
        opt.load_state_dict(copy.deepcopy(self.optimizer.state_dict()))
        return TrainState(model, opt, self.epoch, self.step, list(self.history))


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over all trainable parameters."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay
    )


def new_state(config: DiTConfig, train: TrainConfig) -> TrainState:
    """Fresh model (seeded) and optimiser."""
    torch.manual_seed(train.seed)
    model = DiTActionExpert(config).to(resolve_device(train.device))
    return TrainState(model, make_optimizer(model, train.lr, train.weight_decay))


def lr_at(step: int, steps_per_epoch: int, train: TrainConfig) -> float:
    """Warmup then cosine decay to ``min_lr_ratio * lr`` at the end of ``total_epochs``."""
    total = max(1, steps_per_epoch * train.total_epochs)
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    frac = min(1.0, (step - train.warmup_steps) / max(1, total - train.warmup_steps))
    cos = 0.5 * (1 + math.cos(math.pi * frac))
    return train.lr * (train.min_lr_ratio + (1 - train.min_lr_ratio) * cos)


def train_epochs(
    state: TrainState,
    data: ChunkDataset,
    epochs: int,
    train: TrainConfig,
    *,
    delays: DelayDistribution | None = None,
    soft_overlap: SoftOverlap | None = None,
    desc: str = "train",
    progress: bool = True,
    on_epoch_end: Callable[[TrainState, dict[str, float]], None] | None = None,
) -> TrainState:
    """Run ``epochs`` more epochs (in place) with plain (``delays=None``) or training-time
    RTC flow matching. Batches are shuffled by a generator seeded from (seed, epoch) so
    branches resumed from the same snapshot see the same data order."""
    n = len(data)
    steps_per_epoch = max(1, n // train.batch_size)
    model, opt = state.model, state.optimizer
    model.train()
    for _ in range(epochs):
        g = torch.Generator().manual_seed(train.seed * 1_000_003 + state.epoch)
        if data.weights is not None:  # mixture weighting: draw rows by weight
            perm = torch.multinomial(data.weights, n, replacement=True, generator=g)
        else:
            perm = torch.randperm(n, generator=g)
        total, count = 0.0, 0
        it = range(steps_per_epoch)
        bar = tqdm(it, desc=f"{desc} epoch {state.epoch + 1}", leave=False, disable=not progress)
        for b in bar:
            if train.max_steps is not None and state.step >= train.max_steps:
                break
            idx = perm[b * train.batch_size : (b + 1) * train.batch_size]
            obs, chunk = data.batch(idx)
            dev = next(model.parameters()).device
            if dev.type != "cpu":
                obs = {k: v.to(dev, non_blocking=True) for k, v in obs.items()}
                chunk = chunk.to(dev, non_blocking=True)
            for group in opt.param_groups:
                group["lr"] = lr_at(state.step, steps_per_epoch, train)
            loss = training_loss(model, obs, chunk, delays, generator=g, soft_overlap=soft_overlap)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if train.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
            opt.step()
            state.step += 1
            total += float(loss.detach())
            count += 1
            if progress and b % 20 == 0:
                bar.set_postfix(loss=f"{total / count:.4f}")
        state.epoch += 1
        rec = {
            "epoch": float(state.epoch),
            "loss": total / max(1, count),
            "lr": opt.param_groups[0]["lr"],
        }
        state.history.append(rec)
        if on_epoch_end is not None:
            on_epoch_end(state, rec)
    model.eval()
    return state


# ------------------------------------------------------------------------ checkpoints
def save_checkpoint(
    path: str | Path, state: TrainState, extra: dict[str, Any] | None = None
) -> Path:
    """Write model weights, optimiser, config, epoch/step and ``extra`` metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "config": state.model.config.to_dict(),
            "model": state.model.state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "epoch": state.epoch,
            "step": state.step,
            "history": state.history,
            "extra": extra or {},
        },
        path,
    )
    return path


def load_checkpoint(
    path: str | Path, train: TrainConfig | None = None
) -> tuple[TrainState, dict[str, Any]]:
    """Inverse of :func:`save_checkpoint`; returns the state and its ``extra`` dict."""
    blob = torch.load(Path(path), map_location="cpu", weights_only=False)
    model = DiTActionExpert(DiTConfig.from_dict(blob["config"]))
    model.load_state_dict(blob["model"])
    train = train or TrainConfig()
    opt = make_optimizer(model, train.lr, train.weight_decay)
    opt.load_state_dict(blob["optimizer"])
    model.eval()
    st = TrainState(model, opt, int(blob["epoch"]), int(blob["step"]), list(blob["history"]))
    return st, dict(blob.get("extra", {}))
