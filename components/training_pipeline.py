"""KFP v2 pipeline ``flora-training``: build set -> SFT -> GRPO -> evaluate -> register ->
promote, for one Flora model.

Each component is a thin adapter over one step function of :mod:`training.pipeline` — the
same functions the Airflow DAG ``flora_train_models`` calls (``build_set``, ``sft``,
``grpo``, ``evaluate``, ``register`` + ``record_suites``, ``promote``), so the logic exists
once. A component only moves files in and out of KFP artifacts: sets and models travel as
``Dataset`` / ``Model`` artifacts (directories), the steps' small result dicts as
parameters (without their null values, which KFP parameters cannot hold; their paths are
replaced by the artifact paths the next task sees). The GRPO step passes the rewarder's
SFT model on unchanged (no RL, DESIGN §3.5). SFT, GRPO and evaluation are GPU steps;
every task gets the shared PVC, the pipeline-env ConfigMap and the object-store Secret
(:mod:`components.platform`).

Compile: ``python -m components.training_pipeline`` writes
``components/training_pipeline.yaml``. No ``from __future__ import annotations``: KFP reads
the real annotation objects, and only each function's source is shipped, so everything
is imported inside the bodies.
"""

import os
from pathlib import Path

from kfp import compiler, dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from components.platform import on_cluster

FLORA_IMAGE = os.environ.get("FLORA_IMAGE", "ghcr.io/flora-robotics/flora:cpu")
FLORA_CUDA_IMAGE = os.environ.get("FLORA_CUDA_IMAGE", "ghcr.io/flora-robotics/flora:cuda")
PIPELINE_YAML = Path(__file__).with_suffix(".yaml")
#: Retries of every task after a failure (a lost node, an evicted pod), as the Airflow DAG
#: ``flora_train_models``'s.
RETRIES = 1


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def build_set_op(
    model: str,
    recipe: str,
    dataset_path: str,
    training_set: Output[Dataset],
    mixture_path: str = "",
    max_episodes: int = 0,
) -> dict:
    """``training.pipeline.build_set`` into the ``training_set`` artifact."""
    from training import pipeline

    built = pipeline.build_set(model, recipe, dataset_path, training_set.path,
                               mixture=mixture_path or None,
                               max_episodes=max_episodes or None)  # fmt: skip
    training_set.metadata.update({"model": model, "recipe": built["recipe"],
                                  "examples": built["examples"]})  # fmt: skip
    return {k: v for k, v in built.items() if v is not None}  # KFP parameters hold no null


@dsl.component(base_image=FLORA_CUDA_IMAGE, install_kfp_package=False)
def sft_op(
    model: str,
    recipe: str,
    training_set: Input[Dataset],
    sft_model: Output[Model],
    max_steps: int = 0,
) -> dict:
    """``training.pipeline.sft``; the exported model becomes the ``sft_model`` artifact."""
    import shutil
    import tempfile

    from training import pipeline

    # Scratch space, removed once the export is copied into the artifact (kfp.local runs
    # every component on the same machine: a kept folder per run would pile up in /tmp).
    with tempfile.TemporaryDirectory(prefix="flora-sft-") as out:
        trained = pipeline.sft(model, recipe, training_set.path, out, max_steps=max_steps or None)
        shutil.copytree(trained["model_dir"], sft_model.path)
    sft_model.metadata.update({"stage": "sft", "mlflow_run_id": trained["training_run_id"]})
    return {**{k: v for k, v in trained.items() if v is not None}, "model_dir": sft_model.path}


@dsl.component(base_image=FLORA_CUDA_IMAGE, install_kfp_package=False)
def grpo_op(
    model: str,
    recipe: str,
    training_set: Input[Dataset],
    sft_model: Input[Model],
    sft: dict,
    trained_model: Output[Model],
    max_steps: int = 0,
) -> dict:
    """``training.pipeline.grpo`` from the SFT model (the rewarder's passes on unchanged)."""
    import shutil
    import tempfile

    from training import pipeline

    with tempfile.TemporaryDirectory(prefix="flora-grpo-") as out:  # scratch, as in sft_op
        trained = pipeline.grpo(model, recipe, training_set.path,
                                {**sft, "model_dir": sft_model.path}, out,
                                max_steps=max_steps or None)  # fmt: skip
        shutil.copytree(trained["model_dir"], trained_model.path)
    trained_model.metadata.update({"stage": trained["stage"],
                                   "mlflow_run_id": trained["training_run_id"]})  # fmt: skip
    return {**{k: v for k, v in trained.items() if v is not None},
            "model_dir": trained_model.path}  # fmt: skip


