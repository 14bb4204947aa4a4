"""The flora_data_engine DAG: parses cleanly and runs end to end under ``dag.test()``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dagbag_imports_without_errors(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.get_dag("flora_data_engine")
    assert dag is not None
    assert set(dag.task_ids) >= {"ingest", "validate"}
    assert dag.get_task("validate").upstream_task_ids == {"ingest"}
    assert dag.schedule is None or str(dag.schedule) == "None"


def _nan_action(root: Path, episode: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    for p in sorted((root / "data").rglob("*.parquet")):
        df = pq.read_table(p).to_pandas()
        rows = df.index[df.episode_index == episode]
        if len(rows):
            a = np.array(df.at[rows[3], "action"], dtype=np.float32)
            a[1] = np.inf
            df.at[rows[3], "action"] = a
            pq.write_table(pa.Table.from_pandas(df, preserve_index=False), p)
            return
    raise AssertionError("episode not found")


def test_dag_run_logs_mlflow_and_quarantines_bad_episode(airflow_home, tiny_dataset, tmp_path):
    from airflow.dag_processing.dagbag import DagBag
    from mlflow.tracking import MlflowClient

    from flora.settings import get_settings

    _, flora_home = airflow_home
    # A copy of the tiny dataset with one damaged episode: the run must succeed, log
    # everything to MLflow, and hand only the valid episodes downstream.
    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    _nan_action(root, 1)

    dag = DagBag(dag_folder=str(REPO / "dags")).get_dag("flora_data_engine")
    dr = dag.test(run_conf={"dataset": str(root)})
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert str(dr.state) in ("success", "DagRunState.SUCCESS"), states

    ti = next(t for t in dr.get_task_instances() if t.task_id == "validate")
    state = ti.xcom_pull(task_ids="validate")
    assert state["dataset"] == root.name and state["episodes"] == [0, 1, 2]
    assert state["valid_episodes"] == [0, 2] and state["invalid_episodes"] == [1]
    assert state["validation_success"] is False
    report = json.loads(Path(state["validation_report"]).read_text())
    assert report["issues"][0]["episode"] == 1 and report["issues"][0]["field"] == "action"
    assert Path(state["outputs_dir"], "manifest", f"{root.name}.parquet").exists()
    assert Path(state["validation_report"]).parent == Path(state["outputs_dir"], "validation")
    assert str(flora_home) in state["outputs_dir"]

    s = get_settings()
    assert str(flora_home) in s.tracking_uri
    client = MlflowClient(tracking_uri=s.tracking_uri)
    run = client.get_run(state["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["dataset"] == root.name
    assert run.data.tags["orchestrator"] == "airflow"
    assert run.data.tags["airflow.run_id"] == dr.run_id
    assert run.data.tags["flora.steps"] == "ingest,validate"
    assert run.data.tags["validation.raw"] == "failed"
    m = run.data.metrics
    assert m["ingest.episodes"] == 3 and m["table.manifest.rows"] == 3
    assert m["validation.raw.success"] == 0.0 and m["validation.valid_episodes"] == 2
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "validation")}
    assert "validation/raw.json" in arts


def test_kubernetes_provider_with_airflow_3(airflow_home):
    """Provider 10.5.0 (kubernetes<31, shared with kfp) works with Airflow 3 (docs/dependencies)."""
    import kubernetes
    import pendulum
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import (
        KubernetesExecutor,
    )
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk import DAG, task
    from kubernetes.client import models as k8s

    assert int(kubernetes.__version__.split(".")[0]) < 31
    assert KubernetesExecutor is not None and hasattr(task, "kubernetes")
    with DAG("gpu_step_probe", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        op = KubernetesPodOperator(
            task_id="segment_gpu",
            name="flora-segment",
            image="ghcr.io/flora-robotics/flora:cuda",
            cmds=["python", "-m", "flora.cli"],
            container_resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
        )
    assert dag.get_task("segment_gpu") is op
    assert op.container_resources.limits == {"nvidia.com/gpu": "1"}
