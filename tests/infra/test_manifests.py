"""infra/: every overlay builds, validates offline, and meets the serving policy."""

from __future__ import annotations

import copy

import pytest

from model_registry.manifests import (
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
    (peer,) = rule["from"]
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
