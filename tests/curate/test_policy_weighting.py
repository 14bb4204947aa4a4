"""The policy trainer consumes the curated mixture as per-step sampling weights."""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pytest
import torch


def _mixture(name: str) -> pd.DataFrame:
    rows = [
        # episode 0: one segment [1 s, 3 s) with weight 0.75
        {"episode_id": f"{name}/000000", "start_us": 1_000_000, "end_us": 3_000_000,
         "weight": 0.75, "split": "policy"},
        # episode 2: the whole first 2 s with weight 0.25
        {"episode_id": f"{name}/000002", "start_us": 0, "end_us": 2_000_000, "weight": 0.25,
         "split": "policy"},
        # a failure row of episode 1 never trains the policy
        {"episode_id": f"{name}/000001", "start_us": 0, "end_us": 2_000_000, "weight": 1.0,
         "split": "failures"},
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_step_weights_spread_each_segment_over_its_steps():
    from flora.curate.weights import step_weights

    mix = _mixture("d")
    t = np.arange(0, 4_000_000, 50_000)
    w = step_weights(mix[mix.split == "policy"], "d/000000", t)
    inside = (t >= 1_000_000) & (t < 3_000_000)
    assert w[inside].sum() == pytest.approx(0.75) and (w[~inside] == 0).all()
    assert len(set(w[inside])) == 1
    assert step_weights(mix, "d/000009", t).sum() == 0


def test_build_data_and_sampling_follow_the_mixture(tiny_dataset, tmp_path, monkeypatch):
    from flora.policy.lerobot import PolicyTrainConfig, build_data
    from flora.policy.train import TrainConfig, train_epochs

    monkeypatch.setattr("flora.curate.weights.load_split", lambda m, s: m[m.split == s])
    cfg = PolicyTrainConfig(tiny_dataset, tmp_path / "p", horizon=8, max_delay=2,
                            val_fraction=0.0, mlflow=False, progress=False)  # fmt: skip
    cfg.mixture = _mixture(tiny_dataset.name)
    data = build_data(cfg)
    assert data.episodes == [0, 2]  # episode 1 is only in the failures split
    w = data.train.weights.numpy()
    n0 = 6 * 20  # episode 0: 6 s at 20 fps
    assert w[:n0].sum() == pytest.approx(0.75) and w[n0:].sum() == pytest.approx(0.25)
    assert (w[:20] == 0).all() and (w[20:60] > 0).all() and (w[60:n0] == 0).all()

    drawn: list[torch.Tensor] = []

    class Stop(Exception):
        pass

    def batch(idx):
        drawn.append(idx)
        raise Stop

    monkeypatch.setattr(data.train, "batch", batch)
    state = types.SimpleNamespace(model=torch.nn.Linear(1, 1), optimizer=None, epoch=0, step=0)
    with pytest.raises(Stop):
        train_epochs(state, data.train, 1, TrainConfig(batch_size=len(data.train)),
                     progress=False)  # fmt: skip
    idx = drawn[0].numpy()
    assert (w[idx] > 0).all()  # a step the mixture left out is never drawn
    share0 = (idx < n0).mean()
    assert 0.6 < share0 < 0.9  # ~0.75 of the draws come from episode 0's segment
