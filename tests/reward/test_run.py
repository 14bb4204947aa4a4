"""Rewarder step functions with a ground-truth test-double backend (mechanics).

The oracle renders toy-world ground truth through the same grammars, so every table must
reproduce the ground truth; injected faults exercise bounded retries and per-item failure
records. The real tiny model is exercised in test_tiny_model.py.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.backends.base import VLMResponse
from flora.data.ground_truth import load_ground_truth
from flora.reward.benchmark import gt_rubric_for
from flora.reward.oracle import GroundTruthRewardBackend
from flora.reward.rubric import RubricError
from flora.reward.run import (
    _finish_episode,
    dense_dataset,
    episode_times,
    outcome_dataset,
    reward_dataset,
    rubric_dataset,
)
from flora.tables import COMMON_COLUMNS, TableStore


class RecordingOracle(GroundTruthRewardBackend):
    """The oracle, keeping every request it was sent (to check request contents)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.requests = []

    def generate(self, requests):
        self.requests.extend(requests)
        return super().generate(requests)


def _eid(ds, i):
    return f"{ds.name}/{i:06d}"


def test_episode_times():
    assert episode_times(6_000_000, max_frames=32) == [i * 250_000 for i in range(24)]
    t = episode_times(100_000_000, max_frames=32)
    assert len(t) == 32 and t[0] == 0 and t[-1] < 100_000_000
    assert episode_times(1, max_frames=32) == [0]


def test_steps_reproduce_ground_truth(tiny_dataset, tmp_path):
    gt = load_ground_truth(tiny_dataset)
    be = RecordingOracle(tiny_dataset)
    store = TableStore(tmp_path)

    oc = outcome_dataset(tiny_dataset, be, store, run_id="r1", progress=False)
    assert oc.ok and oc.validation.success and len(oc.written) == 3
    df = store.read("outcome")
    assert set(COMMON_COLUMNS) <= set(df.columns)
    assert (df["run_id"] == "r1").all() and (df["model"] == "ground-truth-oracle").all()
    for row in df.itertuples():
        k = gt.outcome(int(row.episode_id[-6:]))
        assert row.argmax_score == k and row.answer_score == k
        assert row.expected_score == pytest.approx(k, abs=1e-4)
        assert row.reward == pytest.approx((k - 1) / 4, abs=1e-4)
    # Outcome input: one mosaic per instant, main | wrist side by side (96x96 each).
    req = next(r for r in be.requests if r.request_id.endswith("|outcome|episode"))
    assert req.top_logprobs > 0 and req.images[0].shape == (96, 192, 3)
    assert len(req.images) == len(req.frame_times_us) <= 32

    de = dense_dataset(tiny_dataset, be, store, progress=False)
    assert de.ok and de.validation.success
    dl = store.read("dense_labels")
    for i in gt.episode_indices():
        got = dl[dl.episode_id == _eid(tiny_dataset, i)].sort_values("t_us")
        assert list(zip(got.t_us, got.label, got.reason, strict=True)) == gt.dense(i)
    dreqs = [r for r in be.requests if "|dense|" in r.request_id]
    # 6 s and 14 s: one window each; 26 s: two windows.
    assert sorted(r.request_id.split("|", 1)[0][-1] + r.request_id[-2:] for r in dreqs) == [
        "0w0",
        "1w0",
        "2w0",
        "2w1",
    ]
    short = next(r for r in dreqs if r.request_id.startswith(_eid(tiny_dataset, 0)))
    assert len(short.images) == 64 and short.frame_times_us[-1] == 15_750_000
    # Stamps are relative to the window (docs/reward.md): window 1 of the 26 s episode
    # starts at 10 s and is stamped 0 .. 15.75 s like window 0.
    w1 = next(r for r in dreqs if r.request_id == f"{_eid(tiny_dataset, 2)}|dense|w1")
    assert w1.frame_times_us[0] == 0 and w1.frame_times_us[-1] == 15_750_000
    assert "starts at 10.0 s" in w1.prompt
    # Instants past T (6 s) repeat the last real mosaic.
    assert (short.images[-1] == short.images[23]).all()

    rb = rubric_dataset(tiny_dataset, be, store, gt_rubric_for(tiny_dataset), progress=False)
    assert rb.ok and rb.validation.success
    rt = store.read("rubric")
    for row in rt.itertuples():
        _, ref = gt.rubric(int(row.episode_id[-6:]))
        assert dict(zip(row.step_names, row.step_scores, strict=True)) == pytest.approx(ref)
        assert row.total == pytest.approx(sum(ref.values()))
        assert json.loads(row.rubric_json)["steps"]
    rreq = next(r for r in be.requests if "|rubric|" in r.request_id)
    # Each camera its own clip: 2 clips of n frames, single-camera images (not mosaics).
    assert rreq.frame_times_us is None and rreq.images[0].shape == (96, 96, 3)
    assert "clip 1: main camera" in rreq.prompt and "clip 2: wrist camera" in rreq.prompt


