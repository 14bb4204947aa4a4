"""KFP v2 pipeline ``flora-data-engine``: ingest -> validate (later: segment, caption, reward).

Compile: ``python -m components.data_engine_pipeline`` writes
``components/data_engine_pipeline.yaml`` (the spec a Kubeflow cluster runs). Locally it
runs with ``kfp.local`` (SubprocessRunner, no containers): see
``tests/components/test_data_engine_pipeline.py``.
"""

from pathlib import Path

from kfp import compiler, dsl

from components.data_engine import ingest_op, validate_op

PIPELINE_YAML = Path(__file__).with_suffix(".yaml")


@dsl.pipeline(
    name="flora-data-engine",
    description="Flora data engine: ingest and validate raw robot episodes.",
)
def data_engine_pipeline(dataset_path: str, strict: bool = False) -> list:
    """Returns the valid episode indices (what later steps may process)."""
    ingest = ingest_op(dataset_path=dataset_path)
    # The dataset can change under the same path: never reuse a cached ingest.
    ingest.set_caching_options(False)
    ingest.set_cpu_limit("2").set_memory_limit("4G")
    validate = validate_op(
        dataset_path=dataset_path,
        mlflow_run_id=ingest.outputs["mlflow_run_id"],
        manifest=ingest.outputs["manifest"],
        strict=strict,
    )
    validate.set_caching_options(False)
    validate.set_cpu_limit("2").set_memory_limit("4G")
    return validate.outputs["valid_episodes"]


def compile_pipeline(path: str | Path = PIPELINE_YAML) -> Path:
    """Compile the pipeline to YAML and return the path."""
    compiler.Compiler().compile(data_engine_pipeline, str(path))
    return Path(path)


if __name__ == "__main__":
    print(compile_pipeline())
