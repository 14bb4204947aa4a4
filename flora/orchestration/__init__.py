"""Orchestration glue shared by the Airflow DAGs (``dags/``).

:mod:`flora.orchestration.steps` holds the DAGs' heavy steps as plain functions of small
JSON inputs; :mod:`flora.orchestration.pod` runs one of them as a pod's command
(``python -m flora.orchestration.pod``); :mod:`flora.orchestration.tasks` builds, from
the settings (``FLORA_MODE``), either an in-process ``@task`` or a
``KubernetesPodOperator`` for a step. See docs/orchestration.md, "Production mode".
"""

from __future__ import annotations

from pathlib import Path

from flora.settings import FloraSettings, get_settings

#: Labels of every pipeline pod (Airflow step pods, KFP steps): the inference pods'
#: NetworkPolicy admits ``flora.ai/role=pipeline``.
POD_LABELS: dict[str, str] = {"flora.ai/role": "pipeline", "app.kubernetes.io/part-of": "flora"}

#: Secret name -> {key: environment variable}. The keys of the Secrets in infra/ are not
#: environment-variable names (``access-key-id``), so step pods map them explicitly, as
#: the MLflow server (infra/base/platform/mlflow.yaml) and the vLLM runtime do. A Secret in
#: ``FLORA_POD_SECRETS`` that is not listed here is mounted whole (``envFrom``; its keys
#: must then be valid variable names).
SECRET_ENV: dict[str, dict[str, str]] = {
    "flora-object-store": {
        "access-key-id": "AWS_ACCESS_KEY_ID",
        "secret-access-key": "AWS_SECRET_ACCESS_KEY",
    },
    "flora-hf": {"token": "HF_TOKEN"},
}


def shared_path(path: str | Path, what: str, settings: FloraSettings | None = None) -> str:
    """``path`` resolved, as a string fit for XCom.

    In production mode every task may run on another worker or in its own pod, so a path
    handed downstream must lie on the shared volume (``FLORA_SHARED_MOUNT``, the
    ``FLORA_SHARED_PVC`` claim); anything else is refused with a clear error here, at the
    task that produced it, instead of a "file not found" several pods later.
    """
    s = settings or get_settings()
    p = Path(path).resolve()
    if s.mode == "production":
        mount = Path(s.shared_mount).resolve()
        if not p.is_relative_to(mount):
            raise ValueError(
                f"{what} {p} is not on the shared volume {mount} (claim {s.shared_pvc}); in "
                "FLORA_MODE=production every path passed between tasks must be visible to "
                "every pod: put it under the mount (FLORA_HOME=/shared/flora in "
                "flora-pipeline-env)"
            )
    return str(p)


def permanent_errors() -> tuple[type[Exception], ...]:
    """Errors a retry cannot fix: bad input (``FloraDataError``: a damaged file, a table
    failing its suite) and curation's refusals (empty mixture, bad rules, lineage)."""
    from flora.curate.rebalance import EmptyMixtureError
    from flora.curate.rules import RulesError
    from flora.curate.run import LineageError
    from flora.data.episode import FloraDataError

    return (FloraDataError, EmptyMixtureError, RulesError, LineageError)


__all__ = ["POD_LABELS", "SECRET_ENV", "permanent_errors", "shared_path"]
