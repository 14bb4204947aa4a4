"""Per-window targets from episode events (SFT targets and the stitching round trip).

The inverse of stitching: clip every event to every window, express it in 20 Hz ticks
from the window start, and set the continuation flags when the event extends past the
window's edge. Rendered with :func:`~flora.segment.grammar.render_segments` these are the
segmenter's SFT targets; stitched back they reproduce the events (DESIGN §3.7).
"""

from __future__ import annotations

from collections.abc import Sequence

from flora.contract import TICK_US
from flora.segment.grammar import canonical_segments
from flora.segment.plan import LocalSegment, Window


def window_targets(events: Sequence, window: Window) -> list[LocalSegment]:
    """The ``LocalSegment`` list a perfect segmenter outputs for ``window``.

    ``events`` are anything with ``start_us``/``end_us``. A clipped start is floored and a
    clipped end is ceiled to the tick grid (exact for tick-aligned events; an end at a
    non-aligned episode end maps to the last partial tick, which projects back to ``T``).
    In canonical form (:func:`~flora.segment.grammar.canonical_segments`): sorted by
    ``(u, v)``, one segment per ``(u, v)`` — overlapping events that clip to the same ticks
    give one segment, its flags OR'd — so the rendered target parses back to this list.
    """
    out: list[LocalSegment] = []
    for ev in events:
        s = max(int(ev.start_us), window.start_us)
        e = min(int(ev.end_us), window.end_us)
        if s >= e:
            continue
        u = (s - window.start_us) // TICK_US
        v = -(-(e - window.start_us) // TICK_US)
        out.append(
            LocalSegment(
                u, v, left_open=ev.start_us < window.start_us, right_open=ev.end_us > window.end_us
            )
        )
    return canonical_segments(out)


def pass_targets(events: Sequence, windows: Sequence[Window]) -> list[list[LocalSegment]]:
    """:func:`window_targets` for every window of a pass."""
    return [window_targets(events, w) for w in windows]
