"""MLflow tracking helpers over the one settings object.

Embedded default: ``sqlite:///<home>/mlflow.db`` with artifacts under ``<home>/mlartifacts``;
production points ``FLORA_MLFLOW_TRACKING_URI`` at the MLflow server (Postgres + object
store, see ``infra/``) and the same code logs there.

A pipeline run opens a parent run (:func:`start_pipeline_run`: experiment per workflow,
git commit, params, left RUNNING) and hands its ``run_id`` on (Airflow XCom / KFP
parameter); each step calls ``mlflow_run(step, run_id=parent)`` and gets its own nested
child run, FAILED if the step raised; the last task closes the parent with
:func:`finish_pipeline_run`, FAILED when any task failed. A ``run_id`` that is not a parent
is simply reopened (a run a step owns, e.g. a training run). MLflow 3 conventions hold everywhere:
``log_model(name=...)`` and registered-model aliases, never stages.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from flora.settings import FloraSettings, get_settings

if TYPE_CHECKING:
    import mlflow


class _Report(Protocol):
    """Anything validation returns: a ValidationReport or a DatasetReport."""

    success: bool

    def to_dict(self) -> dict[str, Any]: ...


_lock = threading.Lock()


def configure(settings: FloraSettings | None = None) -> str:
    """Point MLflow at the configured tracking store (creating ``home``) and return its URI."""
    import mlflow

    s = settings or get_settings()
    uri = s.tracking_uri
    if uri.startswith("sqlite:///"):
        # SQLite needs its directory; MLflow creates the tables on first use.
        s.home.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    return uri


def ensure_experiment(name: str | None = None, settings: FloraSettings | None = None) -> str:
    """Experiment id of ``name`` (default: settings), created with the configured artifact root.

    With a local store the artifact location must be set explicitly, or MLflow would write
    ``./mlruns`` relative to whatever directory the process happens to run in.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    s = settings or get_settings()
    configure(s)
    name = name or s.mlflow_experiment
    with _lock:
        exp = mlflow.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        local = not s.tracking_uri.startswith(("http://", "https://", "databricks"))
        location = (s.artifact_root / name).as_uri() if local else None
        try:
            return mlflow.create_experiment(name, artifact_location=location)
        except MlflowException:
            # Another process created it between our lookup and create.
            exp = mlflow.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


# A pipeline's parent run (one per DAG / pipeline run) carries this tag; a step that
# "reopens" it with ``mlflow_run(..., run_id=parent)`` gets its own nested child run.
PARENT_TAG = "flora.pipeline_parent"
FAILED_STATES = frozenset({"failed", "upstream_failed"})


def git_commit() -> str:
    """The project's git commit (``unknown`` outside a checkout, e.g. in an image)."""
    import subprocess
    from pathlib import Path

    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent,
            timeout=30,
        )
    except OSError:
        return "unknown"
    return res.stdout.strip() if res.returncode == 0 else "unknown"


def pinned_requirements(*packages: str) -> list[str]:
    """``pkg==version`` of ``packages`` as installed, plus what every pyfunc ``python_model``
    needs (mlflow, cloudpickle), for ``log_model(pip_requirements=...)``.

    Explicit because MLflow's inference imports the model's code in a subprocess (about ten
    seconds per logged model on two cores) and misses what the loader imports lazily: it left
    torch out of the policy's requirements. ``flora`` itself is not listed: it is not a PyPI
    package; the serving image carries it.
    """
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("mlflow", "cloudpickle", *packages):
        try:
            out.append(f"{pkg}=={version(pkg)}")
        except PackageNotFoundError:
            continue
    return list(dict.fromkeys(out))


def start_pipeline_run(
    workflow: str,
    *,
    tags: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    experiment: str | None = None,
    run_name: str | None = None,
    settings: FloraSettings | None = None,
) -> str:
    """Open the parent run of one pipeline run (experiment ``flora-<workflow>``).

    Tagged with the git commit and :data:`PARENT_TAG`, the params logged, and left
    RUNNING: :func:`finish_pipeline_run` closes it with the pipeline's real status once
    every task has ended. Returns its run id.
    """
    from mlflow import MlflowClient

    s = settings or get_settings()
    exp_id = ensure_experiment(experiment or f"flora-{workflow}", s)
    all_tags = {"flora.workflow": workflow, "flora.git_commit": git_commit(), PARENT_TAG: "1"}
    all_tags |= {str(k): str(v) for k, v in (tags or {}).items()}
    client = MlflowClient()
    run = client.create_run(exp_id, run_name=run_name or workflow, tags=all_tags)
    for k, v in (params or {}).items():
        client.log_param(run.info.run_id, str(k), str(v)[:6000])
    return run.info.run_id


