"""KFP v2 pipeline ``flora-data-engine``: ingest -> validate -> segment -> caption -> rewards
-> summary -> curate -> export -> report.

Compile: ``python -m components.data_engine_pipeline`` writes
``components/data_engine_pipeline.yaml`` (the spec a Kubeflow cluster runs). Locally it
runs with ``kfp.local`` (SubprocessRunner, no containers): see
``tests/components/test_data_engine_pipeline.py``.

Same steps and order as the Airflow DAG ``flora_data_engine``; the three rewarder modes
run after captioning, in parallel on a cluster, and ``summary_op`` joins them; then
``curate_op`` (curated mixture artifact), ``export_op`` (LeRobot export artifact) and
``report_op`` (HTML reports artifact). The pipeline returns the per-table summary (rows,
failures, location, validity).

On a cluster every task mounts the shared PVC and takes its environment from the
pipeline-env ConfigMap and the object-store Secret; segment, caption and the rewards run
on the CUDA image with a GPU (:func:`components.platform.on_cluster`).
"""

from pathlib import Path

from kfp import compiler, dsl

from components.data_engine import (
    caption_op,
    curate_op,
    export_op,
    ingest_op,
    report_op,
    reward_op,
    segment_op,
    summary_op,
    validate_op,
)
from components.platform import on_cluster

PIPELINE_YAML = Path(__file__).with_suffix(".yaml")
#: Limits of the light steps (kept in the compiled YAML; ``kfp.local`` ignores them). The
#: heavy steps (segment, caption, rewards) are GPU steps: CUDA image, ``nvidia.com/gpu``
#: and the GPU limits from settings, as the Airflow DAG's production pods. Every task:
#: caching off (a dataset can change under the same path), the shared PVC, the
#: pipeline-env ConfigMap and the object-store Secret (:mod:`components.platform`).
CPU_TASK = {"cpu": "2", "memory": "4G"}


@dsl.pipeline(
    name="flora-data-engine",
    description="Flora data engine: ingest, validate, segment, caption and reward robot episodes.",
)
def data_engine_pipeline(
    dataset_path: str,
    strict: bool = False,
    vlm_max_episodes: int = 0,
    max_attempts: int = 3,
    max_new_tokens: int = 0,
    rubric: str = "",
    curation_rules: str = "",
    dvc_repo: str = "",
) -> dict:
    """Returns one summary per table (``flora.engine.engine_summary``).

    ``vlm_max_episodes`` / ``max_new_tokens``: 0 means all episodes / each step's default
    budget; ``rubric``: empty means the dataset's ground-truth family rubrics if present;
    ``curation_rules``: empty means the default rules; ``dvc_repo``: empty means the
    mixture is not DVC-versioned.
    """
    ingest = on_cluster(ingest_op(dataset_path=dataset_path), resources=CPU_TASK)
    validate = on_cluster(
        validate_op(
            dataset_path=dataset_path,
            mlflow_run_id=ingest.outputs["mlflow_run_id"],
            manifest=ingest.outputs["manifest"],
            strict=strict,
        ),
        resources=CPU_TASK,
    )
    run_id = ingest.outputs["mlflow_run_id"]
    valid = validate.outputs["valid_episodes"]
    segment = on_cluster(
        segment_op(dataset_path=dataset_path, mlflow_run_id=run_id, valid_episodes=valid),
        gpu=True,
    )
    vlm = {
        "vlm_max_episodes": vlm_max_episodes,
        "max_attempts": max_attempts,
        "max_new_tokens": max_new_tokens,
    }
    caption = on_cluster(
        caption_op(
            dataset_path=dataset_path,
            mlflow_run_id=run_id,
            valid_episodes=valid,
            events=segment.outputs["events"],
            **vlm,
        ),
        gpu=True,
    )
    rewards = {}
    for mode in ("outcome", "dense", "rubric"):
        t = reward_op(
            mode=mode,
            dataset_path=dataset_path,
            mlflow_run_id=run_id,
            valid_episodes=valid,
            rubric=rubric,
            **vlm,
        )
        t.set_display_name(f"reward-{mode}")
        rewards[mode] = on_cluster(t, gpu=True).after(caption)
    summary = summary_op(
        mlflow_run_id=run_id,
        segment=segment.outputs["report"],
        caption=caption.outputs["report"],
        outcome=rewards["outcome"].outputs["report"],
        dense=rewards["dense"].outputs["report"],
        rubric=rewards["rubric"].outputs["report"],
    )
    on_cluster(summary, resources=CPU_TASK)
    tables = {
        "events": segment.outputs["events"],
        "captions": caption.outputs["captions"],
        "outcome": rewards["outcome"].outputs["table"],
        "dense": rewards["dense"].outputs["table"],
        "rubric": rewards["rubric"].outputs["table"],
    }
    curate = curate_op(
        dataset_path=dataset_path,
        mlflow_run_id=run_id,
        valid_episodes=valid,
        curation_rules=curation_rules,
        dvc_repo=dvc_repo,
        **tables,
    )
    on_cluster(curate, resources=CPU_TASK).after(summary)
    mixture = curate.outputs["mixture"]
    export = export_op(
        dataset_path=dataset_path,
        mlflow_run_id=run_id,
        curate=curate.outputs["Output"],
        mixture=mixture,
        **tables,
    )
    on_cluster(export, resources=CPU_TASK)
    report = report_op(
        dataset_path=dataset_path,
        mlflow_run_id=run_id,
        valid_episodes=valid,
        curate=curate.outputs["Output"],
        export=export.outputs["Output"],
        mixture=mixture,
        **tables,
    )
    on_cluster(report, resources=CPU_TASK)
    return summary.outputs["Output"]


def compile_pipeline(path: str | Path = PIPELINE_YAML) -> Path:
    """Compile the pipeline to YAML and return the path."""
    compiler.Compiler().compile(data_engine_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    print(compile_pipeline())
