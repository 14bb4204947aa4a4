"""`flora segment` and `flora eval segment` (metrics vs ground truth, logged to MLflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from flora.data.ground_truth import load_ground_truth
from flora.segment.evaluate import evaluate_events, read_events


@pytest.fixture
def flora_home(tmp_path, monkeypatch):
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLORA_BACKEND", "kinematic")
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    get_settings.cache_clear()
    yield tmp_path / "home"
    get_settings.cache_clear()


def _gt_frame(root, drop_episode: int | None = None) -> pd.DataFrame:
    gt = load_ground_truth(root)
    rows = []
    for i in gt.episode_indices():
        if i == drop_episode:
            continue
        for e in gt.events(i):
            rows.append(
                {
                    "episode_id": f"{root.name}/{i:06d}",
                    "dataset": root.name,
                    "start_us": e.start_us,
                    "end_us": e.end_us,
                }
            )
    return pd.DataFrame(rows)


def test_evaluate_perfect_and_missing_episode(tiny_dataset) -> None:
    res = evaluate_events(_gt_frame(tiny_dataset), tiny_dataset)
    m = res.metrics
    assert m["f1@0.5"] == 1.0 and m["f1@0.75"] == 1.0 and m["mean_tiou"] == 1.0
    assert m["precision@0.5"] == 1.0 and res.missing_episodes == []
    gt = load_ground_truth(tiny_dataset)
    n1 = len(gt.events(1))
    n_all = sum(len(gt.events(i)) for i in gt.episode_indices())
    res = evaluate_events(_gt_frame(tiny_dataset, drop_episode=1), tiny_dataset)
    assert res.missing_episodes == [1]
    assert res.metrics["precision@0.5"] == 1.0
    assert res.metrics["recall@0.5"] == pytest.approx((n_all - n1) / n_all)
    assert res.metrics["mean_tiou"] == pytest.approx((n_all - n1) / n_all)
    row = res.per_episode.set_index("episode_index").loc[1]
    assert row["f1@0.5"] == 0.0 and row["n_pred"] == 0


def test_evaluate_shifted_boundaries_hand_computed(tiny_dataset) -> None:
    df = _gt_frame(tiny_dataset)
    # Shorten every event to 60 % of its length: tIoU 0.6 -> matched at 0.5, not at 0.75.
    df["end_us"] = df["start_us"] + ((df["end_us"] - df["start_us"]) * 6) // 10
    res = evaluate_events(df, tiny_dataset)
    assert res.metrics["f1@0.5"] == 1.0
    assert res.metrics["f1@0.75"] == 0.0
    assert res.metrics["mean_tiou"] == pytest.approx(0.6, abs=1e-3)


def test_read_events_rejects_missing_path(tmp_path) -> None:
    from flora.data.episode import FloraDataError

    with pytest.raises(FloraDataError, match="events table not found"):
        read_events(tmp_path / "nope")


def test_cli_segment_then_eval_logs_to_mlflow(tiny_dataset, tmp_path, flora_home) -> None:
    import mlflow

    from flora.cli import app

    runner = CliRunner()
    out = tmp_path / "tables"
    r = runner.invoke(app, ["segment", str(tiny_dataset), "--out", str(out), "--run-id", "c1"])
    assert r.exit_code == 0, r.output
    assert "3 episodes segmented" in r.output
    j = tmp_path / "eval.json"
    r = runner.invoke(
        app,
        ["eval", "segment", "--events", str(out), "--dataset", str(tiny_dataset), "--json", str(j)],
    )
    assert r.exit_code == 0, r.output
    assert "f1@0.5" in r.output and "logged to MLflow run" in r.output
    got = json.loads(j.read_text())["metrics"]
    want = evaluate_events(read_events(out), tiny_dataset).metrics
    assert got["f1@0.5"] == pytest.approx(want["f1@0.5"])
    assert got["f1@0.5"] >= 0.75  # the kinematic baseline on the toy world
    run_id = r.output.rsplit("logged to MLflow run", 1)[1].split()[0]
    from flora.settings import get_settings

    mlflow.set_tracking_uri(get_settings().tracking_uri)
    logged = mlflow.get_run(run_id).data.metrics
    assert logged["segment.f1_at_0.5"] == pytest.approx(want["f1@0.5"])
    assert logged["segment.mean_tiou"] == pytest.approx(want["mean_tiou"])


def test_evaluate_dot_names_the_current_folder(tiny_dataset, monkeypatch) -> None:
    # `flora eval segment --dataset .` run from inside the dataset: `.` has no name of its own.
    monkeypatch.chdir(tiny_dataset)
    res = evaluate_events(_gt_frame(tiny_dataset), Path("."))
    assert res.metrics["f1@0.5"] == 1.0 and res.missing_episodes == []
