"""Shared checks of the compiled KFP YAMLs (pipeline spec + Kubernetes platform spec)."""

from __future__ import annotations

from pathlib import Path

import yaml


def load_compiled(path: Path) -> tuple[dict, dict]:
    """The compiled pipeline spec and its per-executor Kubernetes config (two documents)."""
    spec, platform = yaml.safe_load_all(Path(path).read_text())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def assert_on_cluster(e: dict, *, gpu: bool) -> None:
    """One executor's Kubernetes config matches infra/ (components/platform.py)."""
    from components.platform import pipeline_env_keys

    assert [(m["constant"], m["mountPath"]) for m in e["pvcMount"]] == [("flora-shared", "/shared")]
    (cm,) = e["configMapAsEnv"]
    assert cm["configMapName"] == "flora-pipeline-env"
    env = {k["configMapKey"]: k["envVar"] for k in cm["keyToEnv"]}
    assert env == {k: k for k in pipeline_env_keys()} and "FLORA_MLFLOW_TRACKING_URI" in env
    (sec,) = e["secretAsEnv"]
    assert sec["secretName"] == "flora-object-store"
    assert {k["secretKey"]: k["envVar"] for k in sec["keyToEnv"]} == {
        "access-key-id": "AWS_ACCESS_KEY_ID", "secret-access-key": "AWS_SECRET_ACCESS_KEY"
    }  # fmt: skip
    assert e["podMetadata"]["labels"]["flora.ai/role"] == "pipeline"
    # As the Airflow workers (infra/helm/airflow-values.yaml): same files on the volume.
    assert e["securityContext"] == {"runAsUser": "50000", "runAsGroup": "0", "runAsNonRoot": True}
    if gpu:
        assert e["nodeSelector"] == {"labels": {"nvidia.com/gpu.present": "true"}}
        assert e["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    else:
        assert "tolerations" not in e and "nodeSelector" not in e


def assert_gpu_container(c: dict, *, gpu: bool, cpu_limit: str = "2") -> None:
    """A GPU step runs on the CUDA image with one nvidia.com/gpu; a light step on the CPU
    image with ``cpu_limit`` and no accelerator."""
    if gpu:
        assert c["image"] == "ghcr.io/flora-robotics/flora:cuda"
        assert c["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert c["resources"]["accelerator"]["resourceCount"] == "1"
        assert c["resources"]["resourceCpuLimit"] == "8"
    else:
        assert c["image"] == "ghcr.io/flora-robotics/flora:cpu"
        assert "accelerator" not in c["resources"]
        assert c["resources"]["resourceCpuLimit"] == cpu_limit
    assert "pip install" not in " ".join(c["command"])  # the flora image has everything
