"""KFP v2 pipeline ``flora-training``: build set -> SFT -> GRPO -> evaluate -> register.

Thin components over the training functions (:func:`training.sets.build_sft_set`,
:func:`training.sft.train_sft`, :func:`training.grpo.train_grpo`,
:func:`training.evaluate.evaluate_model`, :func:`model_registry.register.register_model`).
Sets and models travel as KFP ``Dataset`` / ``Model`` artifacts (directories). The GRPO
prompts are the train split of the same set (its references carry what the rewards need);
the rewarder has no RL (DESIGN §3.5), so for it the GRPO task hands the SFT model on
unchanged and says so. SFT and GRPO ask for a GPU on the CUDA image (kept in the compiled
YAML; ``kfp.local`` ignores resources and runs them on CPU); so does evaluation, which
generates with the model.

Compile: ``python -m components.training_pipeline`` writes
``components/training_pipeline.yaml``. No ``from __future__ import annotations``: KFP reads
the real annotation objects, and only each function's source is shipped, so everything
is imported inside the bodies.
"""

import os
from pathlib import Path
from typing import NamedTuple

from kfp import compiler, dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

FLORA_IMAGE = os.environ.get("FLORA_IMAGE", "ghcr.io/flora-robotics/flora:cpu")
FLORA_CUDA_IMAGE = os.environ.get("FLORA_CUDA_IMAGE", "ghcr.io/flora-robotics/flora:cuda")
PIPELINE_YAML = Path(__file__).with_suffix(".yaml")
#: One GPU node per training task (production recipes name their own GPU counts; a
#: multi-GPU run goes through the ``deepspeed`` launcher inside the task).
GPU_TASK = {"cpu": "8", "memory": "64G", "accelerator": "nvidia.com/gpu", "gpus": 1}
CPU_TASK = {"cpu": "2", "memory": "8G"}


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def build_set_op(recipe: str, dataset_path: str, training_set: Output[Dataset]) -> NamedTuple(
    "Outputs", [("model", str), ("examples", int)]
):
    """The recipe's SFT set (train + held-out split by episode) from a toy-world dataset."""
    import json
    from collections import namedtuple
    from pathlib import Path

    from training.recipe import load_recipe
    from training.sets import build_sft_set

    r = load_recipe(recipe)
    s = r.sets
    path = build_sft_set(r.model, dataset_path, training_set.path,
                         split_fraction=s.split_fraction, max_episodes=s.max_episodes,
                         profiles=s.profiles, shifted=s.shifted, outcome_frames=s.outcome_frames,
                         rubric_frames=s.rubric_frames, rubric_thinking=s.rubric_thinking,
                         log_mlflow=True, progress=False)  # fmt: skip
    man = json.loads((Path(path) / "manifest.json").read_text())
    n = int(man["examples"])
    training_set.metadata.update({"model": r.model, "recipe": recipe})
    return namedtuple("Outputs", ["model", "examples"])(r.model, n)


@dsl.component(base_image=FLORA_CUDA_IMAGE, install_kfp_package=False)
def sft_op(
    recipe: str, training_set: Input[Dataset], model: Output[Model], max_steps: int = 0
) -> NamedTuple("Outputs", [("mlflow_run_id", str), ("steps", int)]):
    """SFT on DeepSpeed; the exported model directory becomes the ``model`` artifact."""
    import shutil
    import tempfile
    from collections import namedtuple

    from training.sft import train_sft

    out = tempfile.mkdtemp(prefix="flora-sft-")
    res = train_sft(recipe, training_set.path, out, max_steps=max_steps or None,
                    log_mlflow=True, progress=False)  # fmt: skip
    shutil.copytree(res.model_dir, model.path)
    model.metadata.update({"stage": "sft", "mlflow_run_id": res.run_id or ""})
    return namedtuple("Outputs", ["mlflow_run_id", "steps"])(res.run_id or "", int(res.steps))


@dsl.component(base_image=FLORA_CUDA_IMAGE, install_kfp_package=False)
def grpo_op(
    recipe: str,
    training_set: Input[Dataset],
    sft_model: Input[Model],
    sft_run_id: str,
    model: Output[Model],
    max_steps: int = 0,
) -> NamedTuple("Outputs", [("mlflow_run_id", str), ("ran", bool)]):
    """GRPO from the SFT model (segmenter, captioner); the rewarder's SFT model passes on."""
    import shutil
    import tempfile
    from collections import namedtuple

    from training.grpo import GRPO_MODELS, train_grpo
    from training.recipe import load_recipe

    r = load_recipe(recipe)
    outputs = namedtuple("Outputs", ["mlflow_run_id", "ran"])
    if r.model not in GRPO_MODELS or r.grpo is None:
        shutil.copytree(sft_model.path, model.path)
        model.metadata.update({"stage": "sft", "grpo": "skipped: no RL for the rewarder"})
        return outputs(sft_run_id, False)
    out = tempfile.mkdtemp(prefix="flora-grpo-")
    res = train_grpo(r, sft_model.path, training_set.path, out,
                     max_steps=max_steps or None, progress=False)  # fmt: skip
    shutil.copytree(res.model_dir, model.path)
    model.metadata.update({"stage": "grpo", "mlflow_run_id": res.run_id or ""})
    return outputs(res.run_id or "", True)


