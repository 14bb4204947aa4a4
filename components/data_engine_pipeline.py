"""KFP v2 pipeline ``flora-data-engine``: ingest -> validate -> plan -> [per shard: segment
-> caption -> rewards] -> summary -> check shards -> curate -> export -> report, under an
exit handler.

Compile: ``python -m components.data_engine_pipeline`` writes
``components/data_engine_pipeline.yaml`` (the spec a Kubeflow cluster runs). Locally it
runs with ``kfp.local`` (SubprocessRunner, no containers): see
``tests/components/test_data_engine_pipeline.py``.

Same steps and order as the Airflow DAG ``flora_data_engine``, and the same shards: the
engine steps fan out with ``dsl.ParallelFor`` over ``plan_op``'s shards, the three
rewarder modes after captioning in parallel; ``summary_op`` collects every shard's tables
(``dsl.Collected``) and merges them into one artifact per table for ``curate_op``
(after ``check_shards_op``, which fails the run when a shard hit bad input),
``export_op`` and ``report_op``. MLflow: ``open_run_op`` opens the parent run, every task
a child run, and the exit handler ``finalize_op`` closes the parent FAILED when anything
failed (``docs/orchestration.md`` §3).

On a cluster every task mounts the shared PVC and takes its environment from the
pipeline-env ConfigMap and the object-store Secret; segment, caption and the rewards run
on the CUDA image with a GPU (:func:`components.platform.on_cluster`).
"""

from pathlib import Path

from kfp import compiler, dsl

from components.data_engine import (
    caption_op,
    check_shards_op,
    curate_op,
    export_op,
    finalize_op,
    ingest_op,
    open_run_op,
    plan_op,
    report_op,
    reward_op,
    segment_op,
    summary_op,
    validate_op,
)
from components.platform import on_cluster
from flora.engine import REWARD_MODES

PIPELINE_YAML = Path(__file__).with_suffix(".yaml")
#: Limits of the light steps (kept in the compiled YAML; ``kfp.local`` ignores them). The
#: heavy steps (segment, caption, rewards) are GPU steps: CUDA image, ``nvidia.com/gpu``
#: and the GPU limits from settings, as the Airflow DAG's production pods. Every task:
#: caching off (a dataset can change under the same path), the shared PVC, the
#: pipeline-env ConfigMap and the object-store Secret (:mod:`components.platform`).
CPU_TASK = {"cpu": "2", "memory": "4G"}
#: Retries of every task but the two that open and close the MLflow parent run (a retried
#: ``open_run_op`` would open a second parent), as the Airflow DAG's: a retried pod starts
#: from empty output artifacts, so it cannot duplicate rows.
RETRIES = 2


