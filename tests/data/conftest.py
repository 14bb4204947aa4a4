"""Data-area fixtures: other layouts of the tiny toy dataset and damaged copies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flora.data.synth import copy_as


@pytest.fixture(scope="session")
def tiny_v30(tiny_dataset) -> Path:
    """The session's tiny LeRobot v3.0 dataset (read-only)."""
    return tiny_dataset


@pytest.fixture(scope="session")
def tiny_v21(tiny_dataset, tmp_path_factory) -> Path:
    """The same episodes written in the LeRobot v2.1 layout."""
    return copy_as(tiny_dataset, tmp_path_factory.mktemp("v21") / "toy_v21", "v2.1", progress=False)


@pytest.fixture(scope="session")
def tiny_mp4_pairs(tiny_dataset, tmp_path_factory) -> Path:
    """The same episodes as a plain folder of ``<name>.top.mp4`` / ``<name>.wrist.mp4``."""
    return copy_as(tiny_dataset, tmp_path_factory.mktemp("mp4") / "toy_mp4", "mp4", progress=False)


@pytest.fixture(scope="session")
def tiny_mp4_single(tmp_path_factory) -> Path:
    """A single-camera plain mp4 folder (one file per episode), 2 short episodes."""
    from flora.data.synth import generate

    return generate(
        tmp_path_factory.mktemp("mp4s") / "toy_single",
        2,
        seed=3,
        durations_s=[5.0, 7.0],
        layout="mp4",
        cameras=("top",),
        progress=False,
    )


@pytest.fixture
def damaged(tiny_dataset, tmp_path) -> Path:
    """A fresh writable copy of the tiny v3.0 dataset, to break in a test."""
    dst = tmp_path / "toy_damaged"
    shutil.copytree(tiny_dataset, dst)
    return dst
