"""Shifted-pass boundary refinement (DESIGN §3.1; seed §2 "shifted windows").

A primary-pass boundary that lies close to a primary core edge was decided by a window
that saw little context on one side of it. The shifted pass puts its core edges half a
core away (``C/2 + kC``), so the same boundary sits deep inside a shifted core. The rule:

* stitch the shifted pass on its own (same :func:`~flora.segment.stitch.stitch` rules);
* match each primary event to the shifted event of highest tIoU, if that tIoU >= 0.5;
* a primary start (end) within ``guard_us`` of an *interior* primary core edge (episode
  edges 0 and T are not refined: there is no content beyond them) is replaced by the
  matched shifted event's start (end), provided that estimate was selected from a member
  window (not an outermost fallback) and lies at least ``guard_us`` inside the shifted
  core that holds it;
* a replacement that would make ``start >= end`` is not applied.

Boundaries are replaced, never averaged. Exact duplicates created by refinement (two
primary fragments of one action adopting the same shifted boundaries) collapse to one.
``guard_us`` defaults to the profile's left guard (2 s standard, 4 s long-horizon).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from flora.contract import Event
from flora.segment.plan import LocalSegment, Window, get_profile
from flora.segment.stitch import StitchedEvent, stitch_detailed

MATCH_TIOU = 0.5


def _tiou(a0: int, a1: int, b0: int, b1: int) -> float:
    inter = max(0, min(a1, b1) - max(a0, b0))
    union = (a1 - a0) + (b1 - b0) - inter
    return inter / union if union > 0 else 0.0


def primary_core_edges(duration_us: int, profile: str) -> list[int]:
    """Interior core edges ``kC`` (0 < kC < T) of the primary pass."""
    c = get_profile(profile).core_us
    return list(range(c, duration_us, c))


def _near(t: int, edges: Sequence[int], guard: int) -> bool:
    """``t`` is closer than ``guard`` to an edge (``edges`` sorted)."""
    i = bisect.bisect_left(edges, t)
    return any(abs(t - edges[j]) < guard for j in (i - 1, i) if 0 <= j < len(edges))


class _Cores:
    """Sorted, disjoint cores of one pass: which core holds a time, and how deep."""

    def __init__(self, windows: Sequence[Window]) -> None:
        self.windows = sorted(windows, key=lambda w: w.core_start_us)
        self.starts = [w.core_start_us for w in self.windows]

    def deep_start(self, t: int, guard: int) -> bool:
        j = bisect.bisect_right(self.starts, t) - 1
        w = self.windows[j] if j >= 0 else None
        return w is not None and w.core_holds_start(t) and w.core_depth_us(t) >= guard

    def deep_end(self, t: int, guard: int) -> bool:
        j = bisect.bisect_left(self.starts, t) - 1  # core_start < t <= core_end
        w = self.windows[j] if j >= 0 else None
        return w is not None and w.core_holds_end(t) and w.core_depth_us(t) >= guard


@dataclass(frozen=True)
class RefinedEvent:
    """A primary event after refinement, with which boundaries the shifted pass replaced."""

    start_us: int
    end_us: int
    caption: str
    origin: int  # index of the primary event it came from
    start_refined: bool
    end_refined: bool

    def to_event(self) -> Event:
        return Event(self.start_us, self.end_us, self.caption)


def refine_detailed(
    primary_events: Sequence[Event],
    shifted_windows: Sequence[Window],
    shifted_outputs: Sequence[Sequence[LocalSegment]],
    duration_us: int,
    *,
    guard_us: int | None = None,
    primary_windows: Sequence[Window] | None = None,
) -> list[RefinedEvent]:
    """Like :func:`refine` but reports provenance (origin event, replaced boundaries)."""
    if not shifted_windows:
        out = [
            RefinedEvent(ev.start_us, ev.end_us, ev.caption, i, False, False)
            for i, ev in enumerate(primary_events)
        ]
        return sorted(out, key=lambda x: (x.start_us, x.end_us, x.origin))
    profile = shifted_windows[0].profile
    guard = get_profile(profile).left_guard_us if guard_us is None else guard_us
    if primary_windows is not None:
        edges = sorted(
            {w.core_start_us for w in primary_windows} | {w.core_end_us for w in primary_windows}
        )
        edges = [e for e in edges if 0 < e < duration_us]
    else:
        edges = primary_core_edges(duration_us, profile)
    shifted: list[StitchedEvent] = stitch_detailed(shifted_windows, shifted_outputs, duration_us)
    cores = _Cores(shifted_windows)
    starts = [sh.start_us for sh in shifted]  # sorted by stitch
    max_len = max((sh.end_us - sh.start_us for sh in shifted), default=0)
    out: list[RefinedEvent] = []
    seen: set[tuple[int, int, str]] = set()
    for i, ev in enumerate(primary_events):
        s, e = ev.start_us, ev.end_us
        rs = re = False
        best, best_t = None, MATCH_TIOU
        # Only shifted events that can overlap [s, e): start in [s - max_len, e).
        lo = bisect.bisect_left(starts, s - max_len)
        hi = bisect.bisect_left(starts, e)
        for sh in shifted[lo:hi]:
            t = _tiou(s, e, sh.start_us, sh.end_us)
            if t >= best_t and (best is None or t > best_t):
                best, best_t = sh, t
        if best is not None:
            if (
                _near(s, edges, guard)
                and best.start_from is not None
                and cores.deep_start(best.start_us, guard)
                and best.start_us < e
            ):
                rs, s = best.start_us != s, best.start_us
            if (
                _near(e, edges, guard)
                and best.end_from is not None
                and cores.deep_end(best.end_us, guard)
                and best.end_us > s
            ):
                re, e = best.end_us != e, best.end_us
        key = (s, e, ev.caption)
        if key in seen:
            continue  # a fragment that now coincides with an earlier refined event
        seen.add(key)
        out.append(RefinedEvent(s, e, ev.caption, i, rs, re))
    out.sort(key=lambda x: (x.start_us, x.end_us, x.origin))
    return out


def refine(
    primary_events: Sequence[Event],
    shifted_windows: Sequence[Window],
    shifted_outputs: Sequence[Sequence[LocalSegment]],
    duration_us: int,
    *,
    guard_us: int | None = None,
    primary_windows: Sequence[Window] | None = None,
) -> list[Event]:
    """Replace primary boundaries near primary core edges with the shifted pass's estimate.

    ``primary_windows`` (optional) gives the primary core edges; otherwise they are
    ``kC`` for the shifted windows' profile. Returns events sorted by ``(start, end)``;
    captions of primary events are kept.
    """
    return [
        r.to_event()
        for r in refine_detailed(
            primary_events,
            shifted_windows,
            shifted_outputs,
            duration_us,
            guard_us=guard_us,
            primary_windows=primary_windows,
        )
    ]
