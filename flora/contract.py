"""Core data contract (DESIGN §3, seed eq. 1).

Time is integer microseconds everywhere inside the engine; seconds only at the edges.
Intervals are half-open ``[start, end)`` with ``0 <= start < end <= duration``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

US_PER_S = 1_000_000
TICK_US = 50_000  # 20 Hz local ticks used by the segmenter grammar


class ContractError(ValueError):
    """An item violates the data contract. The message names what and where."""


def s_to_us(seconds: float) -> int:
    """Seconds (edge format) to integer microseconds, rounded to nearest."""
    return int(round(seconds * US_PER_S))


def us_to_s(us: int) -> float:
    """Integer microseconds to seconds (for display / edge formats only)."""
    return us / US_PER_S


@dataclass(frozen=True, order=True)
class Interval:
    """Half-open time interval ``[start_us, end_us)``."""

    start_us: int
    end_us: int

    @property
    def duration_us(self) -> int:
        return self.end_us - self.start_us

    def overlaps(self, other: Interval) -> bool:
        """Strict overlap: touching half-open intervals do not overlap."""
        return self.start_us < other.end_us and other.start_us < self.end_us

    def intersection_us(self, other: Interval) -> int:
        return max(0, min(self.end_us, other.end_us) - max(self.start_us, other.start_us))

    def contains(self, t_us: int) -> bool:
        return self.start_us <= t_us < self.end_us


@dataclass(frozen=True)
class Event:
    """One timestamped action ``(s_i, e_i, c_i)`` of eq. (1)."""

    start_us: int
    end_us: int
    caption: str = ""

    @property
    def interval(self) -> Interval:
        return Interval(self.start_us, self.end_us)

    @property
    def duration_us(self) -> int:
        return self.end_us - self.start_us


def validate_interval(
    start_us: int, end_us: int, duration_us: int, *, where: str = "interval"
) -> None:
    """Check eq. (1): integers with ``0 <= start < end <= duration``; raise ContractError."""
    for name, v in (("start_us", start_us), ("end_us", end_us), ("duration_us", duration_us)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ContractError(f"{where}: {name}={v!r} must be an integer number of µs")
    if not 0 <= start_us < end_us <= duration_us:
        raise ContractError(
            f"{where}: violates 0 <= start_us < end_us <= duration_us "
            f"(start_us={start_us}, end_us={end_us}, duration_us={duration_us})"
        )


def validate_events(events: Iterable[Event], duration_us: int, *, where: str = "episode") -> None:
    """Validate every event of one episode against eq. (1)."""
    for i, ev in enumerate(events):
        validate_interval(ev.start_us, ev.end_us, duration_us, where=f"{where} event {i}")


#: The columns that tie a caption to the event it describes: a caption belongs to its event
#: by index *and* interval, so one written before the episode was segmented again (same
#: index, another interval) describes a segment that no longer exists.
EVENT_KEY = ("event_index", "start_us", "end_us")


def event_keys(df: Any) -> set[tuple[int, int, int]]:
    """The :data:`EVENT_KEY` triples of an events or captions frame (empty for ``None``)."""
    if df is None or not len(df):
        return set()
    return {(int(k), int(s), int(e)) for k, s, e in df[list(EVENT_KEY)].itertuples(index=False)}


def captions_by_event(df: Any) -> dict[tuple[int, int, int], Any]:
    """Caption per :data:`EVENT_KEY` triple of a captions frame (empty for ``None``)."""
    if df is None or not len(df):
        return {}
    keys = df[list(EVENT_KEY)].itertuples(index=False)
    return {(int(k), int(s), int(e)): c for (k, s, e), c in zip(keys, df["caption"], strict=True)}
