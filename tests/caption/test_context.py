"""Context selection on hand-built timelines (DESIGN §3.2)."""

from __future__ import annotations

import pytest

from flora.caption.context import CONTEXT_US, Clip, select_contexts
from flora.contract import Event
from flora.data.episode import FloraDataError

S = 1_000_000
T = 20 * S


def ctx_of(events, i, duration=T, **kw):
    out = select_contexts(events, duration, dataset="toy", episode=3, **kw)[i]
    assert not isinstance(out, FloraDataError), out
    return out


def test_middle_event_gets_both_fixed_2s_clips_and_nearest_neighbours():
    ev = [Event(0, 3 * S), Event(4 * S, 8 * S), Event(10 * S, 12 * S), Event(13 * S, 15 * S)]
    c = ctx_of(ev, 1)
    assert c.roles == ("BEFORE", "TARGET", "AFTER")
    assert c.clip("BEFORE") == Clip("BEFORE", 2 * S, 4 * S)
    assert c.clip("TARGET") == Clip("TARGET", 4 * S, 8 * S)
    assert c.clip("AFTER") == Clip("AFTER", 8 * S, 10 * S)
    assert (c.before_index, c.after_index) == (0, 2)


def test_first_and_last_events_omit_the_missing_side():
    ev = [Event(S, 3 * S), Event(5 * S, 9 * S), Event(11 * S, 19 * S)]
    first, last = ctx_of(ev, 0), ctx_of(ev, 2)
    # footage exists before the first event (t in [0, 1 s)) but no previous event -> omitted
    assert first.roles == ("TARGET", "AFTER") and first.before is None
    assert last.roles == ("BEFORE", "TARGET") and last.after is None
    assert last.clip("BEFORE") == Clip("BEFORE", 9 * S, 11 * S)


def test_events_at_zero_and_T_and_short_context_clipped_to_episode():
    ev = [Event(0, S // 2), Event(S, 19_500_000), Event(19_500_000, T)]
    a, b, c = (ctx_of(ev, i) for i in range(3))
    assert a.roles == ("TARGET", "AFTER")  # at t=0: nothing before
    assert b.clip("BEFORE") == Clip("BEFORE", 0, S)  # max(0, s - 2 s)
    assert b.clip("AFTER") == Clip("AFTER", 19_500_000, T)  # min(T, e + 2 s)
    assert c.roles == ("BEFORE", "TARGET")  # ends at T: nothing after
    assert c.clip("BEFORE").duration_us == CONTEXT_US
    # the only event, covering the whole episode
    (only,) = select_contexts([Event(0, T)], T)
    assert only.roles == ("TARGET",)


def test_overlapping_events_are_never_each_others_context():
    # bimanual: B overlaps A and C; D touches C (half-open touch is not an overlap)
    A, B, C, D = Event(0, 5 * S), Event(4 * S, 9 * S), Event(8 * S, 12 * S), Event(12 * S, T)
    ev = [A, B, C, D]
    cb = ctx_of(ev, 1)
    assert cb.before is None and cb.roles[0] == "TARGET"  # A overlaps B
    assert cb.after_index == 3  # C overlaps B, D is the nearest non-overlapping
    cc = ctx_of(ev, 2)
    assert cc.before_index == 0 and cc.after_index == 3
    assert cc.clip("AFTER") == Clip("AFTER", 12 * S, 14 * S)


def test_nearest_tie_breaks_are_documented_ones():
    # two previous candidates end at the same time: the later start wins
    ev = [
        Event(S, 5 * S),
        Event(3 * S, 5 * S),
        Event(6 * S, 8 * S),
        Event(9 * S, 11 * S),
        Event(9 * S, 10 * S),
    ]
    c = ctx_of(ev, 2)
    assert c.before_index == 1
    # two next candidates start at the same time: the earlier end wins
    assert c.after_index == 4
    # identical duplicates: the lowest position wins
    ev2 = [Event(0, S), Event(0, S), Event(2 * S, 3 * S)]
    assert ctx_of(ev2, 2).before_index == 0


def test_nearest_is_by_end_not_start():
    # a long earlier event ending later beats a short one that starts later but ends earlier
    ev = [Event(0, 7 * S), Event(5 * S, 6 * S), Event(8 * S, 9 * S)]
    assert ctx_of(ev, 2).before_index == 0


def test_malformed_and_out_of_episode_events_get_per_event_errors():
    ev = [
        Event(0, 2 * S),
        Event(5 * S, 4 * S),
        Event(3 * S, T + 1),
        Event(6 * S, 8 * S),
        Event(1.5, 3),
    ]
    out = select_contexts(ev, T, dataset="toy", episode=7)
    assert isinstance(out[1], FloraDataError) and "start_us < end_us" in str(out[1])
    assert isinstance(out[2], FloraDataError) and out[2].field == "end_us"
    assert isinstance(out[4], FloraDataError) and "integer" in str(out[4])
    for err in (out[1], out[2], out[4]):
        assert err.dataset == "toy" and err.episode == 7
    # the good events still get contexts and malformed ones are never neighbours
    assert out[3].before_index == 0 and out[0].after_index == 3
    with pytest.raises(FloraDataError, match="duration"):
        select_contexts(ev, 0, dataset="toy", episode=7)


def test_optional_footage_only_mode():
    ev = [Event(S, 3 * S)]
    (c,) = select_contexts(ev, T, require_neighbour=False)
    assert c.roles == ("BEFORE", "TARGET", "AFTER")
    assert c.clip("BEFORE") == Clip("BEFORE", 0, S)
