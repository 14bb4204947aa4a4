"""Ground-truth tables: format contract and consistency with the simulated episodes."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.contract import validate_events
from flora.data import open_dataset
from flora.data.episode import FloraDataError
from flora.data.ground_truth import (
    REQUIREMENT_FAMILIES,
    GTEvent,
    Requirement,
    load_ground_truth,
)


@pytest.fixture(scope="module")
def gt(tiny_dataset):
    return load_ground_truth(tiny_dataset)


def test_files_and_columns(tiny_dataset):
    d = tiny_dataset / "ground_truth"
    ev = pd.read_parquet(d / "events.parquet")
    assert list(ev.columns) == [
        "episode_index",
        "start_us",
        "end_us",
        "caption",
        "action",
        "object",
        "success",
        "requirements",
    ]
    assert ev.start_us.dtype == "int64" and ev.end_us.dtype == "int64"
    assert ev.success.dtype == bool
    de = pd.read_parquet(d / "dense.parquet")
    assert list(de.columns) == ["episode_index", "t_us", "label", "reason"]
    oc = pd.read_parquet(d / "outcome.parquet")
    assert list(oc.columns) == ["episode_index", "score", "success", "failure_modes"]
    rs = pd.read_parquet(d / "rubric_scores.parquet")
    assert list(rs.columns) == ["episode_index", "task", "step", "score"]
    rub = json.loads((d / "rubric.json").read_text())
    for fam, r in rub.items():
        assert set(r) == {"task", "steps"}
        assert abs(sum(max(s["allowed"]) for s in r["steps"]) - 1.0) < 1e-6, fam
        for s in r["steps"]:
            assert set(s) == {"name", "description", "allowed"}


def test_events_tile_active_parts(gt, tiny_dataset):
    ds = open_dataset(tiny_dataset)
    assert gt.episode_indices() == [0, 1, 2]
    for i in gt.episode_indices():
        T = ds.episode(i).duration_us
        evs = gt.events(i)
        assert evs and all(isinstance(e, GTEvent) for e in evs)
        validate_events(evs, T)  # 0 <= s < e <= T, integers
        for a, b in zip(evs, evs[1:], strict=False):
            assert a.end_us <= b.start_us  # non-overlapping, sorted
        # Active part is tiled: only idle stretches (start/end) are left uncovered.
        covered = sum(e.end_us - e.start_us for e in evs)
        assert covered >= 0.75 * T
        for e in evs:
            assert e.start_us % 50_000 == 0 and e.end_us % 50_000 == 0
            assert e.caption and e.action
            fams = {r.family for r in e.requirements}
            assert fams <= set(REQUIREMENT_FAMILIES)
            assert "action" in fams
            assert all(isinstance(r, Requirement) and r.mass > 0 for r in e.requirements)


def test_failed_attempts_keep_their_goal(gt):
    failed = [e for i in gt.episode_indices() for e in gt.events(i) if not e.success]
    assert len(failed) >= 2  # missed grasp (ep 1) and collision (ep 2)
    for e in failed:
        assert " but " in e.caption  # "attempt to grasp the X but miss it", ...
        assert e.object and e.object in e.caption  # the goal object is named
        assert "outcome" in {r.family for r in e.requirements}
    miss = next(e for e in gt.events(1) if not e.success)
    assert miss.caption.startswith("attempt to grasp the") and miss.action == "grasp"


def test_dense_labels(gt, tiny_dataset):
    ds = open_dataset(tiny_dataset)
    for i in gt.episode_indices():
        T = ds.episode(i).duration_us
        rows = gt.dense(i)
        assert [t for t, _, _ in rows] == list(range(0, T, 500_000))
        for _, label, reason in rows:
            assert label in (1, 2, 3)
            assert (reason == "") == (label == 3)
    # Clean episode: all normal. Collision -> failure groups overlapping the failed event;
    # hesitation -> suboptimal groups.
    assert {lab for _, lab, _ in gt.dense(0)} == {3}
    rows2 = gt.dense(2)
    assert {lab for _, lab, _ in rows2} == {1, 2, 3}
    bad = next(e for e in gt.events(2) if not e.success)
    ones = [t for t, lab, _ in rows2 if lab == 1]
    assert all(bad.start_us < t + 500_000 and t < bad.end_us for t in ones)
    assert any("hesitation" in r for _, lab, r in rows2 if lab == 2)


def test_outcome_and_rubric(gt):
    assert gt.outcome(0) == 5 and gt.success(0)
    assert gt.outcome(1) == 4 and gt.failure_modes(1) == ["missed_grasp"]
    assert gt.outcome(2) == 4 and set(gt.failure_modes(2)) == {"collision", "hesitation"}
    for i in gt.episode_indices():
        rubric, scores = gt.rubric(i)
        names = [s["name"] for s in rubric["steps"]]
        assert sorted(scores) == sorted(names)
        for s in rubric["steps"]:
            assert scores[s["name"]] in s["allowed"]
    rubric, scores = gt.rubric(0)
    assert sum(scores.values()) == pytest.approx(1.0)  # clean success: full marks
    _, s1 = gt.rubric(1)
    assert sum(s1.values()) < 1.0  # missed grasp costs grasp points
    with pytest.raises(FloraDataError) as ei:
        gt.outcome(9)
    assert ei.value.field == "episode_index" and ei.value.episode == 9


def _edit_gt(root, name, fn):
    p = root / "ground_truth" / name
    fn(pd.read_parquet(p)).to_parquet(p, index=False)
    return p


def test_incomplete_ground_truth_is_named_error(damaged):
    """An episode with an outcome but no dense / rubric rows, a rubric family missing from
    rubric.json and malformed requirements JSON used to be a bare KeyError or
    JSONDecodeError; each names dataset, episode, file and field."""
    dense = _edit_gt(damaged, "dense.parquet", lambda d: d[d.episode_index != 1])
    scores = _edit_gt(damaged, "rubric_scores.parquet", lambda d: d[d.episode_index != 1])

    def unknown_family(d):
        d.loc[d.episode_index == 2, "task"] = "unknown_family"
        return d

    _edit_gt(damaged, "rubric_scores.parquet", unknown_family)

    def bad_json(d):
        d.loc[d.index[d.episode_index == 0][0], "requirements"] = "not json"
        return d

    events = _edit_gt(damaged, "events.parquet", bad_json)
    gt = load_ground_truth(damaged)
    name = damaged.name
    cases = [
        (lambda: gt.dense(1), 1, dense, "episode_index", "no rows in dense.parquet"),
        (lambda: gt.rubric(1), 1, scores, "episode_index", "no rows in rubric_scores"),
        (lambda: gt.rubric(2), 2, damaged / "ground_truth/rubric.json", "task", "unknown_family"),
        (lambda: gt.events(0), 0, events, "requirements", "JSONDecodeError"),
    ]
    for call, ep, file, field, text in cases:
        with pytest.raises(FloraDataError, match=text) as ei:
            call()
        e = ei.value
        assert (e.dataset, e.episode, e.file, e.field) == (name, ep, str(file), field)
    # What is intact still reads.
    assert gt.dense(0) and gt.rubric(0)[1] and gt.events(1)


def test_malformed_rubric_json_is_named_error(damaged):
    p = damaged / "ground_truth" / "rubric.json"
    p.write_text("{not json")
    with pytest.raises(FloraDataError, match="not valid JSON") as ei:
        load_ground_truth(damaged)
    assert ei.value.file == str(p)
