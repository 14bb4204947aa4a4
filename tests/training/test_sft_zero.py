"""One SFT step under ZeRO-2 and ZeRO-3 on CPU (gloo, fp32), with gradient checkpointing."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.training.helpers import tiny_recipe
from training.sft import deepspeed_config, train_sft, verify_model_dir


@pytest.fixture(scope="module")
def zero2(tiny_base, mini_set, tmp_path_factory):
    out = tmp_path_factory.mktemp("z2")
    r = tiny_recipe("captioner", tiny_base, zero_stage=2, max_steps=1, eval_every=100)
    return train_sft(r, mini_set, out, log_mlflow=False, progress=False), out


def test_zero2_step_changes_exactly_the_trainable_weights(zero2, tiny_base) -> None:
    res, out = zero2
    assert res.steps == 1 and res.model_dir == out / "model"
    man = verify_model_dir(out / "model")
    assert man["kind"] == "full" and man["model"] == "captioner"
    before = load_file(str(tiny_base / "model.safetensors"))
    after = load_file(str(out / "model" / "model" / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert "model.visual.merger.linear_fc1.weight" in changed
    assert "model.language_model.layers.0.mlp.up_proj.weight" in changed
    assert not any(
        k.startswith(("model.visual.blocks", "model.visual.patch_embed")) for k in changed
    )


def test_zero3_step_matches_zero2(zero2, tiny_base, mini_set, tmp_path) -> None:
    res2, out2 = zero2
    r = tiny_recipe(
        "captioner",
        tiny_base,
        zero_stage=3,
        max_steps=1,
        eval_every=100,
        gradient_checkpointing=True,
    )
    res3 = train_sft(r, mini_set, tmp_path, log_mlflow=False, progress=False)
    assert res3.history[0]["loss"] == pytest.approx(res2.history[0]["loss"], rel=1e-6)
    w2 = load_file(str(out2 / "model" / "model" / "model.safetensors"))
    w3 = load_file(str(tmp_path / "model" / "model" / "model.safetensors"))
    assert w2.keys() == w3.keys()
    for k in w2:
        torch.testing.assert_close(w3[k], w2[k], rtol=0, atol=1e-5)


def test_deepspeed_config_fills_every_auto(tiny_base) -> None:
    r = tiny_recipe("captioner", tiny_base, micro_batch=2, grad_accum=3, zero_stage=3)
    cfg = deepspeed_config(r, world=2, hidden=32)
    assert (
        cfg["train_micro_batch_size_per_gpu"],
        cfg["gradient_accumulation_steps"],
        cfg["train_batch_size"],
    ) == (2, 3, 12)
    assert cfg["bf16"] == {"enabled": torch.cuda.is_available()}
    assert cfg["zero_optimization"]["stage"] == 3
    assert "auto" not in str(cfg)
