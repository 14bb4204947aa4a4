"""Released models: a verified copy with its card; the shipped ones match the ``small`` base."""

from __future__ import annotations

import json
import shutil

import pytest

from flora.safety import OutputDirError
from tests.training.helpers import tiny_recipe
from training.recipe import load_recipe
from training.release import RELEASE_CARD, read_release, release_model
from training.sft import TrainingError, resolve_init, train_sft


@pytest.fixture(scope="module")
def export(tiny_base, mini_set, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    r = tiny_recipe("captioner", tiny_base, max_steps=1, eval_every=100)
    return train_sft(r, mini_set, out, log_mlflow=False, progress=False).model_dir


def test_release_copies_a_verified_export_with_its_card(export, tmp_path):
    dst = release_model(export, tmp_path / "models" / "captioner", {"heldout": {"r_cap": 0.3}})
    card = read_release(dst)
    assert card["model"] == "captioner" and card["heldout"] == {"r_cap": 0.3}
    src_man = json.loads((export / "flora_model.json").read_text())
    assert card["base_id"] == src_man["base_id"]
    # Re-releasing replaces the earlier release (a Flora model), not a user's folder.
    release_model(export, dst, {"heldout": {"r_cap": 0.4}})
    assert read_release(dst)["heldout"] == {"r_cap": 0.4}
    mine = tmp_path / "models" / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(OutputDirError, match="mine"):
        release_model(export, mine, {})
    assert (mine / "notes.txt").read_text() == "keep"


def test_release_refuses_adapters_and_damaged_exports(export, tmp_path):
    lora = tmp_path / "lora"
    shutil.copytree(export, lora)
    man = json.loads((lora / "flora_model.json").read_text())
    (lora / "flora_model.json").write_text(json.dumps({**man, "kind": "lora"}))
    with pytest.raises(TrainingError, match="only full-weight"):
        release_model(lora, tmp_path / "out", {})
    bad = tmp_path / "bad"
    shutil.copytree(export, bad)
    (bad / "model" / "config.json").write_text("{}")
    with pytest.raises(TrainingError, match="sha256"):
        release_model(bad, tmp_path / "out2", {})
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()
    with pytest.raises(TrainingError, match=RELEASE_CARD):
        read_release(export)


@pytest.mark.parametrize("model", ["captioner", "rewarder"])
def test_shipped_release_starts_the_demo_recipe(model, tmp_path):
    """make demo's recipes start from models/small/<model>: intact, over today's small base."""
    from flora.backends.transformers_backend import fingerprint_dir
    from training.sizes import build_base

    r = load_recipe(f"{model}-demo")
    assert r.init_from == f"models/small/{model}"
    base = build_base(
        "small", tmp_path / "small", seed=r.base_seed, overwrite=True, max_pixels=r.max_pixels
    )
    init = resolve_init(r, f"small@{fingerprint_dir(base)[:16]}")
    card = read_release(init.root)
    assert card["model"] == model
    # What the release was measured to do, beside its untrained self, on held-out episodes.
    assert {"SFT", "untrained"} <= set(card["heldout"]["variants"])
    assert card["sft"]["steps"] > 0
