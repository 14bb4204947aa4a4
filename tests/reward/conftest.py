"""Fixtures for rewarder tests.

Offline env, ``isolated_home`` and ``tiny_vlm_dir`` come from ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def reward_tiny_vlm(tiny_vlm_dir):
    """The session's tiny random-initialised Qwen3-VL checkpoint (read-only)."""
    return tiny_vlm_dir("qwen3_vl")
