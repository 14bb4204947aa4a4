"""The ``small`` base's frozen embedding / LM head can express a confident answer.

The segmenter trains a LoRA only (DESIGN §3.5), so the small base's tied embedding, LM
head and final norm stay frozen: their scale bounds the logit margin a perfect hidden
state can reach. At the old std 0.02 that bound left a cross-entropy floor of ~3.95
nats/token over the 640-token vocabulary (docs/training.md, "The small base").
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.sizes import (
    EMBED_KEY,
    SIZES,
    SMALL_EMBED_STD,
    TINY_SPEC,
    build_base,
    get_size,
    resolve_base,
    spec_key,
)


def best_case_ce(emb: torch.Tensor) -> float:
    """Mean CE/token when the final hidden state (RMS-normed, norm weight 1) points
    exactly at the target token's embedding — the best any frozen-head model can do."""
    rows = emb.norm(dim=1) > 0  # the padding row is zero
    idx = torch.nonzero(rows).squeeze(1)
    h = emb[idx] / emb[idx].norm(dim=1, keepdim=True) * math.sqrt(emb.shape[1])
    logits = h @ emb.T
    target = logits[torch.arange(len(idx)), idx]
    return float((torch.logsumexp(logits, 1) - target).mean())


def test_small_base_embedding_scale_allows_confident_answers(tmp_path) -> None:
    path = build_base("small", tmp_path / "small", overwrite=True)
    emb = load_file(path / "model.safetensors")[EMBED_KEY]
    assert abs(float(emb.std()) - SMALL_EMBED_STD) < 0.1 * SMALL_EMBED_STD
    assert best_case_ce(emb) < 0.1
    # The same draw at the spec's init_std cannot get below ~3.9 nats/token.
    assert best_case_ce(emb * (SIZES["small"].spec.init_std / SMALL_EMBED_STD)) > 3.0
    assert json.loads((path / "flora_tiny.json").read_text())["embed_std"] == SMALL_EMBED_STD
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True  # so the head is the rescaled embedding


def test_small_base_is_deterministic_and_keyed_by_its_scale(tmp_path) -> None:
    a = build_base("small", tmp_path / "a", overwrite=True)
    b = build_base("small", tmp_path / "b", overwrite=True)
    assert torch.equal(load_file(a / "model.safetensors")[EMBED_KEY],
                       load_file(b / "model.safetensors")[EMBED_KEY])  # fmt: skip
    # The scale is part of the cache key (an old std-0.02 build is never reused) ...
    from dataclasses import replace

    old = replace(SIZES["small"], embed_std=None)
    assert spec_key(SIZES["small"], 0) != spec_key(old, 0)
    # ... and tiny, which has none, keeps its key and its init_std (CI mechanics).
    assert SIZES["tiny"].embed_std is None and SIZES["tiny"].spec == TINY_SPEC


def test_small_segmenter_rollouts_have_the_engines_token_budget() -> None:
    """GRPO rollouts capped below the segment request's budget would cut a correct answer
    of a busy window to an unparseable one (reward 0) — the small recipe does not."""
    import inspect

    from flora.segment.run import segment_episode
    from training.recipe import load_recipe

    budget = inspect.signature(segment_episode).parameters["max_new_tokens"].default
    assert load_recipe("segmenter-small").grpo.max_new_tokens >= budget


def test_a_recipe_image_budget_changes_the_processor_not_the_weights(tmp_path) -> None:
    """A recipe's ``max_pixels`` (no shipped recipe sets it) keeps the seeded weights,
    resizes frames to the new budget and is part of the cache key, so the two bases never
    share a folder."""
    from flora.backends.processing import load_processor

    assert spec_key(get_size("small", 96 * 192), 0) != spec_key(SIZES["small"], 0)
    assert get_size("small", SIZES["small"].spec.max_pixels) is SIZES["small"]
    a = resolve_base("small", cache=tmp_path)
    b = resolve_base("small", cache=tmp_path, max_pixels=96 * 192)
    assert a != b
    assert torch.equal(load_file(a / "model.safetensors")[EMBED_KEY],
                       load_file(b / "model.safetensors")[EMBED_KEY])  # fmt: skip
    frame = torch.zeros(96, 192, 3, dtype=torch.uint8).numpy()
    grids = [load_processor(p, "images").image_processor(images=[frame])["image_grid_thw"]
             for p in (a, b)]  # fmt: skip
    # (t, h, w) in 16-px patches: the size's 64 x 64 budget gives a 32 x 64 mosaic, the
    # recipe's budget keeps the rendered 96 x 192.
    assert grids[0].tolist() == [[1, 2, 4]] and grids[1].tolist() == [[1, 6, 12]]
    with pytest.raises(ValueError, match="below size 'small'"):
        get_size("small", 16 * 16)
    with pytest.raises(ValueError, match="built size"):
        resolve_base(str(a), max_pixels=96 * 192)


def test_a_relative_base_path_is_tried_from_the_repository_root(tmp_path, monkeypatch):
    """A recipe naming a released model's weights (``models/small/captioner/model``) finds
    them from any working directory; a path found nowhere is still refused."""
    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parents[2]
    assert resolve_base("models/small/captioner/model") == root / "models/small/captioner/model"
    with pytest.raises(FileNotFoundError, match="models/small/nothing-here"):
        resolve_base("models/small/nothing-here")
