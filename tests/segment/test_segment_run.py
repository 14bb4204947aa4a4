"""The segment step: any VLMBackend, bounded retries, recorded window failures, the table."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest

from flora.backends.base import VLMRequest, VLMResponse
from flora.contract import Event
from flora.data.dataset import open_dataset
from flora.data.ground_truth import load_ground_truth
from flora.metrics import segment_f1
from flora.segment import Window, render_segments, segment_dataset, segment_episode
from flora.segment.targets import window_targets
from flora.tables import TableStore


class OracleBackend:
    """Deterministic test double: answers each window with its rendered ground truth.

    The window is identified from the request id (``<episode>:<pass>:<k>:<start>-<end>``)
    so the double exercises the real frames → request → parse → stitch mechanics. ``bad``
    maps ``(episode_id, pass, k)`` to texts returned before the good answer (one per
    attempt); ``error`` windows get a transport error every time.
    """

    name = "oracle"
    model_version = "gt"

    def __init__(
        self,
        gt: dict[str, list[Event]],
        bad: dict[tuple[str, str, int], list[str]] | None = None,
        error: set[tuple[str, str, int]] | None = None,
    ) -> None:
        self.gt = gt
        self.bad = {k: list(v) for k, v in (bad or {}).items()}
        self.error = error or set()
        self.requests: list[VLMRequest] = []
        self.calls = 0

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]:
        self.calls += 1
        out = []
        for r in requests:
            self.requests.append(r)
            eid, pas, k, span = r.request_id.rsplit(":", 3)
            key = (eid, pas, int(k))
            if key in self.error:
                out.append(VLMResponse("", error="HTTP 503 from pod", model=self.name))
                continue
            if self.bad.get(key):
                out.append(VLMResponse(self.bad[key].pop(0), model=self.name))
                continue
            s, e = (int(x) for x in span.split("-"))
            segs = window_targets(self.gt[eid], Window(s, e, s, e))
            out.append(VLMResponse(render_segments(segs), model=self.name))
        return out


def _events_of(g: pd.DataFrame) -> list[Event]:
    return [Event(int(a), int(b)) for a, b in zip(g.start_us, g.end_us, strict=True)]


@pytest.fixture(scope="module")
def ds(tiny_dataset):
    return open_dataset(tiny_dataset)


@pytest.fixture(scope="module")
def gt_events(tiny_dataset, ds) -> dict[str, list[Event]]:
    gt = load_ground_truth(tiny_dataset)
    return {
        f"{ds.name}/{i:06d}": [Event(e.start_us, e.end_us) for e in gt.events(i)]
        for i in gt.episode_indices()
    }


def test_oracle_backend_reproduces_ground_truth(ds, gt_events) -> None:
    ep = ds.episode(2)  # 26 s: 3 primary + 3 shifted windows
    backend = OracleBackend(gt_events)
    seg = segment_episode(ep, backend, "standard", shift=True)
    assert seg.failures == []
    assert seg.to_events() == gt_events[ep.episode_id]
    assert (seg.model, seg.model_version) == ("oracle", "gt")
    assert len(seg.primary_windows) == 3 and len(seg.shifted_windows) == 3
    # One request per window, frames at 4 Hz from the window start, 2-camera mosaics.
    assert len(backend.requests) == 6
    by_id = {r.request_id.split(":", 1)[1]: r for r in backend.requests}
    r1 = by_id["primary:1:10000000-26000000"]
    assert len(r1.images) == 64
    assert r1.frame_times_us == [i * 250_000 for i in range(64)]
    h, w, c = r1.images[0].shape
    assert c == 3 and w == 2 * h and r1.images[0].dtype == np.uint8
    assert "0 to 320" in r1.prompt and "u v l r" in r1.prompt
    last = by_id["primary:2:22000000-26000000"]
    assert len(last.images) == 16  # clipped edge window: fewer frames
    # Frames are the real video: consecutive 4 Hz frames of a moving arm differ.
    assert any(not np.array_equal(a, b) for a, b in zip(r1.images, r1.images[1:], strict=False))


def test_short_episode_single_window(ds, gt_events) -> None:
    ep = ds.episode(0)  # 6 s < one core
    backend = OracleBackend(gt_events)
    seg = segment_episode(ep, backend, shift=True)
    assert len(seg.primary_windows) == 1 and seg.shifted_windows == []
    assert seg.to_events() == gt_events[ep.episode_id]
    assert len(backend.requests) == 1 and len(backend.requests[0].images) == 24


def test_garbage_retried_then_accepted(ds, gt_events) -> None:
    ep = ds.episode(2)
    eid = ep.episode_id
    backend = OracleBackend(gt_events, bad={(eid, "primary", 1): ["I see a robot arm.", "1 2"]})
    seg = segment_episode(ep, backend, max_attempts=3)
    assert seg.failures == []
    assert seg.to_events() == gt_events[eid]
    # Only the rejected window was re-sent.
    ids = [r.request_id for r in backend.requests]
    assert sum(":primary:1:" in i for i in ids) == 3
    assert sum(":primary:0:" in i for i in ids) == 1


def test_garbage_window_recorded_others_complete(ds, gt_events) -> None:
    ep = ds.episode(2)
    eid = ep.episode_id
    backend = OracleBackend(
        gt_events,
        bad={(eid, "primary", 1): ["garbage"] * 5},
        error={(eid, "shifted", 0)},
    )
    seg = segment_episode(ep, backend, max_attempts=2)
    fails = {(f.pass_name, f.window): f.reason for f in seg.failures}
    assert set(fails) == {("primary", 1), ("shifted", 0)}
    assert fails[("primary", 1)].startswith("parse: field_count")
    assert "after 2 tries" in fails[("primary", 1)]
    assert fails[("shifted", 0)].startswith("transport: HTTP 503")
    # The events whose evidence lies in the good windows' cores are still there.
    gt = gt_events[eid]
    core0 = [e for e in gt if e.end_us <= 10_000_000]
    assert core0 and all(e in seg.to_events() for e in core0)
    assert all(1 not in e.windows for e in seg.events)


def test_window_without_frames_is_recorded(ds, gt_events) -> None:
    ep = ds.episode(2)
    # Cameras that stop after 14.5 s: later windows have no frames at some 4 Hz instants.
    cams = {
        k: dataclasses.replace(c, file_end_us=c.file_start_us + 14_500_000)
        for k, c in ep.cameras.items()
    }
    ep = dataclasses.replace(ep, cameras=cams)
    seg = segment_episode(ep, OracleBackend(gt_events))
    failed = {(f.pass_name, f.window) for f in seg.failures}
    assert failed == {("primary", 1), ("primary", 2), ("shifted", 1), ("shifted", 2)}
    assert all(f.reason.startswith("no frames") for f in seg.failures)
    # Window 0 still produced its events: those inside its core are exact.
    gt = [e for e in gt_events[ep.episode_id] if e.end_us <= 10_000_000]
    assert gt and all(e in seg.to_events() for e in gt)


def test_kinematic_baseline_episode(ds, gt_events) -> None:
    ep = ds.episode(2)
    seg = segment_episode(ep)  # backend=None -> kinematic baseline through the stitch path
    assert seg.model == "kinematic-baseline" and seg.failures == []
    f1 = segment_f1(seg.to_events(), gt_events[ep.episode_id], 0.5)
    assert f1 >= 0.75, f1


def test_kinematic_rejects_unusable_state(ds) -> None:
    from flora.data.episode import FloraDataError

    ep = ds.episode(1)
    bad = dataclasses.replace(ep, state=np.full_like(ep.state, np.nan))
    with pytest.raises(FloraDataError, match="NaN") as ei:
        segment_episode(bad)
    assert ei.value.episode == 1 and ei.value.field == "observation.state"


def test_segment_dataset_writes_validated_resumable_table(tiny_dataset, tmp_path, ds) -> None:
    out = tmp_path / "tables"
    res = segment_dataset(tiny_dataset, out, run_id="run-a", progress=False)
    assert res.report is not None and res.report.success
    assert sorted(res.processed) == [f"{ds.name}/{i:06d}" for i in range(3)]
    df = res.events
    assert set(df["episode_id"]) == set(res.processed)
    assert (df["run_id"] == "run-a").all() and (df["model"] == "kinematic-baseline").all()
    assert (df["caption"] == "").all()
    for _, g in df.groupby("episode_id"):
        assert list(g.sort_values(["start_us", "end_us"])["event_index"]) == list(range(len(g)))
    assert (df["end_us"] <= df["duration_us"]).all()
    summary = res.to_dict()
    assert summary["rows"] == len(df) and summary["episodes"] == 3
    assert summary["validation"]["success"] is True and summary["failures"] == []
    # Resumable: a second run skips every finished episode and duplicates nothing.
    res2 = segment_dataset(tiny_dataset, out, run_id="run-b", progress=False)
    assert res2.processed == [] and len(res2.skipped) == 3
    pd.testing.assert_frame_equal(
        res2.events.sort_values(["episode_id", "event_index"]).reset_index(drop=True),
        df.sort_values(["episode_id", "event_index"]).reset_index(drop=True),
    )


def test_a_rerun_with_another_model_redoes_what_the_earlier_one_wrote(
    tiny_dataset, tmp_path, ds, gt_events
) -> None:
    """Resume skips an episode only when its rows came from this run's model and version:
    after the kinematic baseline, a VLM segmenter (and then a new version of it) rewrites
    every episode instead of leaving the old model's events in place."""
    out = tmp_path / "tables"
    ids = [f"{ds.name}/{i:06d}" for i in range(3)]
    first = segment_dataset(tiny_dataset, out, run_id="run-a", progress=False)
    assert sorted(first.processed) == ids
    vlm = OracleBackend(gt_events)
    second = segment_dataset(tiny_dataset, out, vlm, run_id="run-b", progress=False)
    assert sorted(second.processed) == ids and second.skipped == []
    assert set(second.events["model"]) == {"oracle"} and set(second.events["run_id"]) == {"run-b"}
    same = segment_dataset(tiny_dataset, out, vlm, run_id="run-c", progress=False)
    assert same.processed == [] and sorted(same.skipped) == ids
    vlm.model_version = "gt-2"
    newer = segment_dataset(tiny_dataset, out, vlm, run_id="run-d", episodes=[1],
                            progress=False)  # fmt: skip
    assert newer.processed == [ids[1]] and newer.skipped == []
    assert set(newer.events.groupby("episode_id")["model_version"].first()) == {"gt", "gt-2"}


