"""Failure analysis: spans from dense labels, reason clusters (MiniLM), groups, examples."""

from __future__ import annotations

import pandas as pd


def test_reasons_cluster_into_failure_modes():
    from flora.curate.failures import cluster_texts

    reasons = [
        "missed grasp: the gripper closed on nothing next to the red block",
        "missed grasp: the gripper closed on nothing next to the blue cube",
        "drop: the red ball fell out of the gripper",
        "drop: the yellow cube fell out of the gripper",
        "collision: the gripper hit the purple ball",
        "collision: the gripper hit the orange block",
        "hesitation: the arm paused for 1.9 s without progress",
        "slip: the orange ball rolled away from the gripper",
    ]
    names = cluster_texts(reasons)
    assert names == ["missed grasp", "missed grasp", "drop", "drop", "collision", "collision",
                     "hesitation", "slip"]  # fmt: skip
    assert cluster_texts([]) == [] and cluster_texts(["x: y"] * 2) == ["x", "x"]


def test_analysis_groups_by_cluster_task_robot_with_examples(tiny_dataset, tmp_path):
    from flora.curate.failures import analyze_failures
    from flora.curate.oracle import write_oracle_tables
    from flora.curate.sources import episode_meta
    from flora.data.ground_truth import load_ground_truth

    tables = tmp_path / "t"
    write_oracle_tables(tiny_dataset, tables, tables=("dense_labels",))
    meta = episode_meta(tiny_dataset)
    extra = pd.DataFrame([{**meta.iloc[0].to_dict(), "episode_id": "toy_tiny/000099",
                           "episode_index": 99}])  # fmt: skip
    res = analyze_failures(tiny_dataset, tables, tmp_path / "f",
                           meta=pd.concat([meta, extra], ignore_index=True))  # fmt: skip
    gt = load_ground_truth(tiny_dataset).tables["dense"]
    assert res.missing == ["toy_tiny/000099"]  # no dense labels: reported, not invented
    assert res.spans.seconds.sum() == (gt.label < 3).sum() * 0.5
    assert set(res.clusters.cluster) >= {"missed grasp", "collision"}
    assert (res.clusters.spans > 0).all() and set(res.clusters.robot) == {"flora_toy_arm"}
    assert len(res.examples) >= len(res.clusters.cluster.unique())
    for r in res.examples.itertuples():
        assert r.thumbnail and (tmp_path / "f" / "thumbs").exists()
        assert r.clip.startswith(r.episode_id + "@[")
    assert (tmp_path / "f" / "clusters.parquet").exists()
