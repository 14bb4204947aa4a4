"""Airflow 3 DAG ``flora_train_models``: train, evaluate, register and promote the Flora models.

One TaskGroup per model, each task a thin adapter over one step of
:mod:`training.pipeline` (the KFP pipeline calls the same functions)::

    prepare -> segmenter: build_set -> sft -> grpo -> evaluate -> register -> promote -> deploy
            -> captioner: build_set -> sft -> grpo -> evaluate -> register -> promote -> deploy
            -> rewarder:  build_set -> sft ---------> evaluate -> register -> promote -> deploy
            -> finalize (all_done)

``register`` registers ``flora-<model>`` (alias ``challenger``, lineage and ``eval.*``
tags) and records the table-suites verdict; ``promote`` runs the gates and moves
``champion`` when they pass (a refusal is a recorded outcome, not a task failure);
``deploy`` renders the champion's inference-pod manifest (never applied from here).
MLflow: ``prepare`` opens the DAG run's parent run (experiment ``flora-train-models``),
every task logs a nested child run, the training runs themselves land in
``flora-train-<model>``; ``finalize`` closes the parent FAILED when any task failed.

Scheduled on the curated mixture (the Asset ``flora_data_engine`` publishes after
``curate``): a scheduled run trains on the mixture named in the Asset event. Triggered by
hand with a conf: ``dataset`` (default ``FLORA_DATASET``), ``mixture`` (a curated
mixture parquet; empty: the dataset's ground truth), ``recipe`` (a size: ``tiny``,
``small``, ``demo``, ``production``), ``models`` (a non-empty subset of :data:`MODELS`;
the others skip; an unknown name fails ``prepare``),
``sft_max_steps`` / ``grpo_max_steps`` (0: the recipe's), ``eval_episodes`` (0: all
held-out), ``n_boot``, ``gates`` (``project`` or ``mechanics``, see
``training.pipeline.GATE_POLICIES``). XCom carries paths, run ids and versions only: the
work folder is under ``FLORA_HOME``, which every worker mounts in production.

``sft``, ``grpo`` and ``evaluate`` come from ``flora.orchestration.tasks.step_task``:
in-process ``@task`` s by default, GPU ``KubernetesPodOperator`` pods running the same
functions (``flora.orchestration.steps``) when ``FLORA_MODE=production``; ``prepare``
then refuses a dataset, mixture or work folder off the shared volume
(docs/orchestration.md, "Production mode").
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Asset, Param, TaskGroup, dag, task

from flora.orchestration.tasks import step_task

DAG_ID = "flora_train_models"
MODELS = ("segmenter", "captioner", "rewarder")
GRPO_MODELS = ("segmenter", "captioner")  # no RL for the rewarder (DESIGN §3.5)
# The same Asset flora_data_engine publishes after curation (name and URI must match).
CURATED = Asset(name="flora_curated_mixture", uri="flora://curated-mixture")


def select_models(requested: Any = None) -> list[str]:
    """The models a run trains, in :data:`MODELS` order: ``requested`` (the ``models``
    param; None: all of them) checked against :data:`MODELS`.

    An unknown name or an empty list raises ``AirflowFailException`` (no retry): a typo
    such as ``Segmenter`` would otherwise skip every model and the run would succeed
    having trained nothing.
    """
    from airflow.sdk.exceptions import AirflowFailException

    if requested is None:
        return list(MODELS)
    allowed = ", ".join(MODELS)
    if isinstance(requested, str) or not isinstance(requested, list | tuple):
        raise AirflowFailException(
            f"param models must be a list of model names ({allowed}), got {requested!r}"
        )
    unknown = [m for m in requested if m not in MODELS]
    if unknown:
        raise AirflowFailException(
            f"param models: unknown model(s) {', '.join(map(repr, unknown))}; allowed: {allowed}"
        )
    if not requested:
        raise AirflowFailException(f"param models is empty: name at least one of {allowed}")
    return [m for m in MODELS if m in requested]


def _skip_unless(state: dict[str, Any], model: str) -> None:
    if model not in state["models"]:
        from airflow.exceptions import AirflowSkipException

        raise AirflowSkipException(f"{model} is not in this run's models {state['models']}")


@dag(
    dag_id=DAG_ID,
    schedule=[CURATED],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["flora", "training", "registry"],
    # Steps are idempotent (sets and exports are written atomically, SFT resumes from its
    # latest checkpoint); a retried registration gets back the version it registered.
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    params={
        "dataset": Param(
            None, type=["null", "string"], description="Dataset root; empty means FLORA_DATASET."
        ),
        "mixture": Param(
            None,
            type=["null", "string"],
            description="Curated mixture parquet; empty: the Asset event's when scheduled, "
            "else the dataset's ground truth.",
        ),
        "recipe": Param("small", type="string", description="Recipe size or suffix (small)."),
        "models": Param(
            list(MODELS),
            type="array",
            items={"type": "string", "enum": list(MODELS)},
            minItems=1,
            uniqueItems=True,
            description="Models to train (a non-empty subset of segmenter, captioner, rewarder).",
        ),
        "sft_max_steps": Param(0, type="integer", minimum=0),
        "grpo_max_steps": Param(0, type="integer", minimum=0),
        "eval_episodes": Param(0, type="integer", minimum=0),
        "n_boot": Param(200, type="integer", minimum=10),
        "gates": Param("project", enum=["project", "mechanics"]),
    },
    doc_md=__doc__,
)
def flora_train_models() -> None:
    """Per Flora model: build set -> SFT -> GRPO -> evaluate -> register -> promote -> deploy."""

    @task(retries=0)
    def prepare(
        params: dict | None = None, dag_run: Any = None, triggering_asset_events: Any = None
    ) -> dict[str, Any]:
        """Resolve dataset, mixture and work folder; open the DAG run's parent MLflow run."""
        from pathlib import Path

        from flora.orchestration import shared_path
        from flora.settings import get_settings
        from flora.tracking import airflow_run_tags, mlflow_run, start_pipeline_run

        p = params or {}
        s = get_settings()
        mixture = p.get("mixture")
        for events in (triggering_asset_events or {}).values():
            for ev in events:  # a scheduled run: the mixture the data engine just curated
                mixture = mixture or (getattr(ev, "extra", None) or {}).get("path")
        models = select_models(p.get("models"))
        run_key = str(getattr(dag_run, "run_id", "") or "manual").replace(":", "_")
        # Paths handed downstream must be visible to every worker and pod (production).
        path = Path(shared_path(p.get("dataset") or s.dataset, "dataset"))
        mixture = shared_path(mixture, "mixture") if mixture else None
        work = shared_path(s.home / "training" / DAG_ID / run_key, "work dir (FLORA_HOME)")
        conf = {
            "recipe": p.get("recipe") or "small",
            "sft_max_steps": int(p.get("sft_max_steps") or 0),
            "grpo_max_steps": int(p.get("grpo_max_steps") or 0),
            "eval_episodes": int(p.get("eval_episodes") or 0),
            "n_boot": int(p.get("n_boot") or 200),
            "gates": p.get("gates") or "project",
        }
        tags = {"dataset": path.name, "dataset_path": str(path)}
        tags |= airflow_run_tags(DAG_ID, dag_run)
        run_id = start_pipeline_run(
            "train-models", tags=tags, run_name=f"{DAG_ID}/{path.name}",
            params={"dataset": str(path), "mixture": mixture or "ground truth",
                    "models": ",".join(models), **conf},
        )  # fmt: skip
        with mlflow_run("prepare", run_id=run_id):
            pass
        return {
            "dataset": str(path),
            "mixture": mixture,
            "models": models,
            "work": work,
            "mlflow_run_id": run_id,
            **conf,
        }

    @task
    def build_set(state: dict[str, Any], model: str) -> dict[str, Any]:
        """The model's SFT set (GX-validated), from the mixture or the ground truth."""
        from training import pipeline

        _skip_unless(state, model)
        return pipeline.build_set(model, state["recipe"], state["dataset"],
                                  f"{state['work']}/{model}/set", mixture=state["mixture"],
                                  run_id=state["mlflow_run_id"])  # fmt: skip

    @task
    def register(
        state: dict[str, Any],
        built: dict[str, Any],
        trained: dict[str, Any],
        evaluated: dict[str, Any],
        model: str,
    ) -> dict[str, Any]:
        """Register as challenger with lineage and eval tags; record the suites verdict."""
        from training import pipeline

        rid = state["mlflow_run_id"]
        reg = pipeline.register(model, built, trained, evaluated, run_id=rid)
        suites = pipeline.record_suites(model, reg["version"], built, evaluated, run_id=rid)
        return {**reg, **suites, "eval_report": evaluated["report"]}

    @task
    def promote(state: dict[str, Any], registered: dict[str, Any], model: str) -> dict[str, Any]:
        """The promotion gates; a refusal is recorded (with reasons), not a failure."""
        from training import pipeline

        res = pipeline.promote(
            model, registered["version"], gates=state["gates"], actor=f"airflow:{DAG_ID}",
            run_id=state["mlflow_run_id"],
        )  # fmt: skip
        return {**registered, **res}

    @task
    def deploy(state: dict[str, Any], promoted: dict[str, Any], model: str) -> dict[str, Any]:
        """Render the champion's inference-pod manifest (not applied)."""
        from training import pipeline

        return {**promoted, **pipeline.deploy(model, run_id=state["mlflow_run_id"])}

    @task(trigger_rule="all_done", retries=0)
    def finalize(ti: Any = None, dag_run: Any = None) -> str:
        """Close the parent MLflow run: FAILED when any task of this DAG run failed."""
        from flora.tracking import finish_dag_run

        return finish_dag_run(ti, dag_run, DAG_ID)

    state = prepare()
    ends = []
    for model in MODELS:
        with TaskGroup(group_id=model):
            built = build_set.override(task_id="build_set")(state, model)
            # Heavy steps: in-process @task (embedded) or a GPU pod (FLORA_MODE=production).
            refs = {"state": state, "built": built, "model": model}
            trained = step_task("sft")(**refs)
            if model in GRPO_MODELS:
                trained = step_task("grpo")(**refs, trained=trained)
            evaluated = step_task("evaluate")(**refs, trained=trained)
            registered = register.override(task_id="register")(
                state, built, trained, evaluated, model
            )
            promoted = promote.override(task_id="promote")(state, registered, model)
            ends.append(deploy.override(task_id="deploy")(state, promoted, model))
    ends >> finalize()


dag_object = flora_train_models()
