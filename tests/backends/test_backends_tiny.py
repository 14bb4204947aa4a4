"""Tiny model factory: builds fast and deterministically, loads offline via Auto classes."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoTokenizer,
)
from transformers.utils import is_torchvision_available
from typer.testing import CliRunner

from flora.backends.base import VLMRequest
from flora.backends.processing import load_processor, render_prompt, request_to_chat
from flora.backends.tiny import SPECIAL_TOKENS, build_tiny_vlm
from tests.backends.backend_helpers import frames


def _digests(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_build_is_deterministic(tmp_path):
    # Build time is a benchmark figure (docs/benchmarks.md), not a test assertion.
    a = build_tiny_vlm(tmp_path / "a", seed=0)
    b = build_tiny_vlm(tmp_path / "b", seed=0)
    c = build_tiny_vlm(tmp_path / "c", seed=1)
    da, db, dc = _digests(a), _digests(b), _digests(c)
    assert da == db  # same seed: byte-identical checkpoint
    assert da["model.safetensors"] != dc["model.safetensors"]
    assert da["tokenizer.json"] == dc["tokenizer.json"]  # the tokenizer does not depend on it
    # Building must not disturb the caller's RNG.
    torch.manual_seed(123)
    x = torch.rand(1)
    torch.manual_seed(123)
    build_tiny_vlm(tmp_path / "d")
    assert torch.equal(torch.rand(1), x)


def test_loads_offline_through_auto_classes(tiny_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = AutoConfig.from_pretrained(tiny_model)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    img = AutoImageProcessor.from_pretrained(tiny_model)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model)
    assert cfg.model_type == "qwen3_vl"
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert cfg.text_config.hidden_size == 32 and cfg.text_config.num_hidden_layers == 2
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert img.patch_size == cfg.vision_config.patch_size == 16
    # The special tokens the processor and chat template rely on exist and match the config.
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) is not None
    assert tok.convert_tokens_to_ids("<|image_pad|>") == cfg.image_token_id
    assert tok.convert_tokens_to_ids("<|video_pad|>") == cfg.video_token_id
    assert tok.convert_tokens_to_ids("<|vision_start|>") == cfg.vision_start_token_id
    assert len(tok) <= cfg.text_config.vocab_size
    # Digits are single tokens (outcome score tokens "1".."5"); grammar text round-trips.
    for d in "0123456789":
        assert len(tok(d, add_special_tokens=False).input_ids) == 1
    text = "worst: 2\n3: 2 | gripper slips\nscore: 4\n0 12 0 1\n<think>\nok\n</think>\nnone"
    assert tok.decode(tok(text).input_ids) == text
    # Byte-level: any text (here non-ASCII) encodes without unknown tokens and round-trips.
    assert tok.decode(tok("ロボット ✓").input_ids) == "ロボット ✓"


def test_processor_expands_image_tokens_and_model_runs(tiny_model):
    proc = load_processor(tiny_model)
    if is_torchvision_available():
        assert type(proc).__name__ == "Qwen3VLProcessor"
    else:  # the Qwen processor class without its video half (documented fallback)
        from transformers import Qwen3VLProcessor

        assert isinstance(proc, Qwen3VLProcessor) and not hasattr(proc, "video_processor")
    req = VLMRequest(prompt="segment", images=frames(3), frame_times_us=[0, 250_000, 500_000])
    chat = request_to_chat(req, "images")
    prompt = render_prompt(proc, chat)
    assert prompt.startswith("<|im_start|>user\n<0.00 seconds><|vision_start|><|image_pad|>")
    assert "<0.25 seconds>" in prompt and "<0.50 seconds>" in prompt
    assert prompt.endswith("segment<|im_end|>\n<|im_start|>assistant\n")
    enc = proc(text=[prompt], images=chat.images(), return_tensors="pt")
    n_pad = int((enc["input_ids"] == proc.image_token_id).sum())
    assert enc["image_grid_thw"].shape == (3, 3)
    assert n_pad == int(enc["image_grid_thw"].prod(-1).sum()) // 4  # 2x2 spatial merge
    model = AutoModelForImageTextToText.from_pretrained(tiny_model)
    with torch.no_grad():
        out = model(**enc)
    assert out.logits.shape[:2] == enc["input_ids"].shape
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"])
def test_other_families_build_load_and_generate(tiny_vlm_dir, family):
    from flora.backends.transformers_backend import TransformersBackend

    d = tiny_vlm_dir(family)
    cfg = AutoConfig.from_pretrained(d)
    assert cfg.model_type == family
    if family == "qwen3_5":  # both Qwen3.5 block types are present
        assert set(cfg.text_config.layer_types) == {"linear_attention", "full_attention"}
    b = TransformersBackend(d, device="cpu")
    reqs = [
        VLMRequest(prompt="describe", images=frames(2, seed=1), max_new_tokens=5, top_logprobs=2),
        VLMRequest(prompt="no frames", max_new_tokens=5),
    ]
    out = b.generate(reqs)
    assert all(r.ok for r in out), [r.error for r in out]
    assert all(1 <= len(r.logprobs) <= 5 for r in out)
    assert all(len(lp.top) >= 1 for lp in out[0].logprobs)


def test_tiny_model_cli(tmp_path):
    from flora.cli import app

    res = CliRunner().invoke(app, ["tiny-model", "--out", str(tmp_path / "m"), "--seed", "3"])
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "m" / "flora_tiny.json").read_text())
    assert meta["family"] == "qwen3_vl" and meta["seed"] == 3
    assert (tmp_path / "m" / "model.safetensors").is_file()
    bad = CliRunner().invoke(app, ["tiny-model", "--out", str(tmp_path / "x"), "--family", "gpt2"])
    assert bad.exit_code != 0


def test_unknown_family_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny VLM family"):
        build_tiny_vlm(tmp_path / "x", family="llava")
