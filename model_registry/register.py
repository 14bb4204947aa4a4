"""Logging a trained Flora model to MLflow and registering it (alias ``challenger``).

A Flora model is logged as an MLflow **pyfunc** model whose artifact ``checkpoint`` is the
exported model directory of :func:`training.sft.train_sft` (``flora_model.json`` +
``model/`` full safetensors weights with tokenizer and processor, or ``adapter/`` PEFT
adapter + ``base/``). pyfunc rather than the transformers flavour because the flavour
cannot carry a PEFT adapter with a locally built base, and because prediction must go
through Flora's own backend (the one prompt path): ``predict`` runs
:class:`flora.backends.transformers_backend.TransformersBackend`.

Registration (:func:`register_model`) verifies the exported directory's manifest (every
file's sha256) before anything is created, so a half-written model is never registered;
each version carries the lineage tags (git commit, DVC md5 of the data, set and training
run ids, recipe, base) and gets the ``challenger`` alias. Promotion gates, ``champion``
and rollback are the lifecycle's (DESIGN §3.9).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MODEL_NAMES = {
    "segmenter": "flora-segmenter",
    "captioner": "flora-captioner",
    "rewarder": "flora-rewarder",
}
ARTIFACT_NAME = "model"
CHECKPOINT_KEY = "checkpoint"
CHALLENGER = "challenger"


class RegistryError(RuntimeError):
    """A model that cannot be logged, registered or loaded."""


def _signature():
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema(
        [
            ColSpec("string", "prompt"),
            ColSpec("string", "system", required=False),
            # JSON list of base64 PNG frames, prompt order.
            ColSpec("string", "images", required=False),
            # JSON list of frame times (µs) or null.
            ColSpec("string", "frame_times_us", required=False),
            ColSpec("long", "max_new_tokens", required=False),
        ]
    )
    return ModelSignature(inputs=inputs, outputs=Schema([ColSpec("string", "text")]))


def _pyfunc_class():
    import mlflow.pyfunc

    class FloraVLM(mlflow.pyfunc.PythonModel):
        """Generation through Flora's transformers backend on the logged checkpoint."""

        def load_context(self, context) -> None:  # noqa: ANN001 - MLflow's signature
            from flora.backends.transformers_backend import TransformersBackend
            from training.sft import model_paths

            path, adapter = model_paths(context.artifacts[CHECKPOINT_KEY])
            self.backend = TransformersBackend(path, adapter_path=adapter, vision_input="images")

        def predict(self, context, model_input, params=None):  # noqa: ANN001
            import base64

            import pandas as pd

            from flora.backends.base import VLMRequest
            from training.sets import decode_png

            reqs = []
            for r in model_input.to_dict("records"):
                imgs = [
                    decode_png(base64.b64decode(b)) for b in json.loads(r.get("images") or "[]")
                ]
                times = json.loads(r.get("frame_times_us") or "null")
                reqs.append(
                    VLMRequest(
                        prompt=r["prompt"],
                        images=imgs,
                        frame_times_us=times,
                        system=r.get("system") or None,
                        max_new_tokens=int(r.get("max_new_tokens") or 256),
                    )
                )
            return pd.DataFrame({"text": [x.text for x in self.backend.generate(reqs)]})

    return FloraVLM


def log_flora_model(model_dir: str | Path, *, name: str = ARTIFACT_NAME) -> str:
    """Log an exported model dir to the active MLflow run; returns the model URI."""
    import mlflow

    from flora.tracking import pinned_requirements
    from training.sft import verify_model_dir

    try:
        man = verify_model_dir(model_dir)
    except Exception as e:  # noqa: BLE001 - any defect means: do not log
        raise RegistryError(f"refusing to log {model_dir}: {e}") from e
    info = mlflow.pyfunc.log_model(
        name=name,
        python_model=_pyfunc_class()(),
        artifacts={CHECKPOINT_KEY: str(Path(model_dir).resolve())},
        signature=_signature(),
        pip_requirements=pinned_requirements(
            "torch", "transformers", "peft", "safetensors", "pillow"
        ),
        metadata={"flora_model": man["model"], "kind": man["kind"], "base": man["base"]},
    )
    return info.model_uri


def _checkpoint_in(root: Path) -> Path:
    """The exported model folder inside a downloaded MLflow model (``artifacts/<name>``)."""
    found = sorted((root / "artifacts").glob("*/flora_model.json"))
    if not found:
        raise RegistryError(f"{root} is not a Flora model (no artifacts/*/flora_model.json)")
    return found[0].parent


def register_model(
    model: str,
    model_uri: str,
    run_id: str,
    *,
    tags: Mapping[str, Any] | None = None,
    alias: str = CHALLENGER,
) -> str:
    """Register the logged model ``model_uri`` (from :func:`log_flora_model`, training run
    ``run_id``) as ``flora-<model>``; returns the version.

    The logged checkpoint must carry a complete manifest (checked on the logged copy);
    the version gets the lineage ``tags`` and the run id, then the ``alias``. Idempotent per
    training run: a version already registered from ``run_id`` is returned (tags and alias
    set again), so a retried registration adds no second version.
    """
    import mlflow
    from mlflow import MlflowClient

    from flora.tracking import configure

    if model not in MODEL_NAMES:
        raise RegistryError(f"unknown model {model!r}; expected one of {list(MODEL_NAMES)}")
    configure()
    client = MlflowClient()
    from training.sft import verify_model_dir

    try:
        verify_model_dir(_checkpoint_in(Path(mlflow.artifacts.download_artifacts(model_uri))))
    except Exception as e:  # noqa: BLE001
        raise RegistryError(f"run {run_id}: logged model is incomplete, not registered: {e}") from e
    name = MODEL_NAMES[model]
    all_tags = {str(k): str(v) for k, v in (tags or {}).items()}
    all_tags["flora.training_run_id"] = run_id
    for mv in client.search_model_versions(f"name='{name}'"):
        if mv.tags.get("flora.training_run_id") == run_id:
            # A retried registration (its task failed after this line last time): the same
            # training run is the same model, so it keeps its version instead of a new one.
            for k, v in all_tags.items():
                client.set_model_version_tag(name, mv.version, k, v)
            client.set_registered_model_alias(name, alias, mv.version)
            return str(mv.version)
    mv = mlflow.register_model(model_uri, name, tags=all_tags)
    client.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)


def download_model(model: str, ref: str = CHALLENGER) -> Path:
    """Local exported-model dir of ``flora-<model>`` at alias or version ``ref``."""
    import mlflow

    from flora.tracking import configure

    configure()
    name = MODEL_NAMES.get(model, model)
    at = f"models:/{name}/{ref}" if str(ref).isdigit() else f"models:/{name}@{ref}"
    try:
        root = Path(mlflow.artifacts.download_artifacts(at))
    except Exception as e:  # noqa: BLE001
        raise RegistryError(f"cannot download {at}: {e}") from e
    return _checkpoint_in(root)


__all__ = [
    "CHALLENGER",
    "MODEL_NAMES",
    "RegistryError",
    "download_model",
    "log_flora_model",
    "register_model",
]
