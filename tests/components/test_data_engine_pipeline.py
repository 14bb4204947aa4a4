"""KFP v2 data-engine pipeline: compiles to the committed YAML and runs under kfp.local."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def flora_home(tmp_path, monkeypatch):
    from flora.settings import get_settings

    home = tmp_path / "flora_home"
    # kfp.local subprocesses inherit this environment, so they log to the same store.
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "false")
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


def test_compiles_to_committed_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv("FLORA_IMAGE", raising=False)
    from components.data_engine_pipeline import PIPELINE_YAML, compile_pipeline

    out = compile_pipeline(tmp_path / "p.yaml")
    fresh = yaml.safe_load(out.read_text())
    committed = yaml.safe_load(PIPELINE_YAML.read_text())
    assert fresh == committed, "run `python -m components.data_engine_pipeline` and commit"
    execs = fresh["deploymentSpec"]["executors"]
    assert set(execs) == {"exec-ingest-op", "exec-validate-op"}
    for ex in execs.values():
        c = ex["container"]
        assert c["image"] == "ghcr.io/flora-robotics/flora:cpu"
        assert "pip install" not in " ".join(c["command"])  # flora image has everything
        assert c["resources"]["resourceCpuLimit"] == "2"
    tasks = fresh["root"]["dag"]["tasks"]
    assert tasks["validate-op"]["dependentTasks"] == ["ingest-op"]


def test_runs_locally_with_subprocess_runner(flora_home, tiny_dataset, tmp_path):
    from kfp import local
    from mlflow.tracking import MlflowClient

    from components.data_engine_pipeline import data_engine_pipeline
    from flora.settings import get_settings

    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp_root")
    )
    task = data_engine_pipeline(dataset_path=str(tiny_dataset))
    assert task.output == [0, 1, 2]

    # The validation report artifact and the MLflow run written by the two components.
    reports = list((tmp_path / "kfp_root").rglob("validate-op/report"))
    assert len(reports) == 1
    rep = json.loads(reports[0].read_text())
    assert rep["success"] is True and rep["dataset"] == tiny_dataset.name
    manifests = list((tmp_path / "kfp_root").rglob("ingest-op/manifest"))
    assert len(manifests) == 1

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    exp = client.get_experiment_by_name(get_settings().mlflow_experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["orchestrator"] == "kfp"
    assert run.data.tags["flora.steps"] == "ingest,validate"
    assert run.data.metrics["validation.raw.success"] == 1.0
    assert run.data.metrics["ingest.episodes"] == 3
    assert os.environ["FLORA_HOME"] == str(flora_home)
