"""Deterministic stitching of per-window segments into episode events (DESIGN §3.7).

Steps, exactly as the design fixes them:

1. *Project* every ``(u, v, l, r)`` to episode time ``[ws + u·tick, ws + v·tick)`` clipped
   to ``[0, T]``.
2. *Core filter*: keep a segment only if ``s < core_end`` and ``e > core_start``.
3. *Same action*: two kept segments from different windows are one action when their
   projected intervals overlap strictly and either the earlier window's segment is
   right-open and the later one's left-open, or their tIoU restricted to the two windows'
   shared span is >= 0.5. Linked segments are grouped (union–find; a group never holds two
   segments of the same window, which would be two distinct — e.g. bimanual — actions).
   Links are applied in order of shared-span tIoU alone: flags admit a link, they do not
   put it first (a flagged sliver of a neighbouring action must not outrank a good match).
4. *Boundaries*: an event's start comes from the member whose core holds its start
   (``[core_start, core_end)``) and that is not left-open; ties go to the member farthest
   from its core's edges, then the earlier window. The end likewise (core holds an end on
   ``(core_start, core_end]``; member not right-open). Only when no member qualifies does
   the boundary fall back to the outermost estimate. Boundaries are selected, never
   averaged.

Events are returned sorted by ``(start, end)``; they may overlap (bimanual work). Events
with the same ``(start, end)`` are one event (their windows joined): the ``events`` table
holds no repeated interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flora.contract import Event
from flora.segment.plan import LocalSegment, Window

MERGE_TIOU = 0.5


@dataclass(frozen=True)
class Projected:
    """A kept window segment in episode time (``window`` indexes the windows list)."""

    window: int
    start_us: int
    end_us: int
    left_open: bool
    right_open: bool


@dataclass(frozen=True)
class StitchedEvent:
    """A stitched event and the windows whose segments formed it (provenance)."""

    start_us: int
    end_us: int
    windows: tuple[int, ...]
    start_from: int | None  # window the start was taken from (None = outermost fallback)
    end_from: int | None

    def to_event(self, caption: str = "") -> Event:
        return Event(self.start_us, self.end_us, caption)


def project(
    windows: Sequence[Window], outputs: Sequence[Sequence[LocalSegment]], duration_us: int
) -> list[Projected]:
    """Project every window's segments to episode µs and apply the core filter."""
    if len(windows) != len(outputs):
        raise ValueError(f"stitch: {len(windows)} windows but {len(outputs)} outputs")
    if duration_us <= 0:
        raise ValueError(f"stitch: duration_us must be > 0, got {duration_us}")
    kept: list[Projected] = []
    for k, (w, segs) in enumerate(zip(windows, outputs, strict=True)):
        for seg in segs:
            if not (0 <= seg.u < seg.v <= w.n_ticks):
                # The parser guarantees this; anything else is a caller bug, not model noise.
                raise ValueError(
                    f"stitch: window {k} [{w.start_us}, {w.end_us}) has invalid segment "
                    f"{seg} (need 0 <= u < v <= {w.n_ticks})"
                )
            s = min(duration_us, max(0, w.tick_to_us(seg.u)))
            e = min(duration_us, max(0, w.tick_to_us(seg.v)))
            if s >= e:  # only possible for a segment wholly past T: nothing to keep
                continue
            if s < w.core_end_us and e > w.core_start_us:
                kept.append(Projected(k, s, e, bool(seg.left_open), bool(seg.right_open)))
    return kept


def _shared_tiou(a: Projected, b: Projected, wa: Window, wb: Window) -> float:
    lo, hi = max(wa.start_us, wb.start_us), min(wa.end_us, wb.end_us)
    if lo >= hi:
        return 0.0
    a0, a1 = max(a.start_us, lo), min(a.end_us, hi)
    b0, b1 = max(b.start_us, lo), min(b.end_us, hi)
    inter = max(0, min(a1, b1) - max(a0, b0))
    union = max(0, a1 - a0) + max(0, b1 - b0) - inter
    return inter / union if union > 0 else 0.0


def _window_order(windows: Sequence[Window], i: int) -> tuple[int, int]:
    return (windows[i].start_us, i)


def same_action(a: Projected, b: Projected, windows: Sequence[Window]) -> float | None:
    """Link score when ``a`` and ``b`` are the same action (DESIGN §3.7), else ``None``.

    The score — the shared-span tIoU — orders competing links. Continuation flags (the
    earlier segment right-open, the later left-open) admit a link whatever its tIoU but do
    not rank it: a flagged link is not put before a better-overlapping one. Near a core edge
    a small boundary error leaves a flagged sliver overlapping the *neighbouring* action;
    linked first, it would fuse the wrong pair (a 0.2 s event) and block the right merge.
    """
    if a.window == b.window:
        return None
    if not (a.start_us < b.end_us and b.start_us < a.end_us):
        return None
    early, late = (
        (a, b) if _window_order(windows, a.window) < _window_order(windows, b.window) else (b, a)
    )
    t = _shared_tiou(a, b, windows[a.window], windows[b.window])
    flagged = early.right_open and late.left_open
    if flagged or t >= MERGE_TIOU:
        return t
    return None