@dsl.pipeline(
    name="flora-data-engine",
    description="Flora data engine: ingest, validate, segment, caption and reward robot episodes.",
)
def data_engine_pipeline(
    dataset_path: str,
    shards: int = 2,
    strict: bool = False,
    vlm_max_episodes: int = 0,
    max_attempts: int = 3,
    max_new_tokens: int = 0,
    rubric: str = "",
    curation_rules: str = "",
    dvc_repo: str = "",
):
    """The data engine over ``shards`` episode shards (``shards[k]`` takes the sorted valid
    episodes ``[k::shards]``). The per-table summary is the ``summary_op`` artifact and
    the MLflow parent run's ``engine_summary.json`` (a pipeline inside an exit handler
    cannot return it).

    ``vlm_max_episodes`` / ``max_new_tokens``: 0 means all episodes / each step's default
    budget; ``rubric``: empty means the dataset's ground-truth family rubrics if present;
    ``curation_rules``: empty means the default rules; ``dvc_repo``: empty means the
    mixture is not DVC-versioned.
    """
    job_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    vlm = {
        "vlm_max_episodes": vlm_max_episodes,
        "max_attempts": max_attempts,
        "max_new_tokens": max_new_tokens,
    }
    opened = open_run_op(
        dataset_path=dataset_path, job_id=job_id, shards=shards, strict=strict, rubric=rubric,
        curation_rules=curation_rules, dvc_repo=dvc_repo, **vlm,
    )  # fmt: skip
    on_cluster(opened, resources=CPU_TASK)
    run_id = opened.output
    # The exit handler closes the MLflow parent run whatever happens inside: FAILED when
    # any task failed (KFP's final state of the group, and every child run's status).
    finalize = on_cluster(finalize_op(job_id=job_id), resources=CPU_TASK)
    light, heavy = {"resources": CPU_TASK, "retries": RETRIES}, {"gpu": True, "retries": RETRIES}
    with dsl.ExitHandler(finalize, name="data-engine"):
        ingest = on_cluster(ingest_op(dataset_path=dataset_path, mlflow_run_id=run_id), **light)
        validate = on_cluster(
            validate_op(
                dataset_path=dataset_path,
                mlflow_run_id=run_id,
                manifest=ingest.outputs["manifest"],
                strict=strict,
            ),
            **light,
        )
        valid = validate.outputs["valid_episodes"]
        plan = plan_op(valid_episodes=valid, shards=shards, vlm_max_episodes=vlm_max_episodes)
        on_cluster(plan, **light)
        # Each iteration takes its episodes from its shard (the loop item), never from
        # another task's output: kfp.local (2.17) hands a loop body the loop item in place
        # of every task-output parameter it gets.
        with dsl.ParallelFor(plan.output, name="shard") as shard:
            common = {"dataset_path": dataset_path, "mlflow_run_id": run_id, "shard": shard}
            segment = on_cluster(segment_op(**common), **heavy)
            caption = on_cluster(
                caption_op(events=segment.outputs["events"], **common, **vlm), **heavy
            )
            rewards = {}
            for mode in REWARD_MODES:
                t = reward_op(mode=mode, rubric=rubric, captions=caption.outputs["captions"],
                              **common, **vlm)  # fmt: skip
                t.set_display_name(f"reward-{mode}")
                rewards[mode] = on_cluster(t, **heavy)
        collected = {"segment": segment.outputs, "caption": caption.outputs} | {
            m: rewards[m].outputs for m in REWARD_MODES}  # fmt: skip
        summary = summary_op(
            mlflow_run_id=run_id,
            dataset_path=dataset_path,
            valid_episodes=valid,
            events_shards=dsl.Collected(segment.outputs["events"]),
            captions_shards=dsl.Collected(caption.outputs["captions"]),
            **{f"{m}_shards": dsl.Collected(rewards[m].outputs["table"]) for m in REWARD_MODES},
            **{f"{k}_reports": dsl.Collected(o["report"]) for k, o in collected.items()},
        )
        on_cluster(summary, **light)
        # Fails the run, naming the shards, after the summary recorded the others' work;
        # not retried (it only reads the summary's verdict).
        check = check_shards_op(failed_shards=summary.outputs["failed_shards"],
                                shards=summary.outputs["shards"])  # fmt: skip
        on_cluster(check, resources=CPU_TASK)
        tables = {
            "events": summary.outputs["events"],
            "captions": summary.outputs["captions"],
            "outcome": summary.outputs["outcome"],
            "dense": summary.outputs["dense"],
            "rubric": summary.outputs["rubric"],
        }
        curate = curate_op(
            dataset_path=dataset_path,
            mlflow_run_id=run_id,
            valid_episodes=valid,
            curation_rules=curation_rules,
            dvc_repo=dvc_repo,
            **tables,
        ).after(check)
        on_cluster(curate, **light)
        mixture = curate.outputs["mixture"]
        export = export_op(
            dataset_path=dataset_path,
            mlflow_run_id=run_id,
            curate=curate.outputs["Output"],
            mixture=mixture,
            **tables,
        )
        on_cluster(export, **light)
        report = report_op(
            dataset_path=dataset_path,
            mlflow_run_id=run_id,
            valid_episodes=valid,
            curate=curate.outputs["Output"],
            export=export.outputs["Output"],
            mixture=mixture,
            **tables,
        )
        on_cluster(report, **light)


def compile_pipeline(path: str | Path = PIPELINE_YAML) -> Path:
    """Compile the pipeline to YAML and return the path."""
    compiler.Compiler().compile(data_engine_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    print(compile_pipeline())
