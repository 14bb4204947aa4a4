"""One DAG file, two flavours of heavy task, chosen by ``FLORA_MODE``.

:func:`step_task` is the only place the DAGs fork on the mode. For a heavy step of
:mod:`flora.orchestration.steps` it builds

* ``embedded`` (default): an in-process ``@task`` that calls
  :func:`~flora.orchestration.steps.run_step`;
* ``production``: a ``KubernetesPodOperator`` (:class:`StepPodOperator`) on
  ``FLORA_CUDA_IMAGE`` whose command is
  ``python -m flora.orchestration.pod <step> --inputs <JSON> --xcom`` (the same
  ``run_step``), with ``nvidia.com/gpu`` limits equal to requests, the GPU tolerations and
  node selector, the shared PVC mounted, its environment from the ``flora-pipeline-env``
  ConfigMap and Secrets by reference (``SECRET_ENV``), the label that lets it reach the
  inference pods, and its return value pushed back to XCom by the sidecar. A pod that
  exits with :data:`~flora.orchestration.pod.EXIT_PERMANENT` (bad input) fails the task
  at once, as :func:`fail_fast_on_bad_input` does in process.

Inputs are the step's keyword arguments: upstream ``XComArg`` s or JSON values. In a pod
they arrive as one JSON argument rendered by Airflow's templating
(``ti.xcom_pull(...) | tojson``), so the pod sees exactly the dicts the ``@task`` would;
inside a mapped task group a pod pulls its own map index's upstream and group argument.
Light steps (ingest, validate, plan_shards, summary, curate, export, report, build_set,
register, promote, deploy, prepare, finalize) stay ``@task`` in both modes: in production
they run on the KubernetesExecutor's worker pods (CPU image, same PVC;
infra/helm/airflow-values.yaml).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

from airflow.sdk import task
from airflow.sdk.definitions._internal.expandinput import MappedArgument
from airflow.sdk.definitions.xcom_arg import PlainXComArg, XComArg

from flora.orchestration import POD_LABELS, SECRET_ENV, permanent_errors
from flora.orchestration.steps import STEPS
from flora.settings import FloraSettings, get_settings

#: The pod's command (the image's entrypoint passes ``python`` through as given).
POD_COMMAND = ["python", "-m", "flora.orchestration.pod"]
#: Labels every step pod carries: flora.ai/role=pipeline is what the inference pods'
#: NetworkPolicy admits (infra/base/serving/networkpolicy.yaml).
SHARED_VOLUME = "shared"


class _Params:
    """Marker: the DAG run's params, rendered into the pod's inputs as JSON."""


PARAMS = _Params()


def _pull(arg: PlainXComArg) -> str:
    """The Jinja expression pulling ``arg``: within a mapped task group, the value of the
    same map index (the shard's own upstream), else the task's one value."""
    same_index = arg.operator.get_closest_mapped_task_group() is not None
    index = ", map_indexes=ti.map_index" if same_index else ""
    return f"ti.xcom_pull(task_ids={arg.operator.task_id!r}, key={arg.key!r}{index})"


def _mapped_source(value: MappedArgument) -> PlainXComArg:
    # A task group's .expand(name=<XComArg>) argument: the list it maps over.
    source = value._input.value.get(value._key) if hasattr(value._input, "value") else None
    if not isinstance(source, PlainXComArg):
        raise TypeError(f"a pod step can take a group's mapped argument only when it maps "
                        f"over one task's output, got {source!r}")  # fmt: skip
    return source


def json_template(value: Any) -> str:
    """``value`` as JSON text in which every ``XComArg`` is a Jinja ``xcom_pull | tojson``
    (:data:`PARAMS` the run's params; a mapped task group's argument the map index's item
    of the list the group maps over), for a templated operator argument."""
    if isinstance(value, PlainXComArg):
        return f"{{{{ {_pull(value)} | tojson }}}}"
    if isinstance(value, MappedArgument):
        return f"{{{{ ({_pull(_mapped_source(value))})[ti.map_index] | tojson }}}}"
    if isinstance(value, XComArg):
        raise TypeError(f"only plain XComArgs can be passed to a pod step, got {value!r}")
    if isinstance(value, _Params):
        return "{{ params | tojson }}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {json_template(v)}"
                               for k, v in value.items()) + "}"  # fmt: skip
    if isinstance(value, list | tuple):
        return "[" + ", ".join(json_template(v) for v in value) + "]"
    return json.dumps(value)


def _upstreams(value: Any) -> list[XComArg]:
    if isinstance(value, XComArg):
        return [value]
    if isinstance(value, MappedArgument):
        return [_mapped_source(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _upstreams(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _upstreams(v)]
    return []


def _in_process(step: str, task_id: str, with_params: bool, **task_kwargs: Any) -> Callable:
    @task(task_id=task_id, doc_md=STEPS[step].__doc__, **task_kwargs)
    def run_in_process(inputs: dict[str, Any], params: dict | None = None) -> dict[str, Any]:
        from flora.orchestration.steps import run_step

        kwargs = {**inputs, "params": dict(params or {})} if with_params else inputs
        return fail_fast_on_bad_input(step, run_step, step, kwargs)

    return lambda **inputs: run_in_process(inputs=inputs)


def fail_fast_on_bad_input(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; a :func:`permanent_errors` error fails the task at once, since
    every retry would fail alike; anything else (a lost node, an out-of-memory kill, a flaky
    mount) propagates and the task's retries apply. Steps resume from their tables, so a
    retry redoes only the unfinished episodes."""
    from airflow.sdk.exceptions import AirflowFailException

    try:
        return fn(*args, **kwargs)
    except permanent_errors() as e:
        raise AirflowFailException(f"{what}: {type(e).__name__}: {e}") from e


def _container_exit_code(pod: Any, container: str) -> int | None:
    """The exit status of ``container`` in ``pod`` (a ``V1Pod``), None when not terminated."""
    statuses = (getattr(getattr(pod, "status", None), "container_statuses", None)) or []
    for st in statuses:
        term = st.state.terminated if st.name == container and st.state else None
        if term is not None:
            return int(term.exit_code)
    return None


@functools.cache
def _step_pod_operator() -> type:
    # Built on first use: importing the cncf provider costs seconds, and embedded-mode DAG
    # parsing (every worker, every parse) never needs it.
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowSkipException,
    )

    from flora.orchestration.pod import EXIT_PERMANENT

    class StepPodOperator(KubernetesPodOperator):
        """``KubernetesPodOperator`` for a heavy step: a pod that exits with
        ``EXIT_PERMANENT`` (the step hit bad input) fails the task with
        ``AirflowFailException``, so the task's retries do not rerun it on a GPU.

        KPO reports every failed pod from ``cleanup`` (synchronous and deferrable runs
        alike) as an ``AirflowException``, which Airflow retries; this reads the base
        container's exit status there, as KPO's own ``skip_on_exit_code`` does.
        """

        def cleanup(self, pod: Any, remote_pod: Any) -> None:
            try:
                super().cleanup(pod, remote_pod)
            except (AirflowFailException, AirflowSkipException):
                raise
            except AirflowException as e:
                code = _container_exit_code(remote_pod, self.base_container_name)
                if code == EXIT_PERMANENT:
                    raise AirflowFailException(
                        f"{self.task_id}: the step failed on bad input (exit {code}); not "
                        f"retried, every try would fail alike. {e}"
                    ) from e
                raise

    StepPodOperator.__module__ = __name__
    StepPodOperator.__qualname__ = "StepPodOperator"
    return StepPodOperator


