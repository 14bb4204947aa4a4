"""KFP v2 lightweight components for the data-engine steps: ingest and validate.

Each component body is a thin adapter over the same ``flora`` function the Airflow task
calls (``flora.data.ingest.ingest_dataset``, ``flora.validation.raw.validate_dataset``)
and logs to the same MLflow run. KFP serialises the function source into the pipeline
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

    import mlflow

    from flora.data.ingest import ingest_dataset
    from flora.tracking import log_table_summary, mlflow_run

    path = Path(dataset_path).resolve()
    tags = {"dataset": path.name, "dataset_path": str(path), "orchestrator": "kfp"}
    with mlflow_run("ingest", tags=tags, run_name=run_name or f"kfp/{path.name}") as run:
        result = ingest_dataset(path, out=manifest.path, progress=False)
        log_table_summary("manifest", result.manifest)
        mlflow.log_metrics(
            {
                "ingest.episodes": len(result.manifest),
                "ingest.ok": result.n_ok,
                "ingest.errors": result.n_error,
            }
        )
        run_id = run.info.run_id
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
