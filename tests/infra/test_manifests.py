"""infra/: every overlay builds, validates offline, and meets the serving policy."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from flora.orchestration import POD_LABELS
from model_registry.manifests import (
    INFRA,
    build_overlay,
    check_objects,
    policy_problems,
    schema_problems,
)

OVERLAYS = ["base", "dev", "prod"]


@pytest.fixture(scope="module", params=OVERLAYS)
def objs(request):
    return request.param, build_overlay(request.param)


def _isvc(objs, model):
    (o,) = [x for x in objs if x["kind"] == "InferenceService" and x["metadata"]["name"] == model]
    return o


def test_overlay_builds_and_every_object_passes(objs):
    name, items = objs
    kinds = sorted({o["kind"] for o in items})
    assert {"InferenceService", "ServingRuntime", "NetworkPolicy", "Deployment",
            "StatefulSet", "ConfigMap", "Namespace"} <= set(kinds)  # fmt: skip
    assert check_objects(items) == []


def test_three_flora_models_on_gpus_with_the_seeds_bases(objs):
    _, items = objs
    seg = _isvc(items, "flora-segmenter")["spec"]["predictor"]
    args = seg["model"]["args"]
    assert "--model=Qwen/Qwen3.5-9B" in args and "--enable-lora" in args
    assert "--max-lora-rank=32" in args
    for m in ("flora-segmenter", "flora-captioner", "flora-rewarder"):
        p = _isvc(items, m)["spec"]["predictor"]
        lim = p["model"]["resources"]["limits"]["nvidia.com/gpu"]
        assert int(lim) >= 1 and p["tolerations"] and p["nodeSelector"]
        assert p["model"]["readinessProbe"] and p["model"]["livenessProbe"]
        assert p["securityContext"]["runAsNonRoot"] is True


def test_pipelines_send_frames_the_way_the_models_were_trained(objs):
    from flora.backends.processing import TRAINING_VISION_INPUT

    _, items = objs
    (env,) = [o for o in items if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == "flora-pipeline-env"]  # fmt: skip
    # vLLM reads a video_url as Qwen's video layout; Flora's trainers render stamped images.
    assert TRAINING_VISION_INPUT == "images"
    assert env["data"]["FLORA_OPENAI_VIDEO"] == "off"


def test_overlays_differ_where_they_should():
    dev, prod = build_overlay("dev"), build_overlay("prod")
    assert {o["metadata"].get("namespace") for o in dev if o["kind"] != "Namespace"} == {
        "flora-dev"
    }
    cap_dev = _isvc(dev, "flora-captioner")["spec"]["predictor"]
    cap_prod = _isvc(prod, "flora-captioner")["spec"]["predictor"]
    assert cap_dev["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert cap_prod["model"]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert cap_prod["minReplicas"] == 2
    assert "nvidia.com/gpu.product" in cap_prod["nodeSelector"]


def test_only_pipelines_reach_the_inference_pods():
    items = build_overlay("base")
    (np_,) = [o for o in items if o["metadata"]["name"] == "flora-inference-ingress"]
    (rule,) = np_["spec"]["ingress"]
    assert rule["from"]
    for peer in rule["from"]:  # this namespace's pipelines, and those of airflow / kubeflow
        assert peer["podSelector"]["matchLabels"] == {"flora.ai/role": "pipeline"}
    assert np_["spec"]["podSelector"]["matchLabels"] == {"flora.ai/role": "inference"}


def test_checks_catch_what_they_claim_to():
    items = build_overlay("base")
    isvc = copy.deepcopy(_isvc(items, "flora-captioner"))
    model = isvc["spec"]["predictor"]["model"]
    del model["resources"]["limits"]["nvidia.com/gpu"]
    del model["livenessProbe"]
    model["env"] = [{"name": "HF_TOKEN", "value": "hf_abc"}]
    isvc["spec"]["predictor"]["securityContext"]["runAsNonRoot"] = False
    del model["securityContext"]["runAsNonRoot"]  # container setting would override the pod's
    probs = " | ".join(policy_problems(isvc))
    for needle in ("limit must be set", "livenessProbe", "inline value", "runAsNonRoot"):
        assert needle in probs
    bad = copy.deepcopy(_isvc(items, "flora-rewarder"))
    bad["spec"]["predictor"]["model"]["storgeUri"] = "s3://typo"
    assert any("storgeUri" in p for p in schema_problems(bad))
    bad["spec"]["predictor"]["model"]["storageUri"] = "/no/scheme"
    assert any("storageUri" in p for p in schema_problems(bad))
    dep = copy.deepcopy([o for o in items if o["kind"] == "Deployment"][0])
    dep["spec"]["replicas"] = "two"
    assert schema_problems(dep)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"},
              "data": {"password": "aHVudGVyMg=="}}  # fmt: skip
    assert "inline data" in " ".join(policy_problems(secret))


# --- NetworkPolicy semantics, enough to ask "may pod A open port P on pod B?" offline -------

HELM_VALUES = INFRA / "helm" / "airflow-values.yaml"
DEPLOYMENT_DOC = INFRA.parent / "docs" / "deployment.md"
NS_LABEL = "kubernetes.io/metadata.name"


def _selects(selector, labels) -> bool:
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, vals = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in vals,
            "NotIn": key not in labels or labels[key] not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_admits(peer, policy_ns, src_ns, src_labels) -> bool:
    if "ipBlock" in peer:
        return False
    ns_sel = peer.get("namespaceSelector")
    if ns_sel is None:  # a bare podSelector: the policy's own namespace
        if src_ns != policy_ns:
            return False
    elif not _selects(ns_sel, {NS_LABEL: src_ns}):
        return False
    return "podSelector" not in peer or _selects(peer["podSelector"], src_labels)


def _isolating(policies, ns, labels):
    return [
        p for p in policies
        if p["metadata"]["namespace"] == ns
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], labels)
    ]  # fmt: skip


def _admits(policies, dst_ns, dst_labels, src_ns, src_labels, port) -> bool:
    """Kubernetes' rule: allowed when no policy isolates the pod, or any rule of any policy
    selecting it admits the source on that TCP port."""
    selecting = _isolating(policies, dst_ns, dst_labels)
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            if peers and not any(_peer_admits(x, dst_ns, src_ns, src_labels) for x in peers):
                continue
            ports = rule.get("ports") or []
            if ports and not any(
                x.get("port") in (None, port) and x.get("protocol", "TCP") == "TCP" for x in ports
            ):
                continue
            return True
    return False


def _helm():
    text = HELM_VALUES.read_text()
    m = re.search(r"helm upgrade --install (\S+) \S+ -n (\S+) -f infra/helm/airflow-values", text)
    assert m, "the install command in the values file names the release and namespace"
    return m.group(1), m.group(2), yaml.safe_load(text)


# component label -> its values key; the official chart labels every pod it runs (the
# KubernetesExecutor pod template included) tier=airflow, component=<c>, release=<release>
# plus `labels` merged under the component's own `labels` (chart/templates/*, chart/files/
# pod-template-file.kubernetes-helm-yaml). helm is not installed here, so this is the model.
CHART_COMPONENTS = {
    "api-server": "apiServer", "scheduler": "scheduler", "triggerer": "triggerer",
    "dag-processor": "dagProcessor", "worker": "workers", "statsd": "statsd",
    "run-airflow-migrations": "migrateDatabaseJob", "create-user": "createUserJob",
}  # fmt: skip
# what the release serves inside itself, at the chart's default `ports:`
AIRFLOW_PORTS = {"api-server": 8080, "worker": 8793, "triggerer": 8794, "statsd": 9125,
                 "postgresql": 5432}  # fmt: skip


def _airflow_pods():
    release, ns, values = _helm()
    common = values.get("labels") or {}
    pods = {
        c: {"tier": "airflow", "component": c, "release": release, **common,
            **((values.get(key) or {}).get("labels") or {})}
        for c, key in CHART_COMPONENTS.items()
    }  # fmt: skip
    if (values.get("postgresql") or {}).get("enabled"):  # Bitnami subchart's own labels
        pods["postgresql"] = {"app.kubernetes.io/name": "postgresql",
                              "app.kubernetes.io/instance": release,
                              "app.kubernetes.io/component": "primary"}  # fmt: skip
    return ns, values, pods


def _template_labels(items, kind, name):
    (o,) = [x for x in items if x["kind"] == kind and x["metadata"]["name"] == name]
    return o["spec"]["template"]["metadata"]["labels"]


def test_the_airflow_release_works_behind_the_default_deny():
    ns, values, pods = _airflow_pods()
    assert values["config"]["kubernetes_executor"]["namespace"] == ns
    items = build_overlay("base")
    pols = [o for o in items if o["kind"] == "NetworkPolicy"]
    assert {o["metadata"]["namespace"] for o in items if o["kind"] != "Namespace"} == {ns}
    for comp, labels in pods.items():
        # the default deny isolates every Airflow pod, so each needs an allowing policy
        sel = _isolating(pols, ns, labels)
        assert any(p["metadata"]["name"] == "flora-default-deny-ingress" for p in sel), comp
        assert any(p["spec"].get("ingress") for p in sel), f"nothing admits Airflow's {comp}"
    flows = [  # Airflow 3: execution API, log servers, statsd, the metadata database
        ("worker", "api-server"), ("dag-processor", "api-server"), ("triggerer", "api-server"),
        ("scheduler", "api-server"), ("api-server", "worker"), ("api-server", "triggerer"),
        ("scheduler", "statsd"), ("worker", "postgresql"), ("scheduler", "postgresql"),
        ("api-server", "postgresql"), ("dag-processor", "postgresql"),
        ("triggerer", "postgresql"), ("run-airflow-migrations", "postgresql"),
        ("create-user", "postgresql"),
    ]  # fmt: skip
    for src, dst in flows:
        assert _admits(pols, ns, pods[dst], ns, pods[src], AIRFLOW_PORTS[dst]), (src, dst)
    # nothing wider: not the inference pods, Flora's own step pods, MLflow, nor the same
    # release's labels from another namespace
    outsiders = [
        (ns, _isvc(items, "flora-segmenter")["metadata"]["labels"]),
        (ns, dict(POD_LABELS)),
        (ns, _template_labels(items, "Deployment", "flora-mlflow")),
        ("airflow", pods["worker"]),
        ("default", {}),
    ]
    for dst, port in AIRFLOW_PORTS.items():
        for src_ns, src in outsiders:
            assert not _admits(pols, ns, pods[dst], src_ns, src, port), (src_ns, src, dst)
    # another release's postgres in the namespace is not opened up
    other = {**pods["postgresql"], "app.kubernetes.io/instance": "other"}
    assert not _admits(pols, ns, other, ns, pods["worker"], 5432)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_platform_pods_get_exactly_the_traffic_they_need(overlay):
    items = build_overlay(overlay)
    (ns,) = {o["metadata"]["namespace"] for o in items if o["kind"] != "Namespace"}
    pols = [o for o in items if o["kind"] == "NetworkPolicy"]
    _, _, airflow = _airflow_pods()
    mlflow = _template_labels(items, "Deployment", "flora-mlflow")
    pg = _template_labels(items, "StatefulSet", "flora-postgres")
    inference = {m: _isvc(items, f"flora-{m}")["metadata"]["labels"]
                 for m in ("segmenter", "captioner", "rewarder")}  # fmt: skip
    pipelines = [dict(POD_LABELS), airflow["worker"]]  # step pods (Airflow GPU, KFP), workers
    for src in pipelines:
        assert _admits(pols, ns, mlflow, ns, src, 5000)
        for labels in inference.values():
            assert _admits(pols, ns, labels, ns, src, 8080)
        assert not _admits(pols, ns, pg, ns, src, 5432)
    assert _admits(pols, ns, pg, ns, mlflow, 5432)
    for labels in inference.values():  # inference pods pull from the object store, not MLflow
        assert not _admits(pols, ns, pg, ns, labels, 5432)
        assert not _admits(pols, ns, labels, ns, {}, 8080)


def test_dev_overlay_points_only_at_its_own_namespace(monkeypatch):
    from flora.settings import FloraSettings

    base, dev = build_overlay("base"), build_overlay("dev")
    ((prod_ns,),) = [{o["metadata"]["name"] for o in base if o["kind"] == "Namespace"}]
    ((dev_ns,),) = [{o["metadata"]["name"] for o in dev if o["kind"] == "Namespace"}]
    assert dev_ns != prod_ns
    assert {o["metadata"]["namespace"] for o in dev if o["kind"] != "Namespace"} == {dev_ns}
    own = {o["metadata"]["name"] for o in base if o["kind"] == "Service"} | {
        f"{o['metadata']['name']}-predictor" for o in base if o["kind"] == "InferenceService"
    }
    for cm in (o for o in dev if o["kind"] == "ConfigMap"):
        for key, value in cm["data"].items():
            assert f".{prod_ns}.svc" not in value, (key, value)
            for host, ns in re.findall(r"//([a-z0-9-]+)\.([a-z0-9-]+)\.svc", value):
                if host in own:
                    assert ns == dev_ns, (key, value)
    pols = [o for o in dev if o["kind"] == "NetworkPolicy"]
    for p in pols:
        for rule in p["spec"].get("ingress") or []:
            for peer in rule.get("from") or []:
                sel = peer.get("namespaceSelector") or {}
                named = set((sel.get("matchLabels") or {}).values())
                for e in sel.get("matchExpressions") or []:
                    named |= set(e.get("values") or [])
                assert prod_ns not in named, p["metadata"]["name"]
    # what the engine resolves per model from dev's ConfigMap
    (env,) = [o for o in dev if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == "flora-pipeline-env"]  # fmt: skip
    for key, value in env["data"].items():
        if key.startswith("FLORA_") and (key.endswith("_URL") or key.endswith("_URI")):
            monkeypatch.setenv(key, value)
    settings = FloraSettings()
    for m in ("segmenter", "captioner", "rewarder"):
        url = settings.for_model(m).openai_base_url
        assert url.startswith(f"http://flora-{m}-predictor.{dev_ns}.svc."), url
    assert f"flora-mlflow.{dev_ns}.svc" in env["data"]["FLORA_MLFLOW_TRACKING_URI"]
    # dev's own pipeline pods reach dev's models; prod's pipeline pods do not
    seg = _isvc(dev, "flora-segmenter")["metadata"]["labels"]
    assert _admits(pols, dev_ns, seg, dev_ns, dict(POD_LABELS), 8080)
    assert not _admits(pols, dev_ns, seg, prod_ns, dict(POD_LABELS), 8080)


def _built_tags():
    """Image -> Dockerfile target, from the docs' build commands and the tag moves after
    them (`imagetools create -t NEW SOURCE`), `$TAG` as a pattern."""
    text = DEPLOYMENT_DOC.read_text().split("## Build and push", 1)[1].split("\n## ", 1)[0]
    code = "\n".join(b.split("```", 1)[0] for b in text.split("```bash")[1:])
    block = code.replace("\\\n", " ")
    registry = re.search(r"\bREGISTRY=(\S+)", block).group(1)

    def pattern(t):
        return re.escape(t.replace("$REGISTRY", registry)).replace(
            re.escape("$TAG"), "[0-9a-f]{7,40}"
        )

    tags = {}
    for line in block.splitlines():
        if "docker buildx build" in line:
            target = re.search(r"--target (\S+)", line).group(1)
            for t in re.findall(r"-t (\S+)", line):
                tags[pattern(t)] = target
        elif "imagetools create" in line:
            new, source = re.search(r"-t (\S+) (\S+)", line).groups()
            tags[pattern(new)] = tags[pattern(source)]
    assert set(tags.values()) == {"cpu", "cuda"}
    return tags


def _target_of(image, tags):
    hits = {target for pat, target in tags.items() if re.fullmatch(pat, image)}
    assert len(hits) == 1, f"{image} is not a tag the docs' build pushes ({sorted(tags)})"
    return hits.pop()


def test_every_image_reference_is_a_tag_the_build_pushes():
    from flora.settings import FloraSettings

    tags = _built_tags()
    _, _, values = _helm()
    images = values.get("images") or {}
    for key in ("airflow", "pod_template"):  # the chart's fallbacks (templates/_helpers.yaml)
        img = images.get(key) or {}
        repo = img.get("repository") or values["defaultAirflowRepository"]
        tag = img.get("tag") or values["defaultAirflowTag"]
        assert _target_of(f"{repo}:{tag}", tags) == "cpu", key
        if not re.search(r"[0-9a-f]{7,40}-", tag):  # a moving tag must be re-pulled
            assert img.get("pullPolicy") == "Always", key
    for overlay in OVERLAYS:
        (env,) = [o for o in build_overlay(overlay) if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "flora-pipeline-env"]  # fmt: skip
        assert _target_of(env["data"]["FLORA_CUDA_IMAGE"], tags) == "cuda"
        if "FLORA_IMAGE" in env["data"]:
            assert _target_of(env["data"]["FLORA_IMAGE"], tags) == "cpu"
    assert _target_of(FloraSettings.model_fields["cuda_image"].default, tags) == "cuda"
    # a bad reference fails: the old Helm tag, an unbuilt target
    for bad in ("ghcr.io/flora-robotics/flora:cpu-0.1.0", "ghcr.io/flora-robotics/flora:prod-cpu"):
        assert not any(re.fullmatch(p, bad) for p in tags)


def test_helm_values_name_the_locked_airflow_version():
    """The chart renders Airflow 3's api-server only from ``airflowVersion`` (the image tag
    says nothing about it): it must be the version the image installs from the lock."""
    import yaml

    locked = re.search(r"^apache-airflow==(\S+)$", (INFRA.parent / "requirements.lock")
                       .read_text(), re.M).group(1)  # fmt: skip
    assert str(yaml.safe_load(HELM_VALUES.read_text())["airflowVersion"]) == locked
