"""Context selection for the contextual captioner (DESIGN §3.2, seed §3, eq. 2).

For a target event ``I_i = [s, e)`` the captioner sees up to three clips:

* ``BEFORE = [max(0, s - 2 s), s)`` — only when a *previous* non-overlapping event exists;
* ``TARGET = [s, e)`` — always;
* ``AFTER  = [e, min(T, e + 2 s))`` — only when a *next* non-overlapping event exists.

Neighbour definition (exact, deterministic):

* previous event: among the other well-formed events ``j`` with ``e_j <= s`` (so it does not
  overlap ``I_i``; touching half-open intervals do not overlap), the one with the largest
  ``e_j``; ties by the latest ``s_j``; remaining ties by the lowest input position.
* next event: among the other well-formed events with ``s_j >= e``, the smallest ``s_j``;
  ties by the earliest ``e_j``; remaining ties by the lowest input position.

Why the clips are fixed 2 s windows while neighbours decide whether they exist: the seed's
``X_i^-`` / ``X_i^+`` are "frames of the neighbouring events", and its reference code cuts
them as fixed 2 s windows adjacent to the target. The neighbour event is what makes the
context meaningful (it is the previous / next *step*); when there is none, the footage
before/after is idle or absent and the context is "unavailable" and therefore omitted,
never padded. The neighbour's interval (and caption, when it has one) is named in the
prompt; its frames are the adjacent 2 s clip. Because a previous event ends at or before
``s`` with ``start < end``, a previous event implies ``s > 0`` and a non-empty BEFORE clip
(symmetrically for AFTER and ``T``); empty clips are still checked and omitted.

Overlapping events (bimanual work) are allowed: they are simply never each other's context.
A malformed or out-of-episode event gets its own ``FloraDataError``; it is never used as a
neighbour, and the other events still get their contexts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flora.contract import US_PER_S, ContractError, Event, validate_interval
from flora.data.episode import FloraDataError

ROLE_BEFORE = "BEFORE"
ROLE_TARGET = "TARGET"
ROLE_AFTER = "AFTER"
ROLES = (ROLE_BEFORE, ROLE_TARGET, ROLE_AFTER)
CONTEXT_US = 2 * US_PER_S  # fixed context clip length (DESIGN §3.2)


@dataclass(frozen=True)
class Clip:
    """One role's half-open time span ``[start_us, end_us)`` in episode time."""

    role: str
    start_us: int
    end_us: int

    @property
    def duration_us(self) -> int:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class EventContext:
    """The target event, its chosen neighbours and the clips the model will see."""

    index: int  # position of the target in the episode's event list
    target: Event
    clips: tuple[Clip, ...]  # ordered BEFORE?, TARGET, AFTER?
    before: Event | None = None
    before_index: int | None = None
    after: Event | None = None
    after_index: int | None = None

    @property
    def roles(self) -> tuple[str, ...]:
        """Roles present, in order (e.g. ``("TARGET", "AFTER")`` for a first event)."""
        return tuple(c.role for c in self.clips)

    def clip(self, role: str) -> Clip | None:
        """The clip of ``role`` or None when that context is unavailable."""
        for c in self.clips:
            if c.role == role:
                return c
        return None


def _check_event(
    ev: object, i: int, duration_us: int, dataset: str | None, episode: int | str | None
) -> FloraDataError | None:
    """Return a per-event error for a malformed / out-of-episode event, else None."""
    start = getattr(ev, "start_us", None)
    end = getattr(ev, "end_us", None)
    if start is None or end is None:
        return FloraDataError(
            f"event {i} has no start_us/end_us (got {type(ev).__name__})",
            dataset=dataset,
            episode=episode,
            field="start_us/end_us",
        )
    try:
        validate_interval(start, end, duration_us, where=f"event {i}")
    except ContractError as err:
        field = "start_us" if not (isinstance(start, int) and 0 <= start) else "end_us"
        return FloraDataError(str(err), dataset=dataset, episode=episode, field=field)
    return None


def _previous(events: Sequence[Event], ok: Sequence[bool], i: int) -> int | None:
    s = events[i].start_us
    best: int | None = None
    for j, ev in enumerate(events):
        if j == i or not ok[j] or ev.end_us > s:
            continue
        if best is None or (ev.end_us, ev.start_us) > (events[best].end_us, events[best].start_us):
            best = j  # strict '>' keeps the lowest position on full ties
    return best


def _next(events: Sequence[Event], ok: Sequence[bool], i: int) -> int | None:
    e = events[i].end_us
    best: int | None = None
    for j, ev in enumerate(events):
        if j == i or not ok[j] or ev.start_us < e:
            continue
        if best is None or (ev.start_us, ev.end_us) < (events[best].start_us, events[best].end_us):
            best = j
    return best


def select_contexts(
    events: Sequence[Event],
    duration_us: int,
    *,
    dataset: str | None = None,
    episode: int | str | None = None,
    context_us: int = CONTEXT_US,
    require_neighbour: bool = True,
) -> list[EventContext | FloraDataError]:
    """Choose BEFORE/TARGET/AFTER clips for every event of one episode.

    Returns one entry per input event, in input order: an ``EventContext`` or the
    ``FloraDataError`` explaining why that event cannot be captioned (malformed interval,
    outside ``[0, duration_us]``). ``require_neighbour=False`` keeps a context clip
    whenever footage exists even without a neighbour event (not the DESIGN default).
    """
    if isinstance(duration_us, bool) or not isinstance(duration_us, int) or duration_us <= 0:
        raise FloraDataError(
            f"episode duration must be a positive integer of µs, got {duration_us!r}",
            dataset=dataset,
            episode=episode,
            field="duration_us",
        )
    if context_us <= 0:
        raise ValueError(f"context_us must be > 0, got {context_us}")
    errors = [_check_event(ev, i, duration_us, dataset, episode) for i, ev in enumerate(events)]
    ok = [err is None for err in errors]
    out: list[EventContext | FloraDataError] = []
    for i, ev in enumerate(events):
        if errors[i] is not None:
            out.append(errors[i])  # type: ignore[arg-type]
            continue
        s, e = ev.start_us, ev.end_us
        prev_j, next_j = _previous(events, ok, i), _next(events, ok, i)
        clips: list[Clip] = []
        if prev_j is not None or not require_neighbour:
            b0 = max(0, s - context_us)
            if b0 < s:  # an empty clip at t=0 is omitted, never padded
                clips.append(Clip(ROLE_BEFORE, b0, s))
        clips.append(Clip(ROLE_TARGET, s, e))
        if next_j is not None or not require_neighbour:
            a1 = min(duration_us, e + context_us)
            if e < a1:  # an empty clip at t=T is omitted
                clips.append(Clip(ROLE_AFTER, e, a1))
        has_before = any(c.role == ROLE_BEFORE for c in clips)
        has_after = any(c.role == ROLE_AFTER for c in clips)
        out.append(
            EventContext(
                index=i,
                target=Event(s, e, getattr(ev, "caption", "") or ""),
                clips=tuple(clips),
                before=events[prev_j] if prev_j is not None and has_before else None,
                before_index=prev_j if has_before else None,
                after=events[next_j] if next_j is not None and has_after else None,
                after_index=next_j if has_after else None,
            )
        )
    return out
