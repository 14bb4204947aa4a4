"""caption_dataset: captions table through TableStore, retries, failures, GX validation."""

from __future__ import annotations

import pandas as pd
import pytest

from flora.caption.grammar import normalise_caption
from flora.caption.oracle import GroundTruthCaptionBackend
from flora.caption.run import CAPTION_DTYPES, CaptionConfig, caption_dataset, request_id
from flora.data.episode import FloraDataError
from flora.data.ground_truth import load_ground_truth
from flora.tables import TableStore
from flora.validation.core import TableValidationError, assert_valid, validate_table


def _gt_frame(root) -> pd.DataFrame:
    return pd.read_parquet(root / "ground_truth" / "events.parquet")


def test_oracle_captions_table_keeps_boundaries_and_validates(tiny_dataset, tmp_path):
    gt = load_ground_truth(tiny_dataset)
    res = caption_dataset(
        tiny_dataset,
        tiny_dataset / "ground_truth" / "events.parquet",
        tmp_path,
        GroundTruthCaptionBackend(tiny_dataset),
        "run-1",
        progress=False,
    )
    assert res.report.success and not res.failures
    df = res.captions
    assert list(df.columns) == list(CAPTION_DTYPES)
    assert set(df.run_id) == {"run-1"} and set(df.model) == {"ground-truth-oracle"}
    for i in gt.episode_indices():
        rows = df[df.episode_index == i].sort_values("event_index")
        evs = gt.events(i)
        assert [(r.start_us, r.end_us) for r in rows.itertuples()] == [
            (e.start_us, e.end_us) for e in evs
        ]  # the captioner never moves a boundary
        assert list(rows.caption) == [normalise_caption(e.caption) for e in evs]
        assert rows.context_roles.iloc[0].startswith("TARGET")  # first event: no BEFORE
        assert rows.context_roles.iloc[-1].endswith("TARGET")  # last event: no AFTER
        assert (rows.before_event_index.iloc[1:] == rows.event_index.iloc[:-1].values).all()
    # resumable: a rerun skips every finished episode and writes no duplicates
    again = caption_dataset(
        tiny_dataset,
        tiny_dataset / "ground_truth" / "events.parquet",
        tmp_path,
        GroundTruthCaptionBackend(tiny_dataset),
        "run-2",
        progress=False,
    )
    assert again.processed == [] and len(again.skipped) == 3
    assert len(again.captions) == len(df) and set(again.captions.run_id) == {"run-1"}


def test_bounded_retries_and_recorded_failures(tiny_dataset, tmp_path):
    ev = _gt_frame(tiny_dataset)
    ev = ev[ev.episode_index == 0].sort_values("start_us").reset_index(drop=True)
    eid = f"{tiny_dataset.name}/000000"
    rid = [
        request_id(eid, k, int(r.start_us), int(r.end_us)) for k, r in enumerate(ev.itertuples())
    ]
    oracle = GroundTruthCaptionBackend(tiny_dataset, faults={rid[0]: 2, rid[1]: 9})
    res = caption_dataset(
        tiny_dataset,
        ev,
        tmp_path,
        oracle,
        "r",
        progress=False,
        config=CaptionConfig(max_attempts=3),
    )
    rows = res.captions.set_index("event_index")
    assert rows.loc[0, "attempts"] == 3  # two garbage answers, then accepted
    assert 1 not in rows.index  # never valid: not written, not filled
    assert oracle.calls.count(rid[1]) == 3  # bounded
    (f,) = res.failures
    assert f.episode_id == eid and f.item.startswith("event 1 [")
    assert "parse rejection after 3 attempts" in f.reason and "single line" in f.reason
    assert TableStore(tmp_path).failures("captions") == [f]
    # the failed episode is captioned again by the next run (the fault is spent by then)
    oracle.faults[rid[1]] = 0
    res2 = caption_dataset(tiny_dataset, ev, tmp_path, oracle, "r2", progress=False)
    assert res2.processed == [eid] and not res2.failures and len(res2.captions) == len(ev)


def test_malformed_events_fail_alone_and_unknown_episodes_are_recorded(tiny_dataset, tmp_path):
    ev = _gt_frame(tiny_dataset)
    ev = ev[ev.episode_index == 1].sort_values("start_us").reset_index(drop=True)
    T = int(
        load_ground_truth(tiny_dataset)
        .tables["episodes"]
        .set_index("episode_index")
        .loc[1, "duration_us"]
    )
    bad = ev.copy()
    bad.loc[2, "end_us"] = bad.loc[2, "start_us"]  # empty interval
    bad.loc[4, "end_us"] = T + 1  # outside the episode
    ghost = ev.iloc[:1].copy()
    ghost["episode_index"] = 42  # not in the dataset
    res = caption_dataset(
        tiny_dataset,
        pd.concat([bad, ghost]),
        tmp_path,
        GroundTruthCaptionBackend(tiny_dataset),
        "r",
        progress=False,
    )
    items = {
        (f.episode_id.rsplit("/", 1)[1], f.item.split(" [")[0]): f.reason for f in res.failures
    }
    assert set(items) == {("000001", "event 2"), ("000001", "event 4"), ("000042", "episode")}
    assert "start_us < end_us" in items[("000001", "event 2")]
    assert "end_us" in items[("000001", "event 4")] and "episode=1" in items[("000001", "event 4")]
    assert sorted(res.captions.event_index) == [k for k in range(len(ev)) if k not in (2, 4)]
    assert res.report.success