def test_segment_dataset_records_failures_and_retries(tiny_dataset, tmp_path, ds, gt_events):
    out = tmp_path / "tables"
    eid = f"{ds.name}/000002"
    backend = OracleBackend(gt_events, bad={(eid, "primary", 2): ["???"] * 3})
    res = segment_dataset(tiny_dataset, out, backend, "r1", max_attempts=3, progress=False)
    assert [(f.episode_id, f.item) for f in res.failures] == [
        (eid, "primary window 2 [22000000, 26000000) µs")
    ]
    assert "garbage" in res.failures[0].reason or "field_count" in res.failures[0].reason
    # Other episodes are exact; the failed episode was written with its good windows.
    got = {e: g for e, g in res.events.groupby("episode_id")}
    for e in (f"{ds.name}/000000", f"{ds.name}/000001"):
        g = got[e].sort_values("event_index")
        assert _events_of(g) == gt_events[e]
    # The rerun retries only the failed episode; now it succeeds and the failure clears.
    res2 = segment_dataset(tiny_dataset, out, OracleBackend(gt_events), "r2", progress=False)
    assert res2.processed == [eid] and len(res2.skipped) == 2
    assert res2.failures == [] and TableStore(out).failures("events") == []
    g = res2.events[res2.events.episode_id == eid].sort_values("event_index")
    assert _events_of(g) == gt_events[eid]
    assert set(g["run_id"]) == {"r2"}


