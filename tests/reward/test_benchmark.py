"""`flora eval reward` harness: toy-world metrics, RoboRewardBench layout, CLI, MLflow."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from typer.testing import CliRunner

from flora.backends.base import TokenLogprob, VLMResponse
from flora.data.episode import FloraDataError
from flora.reward.benchmark import (
    RoboRewardBench,
    is_roborewardbench,
    run_roborewardbench,
    run_toy_benchmark,
)
from flora.reward.oracle import GroundTruthRewardBackend


def test_toy_benchmark_oracle_is_perfect(tiny_dataset, tmp_path):
    res = run_toy_benchmark(tiny_dataset, GroundTruthRewardBackend(tiny_dataset), tmp_path,
                            progress=False)  # fmt: skip
    m = res.metrics
    assert m["outcome.mae"] == pytest.approx(0, abs=1e-4) and m["outcome.mae_argmax"] == 0
    assert m["dense.accuracy"] == 1.0 and m["dense.failure_recall"] == 1.0
    assert m["rubric.l1"] == 0.0 and m["rubric.total_abs_error"] == pytest.approx(0)
    for k in ("outcome", "dense", "rubric"):
        assert m[f"{k}.coverage"] == 1.0 and m[f"{k}.failures"] == 0


def test_toy_benchmark_reports_coverage_not_fake_scores(tiny_dataset, tmp_path):
    e2 = f"{tiny_dataset.name}/000002"
    be = GroundTruthRewardBackend(tiny_dataset, faults={f"{e2}|dense|w1": 9,
                                                        f"{e2}|outcome|episode": 9})  # fmt: skip
    m = run_toy_benchmark(tiny_dataset, be, tmp_path, modes=["outcome", "dense"],
                          progress=False).metrics  # fmt: skip
    assert m["outcome.coverage"] == pytest.approx(2 / 3) and m["outcome.failures"] == 1
    # Episode 2's only failure groups (12 s, 12.5 s) came from the failed window 1:
    # recall is computed on what was produced, coverage shows what is missing.
    assert m["dense.coverage"] == pytest.approx((12 + 28 + 24) / (12 + 28 + 52))
    assert m["dense.accuracy"] == 1.0 and m["dense.failures"] == 1
    assert "rubric.l1" not in m
    with pytest.raises(ValueError, match="unknown modes"):
        run_toy_benchmark(tiny_dataset, be, tmp_path, modes=["video"])


class FixedScorer:
    """Outcome answers with a fixed score distribution (p(3) = p(4) = 0.5 -> E[s] = 3.5)."""

    name = "fixed"
    model_version = "1"

    def generate(self, requests):
        top = {"3": math.log(0.5), "4": math.log(0.5)}
        toks = [TokenLogprob("score", 0.0, {}), TokenLogprob(":", 0.0, {}),
                TokenLogprob(" ", 0.0, {}), TokenLogprob("4", math.log(0.5), top)]  # fmt: skip
        return [VLMResponse(text="score: 4", logprobs=toks) for _ in requests]


@pytest.fixture
def rrb(tiny_dataset, tmp_path):
    """A RoboRewardBench-layout folder made from the toy dataset's top-camera videos."""
    from flora.data import open_dataset

    ds = open_dataset(tiny_dataset)
    root = tmp_path / "rrb"
    (root / "videos").mkdir(parents=True)
    rows = []
    for i, score in zip([0, 1], [5, 2], strict=True):
        cam = ds.episode(i).camera_by_role("main")
        # v3.0 concatenates episodes per file: copy the file, the span does not matter here.
        dst = root / "videos" / f"clip{i}.mp4"
        shutil.copy(cam.path, dst)
        rows.append({"video": f"videos/clip{i}.mp4", "task": ds.episode(i).task, "score": score})
    (root / "annotations.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def test_roborewardbench_layout_mae(rrb, tmp_path):
    assert is_roborewardbench(rrb)
    bench = RoboRewardBench(rrb)
    ep = bench.episode(1)
    assert ep.episode_id == "rrb/000001" and ep.task and ep.camera_by_role("main") is not None
    res = run_roborewardbench(rrb, FixedScorer(), tmp_path / "out", progress=False)
    m = res.metrics
    assert m["rrb.items"] == 2 and m["rrb.coverage"] == 1.0
    assert m["rrb.mae"] == pytest.approx((abs(3.5 - 5) + abs(3.5 - 2)) / 2)
    assert m["rrb.mae_argmax"] == pytest.approx((2 + 1) / 2)  # argmax ties -> 3


def test_roborewardbench_csv_and_bad_annotations(rrb):
    (rrb / "annotations.jsonl").unlink()
    (rrb / "annotations.csv").write_text("video,task,score\nvideos/clip0.mp4,stack,4\n")
    assert len(RoboRewardBench(rrb).items) == 1
    for body, field in [
        ("video,task,score\nvideos/clip0.mp4,stack,6\n", "score"),
        ("video,task,score\nvideos/clip0.mp4,stack,2.5\n", "score"),
        ("video,task,score\nvideos/missing.mp4,stack,3\n", "video"),
        ("video,task\nvideos/clip0.mp4,stack\n", "score"),
    ]:
        (rrb / "annotations.csv").write_text(body)
        with pytest.raises(FloraDataError) as ei:
            RoboRewardBench(rrb)
        assert ei.value.field == field and "annotations.csv" in str(ei.value) or field == "video"
    (rrb / "annotations.csv").unlink()
    with pytest.raises(FloraDataError, match="no annotations"):
        RoboRewardBench(rrb)


def test_cli_eval_reward_oracle_logs_to_mlflow(tiny_dataset, tmp_path, isolated_home):
    import mlflow

    from flora.cli import app
    from flora.tracking import configure

    r = CliRunner().invoke(app, ["eval", "reward", str(tiny_dataset), "--oracle",
                                 "--out", str(tmp_path), "--modes", "dense,rubric"])  # fmt: skip
    assert r.exit_code == 0, r.output
    metrics = json.loads(r.output.strip().splitlines()[-1])
    assert metrics["dense.accuracy"] == 1.0 and metrics["rubric.l1"] == 0.0
    configure()
    runs = mlflow.search_runs(experiment_names=["flora-data-engine"])
    assert len(runs) == 1 and runs["metrics.dense.accuracy"].iloc[0] == 1.0
    assert runs["params.layout"].iloc[0] == "toy_world"


def test_cli_reward_commands(tiny_dataset, tmp_path, isolated_home):
    from flora.cli import app

    bad = tmp_path / "r.yaml"
    bad.write_text("task: t\nsteps:\n- {name: a, allowed: [0, 0.5]}\n- {name: b, allowed: [0.4]}\n")
    r = CliRunner().invoke(app, ["reward", "rubric", str(tiny_dataset), "--rubric", str(bad),
                                 "--out", str(tmp_path)])  # fmt: skip
    assert r.exit_code != 0 and "maxima sum to 0.9" in r.output
    # Kinematic settings have no rewarder: a clear error, not a crash.
    r = CliRunner().invoke(app, ["reward", "outcome", str(tiny_dataset), "--out", str(tmp_path)])
    assert r.exit_code != 0 and "needs a VLM backend" in r.output


def test_score_tables_from_inside_the_dataset_names_it(tiny_dataset, tmp_path, monkeypatch):
    """``flora eval reward --dataset .``: the tables' ``dataset`` column is the folder's name,
    which ``Path(".").name`` ("") never matched, so nothing was scored."""
    from flora.curate.oracle import write_oracle_tables
    from flora.reward.benchmark import score_tables

    store = write_oracle_tables(tiny_dataset, tmp_path / "tables", "run-gt")
    by_path = score_tables(tiny_dataset, store)
    monkeypatch.chdir(tiny_dataset)
    assert by_path and score_tables(".", store) == by_path
