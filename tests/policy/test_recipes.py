"""Named policy recipes: the RTC paper's real-robot settings, overridable per option."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from flora.policy.lerobot import PolicyTrainConfig
from flora.policy.recipes import load_recipe, recipe_names
from flora.policy.train import load_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from flora.data.synth import generate

    root = tmp_path_factory.mktemp("toy_recipe") / "toy_world"
    return generate(root, 3, 0, durations_s=[5.0, 6.0, 5.0], image_size=32, wrist_size=32,
                    progress=False)  # fmt: skip


def test_real_robot_recipe_has_the_papers_settings(tmp_path):
    r = load_recipe("real-robot")
    assert {"real-robot", "toy"} <= set(recipe_names())
    assert r["max_steps"] == 8000 and r["batch_size"] == 512
    assert r["max_delay"] == 10 and r["delay_dist"] == "uniform"
    assert r["denoise_steps"] == 5 and r["horizon"] == 50
    cfg = PolicyTrainConfig(dataset=tmp_path, out=tmp_path / "o", **r)
    probs = list(cfg.delays().probs)
    assert len(probs) == 10 and max(probs) == pytest.approx(min(probs))  # d ~ U{0..9}


def test_unknown_recipe_is_refused(tmp_path):
    from flora.cli import app

    with pytest.raises(ValueError, match="unknown policy recipe 'nope'"):
        load_recipe("nope")
    res = CliRunner().invoke(app, ["policy", "train", "--dataset", str(tmp_path),
                                   "--recipe", "nope", "--no-mlflow"])  # fmt: skip
    assert res.exit_code == 2
    # The option is an enum, so click refuses it and lists the shipped recipes.
    assert "'nope' is not one of" in res.output
    assert "real-robot" in res.output and "toy" in res.output
    assert "Traceback" not in res.output


def test_cli_recipe_with_overrides_trains_exactly_max_steps(toy, tmp_path):
    from flora.cli import app

    out = tmp_path / "rr"
    args = ["policy", "train", "--dataset", str(toy), "--out", str(out), "--no-mlflow"]
    args += ["--recipe", "real-robot", "--max-steps", "3", "--hidden", "16", "--depth", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    state, extra = load_checkpoint(out / "policy.pt")
    tc = extra["train_config"]
    assert state.step == 3  # the step budget, not whole epochs
    assert tc["recipe"] == "real-robot" and tc["max_steps"] == 3  # typed option wins
    assert tc["horizon"] == 50 and tc["max_delay"] == 10 and tc["delay_dist"] == "uniform"
    assert tc["batch_size"] == 512 and tc["denoise_steps"] == 5 and tc["hidden"] == 16
