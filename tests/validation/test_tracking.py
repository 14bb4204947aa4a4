"""MLflow helpers against a real SQLite tracking store under a temporary FLORA_HOME."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.tracking import log_table_summary, log_validation, mlflow_run
from flora.validation.core import validate_table


def test_run_lifecycle_table_summary_and_validation(flora_home, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from flora.settings import get_settings

    # The test suite from test_validation_core may not be imported; register one here.
    from flora.validation.core import common_columns, register_suite

    @register_suite("_test_tracked")
    def _suite(gxe):
        return [*common_columns(gxe), gxe.ExpectColumnValuesToBeBetween(column="x", min_value=0)]

    df = pd.DataFrame(
        {
            "episode_id": ["d/000000", "d/000001"],
            "dataset": "d",
            "model": "m",
            "model_version": "1",
            "run_id": "r",
            "x": [1, -1],
        }
    )
    with mlflow_run("ingest", tags={"dataset": "d"}, experiment="exp-a") as run:
        summary = log_table_summary("manifest", df)
        run_id = run.info.run_id
    assert summary["rows"] == 2 and summary["episodes"] == 2

    # A later step reopens the same run (as the DAG's validate task does).
    report = validate_table("_test_tracked", df)
    with mlflow_run("validate", run_id=run_id):
        log_validation(report)

    s = get_settings()
    assert s.tracking_uri.startswith("sqlite:///") and str(flora_home) in s.tracking_uri
    assert (flora_home / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=s.tracking_uri)
    r = client.get_run(run_id)
    assert r.info.status == "FINISHED"
    assert r.data.tags["dataset"] == "d"
    assert r.data.tags["flora.steps"] == "ingest,validate"
    assert r.data.tags["validation._test_tracked"] == "failed"
    assert r.data.metrics["table.manifest.rows"] == 2
    assert r.data.metrics["validation._test_tracked.success"] == 0.0
    assert r.data.metrics["validation._test_tracked.failed"] == 1.0
    # Artifacts land under the configured artifact root, not ./mlruns.
    art = mlflow.artifacts.download_artifacts(
        run_id=run_id,
        artifact_path="validation/_test_tracked.json",
        tracking_uri=s.tracking_uri,
        dst_path=str(tmp_path),  # mlflow's default is a mkdtemp it never removes
    )
    logged = json.loads(open(art).read())
    assert logged["failing_episodes"] == ["d/000001"]
    assert str(s.artifact_root) in r.info.artifact_uri


def test_failed_body_marks_run_failed(flora_home):
    from mlflow.tracking import MlflowClient

    from flora.settings import get_settings

    with pytest.raises(RuntimeError):
        with mlflow_run("boom") as run:
            raise RuntimeError("step failed")
    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    assert client.get_run(run.info.run_id).info.status == "FAILED"
