"""KFP v2 components and pipeline ``flora-policy-rtc``: train (training-time RTC) -> evaluate.

Thin adapters over the same ``flora.policy.lerobot`` functions the Airflow DAG
``flora_policy_rtc`` calls; both log to one MLflow run. The checkpoint travels as a KFP
``Model`` artifact. On a cluster the train step asks for a GPU (kept in the compiled YAML;
``kfp.local`` ignores resources and runs it on CPU).

Compile: ``python -m components.policy_pipeline`` writes ``components/policy_pipeline.yaml``.
No ``from __future__ import annotations``: KFP reads the real annotation objects, and only
each function's source is shipped, so everything is imported inside the bodies.
"""

import os
from pathlib import Path
from typing import NamedTuple

from kfp import compiler, dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

FLORA_IMAGE = os.environ.get("FLORA_IMAGE", "ghcr.io/flora-robotics/flora:cpu")
PIPELINE_YAML = Path(__file__).with_suffix(".yaml")


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def train_policy_op(
    dataset_path: str,
    checkpoint: Output[Model],
    metrics: Output[Metrics],
    events_path: str = "",
    epochs: int = 20,
    horizon: int = 16,
    max_delay: int = 5,
    hidden: int = 128,
    depth: int = 4,
) -> NamedTuple("Outputs", [("mlflow_run_id", str), ("train_chunks", int)]):
    """Train the DiT expert with training-time RTC; opens the pipeline's MLflow run."""
    import shutil
    import tempfile
    from collections import namedtuple

    from flora.policy.lerobot import PolicyTrainConfig, train_policy

    out_dir = tempfile.mkdtemp(prefix="flora-policy-")
    cfg = PolicyTrainConfig(
        dataset=dataset_path,
        out=out_dir,
        events=events_path or None,
        epochs=epochs,
        horizon=horizon,
        max_delay=max_delay,
        hidden=hidden,
        depth=depth,
        progress=False,
        checkpoint_every=0,
    )
    summary = train_policy(cfg)
    shutil.copyfile(summary["checkpoint"], checkpoint.path)
    checkpoint.metadata.update(
        {"framework": "torch", "kind": "flora.policy.dit", "mlflow_run_id": summary["run_id"]}
    )
    metrics.log_metric("final_loss", float(summary["final_loss"]))
    metrics.log_metric("train_chunks", float(summary["train_chunks"]))
    out = namedtuple("Outputs", ["mlflow_run_id", "train_chunks"])
    return out(summary["run_id"], int(summary["train_chunks"]))


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def evaluate_policy_op(
    dataset_path: str,
    mlflow_run_id: str,
    checkpoint: Input[Model],
    report: Output[Artifact],
    metrics: Output[Metrics],
    events_path: str = "",
    max_delay: int = 5,
) -> float:
    """Per-delay offline evaluation; returns the training-time/plain latency ratio."""
    import json
    import math

    import mlflow

    from flora.policy.lerobot import evaluate_policy, load_policy
    from flora.tracking import mlflow_run

    h = load_policy(checkpoint.path).model.config.horizon
    delays = tuple(d for d in range(max_delay) if d <= h - max(d, 1))
    rep = evaluate_policy(checkpoint.path, dataset_path, events=events_path or None, delays=delays)
    with open(report.path, "w") as f:
        json.dump(rep, f, indent=2)
    flat = {f"latency_ms.{m}": v for m, v in rep["latency_ms"].items()}
    for r in rep["rows"]:
        flat[f"d{r['d']}.{r['method']}.postfix_mse"] = r["postfix_mse"]
        if not math.isnan(r["boundary_jump"]):
            flat[f"d{r['d']}.{r['method']}.boundary_jump"] = r["boundary_jump"]
    for k, v in flat.items():
        metrics.log_metric(k, float(v))
    with mlflow_run("policy_evaluate", run_id=mlflow_run_id):
        mlflow.log_metrics({f"policy.eval.{k}": v for k, v in flat.items()})
        mlflow.log_artifact(report.path, artifact_path="policy")
    return float(rep["latency_ratio_training_time_over_plain"])


@dsl.pipeline(
    name="flora-policy-rtc",
    description="Train the flow-matching action expert with training-time RTC and evaluate it.",
)
def policy_rtc_pipeline(
    dataset_path: str,
    events_path: str = "",
    epochs: int = 20,
    horizon: int = 16,
    max_delay: int = 5,
    hidden: int = 128,
    depth: int = 4,
) -> float:
    """Returns the measured training-time / plain per-chunk latency ratio."""
    train = train_policy_op(
        dataset_path=dataset_path,
        events_path=events_path,
        epochs=epochs,
        horizon=horizon,
        max_delay=max_delay,
        hidden=hidden,
        depth=depth,
    )
    train.set_caching_options(False)
    train.set_cpu_limit("8").set_memory_limit("32G")
    train.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)
    ev = evaluate_policy_op(
        dataset_path=dataset_path,
        mlflow_run_id=train.outputs["mlflow_run_id"],
        checkpoint=train.outputs["checkpoint"],
        events_path=events_path,
        max_delay=max_delay,
    )
    ev.set_caching_options(False)
    ev.set_cpu_limit("2").set_memory_limit("8G")
    return ev.outputs["Output"]


def compile_pipeline(path: str | Path = PIPELINE_YAML) -> Path:
    """Compile the pipeline to YAML and return the path."""
    compiler.Compiler().compile(policy_rtc_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    print(compile_pipeline())
