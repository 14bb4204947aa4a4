"""What every Flora KFP task needs on a cluster, set in one place (``kfp.kubernetes``).

The names come from :class:`flora.settings.FloraSettings` (the same fields the Airflow
production mode's GPU pods use, ``flora.orchestration.tasks.pod_spec_kwargs``) and from
``infra/`` (``infra/kfp/settings.md``):

* the ReadWriteMany PVC ``flora-shared`` (``FLORA_SHARED_PVC``) mounted at ``/shared``
  (``FLORA_SHARED_MOUNT``), so datasets, ``FLORA_HOME`` and every path handed between
  steps are visible to every pod;
* every key of the ConfigMap ``flora-pipeline-env`` (``FLORA_POD_CONFIG_MAP``) as an
  environment variable of the same name (MLflow tracking URI, backends, object store
  endpoint); the keys are read from ``infra/base/platform/pipeline-env.yaml`` when the
  pipeline is compiled, so the spec cannot drift from the manifest unnoticed (the YAML
  drift tests recompile);
* the credentials of every Secret in ``FLORA_POD_SECRETS`` (default ``flora-object-store``),
  key by key as ``flora.orchestration.SECRET_ENV`` maps them (``access-key-id`` ->
  ``AWS_ACCESS_KEY_ID`` ...), never inlined in the spec;
* the pod labels that let step pods reach the inference pods (NetworkPolicy), and the
  user / group of the Airflow workers (``FLORA_POD_RUN_AS_USER`` / ``FLORA_POD_FS_GROUP``),
  since both write the same files on the shared volume;
* for GPU steps: the CUDA image (``FLORA_CUDA_IMAGE``), ``nvidia.com/gpu`` x
  ``FLORA_GPU_COUNT`` with the GPU CPU / memory limits, the GPU node selector and the
  ``nvidia.com/gpu:NoSchedule`` toleration.

``kfp.local`` ignores all of this (platform config, images, resources): the same pipeline
runs on a laptop in tests.
"""

from pathlib import Path
from typing import Any

import yaml
from kfp import dsl, kubernetes

from flora.orchestration import POD_LABELS, SECRET_ENV
from flora.settings import FloraSettings, get_settings

REPO = Path(__file__).resolve().parents[1]
#: The ConfigMap manifest whose keys every task gets as environment variables.
PIPELINE_ENV_MANIFEST = REPO / "infra" / "base" / "platform" / "pipeline-env.yaml"
#: Limits of a CPU task (light steps: ingest, validate, summary, build set, register ...).
CPU_TASK = {"cpu": "2", "memory": "8G"}
#: First wait before a failed task's retry (KFP doubles it on each further try).
RETRY_BACKOFF = "30s"


def pipeline_env_keys(manifest: Path = PIPELINE_ENV_MANIFEST) -> list[str]:
    """The keys of the pipeline-env ConfigMap (sorted), read from its manifest."""
    doc = yaml.safe_load(manifest.read_text())
    return sorted(doc["data"])


def on_cluster(
    task: dsl.PipelineTask,
    *,
    gpu: bool = False,
    resources: dict[str, str] | None = None,
    retries: int = 0,
    settings: FloraSettings | None = None,
) -> dsl.PipelineTask:
    """Give ``task`` the shared volume, environment, credentials, labels and limits.

    ``gpu``: a heavy step (segment, caption, rewards, training, evaluation): CUDA image,
    accelerator, GPU limits, node selector and tolerations from settings. ``resources``:
    ``{"cpu", "memory"}`` limits of a CPU task (default :data:`CPU_TASK`). ``retries``:
    how often KFP reruns the task after a failure (a lost node, an evicted pod),
    :data:`RETRY_BACKOFF` apart, doubling — as the matching Airflow DAG retries its tasks.
    Caching is off: datasets, tables, sets and registry state change under the same inputs.
    """
    s = settings or get_settings()
    task.set_caching_options(False)
    if retries:
        task.set_retry(num_retries=retries, backoff_duration=RETRY_BACKOFF)
    kubernetes.mount_pvc(task, pvc_name=s.shared_pvc, mount_path=str(s.shared_mount))
    kubernetes.use_config_map_as_env(
        task, config_map_name=s.pod_config_map,
        config_map_key_to_env={k: k for k in pipeline_env_keys()},
    )  # fmt: skip
    for name in s.pod_secrets:
        if name not in SECRET_ENV:  # kfp.kubernetes has no envFrom for a whole Secret
            raise ValueError(f"secret {name!r} (FLORA_POD_SECRETS) has no key mapping in "
                             "flora.orchestration.SECRET_ENV")  # fmt: skip
        kubernetes.use_secret_as_env(task, secret_name=name, secret_key_to_env=SECRET_ENV[name])
    for k, v in POD_LABELS.items():
        kubernetes.add_pod_label(task, k, v)
    # The Airflow workers and step pods write the same files on the shared volume.
    kubernetes.set_security_context(task, run_as_user=s.pod_run_as_user,
                                    run_as_group=s.pod_fs_group, run_as_non_root=True)  # fmt: skip
    if not gpu:
        res = resources or CPU_TASK
        return task.set_cpu_limit(res["cpu"]).set_memory_limit(res["memory"])
    task.set_container_image(s.cuda_image)
    task.set_cpu_limit(s.gpu_cpu).set_memory_limit(s.gpu_memory)
    task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(s.gpu_count)
    for key, value in s.gpu_node_selector.items():
        kubernetes.add_node_selector(task, key, value)
    for t in s.gpu_tolerations:
        kubernetes.add_toleration(task, **_toleration(t))
    return task


def _toleration(t: dict[str, Any]) -> dict[str, Any]:
    # Settings spell tolerations as Kubernetes does (camelCase); kfp.kubernetes wants
    # snake_case keyword arguments.
    names = {"tolerationSeconds": "toleration_seconds"}
    return {names.get(k, k): v for k, v in t.items()}


__all__ = [
    "CPU_TASK",
    "PIPELINE_ENV_MANIFEST",
    "POD_LABELS",
    "RETRY_BACKOFF",
    "on_cluster",
    "pipeline_env_keys",
]
