"""Segmentation window planning (DESIGN §3.1, §3.7; seed §2 eq. 12).

An episode ``[0, T)`` is tiled by *cores* of length ``C``; each window is its core plus a
left and right guard, clipped to ``[0, T]``. The model sees the whole window (guards give
context) but only segments that intersect the core are kept. Local timestamps inside a
window are 20 Hz ticks (``TICK_US``) counted from the window start.

The shifted pass moves every core edge by half a core (edges at ``C/2 + kC``, first core
``[0, C/2)``) so that boundaries which fell near a primary core edge sit well inside a
shifted core (see :mod:`flora.segment.refine`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flora.contract import TICK_US, US_PER_S


@dataclass(frozen=True)
class WindowProfile:
    """Guard/core lengths and frame slots of one window profile (DESIGN §3.1)."""

    name: str
    left_guard_us: int
    core_us: int
    right_guard_us: int
    slot_count: int
    slot_fps: int

    @property
    def window_us(self) -> int:
        """Length of an unclipped window (guard + core + guard)."""
        return self.left_guard_us + self.core_us + self.right_guard_us

    @property
    def slot_us(self) -> int:
        """Spacing of the sampled frames (250 ms at 4 Hz)."""
        return US_PER_S // self.slot_fps


PROFILES: dict[str, WindowProfile] = {
    "standard": WindowProfile("standard", 2 * US_PER_S, 12 * US_PER_S, 2 * US_PER_S, 64, 4),
    "long_horizon": WindowProfile(
        "long_horizon", 4 * US_PER_S, 24 * US_PER_S, 4 * US_PER_S, 128, 4
    ),
}


def get_profile(profile: str | WindowProfile) -> WindowProfile:
    """Look a profile up by name (``standard`` / ``long_horizon``); pass objects through."""
    if isinstance(profile, WindowProfile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(
            f"unknown segmentation profile {profile!r}; expected one of {sorted(PROFILES)}"
        ) from None


@dataclass(frozen=True)
class Window:
    """One segmentation window ``[start_us, end_us)`` with its emitting core.

    ``index`` is the window's position in its pass, ``shifted`` tells which pass it
    belongs to, ``profile`` names its :class:`WindowProfile`.
    """

    start_us: int
    end_us: int
    core_start_us: int
    core_end_us: int
    profile: str = "standard"
    index: int = 0
    shifted: bool = False

    @property
    def duration_us(self) -> int:
        return self.end_us - self.start_us

    @property
    def n_ticks(self) -> int:
        """Number of 20 Hz ticks covering the window; valid local ticks are ``0..n_ticks``.

        Windows start on whole seconds, so only a window ending at a non-tick-aligned
        episode end has a last partial tick (projected ends are clipped to ``T``).
        """
        return -(-self.duration_us // TICK_US)

    def frame_times_us(self) -> list[int]:
        """Episode times of the frame slots: 4 Hz from the window start, clipped to the window.

        A full window has ``slot_count`` (64 / 128) frames; a window clipped at an episode
        edge has fewer.
        """
        prof = get_profile(self.profile)
        times = []
        for i in range(prof.slot_count):
            t = self.start_us + i * prof.slot_us
            if t >= self.end_us:
                break
            times.append(t)
        return times

    def tick_to_us(self, tick: int) -> int:
        """Project a local tick to episode microseconds (unclipped)."""
        return self.start_us + tick * TICK_US

    def core_holds_start(self, t_us: int) -> bool:
        """A start belongs to the core ``[core_start, core_end)``."""
        return self.core_start_us <= t_us < self.core_end_us

    def core_holds_end(self, t_us: int) -> bool:
        """An end belongs to the core ``(core_start, core_end]`` (right edge included)."""
        return self.core_start_us < t_us <= self.core_end_us

    def core_depth_us(self, t_us: int) -> int:
        """Distance of ``t_us`` from the nearer core edge (larger = more context)."""
        return min(t_us - self.core_start_us, self.core_end_us - t_us)


@dataclass(frozen=True)
class LocalSegment:
    """One model output item ``(u, v, l, r)`` of eq. (12), in ticks from the window start.

    ``left_open`` / ``right_open``: the action extends past this window's left / right edge.
    """

    u: int
    v: int
    left_open: bool = False
    right_open: bool = False


def plan_windows(
    duration_us: int, profile: str | WindowProfile = "standard", shift: bool = False
) -> list[Window]:
    """Plan the windows of one pass over an episode of ``duration_us`` (DESIGN §3.7).

    Primary pass: core k is ``[kC, min((k+1)C, T))`` for ``k = 0 .. ceil(T/C)-1``; window k
    is ``[max(0, kC - G_left), min(T, (k+1)C + G_right))``. Shifted pass: core edges at
    ``C/2 + kC`` (first core ``[0, C/2)``), windows built the same way. An episode no longer
    than one core gets a single window ``[0, T)`` in either pass (it has no interior core
    edge to refine).
    """
    if isinstance(duration_us, bool) or not isinstance(duration_us, int):
        raise ValueError(f"duration_us must be an integer number of µs, got {duration_us!r}")
    if duration_us <= 0:
        raise ValueError(f"duration_us must be > 0 to plan segmentation windows, got {duration_us}")
    prof = get_profile(profile)
    T, C = duration_us, prof.core_us
    if T <= C:
        return [Window(0, T, 0, T, prof.name, 0, shift)]
    edges = [0]
    e = C // 2 if shift else C
    while e < T:
        edges.append(e)
        e += C
    edges.append(T)
    windows = []
    for k, (cs, ce) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        ws = max(0, cs - prof.left_guard_us)
        we = min(T, ce + prof.right_guard_us)
        windows.append(Window(ws, we, cs, ce, prof.name, k, shift))
    return windows
