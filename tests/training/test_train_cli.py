"""``flora train sft`` as users call it: trains and exports; refusals are one-line errors."""

from __future__ import annotations

import json

import yaml

from flora.cli import app
from flora.cli_common import run_app
from training.recipe import RECIPES_DIR


def test_train_sft_trains_then_refuses_bad_init_weights(
    isolated_home, tiny_base, mini_set, tmp_path, capsys
):
    out = tmp_path / "run"
    args = ["train", "sft", "--model", "captioner", "--set", str(mini_set), "--no-mlflow"]
    recipe = yaml.safe_load((RECIPES_DIR / "captioner-tiny.yaml").read_text())
    rec = tmp_path / "captioner-mine.yaml"
    rec.write_text(yaml.safe_dump({**recipe, "base": str(tiny_base), "eval_every": 100}))
    code = run_app(app, [*args, "--recipe", str(rec), "--out", str(out), "--max-steps", "1"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    res = json.loads(cap.out.strip().splitlines()[-1])
    assert res["steps"] == 1
    man = json.loads((out / "model" / "flora_model.json").read_text())
    assert man["vision_input"] == "images"  # served as trained (trained_vision_input)

    # Weights that are not a Flora export: refused before training, named, no traceback.
    rec.write_text(yaml.safe_dump({**recipe, "base": str(tiny_base), "init_from": str(tmp_path)}))
    code = run_app(app, [*args, "--recipe", str(rec), "--out", str(tmp_path / "run2")])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("flora train sft: error: recipe captioner-tiny: init_from")
    assert "not an exported flora model" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1

    # A recipe for another model is a usage error.
    code = run_app(app, [*args, "--recipe", "rewarder-tiny", "--out", str(tmp_path / "run3")])
    assert code == 2
    assert "is for rewarder, not captioner" in capsys.readouterr().err
