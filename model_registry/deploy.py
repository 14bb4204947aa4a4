"""Render (and, with a cluster, apply) the inference-pod manifest of a registry version.

``flora registry deploy <model> [ref]`` takes the version behind ``ref`` (default the
``champion``), builds the overlay's ``InferenceService`` for that model, points its
``storageUri`` at the version's artifacts as MLflow reports them
(``get_model_version_download_uri``: ``s3://…`` / ``mlflow-artifacts://…`` on the
production server, ``file://…`` on the embedded SQLite store), stamps the version, run id
and lineage as annotations, checks the result offline (``manifests.check_objects``) and
writes it. When ``kubectl`` has a current context it then runs a server-side dry run and
applies; otherwise the manifest is written and the action says so. After ``flora registry
rollback`` the same command renders the restored champion, which is how a deployment is
rolled back.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from model_registry.manifests import build_overlay, check_objects
from model_registry.promotion import CHAMPION, _client, _resolve, registered_name
from model_registry.register import RegistryError


@dataclass
class Deployment:
    """What :func:`deploy` produced."""

    model: str
    version: str
    storage_uri: str
    manifest: str
    overlay: str
    action: str  # "written (no cluster configured)" | "applied" | "dry-run only"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The exported model folder as the manifests name it; :func:`render_manifest` puts the
#: version's own folder in its place (MLflow names it after the logged directory).
CHECKPOINT_DIR = "/mnt/models/artifacts/checkpoint"


def checkpoint_dir(uri: str) -> str:
    """Where a version's exported model folder lies under ``/mnt/models`` (the storage
    initializer's copy of ``uri``), read from the version's ``MLmodel``."""
    import mlflow

    from model_registry.register import CHECKPOINT_KEY

    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=f"{uri.rstrip('/')}/MLmodel")
        spec = yaml.safe_load(Path(local).read_text())
        rel = spec["flavors"]["python_function"]["artifacts"][CHECKPOINT_KEY]["path"]
    except Exception as e:  # noqa: BLE001 - any gap means it is no Flora model to serve
        raise RegistryError(f"{uri} is not a Flora MLflow model (no {CHECKPOINT_KEY!r} "
                            f"artifact in its MLmodel): {e}") from e  # fmt: skip
    return f"/mnt/models/{str(rel).strip('/')}"


def render_manifest(model: str, ref: str | int = CHAMPION, overlay: str = "dev") -> dict[str, Any]:
    """The checked ``InferenceService`` of ``model`` at version/alias ``ref``."""
    name = registered_name(model)
    if name == "flora-policy":
        raise RegistryError("the policy is served by the robot runtime, not an inference pod")
    client = _client()
    version = _resolve(client, name, ref)
    mv = client.get_model_version(name, version)
    uri = client.get_model_version_download_uri(name, version)
    objs = [
        o
        for o in build_overlay(overlay)
        if o.get("kind") == "InferenceService" and o["metadata"]["name"] == name
    ]
    if len(objs) != 1:
        raise RegistryError(f"overlay {overlay!r} has no InferenceService {name}")
    isvc = copy.deepcopy(objs[0])
    isvc["spec"]["predictor"]["model"]["storageUri"] = uri
    # vLLM reads the weights where the storage initializer put this version's folder.
    where = checkpoint_dir(uri)
    spec = isvc["spec"]["predictor"]["model"]
    spec["args"] = [str(a).replace(CHECKPOINT_DIR, where) for a in spec.get("args", [])]
    ann = isvc["metadata"].setdefault("annotations", {})
    ann["flora.ai/model-version"] = str(version)
    ann["flora.ai/run-id"] = str(mv.run_id or "")
    for k, v in mv.tags.items():
        if k in ("flora.git_commit", "flora.dvc_md5", "flora.recipe", "flora.base"):
            ann[f"flora.ai/{k.removeprefix('flora.').replace('_', '-')}"] = str(v)
    problems = check_objects([isvc])
    if problems:
        raise RegistryError(f"rendered manifest for {name} v{version} fails: {problems}")
    return isvc


def _cluster_configured() -> bool:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return False
    res = subprocess.run(
        [kubectl, "config", "current-context"], capture_output=True, text=True, timeout=30
    )
    return res.returncode == 0 and bool(res.stdout.strip())


def deploy(
    model: str,
    ref: str | int = CHAMPION,
    *,
    overlay: str = "dev",
    out: str | Path | None = None,
    apply: bool = True,
) -> Deployment:
    """Render, check and write the manifest; dry-run and apply when a cluster is set."""
    from flora.settings import get_settings

    isvc = render_manifest(model, ref, overlay)
    name = isvc["metadata"]["name"]
    version = isvc["metadata"]["annotations"]["flora.ai/model-version"]
    path = Path(out) if out else get_settings().home / "deploy" / overlay / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(isvc, sort_keys=False))
    tmp.replace(path)
    action = "written (no cluster configured)"
    if apply and _cluster_configured():
        for extra, label in ((["--dry-run=server"], "dry-run"), ([], "apply")):
            res = subprocess.run(
                ["kubectl", "apply", *extra, "-f", str(path)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if res.returncode != 0:
                raise RegistryError(f"kubectl {label} of {path} failed: {res.stderr.strip()}")
        action = "applied"
    elif not apply:
        action = "written (--no-apply)"
    uri = isvc["spec"]["predictor"]["model"]["storageUri"]
    return Deployment(name, version, uri, str(path), overlay, action)


__all__ = ["CHECKPOINT_DIR", "Deployment", "checkpoint_dir", "deploy", "render_manifest"]