def __getattr__(name: str) -> Any:
    """``StepPodOperator`` is built lazily (see :func:`_step_pod_operator`)."""
    if name == "StepPodOperator":
        return _step_pod_operator()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _snake(d: dict[str, Any]) -> dict[str, Any]:
    # Settings spell Kubernetes objects as Kubernetes does (tolerationSeconds); the
    # client's models take snake_case arguments.
    return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): v for k, v in d.items()}


def pod_spec_kwargs(s: FloraSettings) -> dict[str, Any]:
    """The ``KubernetesPodOperator`` arguments every GPU step pod shares, from settings."""
    from kubernetes.client import models as k8s

    resources = {"cpu": s.gpu_cpu, "memory": s.gpu_memory, "nvidia.com/gpu": str(s.gpu_count)}
    env_from = [k8s.V1EnvFromSource(config_map_ref=k8s.V1ConfigMapEnvSource(name=s.pod_config_map))]
    env: list[k8s.V1EnvVar] = []
    for name in s.pod_secrets:  # by reference only: no value enters the DAG or the spec
        if name not in SECRET_ENV:
            env_from.append(k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=name)))
            continue
        env += [
            k8s.V1EnvVar(name=var, value_from=k8s.V1EnvVarSource(
                secret_key_ref=k8s.V1SecretKeySelector(name=name, key=key)))
            for key, var in SECRET_ENV[name].items()
        ]  # fmt: skip
    return {
        "namespace": s.pod_namespace,
        "image": s.cuda_image,
        "cmds": list(POD_COMMAND),
        "labels": dict(POD_LABELS),
        # Guaranteed QoS: limits = requests (a GPU cannot be overcommitted anyway).
        "container_resources": k8s.V1ResourceRequirements(
            requests=dict(resources), limits=dict(resources)
        ),
        "tolerations": [k8s.V1Toleration(**_snake(t)) for t in s.gpu_tolerations],
        "node_selector": dict(s.gpu_node_selector),
        "volumes": [
            k8s.V1Volume(
                name=SHARED_VOLUME,
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                    claim_name=s.shared_pvc
                ),
            )
        ],
        "volume_mounts": [k8s.V1VolumeMount(name=SHARED_VOLUME, mount_path=str(s.shared_mount))],
        "env_from": env_from,
        # Same user and group as the workers: both write the same tables on the volume.
        "security_context": k8s.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=s.pod_run_as_user,
            run_as_group=s.pod_fs_group,
            fs_group=s.pod_fs_group,
        ),
        "env_vars": env,
        "do_xcom_push": True,
        "get_logs": True,
        "on_finish_action": "delete_pod",
    }


