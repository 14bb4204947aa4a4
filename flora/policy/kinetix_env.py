"""Kinetix levels behind the benchmark's batched-env interface (issue 14).

Kinetix (``pip install -e '.[kinetix]'``, ``make kinetix``) is a JAX 2-D physics suite; the
RTC papers evaluate on its hand-made ``l/`` levels. JAX is used only for the environment:
observations come back as torch float32 ``(B, obs_dim)`` tensors and actions go in as torch
``(B, action_dim)`` tensors in ``[-1, 1]``, so the torch flow policy of :mod:`flora.policy.bench`
drives it unchanged.

Solve signal (Kinetix semantics): an episode ends when a green shape touches a blue one
(goal, Kinetix' ``info["GoalR"]``), when it touches a red one, or after ``max_timesteps``.
The reward also carries a small dense shaping term (distance progress), so ``reward > 0``
is *not* a solve: ``solved`` is ``GoalR``.
Finished episodes are not auto-reset: their state stays frozen so a
batch of rollouts ends with one outcome each, like :class:`flora.policy.sim.PursuitEnv`.

A hand-made level starts from its one stored state and its physics is deterministic:
``reset``'s ``seed`` changes nothing (seeds 0 and 1 give identical trajectories under the
same actions, checked with kinetix-env 3.0.2), so the rollouts of a batch differ only
through the policy's sampling noise and the delays a benchmark applies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Levels used by the feasibility run. The RTC paper evaluates 12 hand-made Kinetix levels;
# seed 002 does not name them, so these are shipped ``l/`` levels of the same families
# (grasping, lander, MuJoCo-like locomotion), not a claim about the paper's exact list.
FEASIBILITY_LEVELS: tuple[str, ...] = (
    "l/grasp_easy",
    "l/hard_lunar_lander",
    "l/mjc_half_cheetah",
    "l/h17_unicycle",
)


class KinetixUnavailable(RuntimeError):
    """The ``kinetix`` extra is not installed."""


class ExpertMissing(FileNotFoundError):
    """No cached PPO expert for a level; the message says how to produce one."""


def _require_kinetix() -> Any:
    # JAX must not grab every core of a shared box.
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax
        import kinetix  # noqa: F401
    except ImportError as exc:  # pragma: no cover - the extra is installed by `make test`
        raise KinetixUnavailable(
            "Kinetix is not installed: run `make kinetix` "
            "(pip install -c requirements.lock -e '.[kinetix]')"
        ) from exc
    return jax


def shipped_levels() -> list[str]:
    """Names (``l/<name>``) of the hand-made levels that ship inside the kinetix package."""
    _require_kinetix()
    import kinetix

    root = Path(kinetix.__file__).parent / "levels" / "l"
    return sorted(f"l/{p.stem}" for p in root.glob("*.json"))


def expert_path(home: Path, level: str) -> Path:
    """Where the cached PPO expert for ``level`` lives (``<FLORA_HOME>/kinetix/experts/``)."""
    return home / "kinetix" / "experts" / (level.replace("/", "__") + ".safetensors")


def require_expert(home: Path, level: str) -> Path:
    """Path of the cached expert for ``level``; :class:`ExpertMissing` when there is none."""
    path = expert_path(home, level)
    if not path.exists():
        raise ExpertMissing(
            f"no PPO expert for Kinetix level {level!r} at {path}: train one with Kinetix' "
            "PPO script (experiments/ppo.py of github.com/FLAIROx/Kinetix; the PyPI wheel has "
            "no trainer) on this level with symbolic_flat observations and continuous actions, "
            "and save its parameters there; see docs/policy.md#kinetix. Experts are not faked."
        )
    return path


@dataclass
class KinetixStep:
    """One batched step: observations, reward, done and solved flags (all torch)."""

    obs: torch.Tensor  # (B, obs_dim) float32
    reward: torch.Tensor  # (B,) float32
    done: torch.Tensor  # (B,) bool, sticky once an episode ended
    solved: torch.Tensor  # (B,) bool, sticky


class KinetixLevelEnv:
    """A batch of copies of one Kinetix level, stepped with ``jax.vmap`` under one ``jit``."""

    def __init__(self, level: str, max_timesteps: int | None = None) -> None:
        jax = _require_kinetix()
        import jax.numpy as jnp
        from kinetix.environment.env import make_kinetix_env
        from kinetix.environment.spaces import ActionType, ObservationType
        from kinetix.util.saving import load_from_json_file

        self.level = level
        level_state, static_params, env_params = load_from_json_file(level)
        if max_timesteps is not None:
            env_params = env_params.replace(max_timesteps=max_timesteps)
        self.env_params = env_params
        self.max_timesteps = int(env_params.max_timesteps)
        env = make_kinetix_env(
            ActionType.CONTINUOUS,
            ObservationType.SYMBOLIC_FLAT,
            reset_fn=None,
            env_params=env_params,
            static_env_params=static_params,
            auto_reset=False,
        )
        self._env = env
        self._level_state = level_state
        self.action_dim = int(env.action_space(env_params).shape[0])

        def _reset(key: Any) -> tuple[Any, Any]:
            obs, state = env.reset(key, env_params, override_reset_state=level_state)
            # Kinetix's reset leaves a weak-typed leaf (``last_distance``) that ``step``
            # returns strongly typed: without this cast the step compiles twice (~25 s each
            # on a 2-core CPU), once for the reset state and once for its own.
            return obs, jax.tree.map(lambda x: x.astype(x.dtype), state)

        def _step(key: Any, state: Any, action: Any) -> tuple[Any, ...]:
            obs, new_state, reward, done, info = env.step(key, state, action, env_params)
            return obs, new_state, reward, done, info["GoalR"]

        def _step_frozen(keys: Any, state: Any, action: Any, live: Any) -> tuple[Any, ...]:
            # Freeze finished episodes (no auto-reset) inside the jit: an eager tree.map over
            # the state's many leaves costs ~0.2 s per step on this CPU.
            obs, new_state, reward, done, goal = jax.vmap(_step)(keys, state, action)

            def keep(new: Any, old: Any) -> Any:
                return jnp.where(live.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)

            return obs, jax.tree.map(keep, new_state, state), reward, done, goal

        self._reset = jax.jit(jax.vmap(_reset))
        self._step = jax.jit(_step_frozen)
        self._jax, self._jnp = jax, jnp
        self._key = jax.random.PRNGKey(0)
        self._state: Any = None
        self._obs = np.zeros((0, 0), np.float32)
        self._done = np.zeros(0, bool)
        self._solved = np.zeros(0, bool)

    def reset(self, batch: int, seed: int = 0) -> torch.Tensor:
        """Start ``batch`` episodes of the level; returns observations ``(B, obs_dim)``."""
        jax = self._jax
        self._key, sub = jax.random.split(jax.random.PRNGKey(seed))
        obs, self._state = self._reset(jax.random.split(sub, batch))
        self._obs = np.asarray(obs, dtype=np.float32)
        self._done = np.zeros(batch, bool)
        self._solved = np.zeros(batch, bool)
        return torch.from_numpy(self._obs.copy())

    @property
    def obs_dim(self) -> int:
        """Length of the flat symbolic observation (after :meth:`reset`)."""
        return int(self._obs.shape[1])

    def step(self, action: torch.Tensor) -> KinetixStep:
        """Apply ``action`` ``(B, action_dim)`` (clipped to ``[-1, 1]``) to live episodes."""
        if self._state is None:
            raise RuntimeError("KinetixLevelEnv.step before reset")
        jax, jnp = self._jax, self._jnp
        a = np.clip(action.detach().cpu().numpy().astype(np.float32), -1.0, 1.0)
        if a.shape != (self._done.shape[0], self.action_dim):
            raise ValueError(
                f"Kinetix level {self.level}: action shape {a.shape}, "
                f"expected {(self._done.shape[0], self.action_dim)}"
            )
        self._key, sub = jax.random.split(self._key)
        live = ~self._done
        obs, self._state, reward, done, goal = self._step(
            jax.random.split(sub, a.shape[0]), self._state, jnp.asarray(a), jnp.asarray(live)
        )
        r = np.asarray(reward, dtype=np.float32) * live
        self._obs = np.where(live[:, None], np.asarray(obs, np.float32), self._obs)
        self._solved |= live & np.asarray(goal, bool)
        self._done |= live & np.asarray(done, bool)
        return KinetixStep(
            obs=torch.from_numpy(self._obs.copy()),
            reward=torch.from_numpy(r),
            done=torch.from_numpy(self._done.copy()),
            solved=torch.from_numpy(self._solved.copy()),
        )
