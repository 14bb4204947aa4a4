"""KFP v2 components and pipeline ``flora-policy-rtc``: train (training-time RTC) -> evaluate
-> register -> promote.

Thin adapters over the functions behind the Airflow DAG ``flora_policy_rtc``
(``flora.policy.lerobot.train_policy``, ``flora.policy.steps.evaluate_step`` — the DAG's
evaluate task still spells the same logic inline —, ``flora.policy.registry.register_step``,
``model_registry.promotion.promote``); every step logs to the MLflow run the training
opened. The checkpoint travels as a KFP
``Model`` artifact. On a cluster the train step runs on the CUDA image with a GPU, and
every task gets the shared PVC, the pipeline-env ConfigMap and the object-store Secret
(:func:`components.platform.on_cluster`; ``kfp.local`` ignores all of it).

Compile: ``python -m components.policy_pipeline`` writes ``components/policy_pipeline.yaml``.
No ``from __future__ import annotations``: KFP reads the real annotation objects, and only
each function's source is shipped, so everything is imported inside the bodies.
"""

import os
from pathlib import Path
from typing import NamedTuple

from kfp import compiler, dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from components.platform import on_cluster

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

    with tempfile.TemporaryDirectory(prefix="flora-policy-") as out_dir:  # scratch only
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
) -> dict:
    """``flora.policy.steps.evaluate_step``: per-delay offline evaluation, logged to MLflow."""
    from flora.policy.steps import evaluate_step

    ev = evaluate_step(checkpoint.path, dataset_path, report.path, mlflow_run_id,
                       events=events_path or None, max_delay=max_delay)  # fmt: skip
    for k, v in ev["metrics"].items():
        metrics.log_metric(k, v)
    return ev


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def register_policy_op(
    dataset_path: str,
    mlflow_run_id: str,
    checkpoint: Input[Model],
    report: Input[Artifact],
    epochs: int,
    horizon: int,
    max_delay: int,
    hidden: int,
    depth: int,
) -> dict:
    """``flora.policy.registry.register_step``: MLflow model, ``flora-policy@challenger``."""
    from flora.policy.registry import register_step

    recipe = {"epochs": epochs, "horizon": horizon, "max_delay": max_delay, "hidden": hidden,
              "depth": depth}  # fmt: skip
    return register_step(checkpoint.path, report.path, pipeline_run_id=mlflow_run_id,
                         dataset=dataset_path, recipe=recipe)  # fmt: skip


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def promote_policy_op(registered: dict, evaluated: dict) -> dict:
    """The promotion gates (``model_registry.promotion``); a refusal is a result."""
    from model_registry.promotion import promote

    res = promote("policy", registered["version"], actor="kfp:flora-policy-rtc")
    out = {**registered, "latency_ratio": evaluated["latency_ratio"],
           "promoted": res.promoted, "champion": res.champion,
           "gate_reasons": list(res.decision.reasons)}  # fmt: skip
    return {k: v for k, v in out.items() if v is not None}  # KFP parameters hold no null


@dsl.pipeline(
    name="flora-policy-rtc",
    description="Train the flow-matching action expert with training-time RTC, evaluate, "
    "register and promote it.",
)
def policy_rtc_pipeline(
    dataset_path: str,
    events_path: str = "",
    epochs: int = 20,
    horizon: int = 16,
    max_delay: int = 5,
    hidden: int = 128,
    depth: int = 4,
) -> dict:
    """Returns the registered ``version``, held-out ``metrics``, the training-time / plain
    ``latency_ratio`` and the promotion's outcome (``promoted``, ``champion``, reasons)."""
    recipe = {"epochs": epochs, "horizon": horizon, "max_delay": max_delay, "hidden": hidden,
              "depth": depth}  # fmt: skip
    train = on_cluster(
        train_policy_op(dataset_path=dataset_path, events_path=events_path, **recipe), gpu=True
    )
    run_id = train.outputs["mlflow_run_id"]
    ckpt = train.outputs["checkpoint"]
    ev = on_cluster(
        evaluate_policy_op(dataset_path=dataset_path, mlflow_run_id=run_id, checkpoint=ckpt,
                           events_path=events_path, max_delay=max_delay)
    )  # fmt: skip
    reg = on_cluster(
        register_policy_op(dataset_path=dataset_path, mlflow_run_id=run_id, checkpoint=ckpt,
                           report=ev.outputs["report"], **recipe)
    )  # fmt: skip
    promoted = promote_policy_op(registered=reg.output, evaluated=ev.outputs["Output"])
    return on_cluster(promoted).output


def compile_pipeline(path: str | Path = PIPELINE_YAML) -> Path:
    """Compile the pipeline to YAML and return the path."""
    compiler.Compiler().compile(policy_rtc_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    print(compile_pipeline())
