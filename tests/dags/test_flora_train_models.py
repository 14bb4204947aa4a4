"""The flora_train_models DAG: parses, has the documented graph, and trains + registers +
promotes the tiny captioner under ``dag.test()``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "flora_train_models"


def test_dag_structure(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.get_dag(DAG_ID)
    assert dag is not None
    chain = {
        "segmenter": ["build_set", "sft", "grpo", "evaluate", "register", "promote", "deploy"],
        "captioner": ["build_set", "sft", "grpo", "evaluate", "register", "promote", "deploy"],
        "rewarder": ["build_set", "sft", "evaluate", "register", "promote", "deploy"],
    }
    want = {"prepare", "finalize"} | {f"{m}.{t}" for m, ts in chain.items() for t in ts}
    assert set(dag.task_ids) == want
    for m, ts in chain.items():
        assert dag.get_task(f"{m}.build_set").upstream_task_ids == {"prepare"}
        for a, b in zip(ts, ts[1:], strict=False):
            assert f"{m}.{a}" in dag.get_task(f"{m}.{b}").upstream_task_ids
    fin = dag.get_task("finalize")
    assert fin.trigger_rule == "all_done"
    assert fin.upstream_task_ids == {f"{m}.deploy" for m in chain}
    assert dag.get_task("captioner.sft").retries >= 1
    assert "flora://curated-mixture" in repr(dag.timetable.asset_condition)


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared CI box: one thread avoids OpenMP spin-wait stalls."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_dag_run_trains_registers_and_promotes(airflow_home, tiny_dataset, one_torch_thread):
    from airflow.dag_processing.dagbag import DagBag
    from mlflow.tracking import MlflowClient

    from flora.settings import get_settings

    _, flora_home = airflow_home
    dag = DagBag(dag_folder=str(REPO / "dags")).get_dag(DAG_ID)
    conf = {
        "dataset": str(tiny_dataset),
        "recipe": "tiny",
        "models": ["captioner"],
        "sft_max_steps": 1,
        "grpo_max_steps": 1,
        "eval_episodes": 1,
        "n_boot": 10,
        "gates": "mechanics",  # random tiny weights never clear a quality floor
    }
    dr = dag.test(run_conf=conf)
    tis = {ti.task_id: ti for ti in dr.get_task_instances()}
    states = {k: str(ti.state) for k, ti in tis.items()}
    assert str(dr.state) in ("success", "DagRunState.SUCCESS"), states
    # models outside the subset skip; the captioner's chain ran
    assert all("skipped" in states[t] for t in states if t.startswith(("segmenter.", "rewarder.")))
    assert all("success" in states[t] for t in states if t.startswith("captioner."))

    done = tis["captioner.deploy"].xcom_pull(task_ids="captioner.deploy")
    assert done["promoted"] and done["champion"] == done["version"] == "1"
    assert done["suites_passed"] and done["deployed"]
    assert Path(done["manifest"]).is_file() and str(flora_home) in done["manifest"]
    report = json.loads(Path(done["eval_report"]).read_text())
    assert report["items"] > 0 and "eval.parse_rate" in report["flat"]
    assert "eval.parse_rate" in report["baseline"]  # the untrained base, same items

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    mv = client.get_model_version_by_alias("flora-captioner", "champion")
    assert str(mv.version) == "1"
    assert mv.tags["flora.recipe"] == "captioner-tiny" and mv.tags["flora.base"] == "tiny"
    for k in ("flora.git_commit", "flora.dvc_md5", "flora.set.run_id", "eval.r_cap",
              "flora.suites", "flora.training_run_id"):  # fmt: skip
        assert mv.tags.get(k), k
    assert client.get_run(mv.tags["flora.training_run_id"]).data.tags["flora.stage"] == "grpo"
    grpo_out = tis["captioner.grpo"].xcom_pull(task_ids="captioner.grpo")
    history = json.loads((Path(grpo_out["model_dir"]).parent / "log" / "history.json").read_text())
    assert [h["step"] for h in history] == [1] and math.isfinite(history[0]["grpo.kl"])

    prepared = tis["prepare"].xcom_pull(task_ids="prepare")
    parent = client.get_run(prepared["mlflow_run_id"])
    assert parent.info.status == "FINISHED"  # closed by finalize, nothing failed
    exp = client.get_experiment(parent.info.experiment_id)
    assert exp.name == "flora-train-models"
    assert parent.data.params["recipe"] == "tiny" and parent.data.tags["orchestrator"] == "airflow"
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    steps = {c.data.tags["flora.step"] for c in children}
    assert steps == {"prepare"} | {
        f"{s}_captioner"
        for s in ("build_set", "sft", "grpo", "evaluate", "register", "record_suites",
                  "promote", "deploy")
    }  # fmt: skip
    assert all(c.info.status == "FINISHED" for c in children)