@pytest.fixture(scope="module")
def episode0_table(tiny_dataset, tmp_path_factory) -> pd.DataFrame:
    ev = _gt_frame(tiny_dataset)
    return caption_dataset(
        tiny_dataset,
        ev[ev.episode_index == 0],
        tmp_path_factory.mktemp("cap0"),
        GroundTruthCaptionBackend(tiny_dataset),
        "r",
        progress=False,
    ).captions


@pytest.mark.parametrize(
    "column, value, field",
    [
        ("caption", "grasp it. then lift it.", "_chk_caption_grammar"),
        ("caption", "", "_chk_caption_grammar"),
        ("context_roles", "AFTER,TARGET", "context_roles"),
        ("end_us", 0, "end_us,start_us"),
        ("end_us", 10**12, "duration_us,end_us"),
        ("event_index", 0, "episode_id,event_index"),
    ],
)
def test_captions_suite_rejects_bad_tables(tiny_dataset, episode0_table, column, value, field):
    df = episode0_table
    assert validate_table("captions", df).success
    bad = df.copy()
    bad.loc[1, column] = value
    report = validate_table("captions", bad)
    assert not report.success
    assert field in {r.column for r in report.failures}
    assert report.failing_episodes == [f"{tiny_dataset.name}/000000"]
    with pytest.raises(TableValidationError):
        assert_valid("captions", bad)
    missing = validate_table("captions", df.drop(columns=["missing_views"]))
    assert "missing_views" in {r.column for r in missing.failures}


def test_an_episode_segmented_again_is_captioned_again(tiny_dataset, tmp_path):
    """A rerun over new events of one episode (merged segments, as after ``segment
    --overwrite``) captions that episode again instead of keeping captions of intervals
    that no longer exist; the unchanged episodes are skipped and nothing is duplicated."""
    ev = _gt_frame(tiny_dataset)
    backend = GroundTruthCaptionBackend(tiny_dataset)
    first = caption_dataset(tiny_dataset, ev, tmp_path, backend, "run-1", progress=False)
    one = ev[ev.episode_index == 1].sort_values("start_us").reset_index(drop=True)
    merged = pd.concat([one.iloc[[0]], one.iloc[[1]].assign(end_us=one.end_us.iloc[2]),
                        one.iloc[3:]])  # fmt: skip
    ev2 = pd.concat([ev[ev.episode_index != 1], merged], ignore_index=True)
    again = caption_dataset(tiny_dataset, ev2, tmp_path, backend, "run-2", progress=False)
    eid = f"{tiny_dataset.name}/000001"
    assert again.processed == [eid] and eid not in again.skipped and len(again.skipped) == 2
    got = again.captions[again.captions.episode_id == eid]
    assert len(got) + len(again.failures) == len(merged)
    assert {(r.start_us, r.end_us) for r in got.itertuples()} <= {
        (r.start_us, r.end_us) for r in merged.itertuples()
    }
    assert set(got.run_id) == {"run-2"}
    others = again.captions[again.captions.episode_id != eid]
    assert len(others) == len(first.captions[first.captions.episode_id != eid])
    assert set(others.run_id) == {"run-1"}


def test_a_redo_that_fails_as_a_whole_keeps_no_earlier_captions(tiny_dataset, tmp_path):
    """Review finding: episode 0 segmented again, then unreadable: its run-1 captions of
    intervals that no longer exist stayed in the table beside run 2's failure."""
    import shutil

    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    ev = _gt_frame(root)
    ev = ev[ev.episode_index == 0].sort_values("start_us").reset_index(drop=True)
    backend = GroundTruthCaptionBackend(root)
    first = caption_dataset(root, ev, tmp_path / "out", backend, "run-1", progress=False)
    eid = f"{root.name}/000000"
    assert set(first.captions.episode_id) == {eid}
    merged = pd.concat([ev.iloc[[0]].assign(end_us=ev.end_us.iloc[1]), ev.iloc[2:]])
    (root / "data" / "chunk-000" / "file-000.parquet").write_bytes(b"not parquet")
    again = caption_dataset(root, merged, tmp_path / "out", backend, "run-2", progress=False)
    assert again.processed == [eid]
    assert [(f.episode_id, f.item) for f in again.failures] == [(eid, "episode")]
    assert len(again.captions) == 0  # no run-1 rows of intervals that no longer exist
    assert TableStore(tmp_path / "out").pending("captions") == []


def _events_parts(root, ev, name, empty=()) -> None:
    """The segmenter's store: one part per episode, empty for an episode without events."""
    from flora.data.episode import make_episode_id

    store = TableStore(root)
    for i, g in ev.groupby("episode_index"):
        g = g.iloc[:0] if i in empty else g
        g = g.assign(episode_id=make_episode_id(name, i), dataset=name, model="flora-segmenter",
                     model_version="v1", run_id="seg-run")  # fmt: skip
        cols = ["episode_id", "dataset", "model", "model_version", "run_id", "start_us",
                "end_us", "caption"]  # fmt: skip
        store.write("events", make_episode_id(name, i), g[cols])


