"""KFP v2 training pipeline: compiles to the committed YAML and runs under kfp.local."""

from __future__ import annotations

import json

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

    fresh = yaml.safe_load(compile_pipeline(tmp_path / "p.yaml").read_text())
    committed = yaml.safe_load(PIPELINE_YAML.read_text())
    assert fresh == committed, "run `python -m components.training_pipeline` and commit"
    execs = fresh["deploymentSpec"]["executors"]
    ops = ("build-set-op", "sft-op", "grpo-op", "evaluate-op", "register-op")
    assert set(execs) == {f"exec-{o}" for o in ops}
    for op in ("sft-op", "grpo-op", "evaluate-op"):
        c = execs[f"exec-{op}"]["container"]
        assert c["image"] == "ghcr.io/flora-robotics/flora:cuda"
        assert c["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert c["resources"]["accelerator"]["resourceCount"] == "1"
    for op in ("build-set-op", "register-op"):
        c = execs[f"exec-{op}"]["container"]
        assert c["image"] == "ghcr.io/flora-robotics/flora:cpu" and "accelerator" not in c.get(
            "resources", {}
        )
    assert all("pip install" not in " ".join(e["container"]["command"]) for e in execs.values())
    tasks = fresh["root"]["dag"]["tasks"]
    assert tasks["sft-op"]["dependentTasks"] == ["build-set-op"]
    assert sorted(tasks["grpo-op"]["dependentTasks"]) == ["build-set-op", "sft-op"]
    assert sorted(tasks["register-op"]["dependentTasks"]) == ["evaluate-op", "grpo-op"]


def test_runs_the_tiny_recipe_locally(flora_home, tiny_dataset, tmp_path):
    from kfp import local
    from mlflow.tracking import MlflowClient

    from components.training_pipeline import training_pipeline
    from flora.settings import get_settings

    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp_root")
    )
    task = training_pipeline(
        recipe="captioner-tiny", dataset_path=str(tiny_dataset), sft_max_steps=1,
        grpo_max_steps=1, n_boot=20,
    )  # fmt: skip
    version = task.output
    assert version == "1"

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    mv = client.get_model_version("flora-captioner", version)
    assert (
        str(client.get_model_version_by_alias("flora-captioner", "challenger").version) == version
    )
    assert "eval.r_cap" in mv.tags and "eval.parse_rate" in mv.tags and "eval.run_id" in mv.tags
    grpo_run = client.get_run(mv.tags["flora.training_run_id"])
    assert grpo_run.data.tags["flora.stage"] == "grpo"
    for k in ("grpo.reward_mean", "grpo.parse_rate", "grpo.kl", "grpo.loss", "grpo.clip_fraction"):
        assert k in grpo_run.data.metrics
    ev = client.get_run(mv.tags["eval.run_id"])
    assert ev.data.metrics["eval.items"] > 0 and 0.0 <= ev.data.metrics["eval.r_cap"] <= 1.0

    reports = list((tmp_path / "kfp_root").rglob("evaluate-op/report"))
    rep = json.loads(reports[0].read_text())
    assert rep["model"] == "captioner" and rep["metrics"]["items"] > 0
    models = list((tmp_path / "kfp_root").rglob("grpo-op/model/flora_model.json"))
    assert len(models) == 1
