"""The Kinetix adapter runs a shipped level through the benchmark's batched-env interface."""

from __future__ import annotations

import pytest
import torch

from flora.policy.kinetix_env import (
    ExpertMissing,
    KinetixLevelEnv,
    expert_path,
    require_expert,
    shipped_levels,
)


@pytest.fixture(scope="module")
def env() -> KinetixLevelEnv:
    torch.set_num_threads(1)
    return KinetixLevelEnv("l/grasp_easy", max_timesteps=6)


def test_shipped_levels_include_the_feasibility_levels() -> None:
    levels = shipped_levels()
    assert {"l/grasp_easy", "l/hard_lunar_lander", "l/mjc_half_cheetah"} <= set(levels)


def test_observations_actions_and_solve_signal(env: KinetixLevelEnv) -> None:
    obs = env.reset(3, seed=0)
    assert obs.dtype == torch.float32 and obs.ndim == 2 and obs.shape[0] == 3
    assert torch.isfinite(obs).all()
    assert env.action_dim > 0
    # Out-of-range actions are clipped to the Box [-1, 1], not rejected.
    big = torch.full((3, env.action_dim), 5.0)
    dones = []
    for _ in range(env.max_timesteps):
        step = env.step(big)
        assert step.obs.shape == obs.shape and step.obs.dtype == torch.float32
        # Dense shaping makes reward non-zero without a solve: solved must come from GoalR.
        assert not step.solved.any()
        dones.append(step.done.clone())
    # The level times out after max_timesteps; done is sticky and the frozen state stays put.
    assert dones[-1].all() and not dones[0].any()
    frozen = env.step(big)
    assert frozen.done.all() and (frozen.reward == 0).all()
    assert torch.equal(frozen.obs, step.obs)
    with pytest.raises(ValueError, match="action shape"):
        env.step(torch.zeros(2, env.action_dim))


def test_reset_state_has_the_types_step_returns(env: KinetixLevelEnv) -> None:
    """``step`` is jitted on the state: a leaf whose shape, dtype or weak type differs
    between the reset state and a stepped one compiles the whole physics step a second time
    (Kinetix' reset left ``last_distance`` weak-typed: ~25 s more per level on 2 cores)."""
    import jax

    def avals(state):
        return jax.tree.map(lambda x: (x.shape, str(x.dtype), bool(x.weak_type)), state)

    env.reset(3, seed=1)  # the batch of the test above: its compiled step is reused
    before = avals(env._state)
    env.step(torch.zeros(3, env.action_dim))
    assert avals(env._state) == before


def test_missing_expert_fails_with_how_to(tmp_path) -> None:
    with pytest.raises(ExpertMissing, match="PPO script"):
        require_expert(tmp_path, "l/grasp_easy")
    path = expert_path(tmp_path, "l/grasp_easy")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    assert require_expert(tmp_path, "l/grasp_easy") == path


def test_bench_cli_kinetix_without_expert_fails_clearly(tmp_path, monkeypatch) -> None:

    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_HOME", str(tmp_path))
    get_settings.cache_clear()  # settings are cached; the home must be this test's
    try:
        _check_cli(tmp_path)
    finally:
        get_settings.cache_clear()


def _check_cli(tmp_path) -> None:
    from typer.testing import CliRunner

    from flora.cli import app

    res = CliRunner().invoke(
        app, ["policy", "bench", "--env", "kinetix", "--levels", "l/grasp_easy"]
    )
    assert res.exit_code != 0
    assert "no PPO expert" in res.output and not (tmp_path / "policy_bench").exists()
    res = CliRunner().invoke(app, ["policy", "bench", "--env", "kinetix", "--levels", "l/nope"])
    assert res.exit_code != 0 and "unknown Kinetix level" in res.output