@pytest.mark.parametrize("episodes", [None, [0, 1, 2]])
def test_an_episode_segmented_again_into_no_events_loses_its_captions(
    tiny_dataset, tmp_path, episodes
):
    """Review finding: only episodes that still had events were checked for staleness, so
    an episode re-segmented into zero events kept every old caption."""
    name = tiny_dataset.name
    ev = _gt_frame(tiny_dataset)
    backend = GroundTruthCaptionBackend(tiny_dataset)
    store_root = tmp_path / "store"
    _events_parts(store_root, ev, name)
    out = tmp_path / "out"
    first = caption_dataset(tiny_dataset, store_root, out, backend, "run-1",
                            episodes=episodes, progress=False)  # fmt: skip
    assert first.captions.episode_id.nunique() == 3
    # The segmenter runs again: episode 0 now has no events (its part is written empty).
    _events_parts(store_root, ev, name, empty={0})
    again = caption_dataset(tiny_dataset, store_root, out, backend, "run-2",
                            episodes=episodes, progress=False)  # fmt: skip
    eid = f"{name}/000000"
    assert eid not in set(again.captions.episode_id)
    kept = first.captions[first.captions.episode_id != eid]
    assert len(again.captions) == len(kept) and set(again.captions.run_id) == {"run-1"}
    assert again.dropped == [eid] and again.processed == [] and len(again.skipped) == 2
    assert first.dropped == []
    store = TableStore(out)
    assert store.pending("captions") == [] and store.failures("captions") == []
    # A third run changes nothing.
    third = caption_dataset(tiny_dataset, store_root, out, backend, "run-3",
                            episodes=episodes, progress=False)  # fmt: skip
    assert third.dropped == [] and len(third.captions) == len(kept)
    # Events that merely leave episodes out (a partial table) remove nothing of theirs:
    # those episodes may not be segmented yet.
    partial = ev[ev.episode_index == 2]
    fourth = caption_dataset(tiny_dataset, partial, out, backend, "run-4",
                             episodes=episodes, progress=False)  # fmt: skip
    assert fourth.dropped == [] and len(fourth.captions) == len(kept)


def test_another_datasets_episodes_are_never_captioned_failed_or_removed(tiny_dataset, tmp_path):
    """A shared store holds another dataset's captions and a failure record; captioning
    this dataset with events that also name the other's episodes leaves both alone."""
    from flora.tables import Failure

    ev = _gt_frame(tiny_dataset)
    ev0 = ev[ev.episode_index == 0]
    backend = GroundTruthCaptionBackend(tiny_dataset)
    out = tmp_path / "out"
    mine = caption_dataset(tiny_dataset, ev0, out, backend, "run-1", progress=False).captions
    other = "other/000000"
    store = TableStore(out)
    theirs = mine.assign(episode_id=other, dataset="other")
    old = [Failure("captions", other, "event 3 [0, 1) µs", "their own failure")]
    store.commit("captions", other, theirs, old)
    foreign = ev0.drop(columns=["episode_index"]).assign(episode_id=other)
    mixed = pd.concat([ev0.assign(episode_id=f"{tiny_dataset.name}/000000"), foreign])
    res = caption_dataset(tiny_dataset, mixed, out, backend, "run-2", overwrite=True,
                          progress=False)  # fmt: skip
    assert store.read_part("captions", other).equals(theirs)
    assert [f for f in store.failures("captions") if f.episode_id == other] == old
    ours = [f for f in res.failures if f.episode_id == other and f.item == "episode"]
    assert len(ours) == 1 and "does not belong to dataset" in ours[0].reason
    with pytest.raises(FloraDataError, match="no episode of dataset") as e:
        caption_dataset(tiny_dataset, foreign, out, backend, "run-3", progress=False)
    assert e.value.field == "episode_id"
    assert store.read_part("captions", other).equals(theirs)


def test_a_rerun_with_another_captioner_version_captions_again(tiny_dataset, tmp_path):
    """Resume skips an episode only when its captions came from this model and version: a
    newly promoted captioner rewrites them instead of leaving the old model's in place."""
    ev = tiny_dataset / "ground_truth" / "events.parquet"
    backend = GroundTruthCaptionBackend(tiny_dataset)
    out = tmp_path / "out"
    first = caption_dataset(tiny_dataset, ev, out, backend, "run-1", progress=False)
    again = caption_dataset(tiny_dataset, ev, out, backend, "run-2", progress=False)
    assert again.processed == [] and sorted(again.skipped) == sorted(first.processed)
    backend.model_version = "v2"
    newer = caption_dataset(tiny_dataset, ev, out, backend, "run-3", progress=False)
    assert sorted(newer.processed) == sorted(first.processed) and newer.skipped == []
    assert set(newer.captions.model_version) == {"v2"} and set(newer.captions.run_id) == {"run-3"}
