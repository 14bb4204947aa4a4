"""The `events` table GX suite: eq. (1) per row, start-ordered indices, named failures."""

from __future__ import annotations

import pandas as pd
import pytest

from flora.validation.core import TableValidationError, assert_valid, validate_table


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "episode_id": ["d/000000", "d/000000", "d/000000", "d/000001"],
            "dataset": "d",
            "model": "kinematic-baseline",
            "model_version": "1",
            "run_id": "r",
            "event_index": [0, 1, 2, 0],
            "start_us": [0, 1_000_000, 1_500_000, 200_000],  # 1 and 2 overlap (bimanual)
            "end_us": [1_000_000, 3_000_000, 2_000_000, 900_000],
            "duration_us": [3_000_000, 3_000_000, 3_000_000, 900_000],
            "caption": "",
            "source": "stitch",
            "n_windows": [1, 2, 1, 1],
        }
    )


def _failed(df: pd.DataFrame) -> dict[str, list[str]]:
    rep = validate_table("events", df)
    assert not rep.success
    return {f"{r.expectation}[{r.column}]": r.failing_ids for r in rep.failures}


def test_valid_table_passes_including_overlaps_and_empty() -> None:
    assert assert_valid("events", _table()) is not None
    empty = _table().iloc[:0]
    assert validate_table("events", empty).success


def test_end_past_duration_names_episode() -> None:
    df = _table()
    df.loc[3, "end_us"] = 950_000
    failed = _failed(df)
    assert failed == {
        "expect_column_pair_values_a_to_be_greater_than_b[duration_us,end_us]": ["d/000001"]
    }


@pytest.mark.parametrize(
    ("col", "value", "check"),
    [
        ("start_us", -5, "expect_column_values_to_be_between[start_us]"),
        ("end_us", 1_000_000, "expect_column_pair_values_a_to_be_greater_than_b[end_us,start_us]"),
        ("n_windows", 0, "expect_column_values_to_be_between[n_windows]"),
        ("caption", None, "expect_column_values_to_not_be_null[caption]"),
        # A range check skips nulls: a null n_windows fails on its own.
        ("n_windows", None, "expect_column_values_to_not_be_null[n_windows]"),
    ],
)
def test_row_checks(col: str, value, check: str) -> None:
    df = _table()
    df.loc[1, col] = value
    failed = _failed(df)
    assert check in failed
    assert failed[check] == ["d/000000"]


def test_event_index_must_follow_start_order() -> None:
    df = _table()
    df.loc[[1, 2], "event_index"] = [2, 1]  # rows start at 1.0 s / 1.5 s: swapped -> fail
    assert "expect_column_values_to_be_in_set[_chk_sorted_index]" in _failed(df)
    df.loc[1, "start_us"] = 1_600_000  # now the row indexed 1 (1.5 s) starts first -> fine
    assert validate_table("events", df).success
    df.loc[[1, 2], "event_index"] = [1, 2]  # index 1 is the later-starting row -> fail
    failed = _failed(df)
    assert failed == {"expect_column_values_to_be_in_set[_chk_sorted_index]": ["d/000000"]}


def test_duplicate_event_and_missing_column() -> None:
    df = pd.concat([_table(), _table().iloc[[3]].assign(event_index=1)], ignore_index=True)
    failed = _failed(df)
    assert failed["expect_column_values_to_be_in_set[_chk_unique_interval]"] == ["d/000001"]
    with pytest.raises(TableValidationError, match="duration_us"):
        assert_valid("events", _table().drop(columns=["duration_us"]))


def test_float_times_rejected() -> None:
    df = _table()
    df["start_us"] = df["start_us"].astype(float)
    failed = _failed(df)
    assert "expect_column_values_to_be_in_type_list[start_us]" in failed
