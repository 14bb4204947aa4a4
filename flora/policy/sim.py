"""A batched torch environment where inference delay hurts, and a multi-modal expert.

"Pursuit": a point robot in the square ``[-1, 1]^2`` must catch one of two moving balls
(red or blue — the task text says which) before a time limit, without touching the disc
obstacles. Why this exercises real-time chunking:

* the balls turn randomly (a heading random walk plus occasional sharp turns) and bounce
  off walls and obstacles, so an observation that is ``d`` steps old is stale and the
  robot must keep reacting (delay hurts every method);
* an obstacle usually sits between robot and ball, and the expert goes round it on either
  side (a per-episode, per-obstacle choice that is 50/50 when the obstacle is dead ahead).
  The behaviour-cloned policy is therefore multi-modal, and switching to an independently
  sampled chunk can flip the side half-way round (this is what hurts naive async);
* executed actions carry Gaussian noise, so open-loop chunks drift.

Actions are normalised velocities (norm <= 1, times ``v_max`` per step). Observations are
a 16-d state vector (robot, both balls with velocities, two obstacles) plus the task text.
Everything is vectorised over a batch of environments and seeded by a torch.Generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

COLORS = ("red", "blue")
_TEMPLATES = ("catch the {c} ball", "chase the {c} one", "go get the {c} ball")


@dataclass(frozen=True)
class PursuitConfig:
    """Constants of the pursuit task (lengths in arena units, speeds per control step)."""

    v_max: float = 0.06
    ball_speed: float = 0.025
    heading_noise: float = 0.12  # rad / step random walk of each ball's heading
    turn_prob: float = 0.03  # chance per step of a sharp turn (90..180 degrees)
    catch_radius: float = 0.08
    robot_radius: float = 0.03
    n_obstacles: int = 2
    obstacle_radius: tuple[float, float] = (0.15, 0.25)
    action_noise: float = 0.15  # std of executed-action noise, in units of v_max
    max_steps: int = 50  # ~2.5x the expert's median episode (20 steps)
    # Expert: lead (steps) cap for interception, safety margin and side-choice temperature.
    expert_lead_cap: float = 15.0
    expert_margin: float = 0.05
    expert_side_temp: float = 0.05

    @property
    def state_dim(self) -> int:
        """Length of the observation state vector."""
        return 2 + 4 * 2 + 3 * self.n_obstacles


@dataclass
class PursuitState:
    """Batched simulator state (B environments)."""

    robot: torch.Tensor  # (B, 2)
    balls: torch.Tensor  # (B, 2 balls, 2)
    heading: torch.Tensor  # (B, 2 balls)
    obstacles: torch.Tensor  # (B, K, 2)
    radii: torch.Tensor  # (B, K)
    target: torch.Tensor  # (B,) long, index of the ball to catch
    texts: list[str]
    t: torch.Tensor  # (B,) long
    done: torch.Tensor  # (B,) bool
    success: torch.Tensor  # (B,) bool
    collided: torch.Tensor  # (B,) bool


def _rot(v: torch.Tensor, ang: torch.Tensor) -> torch.Tensor:
    c, s = torch.cos(ang), torch.sin(ang)
    return torch.stack([c * v[..., 0] - s * v[..., 1], s * v[..., 0] + c * v[..., 1]], dim=-1)


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp(min=1e-8)


class PursuitEnv:
    """Batched pursuit environment (see module docstring). All tensors on CPU."""

    def __init__(self, config: PursuitConfig | None = None) -> None:
        self.cfg = config or PursuitConfig()

    # ------------------------------------------------------------------ reset/obs
    def reset(self, batch: int, generator: torch.Generator) -> PursuitState:
        """Sample ``batch`` initial states (obstacle 0 placed between robot and target)."""
        c, g = self.cfg, generator
        B, K = batch, c.n_obstacles
        robot = (torch.rand(B, 2, generator=g) * 2 - 1) * 0.9
        balls = (torch.rand(B, 2, 2, generator=g) * 2 - 1) * 0.8
        # Start far enough from the balls that the chase takes a while.
        far = (balls - robot[:, None]).norm(dim=-1).min(dim=1).values < 0.6
        for _ in range(20):
            if not far.any():
                break
            robot[far] = (torch.rand(int(far.sum()), 2, generator=g) * 2 - 1) * 0.9
            far = (balls - robot[:, None]).norm(dim=-1).min(dim=1).values < 0.6
        target = torch.randint(0, 2, (B,), generator=g)
        tgt = balls[torch.arange(B), target]
        lo, hi = c.obstacle_radius
        radii = lo + (hi - lo) * torch.rand(B, K, generator=g)
        obstacles = (torch.rand(B, K, 2, generator=g) * 2 - 1) * 0.7
        frac = 0.35 + 0.3 * torch.rand(B, 1, generator=g)
        jitter = 0.06 * torch.randn(B, 2, generator=g)
        obstacles[:, 0] = robot + frac * (tgt - robot) + jitter
        # Other obstacles: resample until they keep a gap to the earlier ones.
        for k in range(1, K):
            for _ in range(20):
                gap = (obstacles[:, k : k + 1] - obstacles[:, :k]).norm(dim=-1)
                bad = (gap < radii[:, k : k + 1] + radii[:, :k] + 0.15).any(1)
                if not bad.any():
                    break
                obstacles[bad, k] = (torch.rand(int(bad.sum()), 2, generator=g) * 2 - 1) * 0.7
        # Keep the robot and the balls clear of the obstacles at the start (shrink the disc).
        for k in range(K):
            for pos in (robot, balls[:, 0], balls[:, 1]):
                dist = (pos - obstacles[:, k]).norm(dim=-1)
                radii[:, k] = torch.minimum(radii[:, k], (dist - 0.12).clamp(min=0.0))
        radii = radii.clamp(min=0.0)
        heading = torch.rand(B, 2, generator=g) * 2 * math.pi
        tmpl = torch.randint(0, len(_TEMPLATES), (B,), generator=g).tolist()
        pairs = zip(tmpl, target.tolist(), strict=True)
        texts = [_TEMPLATES[j].format(c=COLORS[i]) for j, i in pairs]
        z = torch.zeros(B, dtype=torch.bool)
        return PursuitState(
            robot,
            balls,
            heading,
            obstacles,
            radii,
            target,
            texts,
            torch.zeros(B, dtype=torch.long),
            z.clone(),
            z.clone(),
            z.clone(),
        )

    def observe(self, st: PursuitState) -> torch.Tensor:
        """State vector (B, 16): robot, balls (pos, velocity / v_max), obstacles (pos, r)."""
        c = self.cfg
        vel = torch.stack([torch.cos(st.heading), torch.sin(st.heading)], dim=-1)
        vel = vel * (c.ball_speed / c.v_max)
        parts = [st.robot, torch.cat([st.balls, vel], dim=-1).flatten(1)]
        parts.append(torch.cat([st.obstacles, st.radii[..., None]], dim=-1).flatten(1))
        return torch.cat(parts, dim=1)

    # ------------------------------------------------------------------------ step
    def step(
        self, st: PursuitState, action: torch.Tensor, generator: torch.Generator
    ) -> PursuitState:
        """Advance every unfinished environment by one control step (in place)."""
        c, g = self.cfg, generator
        B = st.robot.shape[0]
        live = ~st.done
        a = action.float()
        a = a / a.norm(dim=-1, keepdim=True).clamp(min=1.0)  # norm <= 1
        a = a + c.action_noise * torch.randn(B, 2, generator=g)
        st.robot = torch.where(live[:, None], (st.robot + c.v_max * a).clamp(-1, 1), st.robot)
        hit = ((st.robot[:, None] - st.obstacles).norm(dim=-1) < st.radii + c.robot_radius).any(1)
        st.collided |= hit & live
        # Balls: heading random walk, occasional sharp turns, bounce off walls/obstacles.
        turn = torch.rand(B, 2, generator=g) < c.turn_prob
        sharp = (math.pi / 2 + math.pi / 2 * torch.rand(B, 2, generator=g)) * torch.sign(
            torch.rand(B, 2, generator=g) - 0.5
        )
        head = st.heading + c.heading_noise * torch.randn(B, 2, generator=g) + turn * sharp
        vel = c.ball_speed * torch.stack([torch.cos(head), torch.sin(head)], dim=-1)
        pos = st.balls + vel
        for axis in range(2):
            out = pos[..., axis].abs() > 0.95
            vel[..., axis] = torch.where(out, -vel[..., axis], vel[..., axis])
            pos[..., axis] = torch.where(out, st.balls[..., axis] + vel[..., axis], pos[..., axis])
        for k in range(c.n_obstacles):
            delta = pos - st.obstacles[:, k : k + 1]
            dist = delta.norm(dim=-1)
            inside = dist < st.radii[:, k : k + 1] + 0.02
            n = _unit(delta)
            vn = (vel * n).sum(-1, keepdim=True)
            refl = vel - 2 * torch.clamp(vn, max=0) * n
            vel = torch.where(inside[..., None], refl, vel)
            pos = torch.where(inside[..., None], st.balls + vel, pos)
        st.balls = torch.where(live[:, None, None], pos, st.balls)
        st.heading = torch.where(live[:, None], torch.atan2(vel[..., 1], vel[..., 0]), st.heading)
        tgt = st.balls[torch.arange(B), st.target]
        caught = (st.robot - tgt).norm(dim=-1) < c.catch_radius
        st.success |= caught & live & ~st.collided
        st.t = st.t + live.long()
        st.done |= st.collided | st.success | (st.t >= c.max_steps)
        return st


class PursuitExpert:
    """Scripted multi-modal expert: intercept the named ball, go round obstacles.

    When an obstacle blocks the straight path the expert commits to one side for as long as
    that obstacle blocks (a per-episode mode); the side is random, 50/50 when the obstacle
    is dead ahead and biased to the shorter way otherwise. Call :meth:`reset` per episode.
    """

    def __init__(self, config: PursuitConfig | None = None) -> None:
        self.cfg = config or PursuitConfig()
        self.side: torch.Tensor | None = None  # (B, K) in {-1, 0, +1}

    def reset(self, batch: int) -> None:
        """Forget committed sides."""
        self.side = torch.zeros(batch, self.cfg.n_obstacles)

    def act(self, st: PursuitState, generator: torch.Generator) -> torch.Tensor:
        """Normalised velocity command (B, 2) for the current state."""
        c = self.cfg
        B = st.robot.shape[0]
        if self.side is None or self.side.shape[0] != B:
            self.reset(B)
        assert self.side is not None
        p = st.robot
        tgt = st.balls[torch.arange(B), st.target]
        tv = (
            c.ball_speed
            * torch.stack([torch.cos(st.heading), torch.sin(st.heading)], dim=-1)[
                torch.arange(B), st.target
            ]
        )
        lead = ((tgt - p).norm(dim=-1) / c.v_max).clamp(max=c.expert_lead_cap)
        aim = (tgt + tv * lead[:, None]).clamp(-0.95, 0.95)
        u = _unit(aim - p)
        seg = (aim - p).norm(dim=-1)
        heading = torch.atan2(u[:, 1], u[:, 0])
        # Nearest blocking obstacle along the path (if any).
        best = torch.full((B,), float("inf"))
        new_heading = heading.clone()
        for k in range(c.n_obstacles):
            o = st.obstacles[:, k]
            R = st.radii[:, k] + c.robot_radius + c.expert_margin
            rel = o - p
            along = (rel * u).sum(-1)
            lateral = u[:, 0] * rel[:, 1] - u[:, 1] * rel[:, 0]  # >0: obstacle left of path
            dist = rel.norm(dim=-1)
            blocked = (along > 0) & (along < seg + R) & (lateral.abs() < R)
            fresh = blocked & (self.side[:, k] == 0)
            if fresh.any():
                # side=+1 turns clockwise past the obstacle (heading ang_o - half); that is
                # the shorter way when the obstacle lies left of the path (lateral > 0).
                p_cw = torch.sigmoid(lateral / c.expert_side_temp)
                r = torch.rand(B, generator=generator)
                choice = torch.where(r < p_cw, 1.0, -1.0)
                self.side[:, k] = torch.where(fresh, choice, self.side[:, k])
            self.side[:, k] = torch.where(blocked, self.side[:, k], torch.zeros_like(lateral))
            ang_o = torch.atan2(rel[:, 1], rel[:, 0])
            half = torch.asin(torch.clamp(R / dist.clamp(min=1e-6), max=1.0))
            # Inside the safety margin: move along the tangent, slightly outward.
            half = torch.where(dist < R, torch.full_like(half, math.pi / 2 + 0.3), half)
            tangent = ang_o - self.side[:, k] * half
            use = blocked & (along < best)
            new_heading = torch.where(use, tangent, new_heading)
            best = torch.where(use, along, best)
        # Safety: never step into any obstacle; turn to the nearer tangent instead.
        for k in range(c.n_obstacles):
            rel = st.obstacles[:, k] - p
            dist = rel.norm(dim=-1)
            R = st.radii[:, k] + c.robot_radius + 0.5 * c.expert_margin
            ang_o = torch.atan2(rel[:, 1], rel[:, 0])
            half = torch.asin(torch.clamp(R / dist.clamp(min=1e-6), max=1.0))
            half = torch.where(dist < R, torch.full_like(half, math.pi / 2 + 0.3), half)
            off = torch.remainder(new_heading - ang_o + math.pi, 2 * math.pi) - math.pi
            into = (dist < R + 2 * c.v_max) & (off.abs() < half) & (st.radii[:, k] > 0)
            fix = ang_o + torch.where(off >= 0, half, -half)
            new_heading = torch.where(into, fix, new_heading)
        return torch.stack([torch.cos(new_heading), torch.sin(new_heading)], dim=-1)
