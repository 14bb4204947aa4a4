"""A continued model is never scored on an episode its starting point trained on."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tests.training.helpers import mini_examples, write_set
from training.evaluate import heldout_examples
from training.release import trained_episodes
from training.sft import TrainingError

REPO = Path(__file__).resolve().parents[2]


def _export(path: Path, train: list[str], init_from: Path | None = None) -> Path:
    """A model dir holding only the lineage fields of ``flora_model.json``."""
    path.mkdir(parents=True)
    man: dict = {"set_manifest": {"episodes": {"train": train, "heldout": ["other/9"]}}}
    if init_from is not None:
        man["init_from"] = {"path": str(init_from), "sha256": "0" * 64}
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
    spec = importlib.util.spec_from_file_location("learning", REPO / "benchmarks" / "learning.py")
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    ids = {"toy_120_1/000005", "toy_120_2/000006", "toy_16_1_quick/000007", "lerobot/000008"}
    assert learning.same_world_ids(ids, "toy_240_1") == {"toy_240_1/000005"}
    assert learning.same_world_ids(ids, "toy_40_1_quick") == {"toy_40_1_quick/000007"}
    assert learning.same_world_ids(ids, "fleet") == ids  # not a toy world: ids are as given
