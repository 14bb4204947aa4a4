"""KFP v2 policy pipeline: compiles to the committed YAML and runs under kfp.local."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.components.helpers import assert_gpu_container, assert_on_cluster, load_compiled


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
    monkeypatch.delenv("FLORA_CUDA_IMAGE", raising=False)
    from components.policy_pipeline import PIPELINE_YAML, compile_pipeline

    fresh, k8s = load_compiled(compile_pipeline(tmp_path / "p.yaml"))
    assert (fresh, k8s) == load_compiled(PIPELINE_YAML), (
        "run `python -m components.policy_pipeline` and commit"
    )
    execs = fresh["deploymentSpec"]["executors"]
    ops = ("train-policy-op", "evaluate-policy-op", "register-policy-op", "promote-policy-op")
    assert set(execs) == set(k8s) == {f"exec-{o}" for o in ops}
    for op in ops:
        gpu = op == "train-policy-op"
        assert_gpu_container(execs[f"exec-{op}"]["container"], gpu=gpu)
        assert_on_cluster(k8s[f"exec-{op}"], gpu=gpu)
    tasks = fresh["root"]["dag"]["tasks"]
    assert tasks["evaluate-policy-op"]["dependentTasks"] == ["train-policy-op"]
    assert sorted(tasks["register-policy-op"]["dependentTasks"]) == [
        "evaluate-policy-op", "train-policy-op"
    ]  # fmt: skip
    assert sorted(tasks["promote-policy-op"]["dependentTasks"]) == [
        "evaluate-policy-op", "register-policy-op"
    ]  # fmt: skip


def test_runs_locally_with_subprocess_runner(flora_home, tiny_dataset, tmp_path, task_tmp):
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
    out = task.output
    assert out["latency_ratio"] > 0  # training-time / plain latency ratio
    assert out["version"] == "1" and isinstance(out["promoted"], bool), out
    assert out["metrics"]["postfix_mse"] >= 0 and isinstance(out["gate_reasons"], list)

    ckpts = list((tmp_path / "kfp_root").rglob("train-policy-op/checkpoint"))
    assert len(ckpts) == 1 and ckpts[0].stat().st_size > 0
    assert not list(task_tmp.glob("flora-policy-*"))  # the trainer's scratch went with it
    reports = list((tmp_path / "kfp_root").rglob("evaluate-policy-op/report"))
    rep = json.loads(reports[0].read_text())
    assert {r["d"] for r in rep["rows"]} == {0, 1, 2}

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    exp = client.get_experiment_by_name(get_settings().mlflow_experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["flora.steps"] == "policy_train,policy_evaluate,policy_register"
    mv = client.get_model_version("flora-policy", "1")
    assert mv.tags["flora.training_run_id"] == run.info.run_id and "eval.postfix_mse" in mv.tags
    assert str(client.get_model_version_by_alias("flora-policy", "challenger").version) == "1"
    assert "policy.loss" in run.data.metrics
    assert "policy.eval.d1.training_time.boundary_jump" in run.data.metrics
    assert Path(str(flora_home)).exists()
