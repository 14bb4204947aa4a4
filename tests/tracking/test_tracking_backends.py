"""flora.tracking runs on both stores: embedded SQLite and the MLflow server on PostgreSQL.

The PostgreSQL-backed server is the session fixture ``mlflow_pg_server``
(tests/tracking/pg_server.py): a real ``postgres`` on loopback and ``mlflow server`` over
it. If PostgreSQL cannot start, the fixture raises: these tests fail, never skip.
"""

from __future__ import annotations

import pandas as pd
import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def tracking_store(request, tmp_path, monkeypatch) -> str:
    """Settings pointed at one store; returns the tracking URI in use."""
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "flora_home"))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    if request.param == "postgres":
        server = request.getfixturevalue("mlflow_pg_server")
        monkeypatch.setenv("FLORA_MLFLOW_TRACKING_URI", server.url)
    get_settings.cache_clear()
    yield get_settings().tracking_uri
    get_settings.cache_clear()


def test_pipeline_run_steps_and_table_summary(tracking_store, request):
    import mlflow
    from mlflow import MlflowClient

    from flora.tracking import (
        PARENT_TAG,
        configure,
        finish_pipeline_run,
        log_table_summary,
        mlflow_run,
        start_pipeline_run,
    )

    assert configure() == tracking_store
    if "postgres" in request.node.callspec.id:
        assert tracking_store.startswith("http://127.0.0.1:")
    else:
        assert tracking_store.startswith("sqlite:///")
    # A unique experiment per store/test: the Postgres server is shared by the session.
    workflow = f"trk-{request.node.callspec.id}-{id(request)}"
    parent = start_pipeline_run(workflow, params={"episodes": 3})
    with mlflow_run("segment", run_id=parent) as child:
        summary = log_table_summary(
            "events", pd.DataFrame({"episode_id": ["a", "b"], "start_us": [0, 5]})
        )
        child_id = child.info.run_id
    with pytest.raises(RuntimeError, match="boom"), mlflow_run("caption", run_id=parent):
        raise RuntimeError("boom")
    assert finish_pipeline_run(parent, {"segment": "success", "caption": "failed"}) == "FAILED"

    client = MlflowClient()
    p = client.get_run(parent)
    assert p.data.tags[PARENT_TAG] == "1"
    assert p.data.params["episodes"] == "3"
    assert p.data.tags["flora.failed_tasks"] == "caption"
    assert p.info.status == "FAILED"
    c = client.get_run(child_id)
    assert c.info.status == "FINISHED"
    assert c.data.tags["mlflow.parentRunId"] == parent
    assert summary  # the summary was computed and logged
    assert c.data.metrics["table.events.rows"] == 2.0
    assert c.data.metrics["table.events.episodes"] == 2.0
    # The failed step's child run is recorded as FAILED under the same parent.
    children = mlflow.search_runs(
        experiment_ids=[p.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent}'",
        output_format="list",
    )
    assert sorted(r.info.status for r in children) == ["FAILED", "FINISHED"]