def _group(kept: list[Projected], windows: Sequence[Window]) -> list[list[int]]:
    # Candidate links only between strictly overlapping segments: a sweep over starts.
    order = sorted(range(len(kept)), key=lambda i: (kept[i].start_us, kept[i].end_us, i))
    links: list[tuple[float, int, int]] = []
    for pos, i in enumerate(order):
        for j in order[pos + 1 :]:
            if kept[j].start_us >= kept[i].end_us:
                break
            score = same_action(kept[i], kept[j], windows)
            if score is not None:
                links.append((score, min(i, j), max(i, j)))
    links.sort(key=lambda x: (-x[0], x[1], x[2]))
    parent = list(range(len(kept)))
    members: dict[int, set[int]] = {i: {kept[i].window} for i in range(len(kept))}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for _, i, j in links:
        ri, rj = find(i), find(j)
        if ri == rj or members[ri] & members[rj]:
            continue  # already one action, or would put two same-window actions together
        parent[rj] = ri
        members[ri] |= members.pop(rj)
    groups: dict[int, list[int]] = {}
    for i in range(len(kept)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _pick(cands: list[tuple[int, tuple[int, int], int]]) -> tuple[int, int] | None:
    """Best ``(value, window)`` among ``(depth, window_order, value)``; ``None`` if empty.

    Deepest inside its core wins, then the earlier window.
    """
    if not cands:
        return None
    _, (_, k), value = min(cands, key=lambda c: (-c[0], c[1]))
    return value, k


def stitch_detailed(
    windows: Sequence[Window], outputs: Sequence[Sequence[LocalSegment]], duration_us: int
) -> list[StitchedEvent]:
    """Like :func:`stitch` but keeps provenance (member windows, boundary sources)."""
    kept = project(windows, outputs, duration_us)
    events: list[StitchedEvent] = []
    for grp in _group(kept, windows):
        mem = [kept[i] for i in grp]
        starts = [
            (
                windows[m.window].core_depth_us(m.start_us),
                _window_order(windows, m.window),
                m.start_us,
            )
            for m in mem
            if not m.left_open and windows[m.window].core_holds_start(m.start_us)
        ]
        ends = [
            (windows[m.window].core_depth_us(m.end_us), _window_order(windows, m.window), m.end_us)
            for m in mem
            if not m.right_open and windows[m.window].core_holds_end(m.end_us)
        ]
        ps, pe = _pick(starts), _pick(ends)
        outer_s = min(m.start_us for m in mem)
        outer_e = max(m.end_us for m in mem)
        s, s_from = ps if ps else (outer_s, None)
        e, e_from = pe if pe else (outer_e, None)
        if s >= e:
            # Members disagree so much that the selected boundaries cross: keep the
            # outermost extent rather than invent an interval.
            s, e, s_from, e_from = outer_s, outer_e, None, None
        wins = tuple(sorted({m.window for m in mem}))
        events.append(StitchedEvent(s, e, wins, s_from, e_from))
    return _collapse_repeats(events)


def _first(values: Sequence[int | None]) -> int | None:
    return next((v for v in values if v is not None), None)


def _collapse_repeats(events: list[StitchedEvent]) -> list[StitchedEvent]:
    """Sort by ``(start, end)`` and make events with the same interval one event.

    Two groups can end on the same interval (segments of one window differing only in
    flags, or boundaries selected alike); as rows they would repeat an interval, which
    the ``events`` table forbids. The windows are joined; a boundary source is the first
    one recorded in ``(start, end, windows)`` order.
    """
    events.sort(key=lambda ev: (ev.start_us, ev.end_us, ev.windows))
    out: list[StitchedEvent] = []
    for ev in events:
        if out and (out[-1].start_us, out[-1].end_us) == (ev.start_us, ev.end_us):
            prev = out[-1]
            out[-1] = StitchedEvent(
                ev.start_us,
                ev.end_us,
                tuple(sorted(set(prev.windows) | set(ev.windows))),
                _first([prev.start_from, ev.start_from]),
                _first([prev.end_from, ev.end_from]),
            )
        else:
            out.append(ev)
    return out


def stitch(
    windows: Sequence[Window], outputs: Sequence[Sequence[LocalSegment]], duration_us: int
) -> list[Event]:
    """Stitch one pass's window outputs into episode events sorted by start (DESIGN §3.7).

    ``outputs[k]`` is the list of :class:`LocalSegment` of ``windows[k]``. Returns
    ``Event(start_us, end_us, caption="")``; events may overlap.
    """
    return [ev.to_event() for ev in stitch_detailed(windows, outputs, duration_us)]
