"""KFP v2 lightweight components for the data-engine steps.

``ingest_op``, ``validate_op``, ``segment_op``, ``caption_op``, ``reward_op`` (one per
rewarder mode: outcome, dense, rubric), ``summary_op``, ``curate_op``, ``export_op`` and
``report_op``. Each component body is a thin adapter over the same ``flora`` function the
Airflow task calls (``flora.data.ingest.ingest_dataset``,
``flora.validation.raw.validate_dataset``, ``flora.engine.run_segment`` / ``run_caption`` /
``run_reward`` / ``engine_summary``, ``flora.curate.steps.curate_step`` / ``export_step`` /
``report_step``) and logs to the same MLflow run (reopened by id).

Tables travel as ``Dataset`` artifacts: each engine component uses its output artifact's
path as the ``TableStore`` root, so the table is ``<artifact>/<table>/`` (Parquet parts
plus ``_failures/``); the caption component reads the segment artifact's ``events/``;
``curate_op`` reads every table from its artifact (``{table: artifact}``) and writes the
decisions and the curated mixture into its ``mixture`` artifact (``curation/``,
``curated/<dataset>/mixture.parquet``), which ``export_op`` and ``report_op`` read.
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
def ingest_op(
    dataset_path: str,
    manifest: Output[Dataset],
    run_name: str = "",
) -> NamedTuple(
    "Outputs", [("dataset", str), ("mlflow_run_id", str), ("episodes", int), ("ingested", int)]
):
    """Check every episode of the dataset, write the manifest, open the MLflow run."""
    from collections import namedtuple
    from pathlib import Path

    from flora.engine import ingest_tracked

    path = Path(dataset_path).resolve()
    tags = {"dataset": path.name, "dataset_path": str(path), "orchestrator": "kfp"}
    result, run_id = ingest_tracked(path, manifest.path, tags=tags,
                                    run_name=run_name or f"kfp/{path.name}")  # fmt: skip
    manifest.metadata.update({"dataset": result.dataset.name, "episodes": len(result.manifest)})
    out = namedtuple("Outputs", ["dataset", "mlflow_run_id", "episodes", "ingested"])
    return out(result.dataset.name, run_id, len(result.manifest), result.n_ok)


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
def segment_op(
    dataset_path: str,
    mlflow_run_id: str,
    valid_episodes: list,
    events: Output[Dataset],
    metrics: Output[Metrics],
) -> NamedTuple("Outputs", [("rows", int), ("failures", int), ("report", dict)]):
    """Segment the valid episodes (backend from FLORA_BACKEND; kinematic by default)."""
    from collections import namedtuple

    from flora.engine import publish_kfp, run_segment, tracked

    rep = tracked("segment", mlflow_run_id, run_segment, dataset_path, events.path,
                  valid_episodes, mlflow_run_id)  # fmt: skip
    out = namedtuple("Outputs", ["rows", "failures", "report"])
    return out(*publish_kfp(rep, metrics, events))


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def caption_op(
    dataset_path: str,
    mlflow_run_id: str,
    valid_episodes: list,
    events: Input[Dataset],
    captions: Output[Dataset],
    metrics: Output[Metrics],
    vlm_max_episodes: int = 0,
    max_attempts: int = 3,
    max_new_tokens: int = 0,
) -> NamedTuple("Outputs", [("rows", int), ("failures", int), ("report", dict)]):
    """Caption the events (backend: FLORA_BACKEND, else the tiny model). 0 = default."""
    from collections import namedtuple

    from flora.engine import StepOptions, publish_kfp, run_caption, tracked

    opts = StepOptions.from_mapping(
        {"vlm_max_episodes": vlm_max_episodes, "max_attempts": max_attempts,
         "max_new_tokens": max_new_tokens}
    )  # fmt: skip
    rep = tracked("caption", mlflow_run_id, run_caption, dataset_path, events.path,
                  captions.path, valid_episodes, mlflow_run_id, options=opts)  # fmt: skip
    out = namedtuple("Outputs", ["rows", "failures", "report"])
    return out(*publish_kfp(rep, metrics, captions))


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def reward_op(
    mode: str,
    dataset_path: str,
    mlflow_run_id: str,
    valid_episodes: list,
    table: Output[Dataset],
    metrics: Output[Metrics],
    vlm_max_episodes: int = 0,
    max_attempts: int = 3,
    max_new_tokens: int = 0,
    rubric: str = "",
) -> NamedTuple("Outputs", [("rows", int), ("failures", int), ("report", dict)]):
    """One rewarder mode (outcome | dense | rubric) into its table. 0/"" = default."""
    from collections import namedtuple

    from flora.engine import StepOptions, publish_kfp, run_reward, tracked

    opts = StepOptions.from_mapping(
        {"vlm_max_episodes": vlm_max_episodes, "max_attempts": max_attempts,
         "max_new_tokens": max_new_tokens, "rubric": rubric}
    )  # fmt: skip
    rep = tracked(mode, mlflow_run_id, run_reward, mode, dataset_path, table.path,
                  valid_episodes, mlflow_run_id, options=opts)  # fmt: skip
    out = namedtuple("Outputs", ["rows", "failures", "report"])
    return out(*publish_kfp(rep, metrics, table))


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def summary_op(
    mlflow_run_id: str,
    segment: dict,
    caption: dict,
    outcome: dict,
    dense: dict,
    rubric: dict,
    summary: Output[Artifact],
) -> dict:
    """One summary per table (rows, failures, location, validity), logged to MLflow."""
    import json

    import mlflow

    from flora.engine import engine_summary
    from flora.tracking import mlflow_run

    tables = engine_summary([segment, caption, outcome, dense, rubric])
    with open(summary.path, "w") as fh:
        json.dump(tables, fh, indent=1)
    with mlflow_run("summary", run_id=mlflow_run_id):
        mlflow.log_dict(tables, "engine_summary.json")
    return tables


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
