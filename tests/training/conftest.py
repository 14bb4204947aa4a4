"""Fixtures of the training tests: one torch thread, the tiny base checkpoint, a mini set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tiny_finetune import single_torch_thread


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with single_torch_thread():
        yield


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """The ``tiny`` size's random checkpoint (init_std 0.02), built once (read-only)."""
    from training.sizes import build_base

    return build_base("tiny", tmp_path_factory.mktemp("bases") / "tiny", overwrite=True)


@pytest.fixture(scope="session")
def mini_set(tmp_path_factory) -> Path:
    """Four train + one held-out hand-made captioner examples (read-only)."""
    from tests.training.helpers import mini_examples, write_set

    return write_set(tmp_path_factory.mktemp("sets") / "mini", mini_examples())


@pytest.fixture(scope="module")
def seg_set(tiny_dataset, tmp_path_factory) -> Path:
    """Segmenter windows of the toy world's first episodes (standard profile)."""
    from training.sets import build_sft_set

    return build_sft_set(
        "segmenter",
        tiny_dataset,
        tmp_path_factory.mktemp("s") / "seg",
        split_fraction=0.34,
        profiles=("standard",),
        shifted=False,
        max_episodes=2,
        progress=False,
    )


@pytest.fixture(scope="module")
def seg_export(tiny_base, seg_set, tmp_path_factory) -> Path:
    """A tiny LoRA segmenter exported after 2 steps at a high rate (its lora_B is not 0)."""
    from tests.training.helpers import tiny_recipe
    from training.sft import train_sft

    r = tiny_recipe("segmenter", tiny_base, max_steps=2, eval_every=100, lr=5e-2)
    out = tmp_path_factory.mktemp("seg")
    return train_sft(r, seg_set, out, log_mlflow=False, progress=False).model_dir
