"""``init_from``: a full fine-tune starts from released Flora weights, verified first."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file

from tests.training.helpers import tiny_recipe
from training.recipe import RecipeError, load_recipe
from training.sft import TrainingError, train_sft


def _recipe(base, **kw):
    return tiny_recipe("captioner", base, **{"max_steps": 2, "eval_every": 100, **kw})


@pytest.fixture(scope="module")
def released(tiny_base, mini_set, tmp_path_factory):
    """A captioner exported after 2 steps at a high rate (its weights differ from the base)."""
    out = tmp_path_factory.mktemp("released")
    res = train_sft(_recipe(tiny_base, lr=5e-2), mini_set, out, log_mlflow=False, progress=False)
    return res.model_dir


def _weights(model_dir):
    return load_file(str(model_dir / "model" / "model.safetensors"))


def test_training_starts_from_the_released_weights(released, tiny_base, mini_set, tmp_path):
    # A rate so small that one step leaves the weights where they started.
    res = train_sft(
        _recipe(tiny_base, init_from=str(released), lr=1e-12, warmup_steps=0, max_steps=1),
        mini_set,
        tmp_path / "ft",
        log_mlflow=False,
        progress=False,
    )
    start, after = _weights(released), _weights(res.model_dir)
    base = load_file(str(tiny_base / "model.safetensors"))
    trained = [k for k in after if "language_model.layers.0.mlp" in k]
    assert trained
    for k in trained:
        assert (after[k] - start[k]).abs().max() < 1e-6, k
    assert any((start[k] - base[k]).abs().max() > 1e-4 for k in trained)
    man = json.loads((res.model_dir / "flora_model.json").read_text())
    src = json.loads((released / "flora_model.json").read_text())
    assert man["init_from"]["sha256"] == src["files"]["model/model.safetensors"]
    assert man["init_from"]["path"] == str(released.resolve())
    assert man["base_id"] == src["base_id"]  # the base (architecture, untrained ref) is kept


def test_init_from_is_refused_with_the_reason(released, tiny_base, mini_set, tmp_path):
    def refused(init, base=tiny_base):
        r = tiny_recipe("captioner", base, max_steps=1, init_from=str(init))
        with pytest.raises(TrainingError) as e:
            train_sft(r, mini_set, tmp_path / "out", log_mlflow=False, progress=False)
        return str(e.value)

    assert "no such directory" in refused(tmp_path / "missing")
    foreign = tmp_path / "foreign"
    shutil.copytree(released, foreign)
    man = json.loads((foreign / "flora_model.json").read_text())
    (foreign / "flora_model.json").write_text(json.dumps({**man, "model": "rewarder"}))
    assert "holds a rewarder model, not a captioner" in refused(foreign)
    tampered = tmp_path / "tampered"
    shutil.copytree(released, tampered)
    with (tampered / "model" / "model.safetensors").open("ab") as f:
        f.write(b"\0")
    assert "does not match its sha256" in refused(tampered)
    garbled = tmp_path / "garbled"
    shutil.copytree(released, garbled)
    (garbled / "flora_model.json").write_text("{not json")
    assert "is not valid JSON" in refused(garbled)
    (garbled / "flora_model.json").write_text(json.dumps({**man, "files": {}}))
    assert "lists no files to verify" in refused(garbled)
    from training.sizes import build_base

    other = build_base("tiny", tmp_path / "other-base", seed=1, overwrite=True)
    assert "trained over base" in refused(released, base=other)


def test_a_lora_recipe_cannot_start_from_released_weights(tiny_base):
    with pytest.raises(RecipeError, match="init_from"):
        load_recipe("segmenter-tiny", base=str(tiny_base), init_from="models/x")
