"""Airflow 3 DAG ``flora_data_engine``: ingest -> validate -> plan_shards -> [segment ->
caption -> rewards] per shard -> summary -> curate -> export -> report.

Every task is a thin adapter: it calls the one ``flora`` function that implements its
step (``flora.data.ingest``, ``flora.validation.raw``, and for the engine steps
``flora.engine.run_segment`` / ``run_caption`` / ``run_reward``, which wire
``flora.segment`` / ``flora.caption`` / ``flora.reward``), logs to its own MLflow child
run under the DAG run's parent run, and returns a small JSON *state* dict (XCom) that the
next task receives and extends::

    ingest -> validate -> plan_shards -> shard[k]: segment -> caption -> reward_outcome ┐
                                                                     -> reward_dense   ├─┐
                                                                     -> reward_rubric  ┘ │
          summary (all_done) <-------------------------------------- every shard ────────┘
          -> curate -> export -> report -> finalize (all_done)

The heavy steps are a task group ``shard`` mapped over ``plan_shards`` (dynamic task
mapping, ``.partial(state=…).expand(shard=…)``): shard ``k`` of ``n`` processes the valid
episodes ``valid[k::n]`` (the VLM steps apply ``vlm_max_episodes`` to the whole run first),
so shards run in parallel on as many workers or GPU pods as the executor has, and a shard
that fails leaves the others running. ``summary`` (trigger rule ``all_done``) merges the
shard reports, scores the whole ``events`` table against the ground truth, logs the run's
totals to the parent run and writes ``<outputs>/runs/<dataset>/<run id>.json``; when a
shard failed it then fails itself, naming the shard, so no partial mixture is published
(a rerun redoes only the failed shard's unfinished episodes: the tables resume).

``curate`` (``flora.curate.steps.curate_step``) filters and rebalances the tables into the
curated mixture (``<outputs>/curated/<dataset>/mixture.parquet``, logged as an MLflow dataset,
DVC-versioned when ``dvc_repo`` is set) and publishes it as the Airflow Asset
``flora_curated_mixture``; an empty or invalid mixture fails the task. ``export`` writes
the LeRobot export with the events in ``language_persistent``
(``<outputs>/exports/<dataset>``); ``report`` writes the HTML reports
(``<outputs>/reports/<dataset>/<mlflow run id>/``) and logs them to MLflow.

XCom carries references, never episode lists. State keys every step can rely on:
``dataset``, ``dataset_path`` (absolute), ``outputs_dir`` (absolute; the ``TableStore``
root: tables go to ``<outputs>/<table>/``), ``mlflow_run_id`` (the parent run; ``finalize``
closes it FAILED when any task failed), ``manifest`` (path), ``episode_sets`` (the run's
``episodes.json``: ``episodes``, ``ingested``, ``valid``, ``invalid``, ``ingest_errors``;
read with ``flora.orchestration.shards.episode_set``) and counts (``n_episodes``,
``n_valid``, ...). Each engine step adds a reference under its name (``segment``,
``caption``, ``outcome``, ``dense``, ``rubric``: table dir, rows, failures, suite state,
``report`` = its full report's path); after ``summary`` these are the merged run-wide
references. A table that fails its GX suite makes its task fail (the report is logged to
MLflow first), so it is never handed downstream; episodes whose rows fail are quarantined
by the step functions.

The heavy steps come from ``flora.orchestration.tasks.step_task``: in-process ``@task`` s
by default, GPU ``KubernetesPodOperator`` pods running the same functions
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
from airflow.sdk import Asset, Param, dag, task, task_group

from flora.orchestration.tasks import step_task

DAG_ID = "flora_data_engine"
#: The curated mixture, published by ``curate`` (same name as
#: ``flora.curate.steps.MIXTURE_ASSET_NAME``; not imported, to keep parsing cheap).
MIXTURE_ASSET = Asset(name="flora_curated_mixture", uri="flora://curated-mixture")
#: The rewarder's modes, one task each (same tuple as ``flora.engine.REWARD_MODES``; not
#: imported so that parsing this file does not import flora).
REWARD_MODES = ("outcome", "dense", "rubric")
#: The engine steps in the shard group (task id -> the key its reference is under).
SHARD_STEPS = {"segment": "segment", "caption": "caption",
               **{f"reward_{m}": m for m in REWARD_MODES}}  # fmt: skip


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
        "shards": Param(
            2,
            type="integer",
            minimum=1,
            description="Fan the engine steps out over this many episode shards (at most "
            "one per valid episode).",
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
        """Open the MLflow parent run, check every episode, write the manifest."""
        from pathlib import Path

        from flora.engine import ingest_tracked
        from flora.orchestration import shared_path
        from flora.orchestration.shards import write_episode_sets
        from flora.settings import get_settings
        from flora.tracking import airflow_run_tags, finish_pipeline_run, start_pipeline_run

        s = get_settings()
        p = params or {}
        # Paths handed downstream must be visible to every worker and pod (production).
        path = Path(shared_path(p.get("dataset") or s.dataset, "dataset"))
        out_dir = Path(shared_path(s.outputs_dir, "outputs dir (FLORA_HOME/outputs)"))
        tags = {"dataset": path.name, "dataset_path": str(path)}
        tags |= airflow_run_tags(DAG_ID, dag_run)
        # A retried ingest opens a new parent run; the tables do not depend on it.
        parent = start_pipeline_run("data-engine", tags=tags, params=p,
                                    experiment=s.mlflow_experiment,
                                    run_name=f"{DAG_ID}/{path.name}")  # fmt: skip
        manifest = out_dir / "manifest" / f"{path.name}.parquet"
        try:
            result, run_id = ingest_tracked(path, manifest, tags=tags, run_name="ingest",
                                            run_id=parent)  # fmt: skip
            state = {
                "dataset": result.dataset.name,
                "dataset_path": str(path),
                "outputs_dir": str(out_dir),
                "mlflow_run_id": run_id,
                "manifest": str(manifest),
            }
            episodes = [int(i) for i in result.manifest["episode_index"]]
            errors = {str(k): v for k, v in result.errors().items()}
            sets = write_episode_sets(state, episodes=episodes, ingested=result.ok_indices(),
                                      ingest_errors=errors)  # fmt: skip
        except BaseException:
            # finalize cannot close a parent it never heard of (no XCom): close it here, or
            # every failed try would leave one RUNNING.
            finish_pipeline_run(parent, {"ingest": "failed"})
            raise
        return {**state, "episode_sets": sets, "n_episodes": len(episodes),
                "n_ingested": len(result.ok_indices()), "n_ingest_errors": len(errors)}  # fmt: skip

    @task
    def validate(state: dict[str, Any], params: dict | None = None) -> dict[str, Any]:
        """Run the raw-episode GX suites; later steps get only the valid episodes."""
        from pathlib import Path

        import mlflow
        from airflow.sdk.exceptions import AirflowFailException

        from flora.orchestration.shards import episode_set, write_episode_sets
        from flora.tracking import log_validation, mlflow_run
        from flora.validation.raw import validate_dataset

        report = validate_dataset(state["dataset_path"], progress=False)
        out = Path(state["outputs_dir"]) / "validation" / f"{state['dataset']}.raw.json"
        report_path = report.write(out)
        ingested = set(episode_set(state, "ingested"))
        valid = [i for i in report.valid_episodes if i in ingested]
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
        invalid = [int(i) for i in report.invalid_episodes]
        write_episode_sets(state, valid=valid, invalid=invalid)
        return {
            **state,
            "n_valid": len(valid),
            "n_invalid": len(invalid),
            "validation_success": report.success,
            "validation_report": str(report_path),
        }

    @task
    def plan_shards(state: dict[str, Any], params: dict | None = None) -> list[dict[str, int]]:
        """The shards the engine steps fan out over: ``{"index": k, "count": n}`` each."""
        from flora.orchestration.shards import plan_shards as plan

        return plan(state["n_valid"], int((params or {}).get("shards") or 1))

    @task(trigger_rule="all_done")
    def summary(
        state: dict[str, Any], shards: list[dict[str, int]], ti: Any = None
    ) -> dict[str, Any]:
        """Merge the shards' reports into one per table, score the run, log it to the parent
        run; then fail, naming them, when any shard failed (after recording what it did)."""
        from airflow.sdk.exceptions import AirflowFailException

        from flora.engine import summarize_shards
        from flora.orchestration.shards import describe_failed_shards

        # What each shard's tasks handed on, by map index (None: it did not finish).
        every = list(range(len(shards)))
        handoffs = {key: ti.xcom_pull(task_ids=f"shard.{tid}", map_indexes=every)
                    for tid, key in SHARD_STEPS.items()}  # fmt: skip
        out = summarize_shards(state, shards, handoffs)
        failed = out["failed_shards"]
        if failed:
            raise AirflowFailException(
                describe_failed_shards(failed, len(shards))
                + f" (the others completed; summary {out['summary_path']})"
            )
        return out

    @task(outlets=[MIXTURE_ASSET])
    def curate(
        state: dict[str, Any], params: dict | None = None, outlet_events: Any = None
    ) -> dict[str, Any]:
        """Filter + rebalance into the curated mixture; publish it as an Asset event."""
        from flora.curate.steps import curate_step
        from flora.orchestration.shards import episode_set
        from flora.orchestration.tasks import fail_fast_on_bad_input

        p = params or {}
        rep = fail_fast_on_bad_input("curate", curate_step, state["dataset_path"],
                                     state["outputs_dir"], state["outputs_dir"],
                                     episode_set(state, "valid"), state["mlflow_run_id"],
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
        # A count in XCom; the episodes themselves are in the export's meta/ files.
        rep["n_episodes_without_events"] = len(rep.pop("episodes_without_events", []))
        return {**state, "export": rep}

    @task
    def report(state: dict[str, Any]) -> dict[str, Any]:
        """HTML run and episode reports, written under outputs and logged to MLflow."""
        from pathlib import Path

        from flora.curate.steps import report_step
        from flora.orchestration.shards import episode_set

        out = Path(state["outputs_dir"]) / "reports" / state["dataset"] / state["mlflow_run_id"]
        rep = report_step(state["dataset_path"], state["outputs_dir"], out,
                          state["mlflow_run_id"], mixture=state["curate"]["mixture_path"],
                          episodes=episode_set(state, "valid"))  # fmt: skip
        return {**state, "report": rep}

    @task(trigger_rule="all_done", retries=0)
    def finalize(ti: Any = None, dag_run: Any = None) -> str:
        """Close the run's MLflow run with the DAG run's real status: FAILED when any task
        failed, even when a parallel branch that finished later closed it FINISHED."""
        from flora.tracking import finish_dag_run

        return finish_dag_run(ti, dag_run, DAG_ID, prepare_task="ingest")

    # The heavy steps, one group per shard: in-process @task (embedded) or GPU pods
    # (FLORA_MODE=production); within a group each task takes its own shard's upstream.
    @task_group(group_id="shard")
    def shard(state: Any, shard: Any) -> None:
        segmented = step_task("segment")(state=state, shard=shard)
        captioned = step_task("caption", params=True)(state=segmented, shard=shard)
        for m in REWARD_MODES:
            step_task("reward", task_id=f"reward_{m}", params=True)(
                state=captioned, shard=shard, mode=m
            )

    validated = validate(ingest())
    planned = plan_shards(validated)
    groups = shard.partial(state=validated).expand(shard=planned)
    joined = summary(validated, planned)
    groups >> joined
    report(export(curate(joined))) >> finalize()


dag_object = flora_data_engine()
