"""Airflow 3 DAG ``flora_data_engine``: ingest -> validate -> segment -> caption -> rewards
-> summary -> curate -> export -> report.

Every task is a thin adapter: it calls the one ``flora`` function that implements its
step (``flora.data.ingest``, ``flora.validation.raw``, and for the engine steps
``flora.engine.run_segment`` / ``run_caption`` / ``run_reward``, which wire
``flora.segment`` / ``flora.caption`` / ``flora.reward``), logs to the pipeline run's MLflow
run (reopened by id) and returns a small JSON *state* dict (XCom) that the next task
receives and extends::

    ingest -> validate -> segment -> caption -> reward_outcome ┐
                                             -> reward_dense   ├-> summary -> curate
                                             -> reward_rubric  ┘      -> export -> report
                                                                      -> finalize (all_done)

``curate`` (``flora.curate.steps.curate_step``) filters and rebalances the tables into the
curated mixture (``<outputs>/curated/<dataset>/mixture.parquet``, logged as an MLflow dataset,
DVC-versioned when ``dvc_repo`` is set) and publishes it as the Airflow Asset
``flora_curated_mixture``; an empty or invalid mixture fails the task. ``export`` writes
the LeRobot export with the events in ``language_persistent``
(``<outputs>/exports/<dataset>``); ``report`` writes the HTML reports
(``<outputs>/reports/<dataset>/<mlflow run id>/``) and logs them to MLflow.

State keys every step can rely on: ``dataset``, ``dataset_path`` (absolute),
``outputs_dir`` (absolute; the ``TableStore`` root: tables go to ``<outputs>/<table>/``),
``mlflow_run_id`` (the run every task reopens; ``finalize`` closes it FAILED when any
task failed), ``episodes`` (all indices), and after ``validate``:
``valid_episodes`` — the only episodes later steps process. Each engine step adds its
report under its name (``segment``, ``caption``, ``outcome``, ``dense``, ``rubric``: table
dir, row/failure counts, first failures, validation result). A table that fails its GX
suite makes its task fail (the report is logged to MLflow first), so it is never handed
downstream; episodes whose rows fail are quarantined by the step functions.

The heavy steps (segment, caption, reward_*) come from
``flora.orchestration.tasks.step_task``: in-process ``@task`` s by default, GPU
``KubernetesPodOperator`` pods running the same functions
(``flora.orchestration.steps``) when ``FLORA_MODE=production`` (docs/orchestration.md,
"Production mode"); every path in the state lies on the shared volume then.

Backends come from ``FLORA_BACKEND`` (``flora.engine``): embedded default = kinematic
segmenter + the tiny random VLM for captions and rewards (docs/orchestration.md).
``flora`` is imported inside the tasks so that parsing this file stays cheap (only the
light ``flora.settings`` / ``flora.orchestration.tasks`` at parse time).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Asset, Param, dag, task

from flora.orchestration.tasks import step_task

DAG_ID = "flora_data_engine"
#: The curated mixture, published by ``curate`` (same name as
#: ``flora.curate.steps.MIXTURE_ASSET_NAME``; not imported, to keep parsing cheap).
MIXTURE_ASSET = Asset(name="flora_curated_mixture", uri="flora://curated-mixture")
#: The rewarder's modes, one task each (same tuple as ``flora.engine.REWARD_MODES``; not
#: imported so that parsing this file does not import flora).
REWARD_MODES = ("outcome", "dense", "rubric")


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["flora", "data-engine"],
    # Every task retries (a lost worker, an evicted pod): the steps are idempotent and
    # resume from their tables. Bad input fails at once (fail_fast_on_bad_input).
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
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
        "vlm_max_episodes": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            description="Caption/reward only the first N valid episodes (empty or 0: all).",
        ),
        "max_attempts": Param(
            3, type="integer", minimum=1, description="Bounded parse attempts per VLM item."
        ),
        "max_new_tokens": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="Cap on every VLM step's generation budget (empty: step defaults).",
        ),
        "rubric": Param(
            None,
            type=["null", "string"],
            description="Rubric YAML/JSON for every episode (empty: the dataset's "
            "ground_truth/rubric.json family rubrics when present).",
        ),
        "curation_rules": Param(
            None,
            type=["null", "string"],
            description="Curation rules YAML (empty: flora/curate/rules/default.yaml).",
        ),
        "dvc_repo": Param(
            None,
            type=["null", "string"],
            description="DVC repository that versions the curated mixture (empty: none).",
        ),
    },
    doc_md=__doc__,
)
def flora_data_engine() -> None:
    """Flora data engine: raw episodes -> validated episodes -> events, captions, rewards."""

    @task
    def ingest(params: dict | None = None, dag_run: Any = None) -> dict[str, Any]:
        """Open the dataset, check every episode, write the manifest; opens the MLflow run."""
        from pathlib import Path

        from flora.engine import ingest_tracked
        from flora.orchestration import shared_path
        from flora.settings import get_settings
        from flora.tracking import airflow_run_tags

        s = get_settings()
        # Paths handed downstream must be visible to every worker and pod (production).
        path = Path(shared_path((params or {}).get("dataset") or s.dataset, "dataset"))
        out_dir = Path(shared_path(s.outputs_dir, "outputs dir (FLORA_HOME/outputs)"))
        tags = {"dataset": path.name, "dataset_path": str(path)}
        tags |= airflow_run_tags(DAG_ID, dag_run)
        result, run_id = ingest_tracked(path, out_dir / "manifest" / f"{path.name}.parquet",
                                        tags=tags, run_name=f"{DAG_ID}/{path.name}")  # fmt: skip
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
        from airflow.sdk.exceptions import AirflowFailException

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
            # The data will not change on a retry: fail the task at once.
            if not valid:
                raise AirflowFailException(
                    f"dataset {report.dataset}: no valid episode; see {report_path}: "
                    + "; ".join(i.describe() for i in report.issues[:5])
                )
            if (params or {}).get("strict") and not report.success:
                raise AirflowFailException(
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

    @task
    def summary(states: list[dict[str, Any]]) -> dict[str, Any]:
        """Join the reward branches: one summary per table, logged and written to outputs."""
        from pathlib import Path

        import mlflow

        from flora.engine import STEP_TABLES, engine_summary, write_json
        from flora.tracking import mlflow_run

        state = {k: v for st in states for k, v in st.items()}
        tables = engine_summary([state[s] for s in STEP_TABLES if s in state])
        out = Path(state["outputs_dir"]) / "runs" / state["dataset"]
        path = write_json(tables, out / f"{state['mlflow_run_id']}.json")
        with mlflow_run("summary", run_id=state["mlflow_run_id"]):
            mlflow.log_dict(tables, "engine_summary.json")
        return {**state, "tables": tables, "summary_path": str(path)}

    @task(outlets=[MIXTURE_ASSET])
    def curate(
        state: dict[str, Any], params: dict | None = None, outlet_events: Any = None
    ) -> dict[str, Any]:
        """Filter + rebalance into the curated mixture; publish it as an Asset event."""
        from flora.curate.steps import curate_step
        from flora.orchestration.tasks import fail_fast_on_bad_input

        p = params or {}
        rep = fail_fast_on_bad_input("curate", curate_step, state["dataset_path"],
                                     state["outputs_dir"], state["outputs_dir"],
                                     state["valid_episodes"], state["mlflow_run_id"],
                                     rules=p.get("curation_rules"),
                                     dvc_repo=p.get("dvc_repo"))  # fmt: skip
        if outlet_events is not None:
            outlet_events[MIXTURE_ASSET].extra = {
                "path": rep["mixture_path"], "dataset": state["dataset"], "rows": rep["rows"],
                "mlflow_run_id": state["mlflow_run_id"],
            }  # fmt: skip
        return {**state, "curate": rep}

    @task
    def export(state: dict[str, Any]) -> dict[str, Any]:
        """LeRobot export with ``language_persistent`` and ``flora_annotations/``."""
        from pathlib import Path

        from flora.curate.steps import export_step

        out = Path(state["outputs_dir"]) / "exports" / state["dataset"]
        rep = export_step(state["dataset_path"], state["outputs_dir"], out,
                          state["mlflow_run_id"],
                          mixture=state["curate"]["mixture_path"])  # fmt: skip
        return {**state, "export": rep}

    @task
    def report(state: dict[str, Any]) -> dict[str, Any]:
        """HTML run and episode reports, written under outputs and logged to MLflow."""
        from pathlib import Path

        from flora.curate.steps import report_step

        out = Path(state["outputs_dir"]) / "reports" / state["dataset"] / state["mlflow_run_id"]
        rep = report_step(state["dataset_path"], state["outputs_dir"], out,
                          state["mlflow_run_id"], mixture=state["curate"]["mixture_path"],
                          episodes=state["valid_episodes"])  # fmt: skip
        return {**state, "report": rep}

    @task(trigger_rule="all_done", retries=0)
    def finalize(ti: Any = None, dag_run: Any = None) -> str:
        """Close the run's MLflow run with the DAG run's real status: FAILED when any task
        failed, even when a parallel branch that finished later closed it FINISHED."""
        from flora.tracking import finish_dag_run

        return finish_dag_run(ti, dag_run, DAG_ID, prepare_task="ingest")

    # The heavy steps: in-process @task (embedded) or a GPU pod (FLORA_MODE=production).
    segmented = step_task("segment")(state=validate(ingest()))
    captioned = step_task("caption", params=True)(state=segmented)
    joined = summary(
        [step_task("reward", task_id=f"reward_{m}", params=True)(state=captioned, mode=m)
         for m in REWARD_MODES]
    )  # fmt: skip
    report(export(curate(joined))) >> finalize()


dag_object = flora_data_engine()
