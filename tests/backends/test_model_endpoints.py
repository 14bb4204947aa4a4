"""Per-model inference endpoints: one settings object, FLORA_<MODEL>_BASE_URL per model."""

from __future__ import annotations

import pytest


def test_for_model_prefers_the_models_own_url():
    from flora.settings import FloraSettings

    s = FloraSettings(
        backend="openai",
        openai_base_url="http://shared/v1",
        captioner_base_url="http://cap/v1",
        rewarder_base_url="http://rew/v1",
    )
    assert s.for_model("captioner").openai_base_url == "http://cap/v1"
    assert s.for_model("rewarder").openai_base_url == "http://rew/v1"
    assert s.for_model("segmenter").openai_base_url == "http://shared/v1"  # the fallback


def test_engine_steps_reach_each_models_endpoint(monkeypatch):
    import flora.backends
    from flora import engine
    from flora.settings import FloraSettings

    seen: list[str | None] = []

    def fake(settings):
        seen.append(settings.openai_base_url)
        return object()

    monkeypatch.setattr(flora.backends, "make_backend", fake)
    monkeypatch.setattr(engine, "_backend_cache", {})
    s = FloraSettings(
        backend="openai",
        segmenter_base_url="http://seg/v1",
        captioner_base_url="http://cap/v1",
        rewarder_base_url="http://rew/v1",
    )
    engine.segment_backend(s)
    engine.vlm_backend(s, "captioner")
    engine.vlm_backend(s, "rewarder")
    assert seen == ["http://seg/v1", "http://cap/v1", "http://rew/v1"]


@pytest.mark.parametrize("model", ["segmenter", "captioner", "rewarder"])
def test_env_names(monkeypatch, model):
    from flora.settings import FloraSettings

    monkeypatch.setenv(f"FLORA_{model.upper()}_BASE_URL", f"http://{model}/v1")
    assert FloraSettings().for_model(model).openai_base_url == f"http://{model}/v1"


def test_segmenter_backend_override():
    from flora.settings import FloraSettings

    s = FloraSettings(backend="openai", segmenter_backend="kinematic")
    assert s.for_model("segmenter").backend == "kinematic"
    assert s.for_model("captioner").backend == "openai"
