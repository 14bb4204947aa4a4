"""GX suite for the ``captions`` table (contextual captioner output, DESIGN §3.2).

One row per captioned event. Boundaries are the events table's, copied unchanged, so the
same eq. (1) checks hold: integer ``0 <= start_us < end_us <= duration_us``. Each caption
obeys the caption grammar (one sentence, non-empty, bounded length — checked with the
grammar's own checker through a derived column); ``context_roles`` is one of the four
possible role sets and always holds TARGET; ``(episode_id, event_index)`` is unique.
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

CAPTION_COLUMNS = (
    "event_index",
    "start_us",
    "end_us",
    "duration_us",
    "caption",
    "context_roles",
    "missing_views",
    "n_frames",
    "attempts",
    "prompt_version",
)
ROLE_SETS = ["TARGET", "BEFORE,TARGET", "TARGET,AFTER", "BEFORE,TARGET,AFTER"]


def _derive_captions(df: pd.DataFrame) -> pd.DataFrame:
    from flora.caption.grammar import caption_problem

    out = df.copy()
    if "caption" in df.columns:
        out["_chk_caption_grammar"] = [
            isinstance(c, str) and caption_problem(c) is None for c in df["caption"]
        ]
    else:  # the missing column fails ExpectColumnToExist; every row is unchecked
        out["_chk_caption_grammar"] = [False] * len(df)
    return out


@register_suite(
    "captions",
    derive=_derive_captions,
    index_columns=("episode_id", "event_index", "start_us", "end_us"),
    description="Captions, one row per event (eq. 2)",
)
def _captions(gxe):
    """Captioned events: boundaries as in eq. (1), grammar-valid captions, explicit roles."""
    return [
        *common_columns(gxe),
        *columns_exist(gxe, *CAPTION_COLUMNS),
        *not_null(gxe, "event_index", "start_us", "end_us", "duration_us", "caption", "model"),
        *not_null(gxe, "n_frames", "attempts", "context_roles"),  # set/range checks skip nulls
        *interval_in_episode(gxe),
        gxe.ExpectColumnValuesToBeBetween(column="event_index", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="n_frames", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="attempts", min_value=1),
        gxe.ExpectColumnValuesToBeInSet(column="context_roles", value_set=ROLE_SETS),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["episode_id", "event_index"]),
        *checks_hold(gxe, "_chk_caption_grammar"),
    ]
