"""KFP v2 policy pipeline: compiles to the committed YAML and runs under kfp.local."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


@pytest.fixture
def flora_home(tmp_path, monkeypatch):
    from flora.settings import get_settings

    home = tmp_path / "flora_home"
    # kfp.local subprocesses inherit this environment, so they log to the same store.
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("FLORA_DEVICE", "cpu")
    # One torch thread in the task subprocesses: on a shared CI box OpenMP spin-waits
    # across busy cores cost far more than a second thread gains for a tiny model.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


def test_compiles_to_committed_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv("FLORA_IMAGE", raising=False)
    from components.policy_pipeline import PIPELINE_YAML, compile_pipeline

    fresh = yaml.safe_load(compile_pipeline(tmp_path / "p.yaml").read_text())
    committed = yaml.safe_load(PIPELINE_YAML.read_text())
    assert fresh == committed, "run `python -m components.policy_pipeline` and commit"
    execs = fresh["deploymentSpec"]["executors"]
    assert set(execs) == {"exec-train-policy-op", "exec-evaluate-policy-op"}
    train = execs["exec-train-policy-op"]["container"]
    assert train["image"] == "ghcr.io/flora-robotics/flora:cpu"
    assert train["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert "pip install" not in " ".join(train["command"])
    tasks = fresh["root"]["dag"]["tasks"]
    assert tasks["evaluate-policy-op"]["dependentTasks"] == ["train-policy-op"]


def test_runs_locally_with_subprocess_runner(flora_home, tiny_dataset, tmp_path):
    from kfp import local
    from mlflow.tracking import MlflowClient

    from components.policy_pipeline import policy_rtc_pipeline
    from flora.settings import get_settings

    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp_root")
    )
    task = policy_rtc_pipeline(
        dataset_path=str(tiny_dataset), epochs=1, horizon=8, max_delay=3, hidden=16, depth=1
    )
    assert task.output > 0  # training-time / plain latency ratio

    ckpts = list((tmp_path / "kfp_root").rglob("train-policy-op/checkpoint"))
    assert len(ckpts) == 1 and ckpts[0].stat().st_size > 0
    reports = list((tmp_path / "kfp_root").rglob("evaluate-policy-op/report"))
    rep = json.loads(reports[0].read_text())
    assert {r["d"] for r in rep["rows"]} == {0, 1, 2}

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    exp = client.get_experiment_by_name(get_settings().mlflow_experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["flora.steps"] == "policy_train,policy_evaluate"
    assert "policy.loss" in run.data.metrics
    assert "policy.eval.d1.training_time.boundary_jump" in run.data.metrics
    assert Path(str(flora_home)).exists()
