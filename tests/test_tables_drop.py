"""``TableStore.drop``: a redo that produced no rows removes that episode's part, only it.

Review finding (reward stale rows): a redone episode whose answers all failed kept the
previous run's part beside the new failure records; the store had no way to remove a part.
"""

from __future__ import annotations

import pandas as pd
import pytest

from flora.tables import Failure, TableStore, part_key


def _rows(eid: str, model: str = "m") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "episode_id": [eid, eid],
            "dataset": ["d", "d"],
            "model": [model, model],
            "model_version": ["1", "1"],
            "run_id": ["r", "r"],
            "value": [0, 1],
        }
    )


def test_drop_removes_only_that_episodes_part_and_stays_pending_until_recorded(tmp_path):
    store = TableStore(tmp_path / "out")
    a, b = "d/000000", "d/000001"
    for table in ("t", "u"):
        for eid in (a, b):
            store.commit(table, eid, _rows(eid), [])
    store.record_failures("t", b, [Failure("t", b, "w1", "bad")])
    beside = tmp_path / "out" / "dataset.txt"  # something else under the store's root
    beside.write_text("keep")

    assert store.drop("t", a) is True
    assert not store.has("t", a) and store.read_part("t", a) is None
    # Pending until its failures are recorded: a crash here leaves it to be redone.
    assert store.pending("t") == [part_key(a)]
    assert store.split_pending("t", [a]) == ([a], [])
    store.record_failures("t", a, [Failure("t", a, "episode", "rejected")])
    assert store.pending("t") == []
    # Nothing else moved: the other episode, the other table, failure records, files.
    assert set(store.read("t").episode_id) == {b}
    assert set(store.read("u").episode_id) == {a, b}
    assert [f.episode_id for f in store.failures("t")] == [a, b]
    assert beside.read_text() == "keep"


def test_drop_without_a_part_changes_nothing(tmp_path):
    store = TableStore(tmp_path)
    store.commit("t", "d/000001", _rows("d/000001"), [])
    assert store.drop("t", "d/000000") is False
    assert store.pending("t") == [] and len(store.read("t")) == 2
    for bad in ("", ".", "..", "../t", "a/b"):
        with pytest.raises(ValueError, match="not a table name"):
            store.drop(bad, "d/000001")
    assert len(store.read("t")) == 2
