"""The policy pipeline's evaluation step, shared by the Airflow DAG and the KFP component.

Training is :func:`flora.policy.lerobot.train_policy`, registration
:func:`flora.policy.registry.register_step`; this module holds the step between them, so
``dags/flora_policy_rtc.py`` and ``components/policy_pipeline.py`` stay thin adapters over
the same function (the same delays, the same metric names in MLflow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: Prefix of the evaluation's metrics in the pipeline's MLflow run.
METRIC_PREFIX = "policy.eval."


def eval_delays(horizon: int, max_delay: int) -> tuple[int, ...]:
    """Delays ``d < max_delay`` whose postfix ``H - max(d, 1)`` still holds ``d`` actions."""
    return tuple(d for d in range(max_delay) if d <= horizon - max(d, 1))


def flat_eval_metrics(report: dict[str, Any]) -> dict[str, float]:
    """``evaluate_policy``'s report as flat metrics (without :data:`METRIC_PREFIX`):
    ``latency_ms.<method>``, ``d<d>.<method>.postfix_mse`` and, where defined,
    ``d<d>.<method>.boundary_jump``."""
    flat = {f"latency_ms.{m}": float(v) for m, v in report["latency_ms"].items()}
    for r in report["rows"]:
        key = f"d{r['d']}.{r['method']}"
        flat[f"{key}.postfix_mse"] = float(r["postfix_mse"])
        if not math.isnan(r["boundary_jump"]):
            flat[f"{key}.boundary_jump"] = float(r["boundary_jump"])
    return flat


def episode_ids_tag(episodes: list[int], limit: int = 4000) -> str:
    """Comma-separated episode indices for an MLflow tag (cut at ``limit`` characters,
    marked with a trailing ``...``, to stay under MLflow's tag size)."""
    text = ",".join(str(int(i)) for i in episodes)
    return text if len(text) <= limit else text[: text.rfind(",", 0, limit - 3)] + ",..."


def evaluate_step(
    checkpoint: str | Path,
    dataset: str | Path,
    out: str | Path,
    mlflow_run_id: str,
    *,
    events: str | Path | None = None,
    max_delay: int = 5,
) -> dict[str, Any]:
    """Pipeline step: per-delay offline evaluation of ``checkpoint``, logged to MLflow.

    Runs :func:`flora.policy.lerobot.evaluate_policy` for every delay below ``max_delay``
    that the checkpoint's horizon allows, on the episodes training held out (refused when
    the checkpoint records none), writes the report to ``out`` (JSON) and logs its flat
    metrics (``policy.eval.*``), the evaluated episodes (metric ``policy.eval.episodes``:
    their count; tags ``policy.eval.episode_ids`` and ``policy.eval.episode_source``) and
    the report into ``policy_evaluate`` under the pipeline's run ``mlflow_run_id``. Returns
    ``evaluation`` (path), ``latency_ratio`` (training-time over plain), ``metrics`` (flat,
    without the prefix) and ``episodes`` (the evaluated episode indices).
    """
    import mlflow

    from flora.policy.lerobot import evaluate_policy, load_policy
    from flora.tracking import mlflow_run

    horizon = load_policy(checkpoint).model.config.horizon
    report = evaluate_policy(checkpoint, dataset, events=events,
                             delays=eval_delays(horizon, max_delay))  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    flat = flat_eval_metrics(report)
    with mlflow_run("policy_evaluate", run_id=mlflow_run_id):
        mlflow.log_metrics({f"{METRIC_PREFIX}{k}": v for k, v in flat.items()})
        mlflow.log_metric(f"{METRIC_PREFIX}episodes", len(report["episodes"]))
        mlflow.set_tags(
            {
                f"{METRIC_PREFIX}episode_ids": episode_ids_tag(report["episodes"]),
                f"{METRIC_PREFIX}episode_source": report["episode_source"],
            }
        )
        mlflow.log_artifact(str(out), artifact_path="policy")
    return {
        "evaluation": str(out.resolve()),
        "latency_ratio": float(report["latency_ratio_training_time_over_plain"]),
        "metrics": flat,
        "episodes": [int(i) for i in report["episodes"]],
    }


__all__ = [
    "METRIC_PREFIX",
    "episode_ids_tag",
    "eval_delays",
    "evaluate_step",
    "flat_eval_metrics",
]
