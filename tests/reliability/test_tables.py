"""Tables: injective part names, old tables migrated, torn records and interrupted commits.

Issue 15 findings 4 and 5: colliding dataset names lost rows silently; a torn failure
record crashed every later run; a crash between a part and its failure record marked the
episode done and its failed items were never retried.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.steps_common import run_episodes
from flora.tables import LAYOUT_FILE, Failure, TableStore, part_key

# Names that the old part names (every run of other characters -> "__") mapped together.
COLLIDING = [
    "robot data/000000",
    "robot__data/000000",
    "robot:data/000000",
    "机器人/000000",
    "ロボット/000000",
]


def _rows(eid: str, n: int = 2) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "episode_id": [eid] * n,
            "dataset": [eid.rsplit("/", 1)[0]] * n,
            "model": ["m"] * n,
            "model_version": ["1"] * n,
            "run_id": ["r"] * n,
            "value": list(range(n)),
        }
    )


class Crash(Exception):
    """Stands in for the process dying at a chosen point."""


def _step(failing: dict[str, int] | None = None):
    """A step writing two rows per episode and ``failing[eid]`` failed items."""
    failing = failing or {}

    def step(eid: str):
        fails = [Failure("t", eid, f"item {k}", "bad answer") for k in range(failing.get(eid, 0))]
        return _rows(eid), fails, {}

    return step


def test_colliding_dataset_names_keep_every_episode(tmp_path):
    store = TableStore(tmp_path)
    run_episodes(store, "t", COLLIDING, _step(), desc="t", progress=False)
    df = store.read("t")
    assert sorted(set(df.episode_id)) == sorted(COLLIDING)
    assert len(df) == 2 * len(COLLIDING)
    # A second run skips them all (they are found under their own names).
    todo, skipped = TableStore(tmp_path).split_pending("t", COLLIDING)
    assert todo == [] and skipped == COLLIDING
    keys = [part_key(e) for e in COLLIDING]
    assert len(set(keys)) == len(keys)
    # Readable: the slug of the id stays in front of the hash.
    assert keys[0].startswith("robot__data__000000~")
    assert (tmp_path / "t" / f"{keys[0]}.parquet").exists()


def test_colliding_failures_are_kept_apart(tmp_path):
    store = TableStore(tmp_path)
    run_episodes(store, "t", COLLIDING, _step({e: 1 for e in COLLIDING}), desc="t", progress=False)
    assert sorted(f.episode_id for f in store.failures("t")) == sorted(COLLIDING)


def _legacy_table(root):
    """A table as the old code wrote it: ``__`` names, one colliding pair."""
    d = root / "t"
    (d / "_failures").mkdir(parents=True)
    _rows("ds/000000").to_parquet(d / "ds__000000.parquet")  # done
    _rows("ds/000001").to_parquet(d / "ds__000001.parquet")  # done but with a failure
    (d / "_failures" / "ds__000001.json").write_text(
        json.dumps([{"table": "t", "episode_id": "ds/000001", "item": "w 1", "reason": "x"}])
    )
    # "a b/000000" and "a:b/000000" shared a__b__000000.parquet; the second overwrote it.
    _rows("a:b/000000").to_parquet(d / "a__b__000000.parquet")
    return d


def test_old_tables_stay_readable_and_are_migrated(tmp_path):
    d = _legacy_table(tmp_path)
    store = TableStore(tmp_path)
    ids = ["ds/000000", "ds/000001", "a b/000000", "a:b/000000"]
    assert sorted(set(store.read("t").episode_id)) == ["a:b/000000", "ds/000000", "ds/000001"]
    assert [f.episode_id for f in store.failures("t")] == ["ds/000001"]
    todo, skipped = store.split_pending("t", ids)
    # Finished episodes keep their rows and are not redone; the failed one and the one
    # whose rows the old name lost are redone.
    assert skipped == ["ds/000000", "a:b/000000"] and todo == ["ds/000001", "a b/000000"]
    assert json.loads((d / LAYOUT_FILE).read_text())["version"] == 2
    assert sorted(p.name.split("~")[0] for p in d.glob("*.parquet")) == [
        "a__b__000000",
        "ds__000000",
        "ds__000001",
    ]
    assert all("~" in p.stem for p in d.glob("*.parquet"))
    run_episodes(store, "t", todo, _step(), desc="t", progress=False)
    df = TableStore(tmp_path).read("t")
    assert sorted(df.episode_id) == sorted(e for e in ids for _ in range(2))  # no duplicates
    assert TableStore(tmp_path).failures("t") == []


@pytest.mark.parametrize(
    "body",
    [
        b'[{"table": "t", "episode_id": "ds/000001", "it',  # torn mid-write
        b"",  # zero bytes (crash before the first write reached the disk)
        b"\xff\xfe\x00garbage",  # not UTF-8
        b'{"not": "a list"}',  # wrong shape
        b'[{"table": "t", "episode_id": 7, "item": "i", "reason": "r"}]',  # wrong types
    ],
)
def test_a_torn_failure_record_is_quarantined_not_fatal(tmp_path, body):
    store = TableStore(tmp_path)
    ids = ["ds/000000", "ds/000001", "other/000000"]
    run_episodes(store, "t", ids, _step({"ds/000000": 1, "ds/000001": 1}), desc="t", progress=False)
    torn = tmp_path / "t" / "_failures" / f"{part_key('ds/000001')}.json"
    torn.write_bytes(body)

    fresh = TableStore(tmp_path)
    fails = fresh.failures("t")  # the old code raised here, for every dataset
    assert [f.episode_id for f in fails] == ["ds/000000"]
    assert not torn.exists()
    moved = list((tmp_path / "t" / "_quarantine" / "_failures").iterdir())
    assert [p.read_bytes() for p in moved] == [body]  # kept, never deleted
    assert len(fresh.problems) == 1 and torn.name in fresh.problems[0]
    # The episode whose record was torn is redone, not taken as finished.
    todo, skipped = fresh.split_pending("t", ids)
    assert todo == ["ds/000000", "ds/000001"] and skipped == ["other/000000"]
    run_episodes(fresh, "t", todo, _step(), desc="t", progress=False)
    assert TableStore(tmp_path).failures("t") == []
    assert len(TableStore(tmp_path).read("t")) == 2 * len(ids)


def test_crash_between_part_and_failure_record_redoes_the_episode(tmp_path, monkeypatch):
    real = TableStore.record_failures

    def crash_on_failures(self, table, episode_id, failures):
        if failures:
            raise Crash(episode_id)
        return real(self, table, episode_id, failures)

    ids = ["ds/000000", "ds/000001", "ds/000002"]
    monkeypatch.setattr(TableStore, "record_failures", crash_on_failures)
    with pytest.raises(Crash):
        run_episodes(TableStore(tmp_path), "t", ids, _step({"ds/000001": 2}), desc="t",
                     progress=False)  # fmt: skip
    monkeypatch.setattr(TableStore, "record_failures", real)

    store = TableStore(tmp_path)
    todo, skipped = store.split_pending("t", ids)
    assert skipped == ["ds/000000"] and todo == ["ds/000001", "ds/000002"]
    run_episodes(store, "t", todo, _step({"ds/000001": 2}), desc="t", progress=False)
    assert [(f.episode_id, f.item) for f in store.failures("t")] == [
        ("ds/000001", "item 0"),
        ("ds/000001", "item 1"),
    ]
    df = store.read("t")
    assert sorted(df.episode_id) == sorted(e for e in ids for _ in range(2))  # no duplicates
    assert store.pending("t") == []


def test_crash_in_reward_step_between_part_and_failures(tiny_dataset, tmp_path, monkeypatch):
    """The reward steps write the part, then record failures: a crash there is redone."""
    from flora.reward.oracle import GroundTruthRewardBackend
    from flora.reward.run import dense_dataset

    e2 = f"{tiny_dataset.name}/000002"
    faults = {f"{e2}|dense|w1": 100}  # window 1 of episode 2 always answers garbage
    real = TableStore.record_failures

    def crash_on_failures(self, table, episode_id, failures):
        if failures:
            raise Crash(episode_id)
        return real(self, table, episode_id, failures)

    monkeypatch.setattr(TableStore, "record_failures", crash_on_failures)
    with pytest.raises(Crash):
        dense_dataset(tiny_dataset, GroundTruthRewardBackend(tiny_dataset, faults=faults),
                      tmp_path, max_attempts=2, progress=False)  # fmt: skip
    monkeypatch.setattr(TableStore, "record_failures", real)

    res = dense_dataset(tiny_dataset, GroundTruthRewardBackend(tiny_dataset, faults=faults),
                        tmp_path, max_attempts=2, progress=False)  # fmt: skip
    assert res.written == [e2]  # redone, not skipped as finished
    assert [f.episode_id for f in res.failures] == [e2] and "window 1" in res.failures[0].item
    store = TableStore(tmp_path)
    assert [f.episode_id for f in store.failures("dense_labels")] == [e2]
    dl = store.read("dense_labels")
    assert not dl.duplicated(["episode_id", "t_us"]).any()
    assert len(dl[dl.episode_id == e2]) == 24


def test_merge_from_joins_disjoint_shards_once_and_refuses_a_conflict(tmp_path):
    """KFP shards write their own stores; ``merge_from`` makes one table of them: committed
    parts and failure records copied, pending episodes left out, a rerun copies nothing,
    and two different parts for one episode are refused by name."""
    a, b, out = TableStore(tmp_path / "a"), TableStore(tmp_path / "b"), TableStore(tmp_path / "m")
    a.commit("events", "ds/000000", _rows("ds/000000"), [])
    a.commit("events", "ds/000002", None, [Failure("events", "ds/000002", "window 3", "bad")])
    b.commit("events", "ds/000001", _rows("ds/000001", 3), [])
    b.write("events", "ds/000003", _rows("ds/000003"))  # written, never committed
    assert out.merge_from("events", a.root) == 2
    assert out.merge_from("events", b.root) == 1
    merged = out.read("events")
    assert sorted(merged.episode_id.unique()) == ["ds/000000", "ds/000001"] and len(merged) == 5
    assert [(f.episode_id, f.item) for f in out.failures("events")] == [("ds/000002", "window 3")]
    assert out.pending("events") == [] and (out.root / "events" / LAYOUT_FILE).exists()
    assert out.merge_from("events", a.root) == out.merge_from("events", b.root) == 0
    assert out.merge_from("captions", a.root) == 0  # a table the shard never wrote
    c = TableStore(tmp_path / "c")
    c.commit("events", "ds/000001", _rows("ds/000001", 1), [])
    with pytest.raises(ValueError, match=rf"{part_key('ds/000001')}.parquet differs"):
        out.merge_from("events", c.root)
    assert len(out.read("events")) == 5