@dsl.component(base_image=FLORA_CUDA_IMAGE, install_kfp_package=False)
def evaluate_op(
    model: str,
    recipe: str,
    training_set: Input[Dataset],
    trained_model: Input[Model],
    trained: dict,
    metrics: Output[Metrics],
    report: Output[Artifact],
    max_episodes: int = 0,
    n_boot: int = 200,
    baseline: bool = True,
) -> dict:
    """``training.pipeline.evaluate`` (held-out, and the untrained base with ``baseline``)."""
    import json

    from training import pipeline

    evaluated = pipeline.evaluate(model, recipe, training_set.path,
                                  {**trained, "model_dir": trained_model.path}, report.path,
                                  max_episodes=max_episodes or None, n_boot=n_boot,
                                  baseline=baseline)  # fmt: skip
    with open(report.path) as f:
        for k, v in json.load(f)["flat"].items():
            metrics.log_metric(k, v)
    return {k: v for k, v in evaluated.items() if v is not None}  # headline: None if NaN


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def register_op(
    model: str, built: dict, trained: dict, evaluated: dict, eval_report: Input[Artifact]
) -> dict:
    """``training.pipeline.register`` (challenger, lineage, eval tags) + ``record_suites``."""
    from training import pipeline

    evaluated = {**evaluated, "report": eval_report.path}
    reg = pipeline.register(model, built, trained, evaluated)
    return {**reg, **pipeline.record_suites(model, reg["version"], built, evaluated)}


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def promote_op(model: str, registered: dict, gates: str = "project") -> dict:
    """``training.pipeline.promote``: champion if the gates pass; a refusal is a result
    (``promoted: false`` with the gates' reasons), not a failure."""
    from training import pipeline

    res = pipeline.promote(model, registered["version"], gates=gates, actor="kfp:flora-training")
    return {k: v for k, v in {**registered, **res}.items() if v is not None}


@dsl.pipeline(
    name="flora-training",
    description="Train a Flora model: build set, SFT, GRPO, evaluate on held-out episodes, "
    "register as challenger, promote through the gates.",
)
def training_pipeline(
    model: str,
    recipe: str,
    dataset_path: str,
    mixture_path: str = "",
    max_episodes: int = 0,
    sft_max_steps: int = 0,
    grpo_max_steps: int = 0,
    eval_max_episodes: int = 0,
    n_boot: int = 200,
    baseline: bool = True,
    gates: str = "project",
) -> dict:
    """Returns the registered ``version`` of ``flora-<model>``, the suites verdict and the
    promotion's outcome (``promoted``, ``champion``, gate ``reasons``).

    ``recipe``: a size (``small``), a name (``captioner-small``) or a YAML path.
    ``mixture_path``: a curated mixture parquet (empty: the dataset's ground truth).
    ``gates``: ``project`` or ``mechanics`` (``training.pipeline.GATE_POLICIES``). 0 / ""
    mean the recipe's setting / all held-out episodes / none.
    """
    built = on_cluster(
        build_set_op(model=model, recipe=recipe, dataset_path=dataset_path,
                     mixture_path=mixture_path, max_episodes=max_episodes),
        retries=RETRIES,
    )  # fmt: skip
    common = {"model": model, "recipe": recipe, "training_set": built.outputs["training_set"]}
    sft = on_cluster(sft_op(**common, max_steps=sft_max_steps), gpu=True, retries=RETRIES)
    grpo = on_cluster(
        grpo_op(**common, sft_model=sft.outputs["sft_model"], sft=sft.outputs["Output"],
                max_steps=grpo_max_steps),
        gpu=True,
        retries=RETRIES,
    )  # fmt: skip
    ev = on_cluster(
        evaluate_op(**common, trained_model=grpo.outputs["trained_model"],
                    trained=grpo.outputs["Output"], max_episodes=eval_max_episodes,
                    n_boot=n_boot, baseline=baseline),
        gpu=True,
        retries=RETRIES,
    )  # fmt: skip
    reg = on_cluster(
        register_op(model=model, built=built.outputs["Output"], trained=grpo.outputs["Output"],
                    evaluated=ev.outputs["Output"], eval_report=ev.outputs["report"]),
        retries=RETRIES,
    )  # fmt: skip
    promoted = promote_op(model=model, registered=reg.output, gates=gates)
    return on_cluster(promoted, retries=RETRIES).output


def compile_pipeline(path: str | Path = PIPELINE_YAML) -> Path:
    """Compile the pipeline to YAML and return the path."""
    compiler.Compiler().compile(training_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    print(compile_pipeline())
