"""``run_episodes``: an episode whose redo fails as a whole loses its earlier part.

Review finding (caption/segment stale rows): when the step raised ``FloraDataError`` (the
episode cannot be read), ``run_episodes`` recorded the episode's failure but left the
previous run's part in place, so the table kept an earlier run's rows beside this run's
failure for the same episode. Both steps (segment, caption) share this loop.
"""

from __future__ import annotations

import pandas as pd
import pytest

from flora.data.episode import FloraDataError
from flora.steps_common import run_episodes
from flora.tables import Failure, TableStore, part_key

A, B = "ds/000000", "ds/000001"


def _rows(eid: str, run: str) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "episode_id": [eid, eid],
            "dataset": ["ds", "ds"],
            "model": ["m", "m"],
            "model_version": ["1", "1"],
            "run_id": [run, run],
            "value": [0, 1],
        }
    )


def _step(run: str, unreadable: frozenset[str] = frozenset()):
    def step(eid: str):
        if eid in unreadable:
            raise FloraDataError("unreadable parquet", dataset="ds", episode=eid)
        return _rows(eid, run), [], {}

    return step


class Crash(Exception):
    """Stands in for the process dying at a chosen point."""


def test_failed_redo_removes_the_earlier_part_and_records_why(tmp_path):
    store = TableStore(tmp_path)
    run_episodes(store, "t", [A, B], _step("run-1"), desc="t", progress=False)
    run_episodes(store, "u", [A, B], _step("run-1"), desc="u", progress=False)
    assert set(store.read("t").episode_id) == {A, B}

    # Run 2 redoes A (e.g. it was segmented again) and A can no longer be read.
    done = run_episodes(store, "t", [A], _step("run-2", frozenset({A})), desc="t", progress=False)

    assert done == [A]
    assert store.read_part("t", A) is None  # no run-1 rows beside run-2's failure
    (f,) = store.failures("t")
    assert (f.episode_id, f.item) == (A, "episode") and "unreadable" in f.reason
    assert store.pending("t") == []  # committed: the failure says why it has no rows
    # Only that episode's part of that table changed.
    t = store.read("t")
    assert set(t.episode_id) == {B} and set(t.run_id) == {"run-1"}
    assert set(store.read("u").episode_id) == {A, B}
    assert store.failures("u") == []
    # A is redone by the next run, and comes back once readable.
    assert store.split_pending("t", [A, B]) == ([A], [B])
    run_episodes(store, "t", [A], _step("run-3"), desc="t", progress=False)
    assert store.read_part("t", A).run_id.tolist() == ["run-3", "run-3"]
    assert store.failures("t") == []


def test_a_crash_after_the_drop_leaves_the_episode_to_be_redone(tmp_path, monkeypatch):
    store = TableStore(tmp_path)
    run_episodes(store, "t", [A], _step("run-1"), desc="t", progress=False)

    def crash(*_a, **_k):
        raise Crash

    monkeypatch.setattr(store, "record_failures", crash)
    with pytest.raises(Crash):
        run_episodes(store, "t", [A], _step("run-2", frozenset({A})), desc="t", progress=False)
    monkeypatch.undo()
    assert store.read_part("t", A) is None
    assert store.pending("t") == [part_key(A)]
    assert store.split_pending("t", [A]) == ([A], [])


def test_a_failed_episode_without_an_earlier_part_is_only_recorded(tmp_path):
    store = TableStore(tmp_path)
    run_episodes(store, "t", [B], _step("run-1"), desc="t", progress=False)
    run_episodes(store, "t", [A], _step("run-1", frozenset({A})), desc="t", progress=False)
    assert [(f.episode_id, f.item) for f in store.failures("t")] == [(A, "episode")]
    assert store.pending("t") == [] and set(store.read("t").episode_id) == {B}
    assert isinstance(store.failures("t")[0], Failure)
