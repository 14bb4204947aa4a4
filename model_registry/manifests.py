"""Kubernetes manifests of ``infra/``: build an overlay and check it offline.

``build_overlay`` runs ``kubectl kustomize`` (kustomize is built into kubectl). The checks
need no cluster: core objects go through ``kubernetes-validate`` (the Kubernetes OpenAPI
schemas it ships), KServe's ``InferenceService`` / ``ServingRuntime`` through the JSON
schemas kept in ``infra/crds/``, and the serving policy every GPU pod must meet is checked
here: GPU limits equal to requests, readiness and liveness probes, non-root, no privilege
escalation, and no secret value written inline.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import yaml

INFRA = Path(__file__).resolve().parents[1] / "infra"
K8S_VERSION = "1.32.0"
CRD_SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.v1beta1.schema.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.v1alpha1.schema.json",
}
GPU = "nvidia.com/gpu"
SECRETISH = re.compile(r"(TOKEN|PASSWORD|SECRET|API_KEY|ACCESS_KEY)", re.I)


class ManifestError(RuntimeError):
    """An overlay that does not build or objects that fail their checks."""


def build_overlay(overlay: str | Path) -> list[dict[str, Any]]:
    """Objects of ``infra/<overlay>`` (``base``, ``overlays/dev`` or a name like ``dev``)."""
    path = Path(overlay)
    if not path.is_absolute():
        cand = INFRA / path
        path = cand if (cand / "kustomization.yaml").exists() else INFRA / "overlays" / path
    if not (path / "kustomization.yaml").exists():
        raise ManifestError(f"no kustomization.yaml in {path}")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ManifestError("kubectl (with its built-in kustomize) is not on PATH")
    res = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    if res.returncode != 0:
        raise ManifestError(f"kubectl kustomize {path}: {res.stderr.strip()}")
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@cache
def _crd_schema(name: str) -> dict[str, Any]:
    return json.loads((INFRA / "crds" / name).read_text())


def _where(obj: dict[str, Any]) -> str:
    md = obj.get("metadata", {})
    return f"{obj.get('kind')}/{md.get('namespace', '-')}/{md.get('name')}"


def schema_problems(obj: dict[str, Any]) -> list[str]:
    """Schema violations of one object (core: Kubernetes OpenAPI; CRDs: ``infra/crds``)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CRD_SCHEMAS:
        import jsonschema

        v = jsonschema.Draft202012Validator(_crd_schema(CRD_SCHEMAS[key]))
        return [
            f"{_where(obj)}: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in v.iter_errors(obj)
        ]
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{_where(obj)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{_where(obj)}: no schema for {key} ({e})"]
    return []


def _containers(obj: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label, container, pod spec) for every container an object would run."""
    kind = obj.get("kind")
    if kind == "InferenceService":
        pred = obj["spec"]["predictor"]
        yield "predictor.model", pred.get("model", {}), pred
    elif kind == "ServingRuntime":
        for c in obj["spec"].get("containers", []):
            yield f"runtime.{c.get('name')}", c, obj["spec"]
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        pod = obj["spec"]["template"]["spec"]
        for c in pod.get("containers", []):
            yield c.get("name", "?"), c, pod


def policy_problems(obj: dict[str, Any]) -> list[str]:
    """Serving policy: GPU pods have GPU limits and probes; every pod is non-root; no
    inline secrets (env values of secret-looking names, or a committed Secret's data)."""
    out: list[str] = []
    where = _where(obj)
    if obj.get("kind") == "Secret" and (obj.get("data") or obj.get("stringData")):
        out.append(f"{where}: a Secret with inline data is committed")
    for label, c, pod in _containers(obj):
        res = c.get("resources", {})
        gpu_req = res.get("requests", {}).get(GPU)
        gpu_lim = res.get("limits", {}).get(GPU)
        if gpu_req is not None or gpu_lim is not None:
            if gpu_lim is None or str(gpu_lim) != str(gpu_req or gpu_lim):
                out.append(f"{where} {label}: {GPU} limit must be set and equal the request")
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in c:
                    out.append(f"{where} {label}: GPU container without {probe}")
            if not pod.get("tolerations"):
                out.append(f"{where} {label}: GPU pod without tolerations")
        sc = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
        if not sc.get("runAsNonRoot"):
            out.append(f"{where} {label}: runAsNonRoot is not set")
        if c.get("securityContext", {}).get("allowPrivilegeEscalation", True):
            out.append(f"{where} {label}: allowPrivilegeEscalation is not false")
        for e in c.get("env", []):
            if SECRETISH.search(e.get("name", "")) and "value" in e:
                out.append(f"{where} {label}: env {e['name']} has an inline value")
    return out


def check_objects(objs: Iterable[dict[str, Any]]) -> list[str]:
    """Every schema and policy problem of a list of objects (empty when all pass)."""
    out: list[str] = []
    for o in objs:
        out += schema_problems(o)
        out += policy_problems(o)
    return out


__all__ = [
    "INFRA",
    "ManifestError",
    "build_overlay",
    "check_objects",
    "policy_problems",
    "schema_problems",
]
