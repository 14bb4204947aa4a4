"""The curate → export → report steps as orchestrator-neutral calls.

The Airflow tasks (``dags/flora_data_engine.py``) and the KFP components
(``components/data_engine.py``) are thin adapters over these: each opens the pipeline's
MLflow run (reopened by id), calls the step function (``curate_dataset``,
``export_lerobot``, ``build_reports``), logs what it did and returns a small JSON dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flora.curate.sources import TableSource

#: Name of the curated mixture asset (Airflow ``Asset`` / KFP artifact metadata).
MIXTURE_ASSET_NAME = "flora_curated_mixture"


def curate_step(
    dataset_path: str | Path,
    tables: TableSource,
    out_dir: str | Path,
    episodes: Sequence[int],
    mlflow_run_id: str,
    *,
    rules: str | None = None,
    dvc_repo: str | None = None,
) -> dict[str, Any]:
    """Curate in the pipeline's MLflow run: mixture logged as an MLflow dataset, DVC-versioned
    when ``dvc_repo`` is set (``"dvc": "skipped: …"`` otherwise). Raises on an empty or
    invalid mixture (the task fails; nothing downstream runs)."""
    from flora.curate.run import curate_dataset, log_mixture, version_with_dvc
    from flora.tracking import mlflow_run

    with mlflow_run("curate", run_id=mlflow_run_id):
        res = curate_dataset(dataset_path, tables, out_dir, mlflow_run_id, rules=rules or None,
                             episodes=list(episodes))  # fmt: skip
        if dvc_repo:
            res.summary["dvc"] = version_with_dvc(res.mixture_path, dvc_repo, res.dataset)
        else:
            res.summary["dvc"] = {"skipped": "no dvc_repo configured"}
        log_mixture(res)
    out = res.to_dict()
    out["rows"] = int(len(res.mixture))
    return out


def export_step(
    dataset_path: str | Path,
    tables: TableSource,
    out: str | Path,
    mlflow_run_id: str,
    *,
    mixture: str | None = None,
) -> dict[str, Any]:
    """LeRobot export into ``out`` (replaced on a rerun). A source that is not LeRobot v3.0
    is skipped with its reason rather than failing the run."""
    import mlflow

    from flora.data import open_dataset
    from flora.export.lerobot import export_lerobot
    from flora.tracking import mlflow_run

    with mlflow_run("export", run_id=mlflow_run_id):
        fmt = open_dataset(dataset_path).format
        if fmt != "lerobot_v3.0":
            mlflow.set_tag("export.skipped", f"source format {fmt}")
            return {"skipped": f"export needs a LeRobot v3.0 source, got {fmt}"}
        res = export_lerobot(dataset_path, tables, out, mixture=mixture, overwrite=True)
        mlflow.log_metrics({"export.episodes": res.episodes, "export.frames": res.frames,
                            "export.events": res.events})  # fmt: skip
        mlflow.set_tag("export.root", str(res.root))
    return res.to_dict()


def report_step(
    dataset_path: str | Path,
    tables: TableSource,
    out: str | Path,
    mlflow_run_id: str,
    *,
    mixture: str | None = None,
    episodes: Sequence[int] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """HTML reports under ``out``, logged to the MLflow run as ``report/`` artifacts."""
    from flora.report.html import build_reports, log_reports
    from flora.tracking import mlflow_run

    with mlflow_run("report", run_id=mlflow_run_id):
        res = build_reports(dataset_path, tables, out, mixture=mixture, run_id=mlflow_run_id,
                            episodes=list(episodes) if episodes is not None else None)  # fmt: skip
        log_reports(res)
    d = res.to_dict()
    d["episode_pages"] = len(d.pop("episodes"))
    return {**d, **dict(extra or {})}


__all__ = ["MIXTURE_ASSET_NAME", "curate_step", "export_step", "report_step"]