def test_retries_failures_and_resume(tiny_dataset, tmp_path):
    e0, e2 = _eid(tiny_dataset, 0), _eid(tiny_dataset, 2)
    faults = {f"{e0}|outcome|episode": 2, f"{e2}|dense|w1": 5, f"{e2}|rubric|episode": 3}
    be = GroundTruthRewardBackend(tiny_dataset, faults=faults)
    store = TableStore(tmp_path)

    oc = outcome_dataset(tiny_dataset, be, store, max_attempts=3, progress=False)
    assert oc.failures == [] and len(oc.written) == 3  # 2 bad answers, then accepted
    assert int(store.read("outcome").set_index("episode_id").loc[e0, "attempts"]) == 3

    # One window per call: chunking must not change which window fails or what is written.
    de = dense_dataset(tiny_dataset, be, store, max_attempts=3, batch_windows=1, progress=False)
    assert len(de.failures) == 1
    f = de.failures[0]
    assert f.episode_id == e2 and f.item.startswith("window 1 ") and "after 3 attempts" in f.reason
    assert "worst" in f.reason  # the parser's reason is kept
    dl = store.read("dense_labels")
    ep2 = dl[dl.episode_id == e2]
    # Rows sourced from the failed window are absent, not re-sourced or filled.
    assert len(ep2) == 24 and set(ep2.source_window) == {0} and ep2.t_us.max() == 11_500_000
    assert store.failures("dense_labels")[0].item == f.item

    rb = rubric_dataset(tiny_dataset, be, store, gt_rubric_for(tiny_dataset), max_attempts=3,
                        progress=False)  # fmt: skip
    assert [x.episode_id for x in rb.failures] == [e2] and not store.has("rubric", e2)

    # Rerun: finished episodes are skipped, failed ones redone (faults now exhausted).
    de2 = dense_dataset(tiny_dataset, be, store, max_attempts=3, progress=False)
    assert de2.skipped == [_eid(tiny_dataset, 0), _eid(tiny_dataset, 1)]
    assert de2.written == [e2] and de2.failures == [] and store.failures("dense_labels") == []
    assert len(store.read("dense_labels").query("episode_id == @e2")) == 52
    rb2 = rubric_dataset(tiny_dataset, be, store, gt_rubric_for(tiny_dataset), progress=False)
    assert rb2.written == [e2] and rb2.ok


def test_bad_input_is_recorded_and_rest_completes(tiny_dataset, tmp_path):
    be = GroundTruthRewardBackend(tiny_dataset)
    store = TableStore(tmp_path)
    res = reward_dataset("outcome", tiny_dataset, be, store, episodes=[0, 99], progress=False)
    assert res.written == [_eid(tiny_dataset, 0)]
    assert res.failures[0].episode_id == _eid(tiny_dataset, 99)
    assert "out of range" in res.failures[0].reason and res.failures[0].table == "outcome"
    # No rubric for an episode's task: that episode fails, the other completes.
    pick = gt_rubric_for(tiny_dataset)
    res = rubric_dataset(tiny_dataset, be, store, lambda e: None if e.index == 1 else pick(e),
                         episodes=[0, 1], progress=False)  # fmt: skip
    assert res.written == [_eid(tiny_dataset, 0)] and "no rubric" in res.failures[0].reason
    with pytest.raises(ValueError, match="unknown reward mode"):
        reward_dataset("video", tiny_dataset, be, store)


