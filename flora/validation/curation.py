"""GX suites for curation's tables: ``curation`` (decisions) and ``mixture`` (DESIGN §3.8).

``mixture``: weights are non-negative and sum to 1 within each split; intervals obey
eq. (1) (``0 <= start_us < end_us <= duration_us``); every row traces to its sources
(non-empty ``source_run_ids`` and ``source_tables``); pretraining rows carry a caption;
``(split, episode_id, event_index)`` is unique.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flora.validation.core import (
    checks_hold,
    columns_exist,
    common_columns,
    interval_in_episode,
    not_null,
    register_suite,
)

SPLIT_SET = ["pretrain", "policy", "failures"]
_TOL = 1e-6


def _nonempty(v) -> bool:
    try:
        return v is not None and len(v) > 0 and all(isinstance(x, str) and x for x in v)
    except TypeError:
        return False


def _derive_mixture(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    n = len(df)
    if {"split", "weight"} <= set(df.columns):
        w = pd.to_numeric(df["weight"], errors="coerce")
        sums = w.groupby(df["split"]).transform("sum")
        out["_chk_weights_sum_1_per_split"] = (sums - 1.0).abs().to_numpy() <= _TOL
    else:
        out["_chk_weights_sum_1_per_split"] = [False] * n
    for col, chk in (("source_run_ids", "_chk_traces_to_runs"),
                     ("source_tables", "_chk_traces_to_tables")):  # fmt: skip
        out[chk] = [_nonempty(v) for v in df[col]] if col in df.columns else [False] * n
    if {"split", "caption"} <= set(df.columns):
        has = df["caption"].map(lambda c: isinstance(c, str) and bool(c.strip()))
        out["_chk_pretrain_captioned"] = (np.asarray(df["split"] != "pretrain") | has).tolist()
    else:
        out["_chk_pretrain_captioned"] = [False] * n
    return out


@register_suite(
    "mixture",
    derive=_derive_mixture,
    index_columns=("episode_id", "split", "event_index", "start_us", "end_us"),
    description="Curated mixture, one row per item and split (DESIGN §3.8)",
)
def _mixture(gxe):
    """Curated mixture: valid intervals, weights summing to 1 per split, full lineage."""
    return [
        *common_columns(gxe),
        *columns_exist(
            gxe,
            "start_us",
            "end_us",
            "caption",
            "weight",
            "split",
            "reason",
            "source_run_ids",
            "duration_us",
        ),  # fmt: skip
        *not_null(gxe, "start_us", "end_us", "weight", "split", "reason"),
        *interval_in_episode(gxe),
        gxe.ExpectColumnValuesToBeBetween(column="weight", min_value=0.0, max_value=1.0),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=SPLIT_SET),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["split", "episode_id", "event_index"]),
        *checks_hold(
            gxe,
            "_chk_weights_sum_1_per_split",
            "_chk_traces_to_runs",
            "_chk_traces_to_tables",
            "_chk_pretrain_captioned",
        ),  # fmt: skip
    ]


def _derive_curation(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if {"pretrain", "policy", "failures"} <= set(df.columns):
        # pretrain ⊆ policy, and failures never overlap the training splits.
        out["_chk_split_logic"] = ((~df.pretrain | df.policy) & ~(df.failures & df.policy)).tolist()
    else:
        out["_chk_split_logic"] = [False] * len(df)
    if {"failures", "failure_reason"} <= set(df.columns):
        out["_chk_failure_has_reason"] = (~df.failures | df.failure_reason.notna()).tolist()
    else:
        out["_chk_failure_has_reason"] = [False] * len(df)
    return out


@register_suite(
    "curation",
    derive=_derive_curation,
    index_columns=("episode_id", "event_index", "start_us", "end_us"),
    description="Curation decisions, one row per item (keep/drop, split flags, reasons)",
)
def _curation(gxe):
    """Decisions: one row per item, consistent split flags, every failure with its reason."""
    return [
        *common_columns(gxe),
        *columns_exist(
            gxe,
            "event_index",
            "start_us",
            "end_us",
            "duration_us",
            "pretrain",
            "policy",
            "failures",
            "reason",
            "rules_sha",
        ),  # fmt: skip
        *not_null(gxe, "reason", "rules_sha"),
        *interval_in_episode(gxe),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["episode_id", "event_index"]),
        *checks_hold(gxe, "_chk_split_logic", "_chk_failure_has_reason"),
    ]
