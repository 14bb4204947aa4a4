"""Fixtures for rewarder tests: env for offline GX/HF and an isolated FLORA_HOME."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def reward_home(tmp_path, monkeypatch):
    """Point settings (MLflow store, outputs) at a fresh directory for one test."""
    from flora.settings import get_settings

    home = tmp_path / "flora_home"
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def reward_tiny_vlm(tmp_path_factory):
    """A tiny random-initialised Qwen3-VL checkpoint (built offline, once per session)."""
    from flora.backends.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("reward_tiny") / "qwen3_vl")