def test_unreadable_video_fails_its_episodes_only(tiny_dataset, tmp_path):
    import shutil

    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    # Episode 2 is alone in file-001: truncate that wrist video to a few bytes.
    bad = root / "videos" / "observation.images.wrist" / "chunk-000" / "file-001.mp4"
    bad.write_bytes(bad.read_bytes()[:200])
    store = TableStore(tmp_path / "out")
    be = GroundTruthRewardBackend(root)
    for mode in ("outcome", "dense"):
        res = reward_dataset(mode, root, be, store, progress=False)
        assert res.written == [_eid(root, 0), _eid(root, 1)], mode
        assert [f.episode_id for f in res.failures] == [_eid(root, 2)]
        assert "input:" in res.failures[0].reason and "file-001.mp4" in res.failures[0].reason


def test_rubric_with_maxima_0_9_is_refused_before_any_work(tiny_dataset, tmp_path):
    bad = {"task": "t", "steps": [{"name": "a", "allowed": [0, 0.5]},
                                  {"name": "b", "allowed": [0, 0.4]}]}  # fmt: skip
    p = tmp_path / "rubric.json"
    p.write_text(json.dumps(bad))
    be = RecordingOracle(tiny_dataset)
    with pytest.raises(RubricError, match="maxima sum to 0.9"):
        rubric_dataset(tiny_dataset, be, tmp_path / "out", p, progress=False)
    assert be.requests == []


class _Broken:
    """A backend whose answers fail in the ways a real one can."""

    name = "broken"
    model_version = "0"

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def generate(self, requests):
        if self.kind == "transport":
            return [VLMResponse(text="", error="HTTP 503 after retries") for _ in requests]
        if self.kind == "no_logprobs":
            return [VLMResponse(text="score: 4") for _ in requests]
        # out-of-set rubric scores
        return [VLMResponse(text="reach: 0.3\ngrasp: 0.4\nlift: 0.35") for _ in requests]


@pytest.mark.parametrize(
    "kind, mode, needle",
    [
        ("transport", "outcome", "transport: HTTP 503"),
        ("no_logprobs", "outcome", "no logprobs"),
        ("transport", "dense", "transport: HTTP 503"),
        ("bad_rubric", "rubric", "not in allowed set"),
    ],
)
def test_backend_failures_are_recorded(tiny_dataset, tmp_path, kind, mode, needle):
    store = TableStore(tmp_path)
    kw = {"rubric": gt_rubric_for(tiny_dataset)} if mode == "rubric" else {}
    res = reward_dataset(mode, tiny_dataset, _Broken(kind), store, episodes=[0],
                         max_attempts=2, progress=False, **kw)  # fmt: skip
    assert res.written == [] and len(res.failures) == 1
    assert needle in res.failures[0].reason and "after 2 attempts" in res.failures[0].reason
    assert store.read(res.table).empty


def test_rows_failing_their_suite_are_not_written(tmp_path):
    from flora.reward.run import StepResult

    store = TableStore(tmp_path)
    res = StepResult("dense_labels", tmp_path, "r")
    row = dict(episode_id="d/000000", dataset="d", model="m", model_version="v", run_id="r",
               t_us=0, label=1, reason="", source_window=0, source_group=1)  # fmt: skip
    _finish_episode(store, "dense_labels", "d/000000", [row], [], res)
    assert not store.has("dense_labels", "d/000000")
    assert res.failures[0].item == "table" and "reason_iff_not_normal" in res.failures[0].reason
    assert isinstance(store.read("dense_labels"), pd.DataFrame)


def test_failure_reason_shows_model_output_escaped_once():
    """A multi-line rejected answer reads as its repr: one backslash per newline."""
    from flora.parsing import Attempted, Rejection
    from flora.reward.run import _reason

    rej = Rejection("dense: declared worst 1 differs", "worst: 1\n1: 3\n", kind="parse")
    reason = _reason(Attempted(None, rej, attempts=[rej, rej]))
    assert reason.startswith("parse: dense: declared worst 1 differs (after 2 attempts)")
    assert reason.endswith(r"last output: 'worst: 1\n1: 3'")
