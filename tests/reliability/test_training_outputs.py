"""Training sets and exported models never replace a folder Flora did not write (issue 15).

``training.sets`` used to ``rmtree`` whatever the set's ``out`` held; ``training.sft``
renamed away and deleted whatever was at ``<out>/model`` or ``<out>/best``. Each test puts
someone's data there and checks it survives byte for byte and the refusal names the path;
and that the step's own earlier output is still replaced.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from flora.safety import OWNER_MARKER, OutputDirError


def _user_data(root: Path) -> dict[str, bytes]:
    """A folder that looks like someone's dataset; returns its files' bytes."""
    files = {
        "meta/info.json": b'{"codebase_version": "v3.0"}',
        "data/chunk-000/file-000.parquet": b"PAR1 not ours PAR1",
        "manifest.json": b'{"format": "someone-elses/1"}',
        "notes.txt": b"irreplaceable",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


# --------------------------------------------------------------------------- sets


def test_set_build_refuses_a_users_folder_or_file(tiny_dataset, tmp_path):
    from training.sets import build_sft_set

    user = tmp_path / "user"
    files = _user_data(user)
    with pytest.raises(OutputDirError, match=f"{user} is not empty and was not written by"):
        build_sft_set("captioner", tiny_dataset, user, progress=False)
    assert _tree(user) == files
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"data")
    with pytest.raises(OutputDirError, match=f"{a_file} is a file"):
        build_sft_set("captioner", tiny_dataset, a_file, progress=False)
    assert a_file.read_bytes() == b"data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "user"]  # no temp left


def test_set_build_replaces_its_own_earlier_set(tiny_dataset, tmp_path):
    from flora.safety import output_kind
    from training.sets import MANIFEST_FILE, SET_KIND, build_sft_set, check_set_out, load_set

    out = tmp_path / "set"
    build_sft_set("captioner", tiny_dataset, out, max_episodes=2, progress=False)
    assert output_kind(out) == SET_KIND and check_set_out(out)
    first = _tree(out)
    (out / "stale.txt").write_text("from the earlier build")
    build_sft_set("captioner", tiny_dataset, out, max_episodes=2, progress=False)
    assert _tree(out) == first  # replaced as a whole, same bytes
    # A set written before the owner marker existed (its manifest names the set format).
    (out / OWNER_MARKER).unlink()
    assert json.loads((out / MANIFEST_FILE).read_text())["format"] == "flora-training-set/1"
    build_sft_set("captioner", tiny_dataset, out, max_episodes=2, progress=False)
    assert _tree(out) == first and load_set(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_train_sets_cli_refusal_exits_2(tiny_dataset, tmp_path):
    """docs/cli.md: a refused --out is a usage error (2), one line naming the path."""
    from flora.cli_common import run_app

    user = tmp_path / "user"
    files = _user_data(user)
    from flora.cli import app

    rc = run_app(app, ["train", "sets", "--model", "captioner", "--dataset", str(tiny_dataset),
                       "--out", str(user), "--no-mlflow"])  # fmt: skip
    assert rc == 2 and _tree(user) == files


# --------------------------------------------------------------------------- models


def _own_model(root: Path, tag: str) -> None:
    root.mkdir(parents=True)
    (root / "flora_model.json").write_text(json.dumps({"format": "flora-model/1", "tag": tag}))
    (root / "weights.bin").write_bytes(tag.encode())


def test_train_sft_refuses_a_users_folder_before_training(tmp_path):
    from training.sft import train_sft

    out = tmp_path / "run"
    files = _user_data(out / "model")
    (out / "best").write_bytes(b"a file")
    with pytest.raises(OutputDirError, match=f"{out / 'best'} is a file"):
        train_sft("captioner-tiny", tmp_path / "no-set", out, log_mlflow=False)
    (out / "best").unlink()
    with pytest.raises(OutputDirError, match=f"{out / 'model'} is not empty"):
        train_sft("captioner-tiny", tmp_path / "no-set", out, log_mlflow=False)
    assert _tree(out) == {f"model/{k}": v for k, v in files.items()}


def test_best_to_model_promotion_replaces_only_a_model(tmp_path):
    from training.sft import _replace

    best = tmp_path / "best"
    _own_model(best, "best")
    user = tmp_path / "model"
    files = _user_data(user)
    with pytest.raises(OutputDirError, match=str(user)):
        _replace(best, user)
    assert _tree(user) == files and _tree(best)["weights.bin"] == b"best"
    other = tmp_path / "run" / "model"
    _own_model(other, "earlier")
    _replace(best, other)
    assert _tree(other) == _tree(best)
    assert sorted(p.name for p in other.parent.iterdir()) == ["model"]  # nothing left aside


class _FakeModule:
    def save_pretrained(self, path, state_dict=None, safe_serialization=True):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"trained")


def test_export_replaces_only_an_earlier_model(tmp_path, monkeypatch):
    import training.sft as sft
    from training.recipe import load_recipe

    monkeypatch.setattr(sft, "_barrier", lambda: None)  # one process, no process group
    recipe = load_recipe("captioner-tiny")
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    engine = SimpleNamespace(module=_FakeModule())
    user = tmp_path / "user_model"
    files = _user_data(user)
    with pytest.raises(OutputDirError, match=str(user)):
        sft._export(engine, recipe, base, "tiny@x", user, 0, tmp_path)
    assert _tree(user) == files

    dst = tmp_path / "run" / "model"
    _own_model(dst, "earlier")
    sft._export(engine, recipe, base, "tiny@x", dst, 0, tmp_path)
    man = sft.verify_model_dir(dst)
    assert man["format"] == "flora-model/1" and "tag" not in man
    assert (dst / "model" / "model.safetensors").read_bytes() == b"trained"
    assert sorted(p.name for p in dst.parent.iterdir()) == ["model"]


@pytest.mark.parametrize("sub", ["model", "log"])
def test_train_grpo_refuses_a_users_folder_before_any_rollout(tmp_path, sub):
    from training.grpo import train_grpo

    out = tmp_path / "grpo"
    files = _user_data(out / sub)
    # The SFT model and the set do not exist: the refusal must come before they are read.
    with pytest.raises(OutputDirError, match=f"{out / sub} is not empty"):
        train_grpo("captioner-tiny", tmp_path / "no-sft", tmp_path / "no-set", out,
                   log_mlflow=False, progress=False)  # fmt: skip
    assert _tree(out) == {f"{sub}/{k}": v for k, v in files.items()}


def test_grpo_history_replaces_its_own_log_and_never_a_users(tmp_path):
    from training.grpo import write_history

    theirs = tmp_path / "grpo" / "log"
    files = _user_data(theirs)
    with pytest.raises(OutputDirError):
        write_history(theirs, [{"step": 1}])
    assert _tree(theirs) == files

    mine = tmp_path / "mine" / "log"
    write_history(mine, [{"step": 1, "grpo.kl": 0.5}])
    dst = write_history(mine, [{"step": 2, "grpo.kl": 0.25}])  # a rerun replaces its own
    assert json.loads(dst.read_text()) == [{"step": 2, "grpo.kl": 0.25}]
