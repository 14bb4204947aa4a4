"""GX core: declared suites, typed reports naming failing episodes, assert_valid."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.validation.core import (
    TableValidationError,
    assert_valid,
    common_columns,
    get_suite,
    register_suite,
    validate_table,
)


def _derive(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["dt_us"] = out.groupby("episode_id")["t_us"].diff().fillna(1)
    return out


@register_suite("_test_events", derive=_derive, index_columns=("episode_id", "row"))
def _suite(gxe):
    """Toy table used by these tests."""
    return [
        *common_columns(gxe),
        gxe.ExpectColumnValuesToBeBetween(column="t_us", min_value=0),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="end_us", column_B="t_us"),
        gxe.ExpectColumnValuesToBeBetween(
            column="dt_us", min_value=1, description="timestamps strictly increase per episode"
        ),
    ]


def _table(n_eps: int = 3, n: int = 4) -> pd.DataFrame:
    rows = []
    for e in range(n_eps):
        for i in range(n):
            rows.append(
                {
                    "episode_id": f"toy/{e:06d}",
                    "dataset": "toy",
                    "model": "m",
                    "model_version": "1",
                    "run_id": "r",
                    "row": i,
                    "t_us": i * 50_000,
                    "end_us": i * 50_000 + 10,
                }
            )
    return pd.DataFrame(rows)


def test_valid_table_passes_and_report_is_typed():
    df = _table()
    report = validate_table("_test_events", df)
    assert report.success, report.summary()
    assert report.table == "_test_events" and report.suite == "_test_events_suite"
    assert report.row_count == len(df)
    assert report.dataset == "toy"
    assert report.statistics["failed"] == 0
    assert report.statistics["evaluated"] == len(report.results) == 10
    assert assert_valid("_test_events", df) is df
    json.dumps(report.to_dict())  # loggable as is


def test_failures_name_episode_rows_and_field():
    df = _table()
    # Episode 1: a timestamp goes backwards; episode 2: end before start.
    df.loc[(df.episode_id == "toy/000001") & (df.row == 2), "t_us"] = 10_000
    df.loc[(df.episode_id == "toy/000002") & (df.row == 3), "end_us"] = 0
    report = validate_table("_test_events", df)
    assert not report.success
    assert report.failing_episodes == ["toy/000001", "toy/000002"]
    by_col = {r.column: r for r in report.failures}
    assert set(by_col) == {"dt_us", "end_us,t_us"}
    mono = by_col["dt_us"]
    assert mono.description == "timestamps strictly increase per episode"
    assert mono.failing_ids == ["toy/000001"]
    assert mono.unexpected_count == 1
    assert mono.samples[0]["episode_id"] == "toy/000001" and mono.samples[0]["row"] == 2
    assert by_col["end_us,t_us"].failing_ids == ["toy/000002"]
    assert "toy/000001" in report.summary()
    json.dumps(report.to_dict())

    with pytest.raises(TableValidationError) as ei:
        assert_valid("_test_events", df)
    err = ei.value
    assert err.report is not None and not err.report.success
    assert err.dataset == "toy"
    assert "toy/000001" in str(err) and "toy/000002" in str(err)
    assert "dt_us" in err.field and "end_us" in err.field


def test_missing_column_fails_naming_the_field():
    df = _table().drop(columns=["model_version"])
    report = validate_table("_test_events", df)
    assert not report.success
    kinds = {(r.expectation, r.column) for r in report.failures}
    assert kinds == {("expect_column_to_exist", "model_version")}
    with pytest.raises(TableValidationError, match="model_version"):
        assert_valid("_test_events", df)


def test_expectation_that_cannot_run_is_a_failure_with_its_error():
    df = _table().drop(columns=["end_us"])
    report = validate_table("_test_events", df)
    pair = [r for r in report.failures if r.column == "end_us,t_us"]
    assert len(pair) == 1 and pair[0].error and "end_us" in pair[0].error
    json.dumps(report.to_dict())


def test_unknown_table_is_a_clear_error():
    with pytest.raises(KeyError, match="no validation suite for table 'nope'"):
        get_suite("nope")


def test_repeat_validation_reuses_one_gx_context(monkeypatch):
    """The GX context is built once per process (its cost is measured in benchmarks/)."""
    import great_expectations as gx

    df = _table(5, 50)
    validate_table("_test_events", df)  # warm: builds the process-wide context
    built: list[object] = []
    real = gx.get_context
    monkeypatch.setattr(gx, "get_context", lambda *a, **k: built.append(1) or real(*a, **k))
    for _ in range(3):
        assert validate_table("_test_events", df).success
    assert built == []
