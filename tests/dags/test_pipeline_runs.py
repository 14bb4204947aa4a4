"""MLflow structure of a pipeline run: a parent per run, a nested child per task, the
parent FAILED when any task failed (issue 12)."""

from __future__ import annotations

import pytest


def test_children_nest_under_the_parent_and_a_failure_fails_the_parent(isolated_home):
    import mlflow
    from mlflow import MlflowClient

    from flora.tracking import finish_pipeline_run, mlflow_run, start_pipeline_run

    pid = start_pipeline_run(
        "unit-workflow", tags={"airflow.run_id": "manual__1"}, params={"episodes": 3}
    )
    client = MlflowClient()
    parent = client.get_run(pid)
    assert parent.info.status == "RUNNING" and parent.data.params == {"episodes": "3"}
    assert parent.data.tags["flora.git_commit"]
    with mlflow_run("segment", run_id=pid) as r:
        mlflow.log_metric("rows", 5)
        ok_id = r.info.run_id
    with pytest.raises(RuntimeError), mlflow_run("caption", run_id=pid) as r:
        bad_id = r.info.run_id
        raise RuntimeError("branch failed")
    ok, bad = client.get_run(ok_id), client.get_run(bad_id)
    assert ok_id != pid and ok.data.tags["mlflow.parentRunId"] == pid
    assert ok.info.experiment_id == parent.info.experiment_id
    assert ok.data.tags["airflow.run_id"] == "manual__1"
    assert ok.info.status == "FINISHED" and bad.info.status == "FAILED"
    assert client.get_run(pid).data.metrics == {}  # the step's metrics are on its child
    states = {"segment": "success", "caption": "failed", "report": "upstream_failed"}
    assert finish_pipeline_run(pid, states) == "FAILED"
    done = client.get_run(pid)
    assert done.info.status == "FAILED"
    assert done.data.tags["flora.failed_tasks"] == "caption,report"


def test_all_tasks_good_finishes_the_parent(isolated_home):
    from mlflow import MlflowClient

    from flora.tracking import finish_pipeline_run, mlflow_run, start_pipeline_run

    pid = start_pipeline_run("unit-workflow")
    with mlflow_run("only", run_id=pid):
        pass
    assert finish_pipeline_run(pid, {"only": "success", "skipped_branch": "skipped"}) == (
        "FINISHED"
    )
    assert MlflowClient().get_run(pid).info.status == "FINISHED"


def test_a_plain_run_id_is_still_reopened_flat(isolated_home):
    import mlflow

    from flora.tracking import mlflow_run

    with mlflow_run("ingest") as r:
        rid = r.info.run_id
    with mlflow_run("validate", run_id=rid) as r2:
        mlflow.log_metric("x", 1)
        assert r2.info.run_id == rid
    assert mlflow.get_run(rid).data.tags["flora.steps"] == "ingest,validate"