def finish_pipeline_run(run_id: str, task_states: Mapping[str, str]) -> str:
    """Close a parent run: FAILED when any task failed (or was skipped by a failure)."""
    from mlflow import MlflowClient

    configure()
    failed = sorted(t for t, st in task_states.items() if str(st).lower() in FAILED_STATES)
    client = MlflowClient()
    client.set_tag(run_id, "flora.failed_tasks", ",".join(failed))
    client.set_tag(run_id, "flora.task_states", json.dumps(dict(task_states), sort_keys=True))
    status = "FAILED" if failed else "FINISHED"
    client.set_terminated(run_id, status=status)
    return status


def finish_dag_run(ti: Any, dag_run: Any, dag_id: str, *, prepare_task: str = "prepare",
                   own_task: str = "finalize") -> str:  # fmt: skip
    """A DAG's ``finalize`` task: close the parent run ``prepare_task`` opened, FAILED when
    any other task of this DAG run failed. ``ti``/``dag_run``: the Airflow task context.

    Then, when anything failed, ``finalize`` itself fails: it is the DAG's only leaf, and
    Airflow derives the DAG run's state from its leaves, so a succeeding ``finalize`` would
    show a run with failed tasks as a success."""
    from airflow.sdk.exceptions import AirflowFailException

    run_id = str(getattr(dag_run, "run_id", ""))
    states = ti.get_task_states(dag_id=dag_id, run_ids=[run_id]).get(run_id, {})
    states = {k: v for k, v in states.items() if k != own_task}
    prepared = ti.xcom_pull(task_ids=prepare_task) or {}
    if not prepared.get("mlflow_run_id"):
        raise AirflowFailException(f"no MLflow run to close ({prepare_task} failed)")
    status = finish_pipeline_run(prepared["mlflow_run_id"], states)
    if status == "FAILED":  # finish_pipeline_run tagged the run with the failed tasks
        raise AirflowFailException(f"the DAG run had failed tasks; MLflow run {status}")
    return status


def _is_parent(run: Any) -> bool:
    return run.data.tags.get(PARENT_TAG) == "1"


@contextmanager
def mlflow_run(
    name: str,
    tags: Mapping[str, Any] | None = None,
    experiment: str | None = None,
    *,
    run_id: str | None = None,
    run_name: str | None = None,
    settings: FloraSettings | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """Open (or, with ``run_id``, reopen) an MLflow run; it ends FAILED if the body raises.

    ``name`` is the pipeline step; it is appended to the ``flora.steps`` tag, so a run
    reopened by several steps records which ones touched it. ``run_name`` (default:
    ``name``) names a new run. ``tags`` values are stringified.
    """
    import mlflow

    s = settings or get_settings()
    exp_id = ensure_experiment(experiment, s)
    str_tags = {str(k): str(v) for k, v in (tags or {}).items()}
    parent = mlflow.get_run(run_id) if run_id is not None else None
    if parent is not None and _is_parent(parent):
        # One nested child run per task under the pipeline's parent run.
        str_tags |= {"mlflow.parentRunId": run_id, "flora.steps": name, "flora.step": name}
        for k in ("flora.workflow", "flora.git_commit", "airflow.run_id", "airflow.dag_id"):
            if k in parent.data.tags:
                str_tags.setdefault(k, parent.data.tags[k])
        run = mlflow.start_run(
            experiment_id=parent.info.experiment_id, run_name=run_name or name, tags=str_tags
        )
    elif run_id is not None:
        run = mlflow.start_run(run_id=run_id)
        steps = run.data.tags.get("flora.steps", "")
        str_tags["flora.steps"] = f"{steps},{name}" if steps else name
        mlflow.set_tags(str_tags)
    else:
        str_tags.setdefault("flora.steps", name)
        run = mlflow.start_run(experiment_id=exp_id, run_name=run_name or name, tags=str_tags)
    try:
        yield run
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    else:
        mlflow.end_run(status="FINISHED")


def log_to_run(
    run_id: str,
    *,
    metrics: Mapping[str, float] | None = None,
    tags: Mapping[str, Any] | None = None,
    dicts: Mapping[str, Any] | None = None,
) -> None:
    """Log to run ``run_id`` itself, leaving its status alone: a pipeline's run-wide totals
    on its parent run (``mlflow_run(run_id=parent)`` would open a child). ``dicts``:
    artifact file -> JSON-able object."""
    import time

    from mlflow import MlflowClient
    from mlflow.entities import Metric, RunTag

    configure()
    client = MlflowClient()
    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(str(k), float(v), now, 0) for k, v in (metrics or {}).items()],
        tags=[RunTag(str(k), str(v)) for k, v in (tags or {}).items()],
    )
    for name, obj in (dicts or {}).items():
        client.log_dict(run_id, obj, name)


