"""Airflow 3 DAG ``flora_policy_rtc``: prepare -> train -> evaluate -> register -> promote.

Thin adapters over ``flora.policy.lerobot``: ``train_policy`` fits the DiT action expert
with training-time RTC on a LeRobot dataset (conditioned on the engine's curated captions
when the ``events`` table exists) and ``evaluate_policy`` scores the checkpoint offline per
delay (postfix error, switch jerk, per-chunk latency of plain / training-time /
inference-time sampling). ``register`` logs the checkpoint as an MLflow model and registers
it as ``flora-policy`` (alias ``challenger``, held-out ``postfix_mse`` as a version tag);
``promote`` moves ``champion`` to it when it passes the gates (a refusal is a result, not a
failure). MLflow: ``prepare`` opens the DAG run's parent run (experiment
``flora-policy-rtc``); every task logs into its own nested child run; ``finalize`` runs
whatever happened upstream and closes the parent FAILED when any task failed.

``train`` comes from ``flora.orchestration.tasks.step_task``: an in-process ``@task`` by
default, a GPU ``KubernetesPodOperator`` pod running the same function
(``flora.orchestration.steps.policy_train``) when ``FLORA_MODE=production``; ``evaluate``
and the registry steps stay in-process (docs/orchestration.md, "Production mode").

Scheduled on the curated captions (the ``flora://curated-mixture`` Asset the data engine
publishes) as well as triggered by hand.

Params (run conf): ``dataset`` (default ``FLORA_DATASET``), ``events`` (default: the
engine's ``captions`` or ``events`` table under ``<outputs>`` when it holds captions),
``epochs``, ``horizon``, ``max_delay``, ``hidden``, ``depth``. ``flora`` is imported inside
the tasks so that parsing this file stays cheap.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import Asset, Param, dag, task

from flora.orchestration.tasks import step_task

DAG_ID = "flora_policy_rtc"
# The same Asset flora_data_engine publishes after curation (name and URI must match).
CURATED = Asset(name="flora_curated_mixture", uri="flora://curated-mixture")


@dag(
    dag_id=DAG_ID,
    schedule=[CURATED],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["flora", "policy", "rtc"],
    default_args={"retries": 0},
    params={
        "dataset": Param(
            None, type=["null", "string"], description="Dataset root; empty means FLORA_DATASET."
        ),
        "events": Param(
            None,
            type=["null", "string"],
            description="Captions table; empty: <outputs>/captions or /events.",
        ),
        "epochs": Param(20, type="integer", minimum=1),
        "horizon": Param(16, type="integer", minimum=2),
        "max_delay": Param(5, type="integer", minimum=1),
        "hidden": Param(128, type="integer", minimum=8),
        "depth": Param(4, type="integer", minimum=1),
    },
    doc_md=__doc__,
)
def flora_policy_rtc() -> None:
    """Train and evaluate the flow policy with training-time RTC."""

    @task
    def prepare(params: dict | None = None, dag_run: Any = None) -> dict[str, Any]:
        """Resolve dataset / captions / output dir and open the pipeline's MLflow run."""
        from pathlib import Path

        from flora.orchestration import shared_path
        from flora.policy.lerobot import find_caption_table
        from flora.settings import get_settings
        from flora.tracking import airflow_run_tags, mlflow_run, start_pipeline_run

        p = params or {}
        s = get_settings()
        # Paths handed downstream must be visible to every worker and pod (production).
        path = Path(shared_path(p.get("dataset") or s.dataset, "dataset"))
        outputs = Path(shared_path(s.outputs_dir, "outputs dir (FLORA_HOME/outputs)"))
        events = p.get("events") or find_caption_table(outputs)  # the engine's captions
        events = shared_path(events, "events table") if events else None
        run_key = str(getattr(dag_run, "run_id", "") or "manual").replace(":", "_")
        tags = {"dataset": path.name, "dataset_path": str(path)}
        tags |= airflow_run_tags(DAG_ID, dag_run)
        train_params = {
            k: int(p.get(k) or d)
            for k, d in (("epochs", 20), ("horizon", 16), ("max_delay", 5), ("hidden", 128),
                         ("depth", 4))
        }  # fmt: skip
        run_id = start_pipeline_run(
            "policy-rtc", tags=tags, params={"dataset": str(path), **train_params},
            run_name=f"{DAG_ID}/{path.name}",
        )  # fmt: skip
        with mlflow_run("policy_prepare", run_id=run_id):
            pass
        return {
            "dataset": path.name,
            "dataset_path": str(path),
            "outputs_dir": str(outputs),
            "events": events,
            "policy_dir": str(outputs / "policy" / path.name / run_key),
            "mlflow_run_id": run_id,
            "train": train_params,
        }

    @task
    def evaluate(state: dict[str, Any]) -> dict[str, Any]:
        """Offline per-delay evaluation (``flora.policy.steps.evaluate_step``)."""
        from pathlib import Path

        from flora.policy.steps import evaluate_step

        rep = evaluate_step(state["checkpoint"], state["dataset_path"],
                            Path(state["policy_dir"]) / "evaluation.json",
                            state["mlflow_run_id"], events=state["events"],
                            max_delay=state["train"]["max_delay"])  # fmt: skip
        return {**state, "evaluation": rep["evaluation"], "latency_ratio": rep["latency_ratio"]}

    @task
    def register(state: dict[str, Any]) -> dict[str, Any]:
        """Log the checkpoint as an MLflow model and register it (alias challenger)."""
        from flora.policy.registry import register_step

        out = register_step(
            state["checkpoint"],
            state["evaluation"],
            pipeline_run_id=state["mlflow_run_id"],
            dataset=state["dataset_path"],
            recipe=state["train"],
        )
        return {**state, **out}

    @task
    def promote(state: dict[str, Any]) -> dict[str, Any]:
        """Promotion gates (``model_registry.promotion``); refused is a recorded outcome."""
        from model_registry.promotion import promote as promote_version

        res = promote_version("policy", state["version"], actor=f"airflow:{DAG_ID}")
        return {**state, "promoted": res.promoted, "champion": res.champion,
                "gate_reasons": res.decision.reasons}  # fmt: skip

    @task(trigger_rule="all_done")
    def finalize(ti: Any = None, dag_run: Any = None) -> str:
        """Close the parent MLflow run: FAILED when any task of this DAG run failed."""
        from flora.tracking import finish_dag_run

        return finish_dag_run(ti, dag_run, DAG_ID)

    # The heavy step: in-process @task (embedded) or a GPU pod (FLORA_MODE=production).
    trained = step_task("policy_train", task_id="train")(state=prepare())
    promote(register(evaluate(trained))) >> finalize()


dag_object = flora_policy_rtc()
