"""A trained, registered model loads through the transformers backend, the MLflow pyfunc
and ``flora serve``, and answers an inference step's own request."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pandas as pd
import pytest

from tests.training.helpers import tiny_recipe
from training.sets import load_set
from training.sft import model_paths, train_sft


@pytest.fixture(scope="module")
def registered(seg_set, tiny_base, tmp_path_factory):
    """SFT of the tiny segmenter (LoRA), logged and registered; FLORA_HOME is private."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("home")
    mp.setenv("FLORA_HOME", str(home))
    mp.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    from flora.settings import get_settings

    get_settings.cache_clear()
    recipe = tiny_recipe("segmenter", tiny_base, max_steps=2, eval_every=100)
    res = train_sft(
        recipe,
        seg_set,
        tmp_path_factory.mktemp("run"),
        register=True,
        system_metrics=False,
        progress=False,
    )
    yield res
    get_settings.cache_clear()
    mp.undo()


def test_registered_with_alias_and_lineage(registered, seg_set) -> None:
    from mlflow import MlflowClient

    from flora.tracking import configure

    assert registered.registered_version == "1"
    configure()
    c = MlflowClient()
    mv = c.get_model_version_by_alias("flora-segmenter", "challenger")
    assert str(mv.version) == "1"
    for tag in (
        "flora.git_commit",
        "flora.data.md5",
        "flora.training_run_id",
        "flora.recipe",
        "flora.base",
        "flora.set.sha256",
    ):
        assert mv.tags.get(tag), tag
    assert mv.tags["flora.training_run_id"] == registered.run_id
    assert mv.tags["flora.recipe"] == "segmenter-tiny"
    run = c.get_run(registered.run_id)
    assert run.data.params["lora_rank"] == "32" and "loss" in run.data.metrics


def test_loads_through_backend_pyfunc_and_serve(registered, seg_set, tmp_path) -> None:
    import mlflow

    from flora.backends.openai_backend import OpenAIBackend
    from flora.backends.transformers_backend import TransformersBackend
    from model_registry.register import download_model
    from tests.backends.backend_helpers import start_server, stop_server
    from training.sets import encode_png

    local = download_model("segmenter", "challenger")
    base, adapter = model_paths(local)
    assert adapter is not None and (adapter / "adapter_model.safetensors").is_file()
    ex = load_set(seg_set)[0]
    req = ex.to_request()
    req.max_new_tokens = 8
    backend = TransformersBackend(base, adapter_path=adapter, device="cpu", vision_input="images")
    (ans,) = backend.generate([req])
    assert ans.ok and ans.text

    pyf = mlflow.pyfunc.load_model("models:/flora-segmenter@challenger")
    frame = pd.DataFrame(
        [
            {
                "prompt": req.prompt,
                "system": req.system,
                "images": json.dumps(
                    [base64.b64encode(encode_png(i)).decode() for i in req.images]
                ),
                "frame_times_us": json.dumps(req.frame_times_us),
                "max_new_tokens": 8,
            }
        ]
    )
    assert pyf.predict(frame)["text"].tolist() == [ans.text]

    server = start_server(base, tmp_path / "serve.log", "--adapter", str(adapter))
    try:
        client = OpenAIBackend(server.url, timeout_s=120, max_concurrency=1)
        (over_http,) = client.generate([req])
    finally:
        stop_server(server)
    assert over_http.ok and over_http.text == ans.text  # greedy: the same model answers alike


def test_nothing_half_written_is_logged(tmp_path) -> None:
    from model_registry.register import RegistryError, log_flora_model

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "flora_model.json").write_text(
        json.dumps(
            {
                "format": "flora-model/1",
                "model": "captioner",
                "kind": "full",
                "base": "tiny",
                "files": {"model/model.safetensors": "0" * 64},
            }
        )
    )
    with pytest.raises(RegistryError, match="missing or does not match"):
        log_flora_model(tmp_path / "m")


def test_retried_eval_never_tags_the_version(registered, seg_set, capsys) -> None:
    """The promotion gates read a version's eval.* tags as greedy figures: an evaluation
    through the engine's retries (--attempts 2) logs its run, tagged, and leaves them alone."""
    from mlflow import MlflowClient

    from flora.cli import app
    from flora.cli_common import run_app
    from flora.tracking import configure

    args = ["eval", "model", "--model", "segmenter", "--version", "1", "--set", str(seg_set),
            "--episodes", "1", "--bootstrap", "0", "--attempts", "2"]  # fmt: skip
    assert run_app(app, args) == 0
    out = capsys.readouterr().out
    assert "--attempts 2: version 1's eval.* tags left as they were" in out
    configure()
    c = MlflowClient()
    tags = c.get_model_version("flora-segmenter", "1").tags
    assert not [k for k in tags if k.startswith("eval.")]
    rid = out.split("logged to MLflow run ")[1].split()[0]
    run = c.get_run(rid)
    assert run.data.tags["flora.eval.attempts"] == "2" and "eval.parse_rate" in run.data.metrics


def test_deploy_points_vllm_at_the_folder_mlflow_stored(registered) -> None:
    """The pods load ``/mnt/models/<the version's folder>``: MLflow names the stored folder
    after the exported directory (``model``), not the artifact key the manifests used."""
    import mlflow
    from mlflow import MlflowClient

    from flora.tracking import configure
    from model_registry.deploy import CHECKPOINT_DIR, render_manifest

    configure()
    isvc = render_manifest("segmenter", registered.registered_version)
    args = isvc["spec"]["predictor"]["model"]["args"]
    (lora,) = [a for a in args if a.startswith("--lora-modules=")]
    path = lora.split("=", 2)[2]
    assert CHECKPOINT_DIR not in path and path.startswith("/mnt/models/artifacts/")
    uri = MlflowClient().get_model_version_download_uri("flora-segmenter", "1")
    local = mlflow.artifacts.download_artifacts(artifact_uri=uri)
    assert (Path(local) / path.removeprefix("/mnt/models/") / "adapter_config.json").is_file()


def test_a_retried_registration_keeps_the_version(registered) -> None:
    """register_model from the same training run again (an Airflow/KFP retry after it had
    registered): the same version comes back, no second challenger appears."""
    from mlflow import MlflowClient

    from flora.tracking import configure
    from model_registry.register import register_model
    from training.evaluate import logged_model_uri

    configure()
    again = register_model("segmenter", logged_model_uri(registered.run_id), registered.run_id,
                           tags={"flora.retry": "1"})  # fmt: skip
    c = MlflowClient()
    assert again == registered.registered_version
    assert len(c.search_model_versions("name='flora-segmenter'")) == 1
    assert c.get_model_version("flora-segmenter", again).tags["flora.retry"] == "1"
