"""Production mode, bad input in a GPU step: the pod command exits with ``EXIT_PERMANENT``
and the pod task fails at once (``AirflowFailException``: no retry), as the in-process
``@task`` does (docs/orchestration.md §2); any other failure keeps its retries."""

from __future__ import annotations

import pytest


def _pod(exit_code: int, phase: str = "Failed"):
    """A ``V1Pod`` whose base container terminated with ``exit_code``."""
    from kubernetes.client import models as k8s

    status = k8s.V1ContainerStatus(
        name="base", image="img", image_id="img", ready=False, restart_count=0,
        state=k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=exit_code)),
    )  # fmt: skip
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="flora-captioner-sft-x", namespace="flora"),
        status=k8s.V1PodStatus(phase=phase, container_statuses=[status]),
    )


def test_pod_command_exits_with_the_permanent_status_on_bad_input(airflow_home, monkeypatch):
    import flora.orchestration.steps as steps
    from flora.data.episode import FloraDataError
    from flora.orchestration.pod import EXIT_PERMANENT, main

    assert EXIT_PERMANENT not in (0, 1, 2)  # Python's and argparse's statuses

    def bad_input(step, inputs):
        raise FloraDataError("not a dataset", dataset="notads", field="info")

    monkeypatch.setattr(steps, "run_step", bad_input)
    with pytest.raises(SystemExit) as e:
        main(["segment", "--inputs", "{}"])
    assert e.value.code == EXIT_PERMANENT

    def lost_mount(step, inputs):  # a transient fault: propagates (exit 1, retried)
        raise OSError("stale file handle")

    monkeypatch.setattr(steps, "run_step", lost_mount)
    with pytest.raises(OSError, match="stale"):
        main(["segment", "--inputs", "{}"])


def test_pod_task_fails_without_retry_on_the_permanent_status(airflow_home, monkeypatch):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from flora.orchestration.pod import EXIT_PERMANENT
    from flora.orchestration.tasks import step_task
    from flora.settings import FloraSettings

    prod = FloraSettings(mode="production", home="/shared/flora")
    op = step_task("sft", settings=prod, retries=2)(state={}, model="captioner").operator
    assert isinstance(op, KubernetesPodOperator) and op.retries == 2
    # No cluster: what KPO's cleanup asks of the API server answers nothing.
    for name in ("is_istio_enabled", "patch_already_checked", "_read_pod_events",
                 "process_pod_deletion"):  # fmt: skip
        monkeypatch.setattr(op, name, lambda *a, **k: False)

    with pytest.raises(AirflowFailException, match=f"bad input \\(exit {EXIT_PERMANENT}\\)"):
        op.cleanup(_pod(EXIT_PERMANENT), _pod(EXIT_PERMANENT))
    for transient in (1, 137):  # an uncaught error, an out-of-memory kill: retried
        with pytest.raises(AirflowException) as e:
            op.cleanup(_pod(transient), _pod(transient))
        assert not isinstance(e.value, AirflowFailException)
    op.cleanup(_pod(0, "Succeeded"), _pod(0, "Succeeded"))  # success: nothing raised
