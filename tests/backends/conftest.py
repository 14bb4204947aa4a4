"""Fixtures for the backend tests: tiny model, LoRA adapter, in-process backend, server.

The tiny checkpoint comes from the shared ``tiny_vlm_dir`` factory (tests/conftest.py),
built once per session. The server is a real ``flora serve`` subprocess on a free
loopback port, stopped at the end of the session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.backend_helpers import FAIL_MARKER, TOKEN, Server, start_server, stop_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def tiny_model(tiny_vlm_dir) -> Path:
    """The default (Qwen3-VL) tiny checkpoint."""
    return tiny_vlm_dir("qwen3_vl")


@pytest.fixture(scope="session")
def tiny_backend(tiny_model):
    """In-process backend over the tiny checkpoint (CPU)."""
    from flora.backends.transformers_backend import TransformersBackend

    return TransformersBackend(tiny_model, device="cpu", batch_size=4)


@pytest.fixture(scope="session")
def lora_dir(tiny_model, tmp_path_factory) -> Path:
    """A tiny LoRA adapter made with peft (random B, so it changes the outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    base = AutoModelForImageTextToText.from_pretrained(tiny_model)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = get_peft_model(base, cfg)
    out = tmp_path_factory.mktemp("lora") / "adapter"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def served(tiny_model, tmp_path_factory) -> Iterator[Server]:
    """``flora serve`` with a bearer token; a request containing FAIL_MARKER gets HTTP 500."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = start_server(tiny_model, log, "--token", TOKEN, "--fail-marker", FAIL_MARKER)
    yield server
    stop_server(server)
