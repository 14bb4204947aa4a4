"""KFP v2 lightweight components for the data-engine steps.

``open_run_op``, ``ingest_op``, ``validate_op``, ``plan_op``, then per shard ``segment_op``,
``caption_op``, ``reward_op`` (one per rewarder mode: outcome, dense, rubric), then
``summary_op`` (merges the shards), ``check_shards_op``, ``curate_op``, ``export_op``,
``report_op``, and the exit handler ``finalize_op``. Each component body is a thin adapter
over the same ``flora`` function the Airflow task calls (``flora.data.ingest.ingest_dataset``,
``flora.validation.raw.validate_dataset``, ``flora.engine.run_segment`` / ``run_caption`` /
``run_reward`` / ``summarize_kfp_shards``, ``flora.curate.steps.curate_step`` /
``export_step`` / ``report_step``) and logs to its own child run of the pipeline run's
MLflow parent run (``flora.engine.start_kfp_run`` / ``finish_kfp_run``).

Tables travel as ``Dataset`` artifacts: each engine component uses its output artifact's
path as the ``TableStore`` root, so the table is ``<artifact>/<table>/`` (Parquet parts
plus ``_failures/``); the caption component reads its shard's segment artifact;
``summary_op`` merges the shards' artifacts into one per table; ``curate_op`` reads every
merged table (``{table: artifact}``) and writes the decisions and the curated mixture into
its ``mixture`` artifact (``curation/``, ``curated/<dataset>/mixture.parquet``), which
``export_op`` and ``report_op`` read.
On a cluster the artifacts live in the pipeline root (object storage); ``kfp.local``
keeps them under its ``pipeline_root``. KFP serialises the function source into the pipeline
spec, so everything a body uses is imported inside it, from the ``flora`` package
installed in the image (``FLORA_IMAGE``; locally, the editable install in ``.venv``).

``install_kfp_package=False``: the Flora image already pins kfp (requirements.lock), so
the task does not pip-install anything at start-up — and ``kfp.local`` never touches the
venv.

No ``from __future__ import annotations`` here: KFP reads the real annotation objects,
and output NamedTuples are spelled inline because only the function source is shipped.
"""

import os
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Output

