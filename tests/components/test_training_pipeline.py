"""KFP v2 training pipeline: compiles to the committed YAML and runs under kfp.local."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.components.helpers import assert_gpu_container, assert_on_cluster, load_compiled

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def flora_home(tmp_path, monkeypatch):
    from flora.settings import get_settings

    home = tmp_path / "flora_home"
    # kfp.local subprocesses inherit this environment, so they log to the same store.
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("FLORA_DEVICE", "cpu")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # An in-process trainer test (training.sft.init_distributed) leaves this process's
    # rendezvous in the env; task subprocesses must each start their own one-rank group.
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


def test_compiles_to_committed_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv("FLORA_IMAGE", raising=False)
    monkeypatch.delenv("FLORA_CUDA_IMAGE", raising=False)
    from components.training_pipeline import PIPELINE_YAML, compile_pipeline

    fresh, k8s = load_compiled(compile_pipeline(tmp_path / "p.yaml"))
    assert (fresh, k8s) == load_compiled(PIPELINE_YAML), (
        "run `python -m components.training_pipeline` and commit"
    )
    execs = fresh["deploymentSpec"]["executors"]
    ops = ("build-set-op", "sft-op", "grpo-op", "evaluate-op", "register-op", "promote-op")
    assert set(execs) == set(k8s) == {f"exec-{o}" for o in ops}
    for op in ops:
        gpu = op in ("sft-op", "grpo-op", "evaluate-op")
        assert_gpu_container(execs[f"exec-{op}"]["container"], gpu=gpu)
        # The shared PVC, the pipeline-env ConfigMap, the object-store Secret, the labels.
        assert_on_cluster(k8s[f"exec-{op}"], gpu=gpu)
    tasks = fresh["root"]["dag"]["tasks"]
    assert tasks["sft-op"]["dependentTasks"] == ["build-set-op"]
    assert sorted(tasks["grpo-op"]["dependentTasks"]) == ["build-set-op", "sft-op"]
    assert sorted(tasks["register-op"]["dependentTasks"]) == [
        "build-set-op", "evaluate-op", "grpo-op"
    ]  # fmt: skip
    assert tasks["promote-op"]["dependentTasks"] == ["register-op"]
    assert all(t["cachingOptions"] == {} for t in tasks.values())  # caching off
    # Each step retries once after a failure (a lost node), as the Airflow DAG's tasks.
    assert {t["retryPolicy"]["maxRetryCount"] for t in tasks.values()} == {1}


def test_runs_the_tiny_recipe_locally(flora_home, tiny_dataset, tmp_path, task_tmp):
    """kfp.local ignores the Kubernetes platform config, images and resources."""
    from kfp import local
    from mlflow.tracking import MlflowClient

    from components.training_pipeline import training_pipeline
    from flora.settings import get_settings

    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp_root")
    )
    task = training_pipeline(
        model="captioner", recipe="tiny", dataset_path=str(tiny_dataset), sft_max_steps=1,
        grpo_max_steps=1, eval_max_episodes=1, n_boot=20, gates="mechanics",
    )  # fmt: skip
    out = task.output
    version = out["version"]
    assert version == "1" and out["suites_passed"] is True, out
    # gates=mechanics: only the suites gate, which this run passed.
    assert out["promoted"] is True and out["champion"] == version, out

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    mv = client.get_model_version("flora-captioner", version)
    assert str(client.get_model_version_by_alias("flora-captioner", "champion").version) == version
    assert "eval.r_cap" in mv.tags and "eval.parse_rate" in mv.tags and "eval.run_id" in mv.tags
    assert mv.tags["flora.recipe"] == "captioner-tiny" and mv.tags["flora.dvc_md5"]
    grpo_run = client.get_run(mv.tags["flora.training_run_id"])
    assert grpo_run.data.tags["flora.stage"] == "grpo"
    for k in ("grpo.reward_mean", "grpo.parse_rate", "grpo.kl", "grpo.loss", "grpo.clip_fraction"):
        assert k in grpo_run.data.metrics
    ev = client.get_run(mv.tags["eval.run_id"])
    assert ev.data.metrics["eval.items"] > 0 and 0.0 <= ev.data.metrics["eval.r_cap"] <= 1.0

    reports = list((tmp_path / "kfp_root").rglob("evaluate-op/report"))
    rep = json.loads(reports[0].read_text())
    assert rep["model"] == "captioner" and rep["metrics"]["items"] > 0
    assert rep["baseline"] and "eval.r_cap" in rep["baseline"]  # the untrained base, too
    models = list((tmp_path / "kfp_root").rglob("grpo-op/trained_model/flora_model.json"))
    assert len(models) == 1
    # The SFT and GRPO scratch folders went with their tasks (copied into the artifacts).
    assert not list(task_tmp.glob("flora-*")), sorted(p.name for p in task_tmp.iterdir())


def test_kfp_platform_config_does_not_import_airflow():
    """KFP pods share the Airflow pods' labels and secret mapping without importing Airflow:
    Airflow reads AIRFLOW_HOME once, at first import, so an import from here would bind
    every later DAG test in the process to the wrong metadata DB."""
    import subprocess
    import sys

    code = (
        "import sys, components.platform, flora.orchestration as o; "
        "assert components.platform.POD_LABELS is o.POD_LABELS; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'airflow']"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
