"""GX suites for the rewarder's tables: ``outcome``, ``dense_labels``, ``rubric``.

GX 1.x has no row-wise expectations over list columns, so each suite derives small check
columns (``_chk_*``) from the table first and expects those (see ``flora.validation.core``).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from flora.validation.core import (
    checks_hold,
    columns_exist,
    common_columns,
    not_null,
    register_suite,
)

_TOL = 1e-6


def _derive_outcome(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()

    def probs(v) -> np.ndarray:
        try:
            return np.asarray(list(v), dtype=np.float64)
        except (TypeError, ValueError):
            return np.full(0, np.nan)

    n, ok_sum, ok_min, ok_e, ok_r = [], [], [], [], []
    for p, e, r in zip(
        df.get("score_probs", pd.Series([None] * len(df))),
        df.get("expected_score", pd.Series([np.nan] * len(df))),
        df.get("reward", pd.Series([np.nan] * len(df))),
        strict=True,
    ):
        a = probs(p) if p is not None else np.full(0, np.nan)
        n.append(a.size)
        good = a.size == 5 and bool(np.all(np.isfinite(a)))
        ok_sum.append(good and abs(float(a.sum()) - 1.0) <= _TOL)
        ok_min.append(good and float(a.min()) >= 0.0)
        exp = float(np.dot(a, np.arange(1, 6))) if good else math.nan
        ok_e.append(good and abs(exp - float(e)) <= _TOL)
        ok_r.append(good and abs((exp - 1.0) / 4.0 - float(r)) <= _TOL)
    out["_chk_n_probs"] = n
    out["_chk_probs_sum_1"] = ok_sum
    out["_chk_probs_nonneg"] = ok_min
    out["_chk_expectation"] = ok_e
    out["_chk_reward_eq19"] = ok_r
    return out


@register_suite("outcome", derive=_derive_outcome, description="Outcome rewards, one per episode")
def _outcome(gxe):
    """Outcome rewards: five renormalised score probabilities, E[s], reward = (E[s]-1)/4."""
    return [
        *common_columns(gxe),
        *columns_exist(gxe, "score_probs", "expected_score", "reward", "argmax_score"),
        gxe.ExpectColumnValuesToBeUnique(column="episode_id"),
        # GX's set and range expectations skip nulls: a null must fail on its own.
        *not_null(gxe, "argmax_score"),
        gxe.ExpectColumnValuesToBeBetween(column="expected_score", min_value=1.0, max_value=5.0),
        gxe.ExpectColumnValuesToBeBetween(column="reward", min_value=0.0, max_value=1.0),
        gxe.ExpectColumnValuesToBeInSet(column="argmax_score", value_set=[1, 2, 3, 4, 5]),
        gxe.ExpectColumnValuesToBeInSet(column="_chk_n_probs", value_set=[5]),
        *checks_hold(
            gxe, "_chk_probs_sum_1", "_chk_probs_nonneg", "_chk_expectation", "_chk_reward_eq19"
        ),  # fmt: skip
    ]


def _derive_dense(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if {"label", "reason"} <= set(df.columns):
        reason = df["reason"].fillna("").astype(str).str.strip()
        # A non-normal group carries a reason; a normal one carries none.
        out["_chk_reason_iff_not_normal"] = (df["label"] == 3) == (reason == "")
    else:
        out["_chk_reason_iff_not_normal"] = False
    return out


@register_suite(
    "dense_labels",
    index_columns=("episode_id", "t_us"),
    derive=_derive_dense,
    description="Dense labels, one per episode and 0.5 s group",
)
def _dense(gxe):
    """Dense labels: label 1|2|3 per time, reason iff not normal, eq. (22) source."""
    return [
        *common_columns(gxe),
        *columns_exist(gxe, "t_us", "label", "reason", "source_window", "source_group"),
        # GX's set and range expectations skip nulls: a null must fail on its own.
        *not_null(gxe, "t_us", "label", "source_window", "source_group"),
        gxe.ExpectColumnValuesToBeBetween(column="t_us", min_value=0),
        gxe.ExpectCompoundColumnsToBeUnique(column_list=["episode_id", "t_us"]),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=[1, 2, 3]),
        gxe.ExpectColumnValuesToBeBetween(column="source_window", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="source_group", min_value=1, max_value=32),
        *checks_hold(gxe, "_chk_reason_iff_not_normal"),
    ]


def _derive_rubric(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    ok_len, ok_total, ok_allowed = [], [], []
    cols = {"rubric_json", "step_names", "step_scores", "total"}
    rows = df.to_dict("records") if cols <= set(df.columns) else [{}] * len(df)
    for row in rows:
        try:
            names = list(row["step_names"])
            scores = [float(x) for x in row["step_scores"]]
            rub = json.loads(row["rubric_json"])
            allowed = {s["name"]: [float(a) for a in s["allowed"]] for s in rub["steps"]}
        except (KeyError, TypeError, ValueError):
            ok_len.append(False)
            ok_total.append(False)
            ok_allowed.append(False)
            continue
        ok_len.append(len(names) == len(scores) and sorted(names) == sorted(allowed))
        ok_total.append(abs(math.fsum(scores) - float(row["total"])) <= _TOL)
        ok_allowed.append(
            all(
                n in allowed and any(abs(v - a) <= _TOL for a in allowed[n])
                for n, v in zip(names, scores, strict=False)
            )
        )
    out["_chk_steps_match_rubric"] = ok_len
    out["_chk_total_is_sum"] = ok_total
    out["_chk_scores_allowed"] = ok_allowed
    return out


@register_suite("rubric", derive=_derive_rubric, description="Rubric rewards, one per episode")
def _rubric(gxe):
    """Rubric rewards: every step scored from its allowed set, total = Σ step scores <= 1."""
    return [
        *common_columns(gxe),
        *columns_exist(gxe, "task", "rubric_json", "step_names", "step_scores", "total"),
        gxe.ExpectColumnValuesToBeUnique(column="episode_id"),
        gxe.ExpectColumnValuesToBeBetween(column="total", max_value=1.0 + _TOL),
        *checks_hold(gxe, "_chk_steps_match_rubric", "_chk_total_is_sum", "_chk_scores_allowed"),
    ]
