"""The flora_policy_rtc DAG: parses cleanly and trains + evaluates under ``dag.test()``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_dag_structure(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.get_dag("flora_policy_rtc")
    assert dag is not None
    assert set(dag.task_ids) == {
        "prepare", "train", "evaluate", "register", "promote", "finalize"
    }  # fmt: skip
    assert dag.get_task("train").upstream_task_ids == {"prepare"}
    assert dag.get_task("evaluate").upstream_task_ids == {"train"}
    assert dag.get_task("register").upstream_task_ids == {"evaluate"}
    assert dag.get_task("promote").upstream_task_ids == {"register"}
    assert dag.get_task("finalize").upstream_task_ids == {"promote"}
    assert dag.get_task("finalize").trigger_rule == "all_done"
    assert "flora://curated-mixture" in repr(dag.timetable.asset_condition)


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared CI box: one thread avoids OpenMP spin-wait stalls."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_dag_run_trains_evaluates_and_logs(airflow_home, tiny_dataset, one_torch_thread):
    from airflow.dag_processing.dagbag import DagBag
    from mlflow.tracking import MlflowClient

    from flora.settings import get_settings

    _, flora_home = airflow_home
    dag = DagBag(dag_folder=str(REPO / "dags")).get_dag("flora_policy_rtc")
    conf = {
        "dataset": str(tiny_dataset),
        "epochs": 1,
        "horizon": 8,
        "max_delay": 3,
        "hidden": 16,
        "depth": 1,
    }
    dr = dag.test(run_conf=conf)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert str(dr.state) in ("success", "DagRunState.SUCCESS"), states
    ti = next(t for t in dr.get_task_instances() if t.task_id == "evaluate")
    state = ti.xcom_pull(task_ids="evaluate")
    assert state["dataset"] == tiny_dataset.name
    assert str(flora_home) in state["policy_dir"]
    assert Path(state["checkpoint"]).exists()
    assert state["train_summary"]["episodes"] == 3 and state["train_summary"]["failures"] == []
    report = json.loads(Path(state["evaluation"]).read_text())
    assert {(r["d"], r["method"]) for r in report["rows"]} == {
        (d, m) for d in (0, 1, 2) for m in ("plain", "training_time", "inference_time")
    }
    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    parent = client.get_run(state["mlflow_run_id"])
    assert parent.info.status == "FINISHED"  # closed by finalize, every task succeeded
    assert parent.data.tags["orchestrator"] == "airflow"
    assert parent.data.params["epochs"] == "1" and parent.data.tags["flora.git_commit"]
    children = client.search_runs(
        [parent.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    by_step = {c.data.tags["flora.step"]: c for c in children}
    assert set(by_step) == {
        "policy_prepare", "policy_train", "policy_evaluate", "policy_register"
    }  # fmt: skip
    assert all(c.info.status == "FINISHED" for c in children)
    assert "policy.loss" in by_step["policy_train"].data.metrics
    m = by_step["policy_evaluate"].data.metrics
    assert "policy.eval.d2.training_time.postfix_mse" in m
    assert "policy.eval.latency_ms.inference_time" in m
    arts = {a.path for a in client.list_artifacts(by_step["policy_train"].info.run_id, "policy")}
    assert "policy/policy.pt" in arts
    # registered as an MLflow model, promoted through the gates (first version: champion)
    done = next(t for t in dr.get_task_instances() if t.task_id == "promote").xcom_pull(
        task_ids="promote"
    )
    assert done["promoted"] and done["champion"] == done["version"] == "1"
    mv = client.get_model_version_by_alias("flora-policy", "champion")
    assert float(mv.tags["eval.postfix_mse"]) == pytest.approx(done["metrics"]["postfix_mse"])
    import mlflow

    model = mlflow.pyfunc.load_model("models:/flora-policy@champion")
    import numpy as np
    import pandas as pd

    ep_state = [0.0] * len(model.unwrap_python_model().policy.stats["state_mean"])
    out = model.predict(pd.DataFrame([{"state": json.dumps(ep_state), "text": "pick"}]))
    chunk = np.asarray(json.loads(out["chunk"][0]))
    assert chunk.shape[0] == 8 and np.isfinite(chunk).all()