@dsl.component(base_image=FLORA_CUDA_IMAGE, install_kfp_package=False)
def evaluate_op(
    recipe: str,
    training_set: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    report: Output[Artifact],
    max_episodes: int = 0,
    n_boot: int = 200,
) -> NamedTuple("Outputs", [("headline", float), ("eval_run_id", str)]):
    """Held-out metrics (``flora eval model``), logged to MLflow; returns the headline."""
    import json
    import math
    from collections import namedtuple

    from training.evaluate import (
        HEADLINE,
        backend_for,
        evaluate_model,
        flat_metrics,
        heldout_examples,
        log_eval,
    )
    from training.recipe import load_recipe

    r = load_recipe(recipe)
    examples = heldout_examples(r.model, training_set.path, limit=max_episodes or None)
    judge = None
    if r.model == "captioner":
        from training.rewards import make_judge

        judge = make_judge(r.grpo.judge if r.grpo is not None else "embedding")
    backend = backend_for(model.path, device="auto")  # the GPU on a cluster, else the CPU
    res = evaluate_model(r.model, examples, backend, judge=judge, n_boot=n_boot)
    rid = log_eval(res, tags={"flora.eval.stage": model.metadata.get("stage", "")})
    flat = flat_metrics(res)
    for k, v in flat.items():
        metrics.log_metric(k, v)
    with open(report.path, "w") as f:
        json.dump({**res.to_dict(), "flat": flat, "eval_run_id": rid}, f, indent=2, default=str)
    head = float(res.metrics.get(HEADLINE[r.model], math.nan))
    return namedtuple("Outputs", ["headline", "eval_run_id"])(head, rid)


@dsl.component(base_image=FLORA_IMAGE, install_kfp_package=False)
def register_op(recipe: str, mlflow_run_id: str, eval_report: Input[Artifact]) -> str:
    """Register the model logged by the last training run (alias ``challenger``), eval tags."""
    import json

    from model_registry.register import register_model
    from training.evaluate import logged_model_uri, tag_version
    from training.recipe import load_recipe

    r = load_recipe(recipe)
    with open(eval_report.path) as f:
        rep = json.load(f)
    uri = logged_model_uri(mlflow_run_id)
    version = register_model(r.model, uri, mlflow_run_id, tags={"flora.recipe": recipe})
    tag_version(r.model, version, rep["flat"], rep["eval_run_id"])
    return version


def _res(task: dsl.PipelineTask, res: dict) -> dsl.PipelineTask:
    # Sets, checkpoints and registry state change under the same inputs: never cache.
    task.set_caching_options(False)
    task.set_cpu_limit(res["cpu"]).set_memory_limit(res["memory"])
    if "accelerator" in res:
        task.set_accelerator_type(res["accelerator"]).set_accelerator_limit(res["gpus"])
    return task


@dsl.pipeline(
    name="flora-training",
    description="Train a Flora model: build set, SFT, GRPO, evaluate on held-out episodes, "
    "register as challenger.",
)
def training_pipeline(
    recipe: str,
    dataset_path: str,
    sft_max_steps: int = 0,
    grpo_max_steps: int = 0,
    eval_max_episodes: int = 0,
    n_boot: int = 200,
) -> str:
    """Returns the registered version of ``flora-<model>``.

    ``*_max_steps`` / ``eval_max_episodes``: 0 means the recipe's / all held-out episodes.
    """
    built = _res(build_set_op(recipe=recipe, dataset_path=dataset_path), CPU_TASK)
    sft = _res(
        sft_op(recipe=recipe, training_set=built.outputs["training_set"], max_steps=sft_max_steps),
        GPU_TASK,
    )
    grpo = _res(
        grpo_op(
            recipe=recipe,
            training_set=built.outputs["training_set"],
            sft_model=sft.outputs["model"],
            sft_run_id=sft.outputs["mlflow_run_id"],
            max_steps=grpo_max_steps,
        ),
        GPU_TASK,
    )
    ev = _res(
        evaluate_op(
            recipe=recipe,
            training_set=built.outputs["training_set"],
            model=grpo.outputs["model"],
            max_episodes=eval_max_episodes,
            n_boot=n_boot,
        ),
        GPU_TASK,
    )
    reg = _res(
        register_op(
            recipe=recipe,
            mlflow_run_id=grpo.outputs["mlflow_run_id"],
            eval_report=ev.outputs["report"],
        ),
        CPU_TASK,
    )
    return reg.output


def compile_pipeline(path: str | Path = PIPELINE_YAML) -> Path:
    """Compile the pipeline to YAML and return the path."""
    compiler.Compiler().compile(training_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    print(compile_pipeline())
