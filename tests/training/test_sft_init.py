"""``init_from``: a full fine-tune starts from released Flora weights, a LoRA recipe from an
exported adapter of its shape; both verified first."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file

from tests.training.helpers import tiny_recipe
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


def _adapter(model_dir):
    return load_file(str(model_dir / "adapter" / "adapter_model.safetensors"))


def test_a_lora_recipe_continues_an_exported_adapter(seg_export, tiny_base, seg_set, tmp_path):
    r = tiny_recipe("segmenter", tiny_base, init_from=str(seg_export), lr=1e-12,
                    warmup_steps=0, max_steps=1, eval_every=100)  # fmt: skip
    res = train_sft(r, seg_set, tmp_path / "ft", log_mlflow=False, progress=False)
    start, after = _adapter(seg_export), _adapter(res.model_dir)
    assert start.keys() == after.keys()
    lora_b = [k for k in start if "lora_B" in k]
    # a fresh LoRA's B is zero: non-zero B in the start means trained weights were loaded
    assert lora_b and any(start[k].abs().max() > 1e-4 for k in lora_b)
    for k in start:
        assert (after[k] - start[k]).abs().max() < 1e-6, k
    man = json.loads((res.model_dir / "flora_model.json").read_text())
    src = json.loads((seg_export / "flora_model.json").read_text())
    assert man["kind"] == "lora"
    assert man["init_from"]["sha256"] == src["files"]["adapter/adapter_model.safetensors"]
    # The start's whole lineage, read when training began, is written into the export.
    from training.lineage import trained_episodes

    assert man["init_from"]["train_episodes"] == sorted(trained_episodes(seg_export))


def test_an_adapter_of_another_kind_or_shape_is_refused(
    seg_export, released, tiny_base, seg_set, mini_set, tmp_path
):
    def refused(recipe, set_path):
        with pytest.raises(TrainingError) as e:
            train_sft(recipe, set_path, tmp_path / "out", log_mlflow=False, progress=False)
        return str(e.value)

    seg = tiny_recipe("segmenter", tiny_base, max_steps=1, init_from=str(seg_export))
    # another rank and alpha: the adapter's tensors would not fit the recipe's LoRA
    other = seg.model_copy(update={"lora_rank": 8, "lora_alpha": 16})
    assert "the adapter has r 32 (recipe: 8), lora_alpha 64 (recipe: 16)" in refused(other, seg_set)
    # full weights for a LoRA recipe, an adapter for a full fine-tune
    as_seg = tmp_path / "captioner-as-segmenter"
    shutil.copytree(released, as_seg)
    man = json.loads((as_seg / "flora_model.json").read_text())
    (as_seg / "flora_model.json").write_text(json.dumps({**man, "model": "segmenter"}))
    msg = refused(seg.model_copy(update={"init_from": str(as_seg)}), seg_set)
    assert "holds full weights, not lora weights" in msg
    as_cap = tmp_path / "segmenter-as-captioner"
    shutil.copytree(seg_export, as_cap)
    man = json.loads((as_cap / "flora_model.json").read_text())
    (as_cap / "flora_model.json").write_text(json.dumps({**man, "model": "captioner"}))
    cap = _recipe(tiny_base, max_steps=1, init_from=str(as_cap))
    assert "holds lora weights, not full weights" in refused(cap, mini_set)


def test_a_base_that_is_a_flora_export_passes_its_episodes_on(
    released, tiny_base, seg_set, tmp_path
):
    """A segmenter LoRA over a released captioner's weights (a base that already sees):
    the episodes the captioner learnt from count as seen by the segmenter."""
    from training.lineage import trained_episodes

    cap = tmp_path / "captioner"
    shutil.copytree(released, cap)
    man = json.loads((cap / "flora_model.json").read_text())
    # the hand-made set lists no episodes: give the copy a known lineage
    man["set_manifest"]["episodes"] = {"train": ["toy_120_1/000003"], "heldout": []}
    (cap / "flora_model.json").write_text(json.dumps(man))
    r = tiny_recipe("segmenter", str(cap / "model"), max_steps=1, eval_every=100)
    res = train_sft(r, seg_set, tmp_path / "seg", log_mlflow=False, progress=False)
    man = json.loads((res.model_dir / "flora_model.json").read_text())
    assert man["base_lineage"] == {"path": str(cap.resolve()),
                                   "train_episodes": ["toy_120_1/000003"]}  # fmt: skip
    cap_eps = trained_episodes(cap)
    assert cap_eps <= trained_episodes(res.model_dir)
    # A built base learnt nothing: no base lineage is recorded.
    plain = train_sft(tiny_recipe("segmenter", tiny_base, max_steps=1, eval_every=100),
                      seg_set, tmp_path / "plain", log_mlflow=False, progress=False)  # fmt: skip
    assert "base_lineage" not in json.loads((plain.model_dir / "flora_model.json").read_text())
