"""Episode shards, the episode-sets reference and the merge of shard reports (pure code)."""

from __future__ import annotations

import json

import pytest

from flora.engine import merge_reports, report_counts
from flora.orchestration.shards import (
    episode_set,
    plan_shards,
    plan_shards_with_episodes,
    report_path,
    shard_episodes,
    shard_label,
    unfinished_shards,
    write_episode_sets,
)


def test_plan_shards_never_plans_an_empty_shard():
    assert plan_shards(10, 3) == [{"index": k, "count": 3} for k in range(3)]
    assert plan_shards(2, 4) == [{"index": 0, "count": 2}, {"index": 1, "count": 2}]
    assert plan_shards(0, 4) == [{"index": 0, "count": 1}]  # validate fails before this
    with pytest.raises(ValueError, match="shards must be >= 1"):
        plan_shards(5, 0)


def test_shards_partition_the_episodes_strided():
    eps = [9, 0, 4, 2, 7, 1, 3]
    plan = plan_shards(len(eps), 3)
    parts = [shard_episodes(eps, sh) for sh in plan]
    assert parts == [[0, 3, 9], [1, 4], [2, 7]]
    assert sorted(x for p in parts for x in p) == sorted(eps)  # each episode once
    assert shard_episodes(eps, None) == sorted(eps)
    with pytest.raises(ValueError, match=r"shard index 3 is not in \[0, 3\)"):
        shard_episodes(eps, {"index": 3, "count": 3})
    assert [shard_label(sh) for sh in plan] == ["0-of-3", "1-of-3", "2-of-3"]
    assert shard_label(None) == "all"


def test_kfp_plan_carries_each_shards_episodes_and_the_run_wide_vlm_bound():
    """The KFP loop items: segment takes ``episodes``; the VLM steps take the run's first
    ``vlm_max_episodes`` episodes, each shard its part of them (as the Airflow DAG)."""
    from flora.engine import StepOptions

    eps = [9, 0, 4, 2, 7, 1, 3]
    plan = plan_shards_with_episodes(eps, 3, StepOptions.from_mapping({"vlm_max_episodes": 4}))
    assert [(p["index"], p["count"]) for p in plan] == [(0, 3), (1, 3), (2, 3)]
    assert [p["episodes"] for p in plan] == [[0, 3, 9], [1, 4], [2, 7]]
    assert [p["vlm_episodes"] for p in plan] == [[0, 3], [1], [2]]  # of 0, 1, 2, 3
    everything = plan_shards_with_episodes(eps, 2, StepOptions.from_mapping({}))
    assert [p["vlm_episodes"] for p in everything] == [p["episodes"] for p in everything]
    assert json.loads(json.dumps(plan)) == plan  # a KFP parameter: plain JSON


def test_episode_sets_are_a_reference_with_clear_errors(tmp_path):
    state = {"outputs_dir": str(tmp_path), "dataset": "toy", "mlflow_run_id": "r1"}
    path = write_episode_sets(state, episodes=[0, 1, 2], ingested=[0, 1, 2])
    assert path == str(tmp_path / "runs" / "toy" / "r1" / "episodes.json")
    assert write_episode_sets(state, valid=[0, 2], invalid=[1]) == path  # merged
    ref = {**state, "episode_sets": path}
    assert episode_set(ref, "episodes") == [0, 1, 2] and episode_set(ref, "valid") == [0, 2]
    assert sorted(json.loads((tmp_path / "runs/toy/r1/episodes.json").read_text())) == [
        "episodes", "ingested", "invalid", "valid"]  # fmt: skip
    with pytest.raises(KeyError, match="have no 'curated'"):
        episode_set(ref, "curated")
    gone = {**ref, "episode_sets": str(tmp_path / "nowhere.json")}
    with pytest.raises(FileNotFoundError, match="of run r1 are missing"):
        episode_set(gone, "valid")
    assert report_path(ref, "segment", {"index": 1, "count": 2}).name == "segment.1-of-2.json"


def _report(episodes, rows, failures, valid):
    return {
        "step": "caption", "table": "captions", "table_dir": "/t/captions", "dataset": "toy",
        "episodes_in": episodes, "processed": [f"toy/{i:06d}" for i in episodes], "skipped": [],
        "rows": rows, "episodes_with_rows": len(episodes) if rows else 0,
        "failures": [{"episode_id": f"toy/{episodes[0]:06d}", "item": "event 0", "reason": "x"}]
        * failures,
        "n_failures": failures,
        "failed_episodes": [f"toy/{episodes[0]:06d}"] if failures else [],
        "valid": valid, "model": "m", "model_version": "1", "metrics": {"caption.x": 1.0},
    }  # fmt: skip


def test_merge_reports_sums_counts_joins_lists_and_keeps_the_worst_suite_state():
    a, b, c = (
        _report([0, 3], 5, 1, "passed"),
        _report([1], 0, 2, "empty"),
        _report([2], 2, 0, "passed"),
    )
    m = merge_reports([b, a, c])
    assert m["episodes_in"] == [0, 1, 2, 3] and m["rows"] == 7 and m["n_failures"] == 3
    assert len(m["failures"]) == 3 and m["failed_episodes"] == ["toy/000000", "toy/000001"]
    assert m["episodes_with_rows"] == 3 and m["valid"] == "passed" and m["metrics"] == {}
    assert report_counts(m)["step.caption.episodes_in"] == 4.0
    assert merge_reports([b])["valid"] == "empty"
    assert merge_reports([a, _report([4], 1, 0, "failed"), b])["valid"] == "failed"
    with pytest.raises(ValueError, match="no step reports"):
        merge_reports([])
    with pytest.raises(ValueError, match="different steps"):
        merge_reports([a, {**b, "step": "segment"}])


def test_unfinished_shards_names_each_shard_and_the_steps_it_missed():
    plan = plan_shards(3, 3)
    handoffs = {
        "segment": [{"shard": plan[0]}, None, {"shard": plan[2]}],
        "caption": [{"shard": plan[0]}, None, None],
    }
    assert unfinished_shards(plan, handoffs) == {"1-of-3": ["segment", "caption"],
                                                 "2-of-3": ["caption"]}  # fmt: skip
    assert unfinished_shards(plan[:1], handoffs) == {}
    assert unfinished_shards(plan, {"segment": []}) == {
        "0-of-3": ["segment"], "1-of-3": ["segment"], "2-of-3": ["segment"]}  # fmt: skip