def _in_pod(
    step: str, task_id: str, with_params: bool, s: FloraSettings, **task_kwargs: Any
) -> Callable:
    pod_operator = _step_pod_operator()

    def build(**inputs: Any) -> XComArg:
        payload = {**inputs, "params": PARAMS} if with_params else inputs
        op = pod_operator(
            task_id=task_id,
            arguments=[step, "--inputs", json_template(payload), "--xcom"],
            doc_md=STEPS[step].__doc__,
            **pod_spec_kwargs(s),
            **task_kwargs,
        )
        # The pod name carries the full task id (TaskGroup prefix included) as a DNS label;
        # KPO adds a random suffix per try.
        op.name = re.sub(r"[^a-z0-9-]+", "-", f"flora-{op.task_id}".lower())
        for up in _upstreams(inputs):
            up.operator >> op
        return XComArg(op)

    return build


def step_task(
    step: str,
    *,
    task_id: str | None = None,
    params: bool = False,
    settings: FloraSettings | None = None,
    **task_kwargs: Any,
) -> Callable[..., XComArg]:
    """A task factory for heavy step ``step``: call it with the step's inputs in a DAG.

    ``params=True`` passes the DAG run's params as the step's ``params`` argument.
    ``task_kwargs`` (retries, trigger_rule, ...) go to the operator either way.
    """
    if step not in STEPS:
        raise ValueError(f"unknown step {step!r}; known steps: {', '.join(sorted(STEPS))}")
    s = settings or get_settings()
    tid = task_id or step
    if s.mode == "production":
        return _in_pod(step, tid, params, s, **task_kwargs)
    return _in_process(step, tid, params, **task_kwargs)


__all__ = [
    "PARAMS",
    "POD_COMMAND",
    "POD_LABELS",
    "fail_fast_on_bad_input",
    "json_template",
    "permanent_errors",
    "pod_spec_kwargs",
    "step_task",
]