#: Image the components run in on a cluster (the Dockerfile's ``cpu`` target).
FLORA_IMAGE = os.environ.get("FLORA_IMAGE", "ghcr.io/flora-robotics/flora:cpu")


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def open_run_op(
    dataset_path: str,
    job_id: str,
    shards: int,
    strict: bool = False,
    vlm_max_episodes: int = 0,
    max_attempts: int = 3,
    max_new_tokens: int = 0,
    rubric: str = "",
    curation_rules: str = "",
    dvc_repo: str = "",
) -> str:
    """Open the run's MLflow parent run (params logged, tagged with the KFP job id)."""
    from flora.engine import start_kfp_run

    params = {"dataset": dataset_path, "shards": shards, "strict": strict,
              "vlm_max_episodes": vlm_max_episodes, "max_attempts": max_attempts,
              "max_new_tokens": max_new_tokens, "rubric": rubric,
              "curation_rules": curation_rules, "dvc_repo": dvc_repo}  # fmt: skip
    return start_kfp_run(dataset_path, job_id, params)


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def ingest_op(
    dataset_path: str,
    mlflow_run_id: str,
    manifest: Output[Dataset],
) -> NamedTuple("Outputs", [("dataset", str), ("episodes", int), ("ingested", int)]):
    """Check every episode of the dataset and write the manifest (a child MLflow run)."""
    from collections import namedtuple
    from pathlib import Path

    from flora.engine import ingest_tracked

    path = Path(dataset_path).resolve()
    tags = {"dataset": path.name, "dataset_path": str(path), "orchestrator": "kfp"}
    result, _ = ingest_tracked(path, manifest.path, tags=tags, run_name="ingest",
                               run_id=mlflow_run_id)  # fmt: skip
    manifest.metadata.update({"dataset": result.dataset.name, "episodes": len(result.manifest)})
    out = namedtuple("Outputs", ["dataset", "episodes", "ingested"])
    return out(result.dataset.name, len(result.manifest), result.n_ok)


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def validate_op(
    dataset_path: str,
    mlflow_run_id: str,
    manifest: Input[Dataset],
    report: Output[Artifact],
    metrics: Output[Metrics],
    strict: bool = False,
) -> NamedTuple(
    "Outputs", [("success", bool), ("valid_episodes", list), ("invalid_episodes", list)]
):
    """Run the raw-episode GX suites; outputs the episodes later steps may process."""
    from collections import namedtuple

    import pandas as pd

    from flora.tracking import log_validation, mlflow_run
    from flora.validation.raw import validate_dataset

    ingested = set(pd.read_parquet(manifest.path).query("status == 'ok'")["episode_index"])
    rep = validate_dataset(dataset_path, progress=False)
    rep.write(report.path)
    valid = [int(i) for i in rep.valid_episodes if i in ingested]
    for k, v in rep.statistics.items():
        metrics.log_metric(k, float(v))
    with mlflow_run("validate", run_id=mlflow_run_id):
        log_validation(rep, name="raw")
        if not valid:
            raise ValueError(f"dataset {rep.dataset}: no valid episode (see {report.path})")
        if strict and not rep.success:
            raise ValueError(
                f"dataset {rep.dataset}: invalid episodes {rep.invalid_episodes} and strict=True"
            )
    out = namedtuple("Outputs", ["success", "valid_episodes", "invalid_episodes"])
    return out(rep.success, valid, [int(i) for i in rep.invalid_episodes])


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def plan_op(valid_episodes: list, shards: int, vlm_max_episodes: int = 0) -> list:
    """The shards the engine steps fan out over, each with its episodes: ``episodes``
    (segment) and ``vlm_episodes`` (caption, rewards; the bound applies to the whole run).
    ``flora.orchestration.shards.plan_shards_with_episodes``."""
    from flora.engine import StepOptions
    from flora.orchestration.shards import plan_shards_with_episodes

    opts = StepOptions.from_mapping({"vlm_max_episodes": vlm_max_episodes})
    return plan_shards_with_episodes(valid_episodes, shards, opts)


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def segment_op(
    dataset_path: str,
    mlflow_run_id: str,
    shard: dict,
    events: Output[Dataset],
    metrics: Output[Metrics],
) -> NamedTuple("Outputs", [("rows", int), ("failures", int), ("report", dict)]):
    """Segment the shard's episodes (backend from FLORA_BACKEND; kinematic by
    default); ``summary_op`` scores the whole run's events."""
    from collections import namedtuple

    from flora.engine import kfp_shard_step, run_segment

    out = namedtuple("Outputs", ["rows", "failures", "report"])
    return out(*kfp_shard_step("segment", mlflow_run_id, shard, run_segment, dataset_path,
                               events.path, shard["episodes"], mlflow_run_id, evaluate=False,
                               metrics=metrics, table=events))  # fmt: skip


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def caption_op(
    dataset_path: str,
    mlflow_run_id: str,
    shard: dict,
    events: Input[Dataset],
    captions: Output[Dataset],
    metrics: Output[Metrics],
    vlm_max_episodes: int = 0,
    max_attempts: int = 3,
    max_new_tokens: int = 0,
) -> NamedTuple("Outputs", [("rows", int), ("failures", int), ("report", dict)]):
    """Caption the shard's events (backend: FLORA_BACKEND, else the tiny model).
    0 = default."""
    from collections import namedtuple

    from flora.engine import StepOptions, kfp_shard_step, run_caption

    opts = StepOptions.from_mapping(
        {"vlm_max_episodes": vlm_max_episodes, "max_attempts": max_attempts,
         "max_new_tokens": max_new_tokens}
    )  # fmt: skip
    out = namedtuple("Outputs", ["rows", "failures", "report"])
    return out(*kfp_shard_step("caption", mlflow_run_id, shard, run_caption, dataset_path,
                               events.path, captions.path, shard["vlm_episodes"],
                               mlflow_run_id, options=opts, metrics=metrics, table=captions,
                               upstream=events))  # fmt: skip


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def reward_op(
    mode: str,
    dataset_path: str,
    mlflow_run_id: str,
    shard: dict,
    captions: Input[Dataset],
    table: Output[Dataset],
    metrics: Output[Metrics],
    vlm_max_episodes: int = 0,
    max_attempts: int = 3,
    max_new_tokens: int = 0,
    rubric: str = "",
) -> NamedTuple("Outputs", [("rows", int), ("failures", int), ("report", dict)]):
    """One rewarder mode (outcome | dense | rubric) on the shard's episodes into its
    table, after the shard's captions (not run when the shard failed before).
    0/"" = default."""
    from collections import namedtuple

    from flora.engine import StepOptions, kfp_shard_step, run_reward

    opts = StepOptions.from_mapping(
        {"vlm_max_episodes": vlm_max_episodes, "max_attempts": max_attempts,
         "max_new_tokens": max_new_tokens, "rubric": rubric}
    )  # fmt: skip
    out = namedtuple("Outputs", ["rows", "failures", "report"])
    return out(*kfp_shard_step(mode, mlflow_run_id, shard, run_reward, mode, dataset_path,
                               table.path, shard["vlm_episodes"], mlflow_run_id,
                               options=opts, metrics=metrics, table=table,
                               upstream=captions))  # fmt: skip


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def summary_op(
    mlflow_run_id: str,
    dataset_path: str,
    valid_episodes: list,
    segment_reports: list[dict],
    caption_reports: list[dict],
    outcome_reports: list[dict],
    dense_reports: list[dict],
    rubric_reports: list[dict],
    events_shards: Input[list[Dataset]],
    captions_shards: Input[list[Dataset]],
    outcome_shards: Input[list[Dataset]],
    dense_shards: Input[list[Dataset]],
    rubric_shards: Input[list[Dataset]],
    events: Output[Dataset],
    captions: Output[Dataset],
    outcome: Output[Dataset],
    dense: Output[Dataset],
    rubric: Output[Dataset],
    summary: Output[Artifact],
) -> NamedTuple("Outputs", [("tables", dict), ("failed_shards", dict), ("shards", int)]):
    """Merge the finished shards' tables into one artifact per table, summarise them
    (rows, failures, location, validity) and log the run's totals to the MLflow parent
    run; ``failed_shards``: shard label -> the steps it did not finish; ``shards``: how
    many ran (the plan makes at most one per valid episode)."""
    import json
    from collections import namedtuple

    from flora.engine import SHARD_FAILED, STEP_TABLES, summarize_kfp_shards

    reports = {"segment": segment_reports, "caption": caption_reports,
               "outcome": outcome_reports, "dense": dense_reports,
               "rubric": rubric_reports}  # fmt: skip
    shards = {"segment": events_shards, "caption": captions_shards,
              "outcome": outcome_shards, "dense": dense_shards,
              "rubric": rubric_shards}  # fmt: skip
    outs = {"segment": events, "caption": captions, "outcome": outcome, "dense": dense,
            "rubric": rubric}  # fmt: skip
    tables, failed = summarize_kfp_shards(
        mlflow_run_id, dataset_path, valid_episodes, reports,
        {k: [a.path for a in v if SHARD_FAILED not in a.metadata] for k, v in shards.items()},
        {k: a.path for k, a in outs.items()},
    )  # fmt: skip
    for key, art in outs.items():
        table = STEP_TABLES[key]
        art.metadata.update({"table": table, "rows": tables.get(table, {}).get("rows", 0)})
    with open(summary.path, "w") as fh:
        json.dump(tables, fh, indent=1)
    n = len(segment_reports)
    return namedtuple("Outputs", ["tables", "failed_shards", "shards"])(tables, failed, n)


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def check_shards_op(failed_shards: dict, shards: int) -> None:
    """Fail, naming them, when shards did not finish (after ``summary_op`` recorded what
    the others did), so that no mixture is curated from a partial run."""
    from flora.orchestration.shards import describe_failed_shards

    if failed_shards:
        raise RuntimeError(
            describe_failed_shards(failed_shards, shards) + " (the others completed)"
        )


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def curate_op(
    dataset_path: str,
    mlflow_run_id: str,
    valid_episodes: list,
    events: Input[Dataset],
    captions: Input[Dataset],
    outcome: Input[Dataset],
    dense: Input[Dataset],
    rubric: Input[Dataset],
    mixture: Output[Dataset],
    metrics: Output[Metrics],
    curation_rules: str = "",
    dvc_repo: str = "",
) -> dict:
    """Filter + rebalance the tables into the curated mixture (MLflow dataset, DVC)."""
    from flora.curate.steps import MIXTURE_ASSET_NAME, curate_step

    tables = {"events": events.path, "captions": captions.path, "outcome": outcome.path,
              "dense_labels": dense.path, "rubric": rubric.path}  # fmt: skip
    rep = curate_step(dataset_path, tables, mixture.path, valid_episodes, mlflow_run_id,
                      rules=curation_rules or None, dvc_repo=dvc_repo or None)  # fmt: skip
    for split, s in rep["summary"]["mixture"]["splits"].items():
        metrics.log_metric(f"curate.mixture.{split}.rows", float(s.get("rows", 0)))
    mixture.metadata.update({"asset": MIXTURE_ASSET_NAME, "rows": rep["rows"],
                             "mixture_path": rep["mixture_path"]})  # fmt: skip
    return rep


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def export_op(
    dataset_path: str,
    mlflow_run_id: str,
    curate: dict,
    events: Input[Dataset],
    captions: Input[Dataset],
    outcome: Input[Dataset],
    dense: Input[Dataset],
    rubric: Input[Dataset],
    mixture: Input[Dataset],
    export: Output[Dataset],
) -> dict:
    """LeRobot v3.0 export with ``language_persistent`` and ``flora_annotations/``."""
    from flora.curate.steps import export_step

    tables = {"events": events.path, "captions": captions.path, "outcome": outcome.path,
              "dense_labels": dense.path, "rubric": rubric.path,
              "curation": mixture.path}  # fmt: skip
    return export_step(dataset_path, tables, export.path, mlflow_run_id,
                       mixture=curate["mixture_path"])  # fmt: skip


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def report_op(
    dataset_path: str,
    mlflow_run_id: str,
    valid_episodes: list,
    curate: dict,
    export: dict,
    events: Input[Dataset],
    captions: Input[Dataset],
    outcome: Input[Dataset],
    dense: Input[Dataset],
    rubric: Input[Dataset],
    mixture: Input[Dataset],
    report: Output[Artifact],
) -> dict:
    """HTML run and episode reports (self-contained), logged to MLflow as artifacts."""
    from flora.curate.steps import report_step

    tables = {"events": events.path, "captions": captions.path, "outcome": outcome.path,
              "dense_labels": dense.path, "rubric": rubric.path,
              "curation": mixture.path}  # fmt: skip
    return report_step(dataset_path, tables, report.path, mlflow_run_id,
                       mixture=curate["mixture_path"], episodes=valid_episodes,
                       extra={"export_root": export.get("root", "")})  # fmt: skip


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def finalize_op(job_id: str, status: dsl.PipelineTaskFinalStatus) -> None:
    """Exit handler: close the MLflow parent run, FAILED when any task failed."""
    from flora.engine import finish_kfp_run

    finish_kfp_run(job_id, status.state, status.error_message or "")
