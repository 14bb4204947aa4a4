"""A continued model is never scored on an episode its starting point trained on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flora.cli import app
from flora.cli_common import run_app
from tests.training.helpers import mini_examples, write_set
from training.evaluate import heldout_examples, lineages_seen, unseen_heldout
from training.lineage import same_world_ids, trained_episodes
from training.sft import TrainingError


def _export(path: Path, train: list[str], init_from: Path | None = None) -> Path:
    """A model dir holding only the lineage fields of ``flora_model.json``."""
    path.mkdir(parents=True)
    man: dict = {
        "set_manifest": {"episodes": {"train": train, "heldout": ["other/9"]}},
        "files": {"model/model.safetensors": f"{len(train):064d}"},
    }
    if init_from is not None:
        parent = (
            json.loads((init_from / "flora_model.json").read_text()) if init_from.exists() else {}
        )
        digest = next(iter(parent.get("files", {}).values()), "f" * 64)
        man["init_from"] = {"path": str(init_from), "sha256": digest}
    (path / "flora_model.json").write_text(json.dumps(man))
    return path


def test_trained_episodes_follow_init_from_and_refuse_a_lost_parent(tmp_path):
    first = _export(tmp_path / "first", ["toy_120_1/000001", "toy_120_1/000004"])
    second = _export(tmp_path / "second", ["toy_240_1/000007"], init_from=first)
    assert trained_episodes(first) == {"toy_120_1/000001", "toy_120_1/000004"}
    assert trained_episodes(second) == {
        "toy_120_1/000001",
        "toy_120_1/000004",
        "toy_240_1/000007",
    }
    _export(tmp_path / "other", ["toy_120_1/000009"])
    shutil.rmtree(first)
    shutil.copytree(tmp_path / "other", first)  # the folder now holds other weights
    with pytest.raises(TrainingError, match="now holds other weights"):
        trained_episodes(second)
    shutil.rmtree(first)
    with pytest.raises(TrainingError, match="not on disk"):
        trained_episodes(second)  # an unknown lineage is not an empty one
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "flora_model.json").write_text(json.dumps({"set_manifest": {}}))
    with pytest.raises(TrainingError, match="records no training episodes"):
        trained_episodes(bare)  # trained on a bare examples file: episodes unknown


def test_heldout_examples_leave_out_excluded_episodes(tmp_path):
    s = write_set(tmp_path / "set", mini_examples(n_heldout=3))
    every = {e.episode_id for e in heldout_examples("captioner", s)}
    assert every == {"mini/000004", "mini/000005", "mini/000006"}
    kept = heldout_examples("captioner", s, limit=2, exclude={"mini/000004"})
    assert [e.episode_id for e in kept] == ["mini/000005", "mini/000006"]
    with pytest.raises(ValueError, match="no held-out captioner"):
        heldout_examples("captioner", s, exclude=every)


def test_same_world_ids_maps_only_the_same_seed_and_kind():
    ids = {"toy_120_1/000005", "toy_120_2/000006", "toy_16_1_quick/000007", "lerobot/000008"}
    assert same_world_ids(ids, "toy_240_1") == {"toy_240_1/000005"}
    assert same_world_ids(ids, "toy_40_1_quick") == {"toy_40_1_quick/000007"}
    assert same_world_ids(ids, "fleet") == ids  # not a toy world: ids are as given


def test_unseen_heldout_leaves_out_the_lineage_and_refuses_an_unknown_one(tmp_path):
    s = write_set(tmp_path / "set", mini_examples(n_heldout=3))
    first = _export(tmp_path / "first", ["mini/000004"])  # a held-out episode of this set
    second = _export(tmp_path / "second", ["mini/000000"], init_from=first)
    held = unseen_heldout("captioner", s, second, limit=1)
    assert held.left_out == ["mini/000004"] and held.lineage == "known"
    assert [e.episode_id for e in held.examples] == ["mini/000005"]  # limit after exclusion
    shutil.rmtree(first)
    with pytest.raises(TrainingError, match="allow-unknown-lineage"):
        unseen_heldout("captioner", s, second)
    loose = unseen_heldout("captioner", s, second, allow_unknown_lineage=True)
    assert loose.lineage.startswith("unknown: ") and "not on disk" in loose.lineage
    assert len({e.episode_id for e in loose.examples}) == 3 and loose.left_out == []
    every = _export(tmp_path / "every", ["mini/000004", "mini/000005", "mini/000006"])
    with pytest.raises(ValueError, match="trained on every held-out captioner episode"):
        unseen_heldout("captioner", s, every)


def test_unseen_heldout_also_leaves_out_another_models_lineage(tmp_path):
    """Two models of different lineages are scored on the same items."""
    s = write_set(tmp_path / "set", mini_examples(n_heldout=3))
    scratch = _export(tmp_path / "scratch", ["mini/000000"])  # saw no held-out episode
    base = _export(tmp_path / "base", ["mini/000005"])
    over_base = _export(tmp_path / "over_base", ["mini/000001"], init_from=base)
    alone = unseen_heldout("captioner", s, scratch)
    assert alone.left_out == [] and len({e.episode_id for e in alone.examples}) == 3
    both = unseen_heldout("captioner", s, scratch, also_unseen_by=[over_base])
    mirrored = unseen_heldout("captioner", s, over_base, also_unseen_by=[scratch])
    assert both.left_out == mirrored.left_out == ["mini/000005"]
    ids = [e.example_id for e in both.examples]
    assert ids == [e.example_id for e in mirrored.examples] and ids
    assert {e.episode_id for e in both.examples} == {"mini/000004", "mini/000006"}
    assert lineages_seen(heldout_examples("captioner", s), [scratch, over_base]) == {"mini/000005"}
    every = _export(tmp_path / "every", ["mini/000004", "mini/000006"])
    with pytest.raises(ValueError, match=r"every.*trained on every held-out captioner episode"):
        unseen_heldout("captioner", s, scratch, also_unseen_by=[over_base, every])
    shutil.rmtree(base)  # the other model's lineage is lost: refused as the model's own is
    with pytest.raises(TrainingError, match="allow-unknown-lineage"):
        unseen_heldout("captioner", s, scratch, also_unseen_by=[over_base])


def test_eval_model_refuses_a_model_whose_lineage_is_lost(tmp_path, capsys):
    s = write_set(tmp_path / "set", mini_examples(n_heldout=2))
    model = _export(tmp_path / "model", ["mini/000000"], init_from=tmp_path / "gone")
    args = ["eval", "model", "--model", "captioner", "--path", str(model), "--set", str(s)]
    assert run_app(app, [*args, "--no-mlflow"]) != 0
    err = capsys.readouterr().err
    assert "continued from" in err and "not on disk" in err and "--allow-unknown-lineage" in err


def test_an_export_carries_its_ancestors_episodes_so_they_need_not_be_on_disk(tmp_path):
    from training.sft import _ancestor_episodes, export_weights, read_model_manifest

    first = _export(tmp_path / "first", ["toy_120_1/000001", "toy_120_1/000004"])
    second = _export(tmp_path / "second", ["toy_240_1/000007"], init_from=first)
    start = export_weights(second, read_model_manifest(second))  # read when training starts
    shutil.rmtree(first)
    shutil.rmtree(second)  # gone during training, or another machine: no ancestor on disk
    # What a model trained from `second` writes into its init_from (training.sft._export).
    assert start.ancestry == {"train_episodes": sorted({"toy_120_1/000001", "toy_120_1/000004",
                                                         "toy_240_1/000007"})}  # fmt: skip
    third = _export(tmp_path / "third", ["toy_240_1/000008"], init_from=second)
    man = json.loads((third / "flora_model.json").read_text())
    man["init_from"].update({**start.lineage(), **start.ancestry})
    (third / "flora_model.json").write_text(json.dumps(man))
    assert trained_episodes(third) == {
        "toy_120_1/000001",
        "toy_120_1/000004",
        "toy_240_1/000007",
        "toy_240_1/000008",
    }
    assert _ancestor_episodes(tmp_path / "gone") == {}  # unknown: the path is followed later


def test_a_base_lineage_counts_and_an_unknown_one_refuses(tmp_path):
    model = _export(tmp_path / "seg", ["toy_120_1/000002"])
    man = json.loads((model / "flora_model.json").read_text())
    man["base_lineage"] = {"path": "/releases/captioner", "train_episodes": ["toy_120_1/000005"]}
    (model / "flora_model.json").write_text(json.dumps(man))
    assert trained_episodes(model) == {"toy_120_1/000002", "toy_120_1/000005"}
    man["base_lineage"] = {"path": "/releases/captioner"}  # its episodes were unknown
    (model / "flora_model.json").write_text(json.dumps(man))
    with pytest.raises(TrainingError, match="whose training episodes were unknown"):
        trained_episodes(model)


def test_a_recipe_base_that_is_an_export_passes_its_episodes_on(tmp_path):
    """The small segmenter's base is the released captioner: the episodes it learnt from
    are seen, in every toy world of its seed, before any training; a built base saw none."""
    from training.lineage import base_seen_in

    release = "models/small/captioner/model"
    seen = base_seen_in(release, "toy_120_1")
    assert seen and all(i.startswith("toy_120_1/") for i in seen)
    assert seen == same_world_ids(trained_episodes(Path(release).parent), "toy_120_1")
    assert {i.split("/")[1] for i in base_seen_in(release, "toy_240_1")} == {
        i.split("/")[1] for i in seen
    }
    assert base_seen_in(release, "toy_120_2") == set()
    assert base_seen_in("small", "toy_120_1") == set()
    # an export whose own lineage is unknown cannot be a base whose episodes are left out
    lost = tmp_path / "lost"
    (lost / "model").mkdir(parents=True)
    (lost / "model" / "config.json").write_text("{}")
    (lost / "flora_model.json").write_text(json.dumps({"files": {}}))
    with pytest.raises(TrainingError, match="training episodes of .* are unknown"):
        base_seen_in(str(lost / "model"), "toy_120_1")


def test_the_learning_benchmark_leaves_out_what_the_recipe_base_saw():
    """``benchmarks/learning.py`` scores no variant on an episode the segmenter's base (the
    released captioner) trained on, and picks GRPO's probe among the rest, as GRPO does."""
    from argparse import Namespace

    from tests.benchmark_scripts import load_benchmark
    from training.lineage import base_seen_in

    learning = load_benchmark("learning")
    world = Path("toy_120_1")
    none = Namespace(init_from=None)
    base = base_seen_in("models/small/captioner/model", "toy_120_1")
    assert learning.seen_by_lineage("segmenter", none, world) == base
    assert learning.seen_by_lineage("captioner", none, world) == set()  # a built base
