"""Airflow 3 DAG ``flora_data_engine``: ingest -> validate (-> later: segment, caption, reward).

Every task is a thin adapter: it calls the one ``flora`` function that implements its
step, logs to the pipeline run's MLflow run and returns a small JSON *state* dict (XCom)
that the next task receives. Later steps are appended the same way::

    @task
    def segment(state: dict) -> dict:
        ...call flora.segment..., log to MLflow with mlflow_run("segment", run_id=...)
        return {**state, "events_table": ...}

    state = segment(validate(ingest()))

State keys every step can rely on: ``dataset``, ``dataset_path`` (absolute),
``outputs_dir`` (absolute; the ``TableStore`` root: tables go to ``<outputs>/<table>/``),
``mlflow_run_id``, ``episodes`` (all indices), and after ``validate``:
``valid_episodes`` — the only episodes later steps may process (a table or episode that
fails its suite is never passed downstream).

The dataset comes from the run conf / params (``dataset``) or else ``FLORA_DATASET``.
``flora`` is imported inside the tasks so that parsing this file stays cheap.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

DAG_ID = "flora_data_engine"


def _run_tags(dag_run: Any) -> dict[str, str]:
    return {
        "orchestrator": "airflow",
        "airflow.dag_id": DAG_ID,
        "airflow.run_id": str(getattr(dag_run, "run_id", "") or ""),
    }


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["flora", "data-engine"],
    default_args={"retries": 0},
    params={
        "dataset": Param(
            None,
            type=["null", "string"],
            description="Dataset root; empty means FLORA_DATASET (settings.dataset).",
        ),
        "strict": Param(
            False,
            type="boolean",
            description="Fail the run when any episode is invalid (default: quarantine it).",
        ),
    },
    doc_md=__doc__,
)
def flora_data_engine() -> None:
    """Flora data engine: raw episodes -> validated episodes -> (segments, captions, rewards)."""

    @task
    def ingest(params: dict | None = None, dag_run: Any = None) -> dict[str, Any]:
        """Open the dataset, check every episode, write the manifest; opens the MLflow run."""
        from pathlib import Path

        import mlflow

        from flora.data.ingest import ingest_dataset
        from flora.settings import get_settings
        from flora.tracking import log_table_summary, mlflow_run

        s = get_settings()
        path = Path((params or {}).get("dataset") or s.dataset).resolve()
        out_dir = s.outputs_dir.resolve()
        tags = {"dataset": path.name, "dataset_path": str(path), **_run_tags(dag_run)}
        with mlflow_run("ingest", tags=tags, run_name=f"{DAG_ID}/{path.name}") as run:
            result = ingest_dataset(
                path, out=out_dir / "manifest" / f"{path.name}.parquet", progress=False
            )
            log_table_summary("manifest", result.manifest)
            mlflow.log_metrics(
                {
                    "ingest.episodes": len(result.manifest),
                    "ingest.ok": result.n_ok,
                    "ingest.errors": result.n_error,
                }
            )
            run_id = run.info.run_id
        return {
            "dataset": result.dataset.name,
            "dataset_path": str(path),
            "outputs_dir": str(out_dir),
            "mlflow_run_id": run_id,
            "episodes": [int(i) for i in result.manifest["episode_index"]],
            "ingested": result.ok_indices(),
            "ingest_errors": {str(k): v for k, v in result.errors().items()},
        }

    @task
    def validate(state: dict[str, Any], params: dict | None = None) -> dict[str, Any]:
        """Run the raw-episode GX suites; later steps get only the valid episodes."""
        from pathlib import Path

        import mlflow

        from flora.tracking import log_validation, mlflow_run
        from flora.validation.raw import validate_dataset

        report = validate_dataset(state["dataset_path"], progress=False)
        out = Path(state["outputs_dir"]) / "validation" / f"{state['dataset']}.raw.json"
        report_path = report.write(out)
        valid = [i for i in report.valid_episodes if i in set(state["ingested"])]
        with mlflow_run("validate", run_id=state["mlflow_run_id"]):
            log_validation(report, name="raw")
            mlflow.log_metrics(
                {"validation.valid_episodes": len(valid), "validation.issues": len(report.issues)}
            )
            if not valid:
                raise ValueError(
                    f"dataset {report.dataset}: no valid episode; see {report_path}: "
                    + "; ".join(i.describe() for i in report.issues[:5])
                )
            if (params or {}).get("strict") and not report.success:
                raise ValueError(
                    f"dataset {report.dataset}: {len(report.invalid_episodes)} invalid "
                    f"episode(s) {report.invalid_episodes} and strict=True; see {report_path}"
                )
        return {
            **state,
            "valid_episodes": valid,
            "invalid_episodes": report.invalid_episodes,
            "validation_success": report.success,
            "validation_report": str(report_path),
        }

    validate(ingest())


dag_object = flora_data_engine()
