"""GX suite for the ``events`` table (stitched segmenter output, captioned later).

One row per event. Eq. (1) is checked row-wise: integer ``start_us``/``end_us`` with
``0 <= start_us < end_us <= duration_us`` (``duration_us`` is the episode duration,
carried on every row so the check needs no other table). Per episode, ``event_index``
numbers the events ``0..n-1`` in ``(start_us, end_us)`` order and no event is repeated.
Events may overlap (bimanual work), so overlap is *not* a failure.
"""

from __future__ import annotations

import pandas as pd

from flora.validation.core import (
    checks_hold,
    columns_exist,
    common_columns,
    interval_in_episode,
    not_null,
    register_suite,
)

EVENT_COLUMNS = (
    "event_index",
    "start_us",
    "end_us",
    "duration_us",
    "caption",
    "source",
    "n_windows",
)


def _derive_events(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    n = len(df)
    needed = {"episode_id", "start_us", "end_us", "event_index", "caption"}
    if not needed <= set(df.columns):
        # The missing column itself fails ExpectColumnToExist; mark every row as unchecked.
        out["_chk_sorted_index"] = [False] * n
        out["_chk_unique_interval"] = [False] * n
        return out
    ok_index = pd.Series(False, index=df.index)
    for _, g in df.groupby("episode_id", sort=False):
        order = g.sort_values(["start_us", "end_us"], kind="stable")
        # event_index must be 0..n-1 and follow (start, end) order.
        expected = list(range(len(g)))
        idx_ok = list(order["event_index"]) == expected and g["event_index"].is_unique
        ok_index.loc[g.index] = idx_ok
    out["_chk_sorted_index"] = ok_index.to_numpy()
    dup = df.duplicated(subset=["episode_id", "start_us", "end_us", "caption"], keep=False)
    out["_chk_unique_interval"] = ~dup.to_numpy()
    return out


@register_suite(
    "events",
    derive=_derive_events,
    index_columns=("episode_id", "event_index", "start_us", "end_us"),
    description="Stitched events, one row per event (eq. 1)",
)
def _events(gxe):
    """Stitched events: half-open µs intervals inside the episode, indexed in start order."""
    return [
        *common_columns(gxe),
        *columns_exist(gxe, *EVENT_COLUMNS),
        *not_null(gxe, "start_us", "end_us", "duration_us", "caption", "n_windows"),
        *interval_in_episode(gxe),
        gxe.ExpectColumnValuesToBeBetween(column="duration_us", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="n_windows", min_value=1),
        *checks_hold(gxe, "_chk_sorted_index", "_chk_unique_interval"),
    ]