def test_unreadable_episode_recorded(tiny_dataset, tmp_path, ds) -> None:
    out = tmp_path / "tables"
    res = segment_dataset(tiny_dataset, out, episodes=[0, 7], progress=False)
    assert res.processed == [f"{ds.name}/000000", f"{ds.name}/000007"]
    (f,) = res.failures
    assert f.episode_id == f"{ds.name}/000007" and f.item == "episode"
    assert "out of range" in f.reason
    assert set(res.events["episode_id"]) == {f"{ds.name}/000000"}


class FixedBackend:
    """Answers every window with the same text."""

    name = "fixed"
    model_version = "1"

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]:
        return [VLMResponse(self.text, model=self.name) for _ in requests]


def test_same_ticks_with_other_flags_never_reach_the_table(tiny_dataset, tmp_path, ds) -> None:
    """The review's answer ``0 20 0 0 / 0 20 1 0`` used to parse, stitch to two identical
    events, be committed, and fail the events suite on this and every later run. Now each
    window is a recorded ``duplicate`` failure, and reruns keep working."""
    backend = FixedBackend("0 20 0 0\n0 20 1 0")
    seg = segment_episode(ds.episode(0), backend, max_attempts=2)
    assert seg.events == [] and len(seg.failures) == 1
    assert seg.failures[0].reason.startswith("parse: duplicate"), seg.failures[0].reason
    out = tmp_path / "tables"
    for run in ("r1", "r2"):
        res = segment_dataset(tiny_dataset, out, backend, run, episodes=[0], progress=False)
        assert res.report is not None and res.report.success
        assert [f.reason.split(":")[1].strip() for f in res.failures] == ["duplicate"]


def test_repeated_interval_is_a_recorded_failure_not_a_committed_part(
    tiny_dataset, tmp_path, ds, monkeypatch
) -> None:
    """Should stitching or refinement ever emit one interval twice, the episode becomes a
    failure naming it and nothing is written — not a part that fails the events suite on
    every later run (the episode counting as done)."""
    import flora.segment.run as run_mod
    from flora.data.episode import FloraDataError

    real = run_mod.refine_detailed

    def repeating(*args, **kwargs):
        out = real(*args, **kwargs)
        return out + out[:1]

    monkeypatch.setattr(run_mod, "refine_detailed", repeating)
    eid = f"{ds.name}/000000"
    out = tmp_path / "tables"
    res = segment_dataset(tiny_dataset, out, episodes=[0], progress=False)
    (f,) = res.failures
    assert (f.episode_id, f.item) == (eid, "episode") and "repeat the interval" in f.reason
    assert len(res.events) == 0 and TableStore(out).read_part("events", eid) is None
    with pytest.raises(FloraDataError, match="repeat the interval") as ei:
        segment_episode(ds.episode(0))
    assert type(ei.value).__name__ == "RepeatedEventError" and ei.value.episode == eid
    # The next run (stitching sound again) retries the episode and the table validates.
    monkeypatch.setattr(run_mod, "refine_detailed", real)
    res2 = segment_dataset(tiny_dataset, out, episodes=[0], progress=False)
    assert res2.processed == [eid] and res2.failures == [] and res2.report.success
    assert len(res2.events) > 0
