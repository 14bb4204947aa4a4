"""Kinetix feasibility on this CPU (issue 14): env steps/s, single and ``jax.vmap``-batched.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kinetix_feasibility.py [levels...]``
(needs ``make kinetix``). Prints one JSON line per (level, batch) with the jit compile time,
the second step's time (a compile there means the state changed type)
and the steady-state env steps/s (batch x steps / seconds, random actions).
"""

from __future__ import annotations

import json
import sys
import time

import torch

from flora.policy.kinetix_env import FEASIBILITY_LEVELS, KinetixLevelEnv


def measure(level: str, batch: int, steps: int) -> dict:
    """Compile time and steady-state steps/s of ``level`` at ``batch`` parallel copies."""
    t0 = time.perf_counter()
    env = KinetixLevelEnv(level, max_timesteps=10**6)  # no timeouts inside the timed loop
    env.reset(batch, seed=0)
    g = torch.Generator().manual_seed(0)
    env.step(torch.rand(batch, env.action_dim, generator=g) * 2 - 1)  # compiles
    compile_s = time.perf_counter() - t0
    # Timed on its own: a step that compiles again (a state whose types changed, as the
    # adapter's reset once did) shows here instead of hiding inside the steady rate.
    t1 = time.perf_counter()
    env.step(torch.rand(batch, env.action_dim, generator=g) * 2 - 1)
    second_s = time.perf_counter() - t1
    t1 = time.perf_counter()
    for _ in range(steps):
        env.step(torch.rand(batch, env.action_dim, generator=g) * 2 - 1)
    run_s = time.perf_counter() - t1
    return {
        "level": level,
        "batch": batch,
        "steps": steps,
        "compile_s": round(compile_s, 1),
        "second_step_s": round(second_s, 3),
        "env_steps_per_s": round(batch * steps / run_s, 1),
    }


def main() -> None:
    """Measure each level at batch 1 and batch 256."""
    torch.set_num_threads(1)
    levels = sys.argv[1:] or list(FEASIBILITY_LEVELS)
    for level in levels:
        for batch, steps in ((1, 200), (256, 40)):
            print(json.dumps(measure(level, batch, steps)), flush=True)


if __name__ == "__main__":
    main()