def child_runs(parent_run_id: str) -> list[Any]:
    """The child runs of a pipeline parent run (one per task; oldest first)."""
    from mlflow import MlflowClient

    configure()
    client = MlflowClient()
    parent = client.get_run(parent_run_id)
    return client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
        order_by=["attributes.start_time ASC"],
        max_results=1000,
    )


def airflow_run_tags(dag_id: str, dag_run: Any) -> dict[str, str]:
    """MLflow tags that tie a run to the Airflow DAG run that produced it."""
    return {
        "orchestrator": "airflow",
        "airflow.dag_id": dag_id,
        "airflow.run_id": str(getattr(dag_run, "run_id", "") or ""),
    }


def _metric_key(*parts: str) -> str:
    # MLflow keys allow [A-Za-z0-9_-./ ]; table/column names are mapped onto that.
    return ".".join(
        "".join(c if c.isalnum() or c in "_-./ " else "_" for c in p) for p in parts if p
    )


def log_table_summary(name: str, df: pd.DataFrame, *, log_artifact: bool = True) -> dict[str, Any]:
    """Log row/episode counts, columns and null counts of table ``name`` to the active run.

    Returns the summary that was logged (also stored as ``tables/<name>.json``).
    """
    import mlflow

    summary: dict[str, Any] = {
        "table": name,
        "rows": len(df),
        "columns": [str(c) for c in df.columns],
        "nulls": {str(c): int(n) for c, n in df.isna().sum().items() if n},
    }
    if "episode_id" in df.columns:
        summary["episodes"] = int(df["episode_id"].nunique())
    if "dataset" in df.columns:
        summary["datasets"] = sorted(map(str, df["dataset"].dropna().unique()))
    metrics = {_metric_key("table", name, "rows"): float(summary["rows"])}
    if "episodes" in summary:
        metrics[_metric_key("table", name, "episodes")] = float(summary["episodes"])
    mlflow.log_metrics(metrics)
    if log_artifact:
        mlflow.log_dict(summary, f"tables/{name}.json")
    return summary


def log_validation(report: _Report, *, name: str | None = None) -> dict[str, Any]:
    """Log a validation report (table or dataset) to the active run.

    Metrics ``validation.<name>.success`` (0/1) and ``.failed`` (failed expectations or
    invalid episodes), tag ``validation.<name>`` = passed/failed, and the full report as
    ``validation/<name>.json``. Returns the logged dict.
    """
    import mlflow

    d = report.to_dict()
    name = name or str(d.get("table") or d.get("dataset") or "report")
    if "statistics" in d and "failed" in d["statistics"]:
        failed = d["statistics"]["failed"]
    else:
        failed = len(d.get("invalid_episodes", d.get("issues", [])))
    mlflow.log_metrics(
        {
            _metric_key("validation", name, "success"): float(bool(report.success)),
            _metric_key("validation", name, "failed"): float(failed),
        }
    )
    mlflow.set_tag(_metric_key("validation", name), "passed" if report.success else "failed")
    mlflow.log_text(json.dumps(d, indent=1, default=str), f"validation/{name}.json")
    return d
