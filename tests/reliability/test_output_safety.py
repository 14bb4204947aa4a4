"""Nothing Flora runs deletes or overwrites data it did not create (issue 15 finding 1).

``flora tiny-model --out DIR`` used to ``rmtree`` whatever DIR held, the embedded tiny
model replaced any folder without its marker, and the demo regenerated its toy world over
``FLORA_DATASET`` (the DAGs' input).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flora.safety import (
    OWNER_MARKER,
    OutputDirError,
    ensure_own_output_dir,
    output_kind,
    prepare_output_dir,
)

REPO = Path(__file__).resolve().parents[2]


def _user_data(root: Path) -> dict[str, bytes]:
    """A folder that looks like someone's dataset; returns its files' bytes."""
    files = {
        "meta/info.json": b'{"codebase_version": "v3.0"}',
        "data/chunk-000/file-000.parquet": b"PAR1 not ours PAR1",
        "notes.txt": b"irreplaceable",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _intact(root: Path, files: dict[str, bytes]) -> bool:
    return all((root / rel).read_bytes() == data for rel, data in files.items())


def _digests(d: Path) -> dict[str, str]:
    return {
        p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


# --------------------------------------------------------------------------- the guard


def test_guard_decisions(tmp_path):
    kind = "tiny-model"
    assert ensure_own_output_dir(tmp_path / "missing", kind) is False
    (tmp_path / "empty").mkdir()
    assert ensure_own_output_dir(tmp_path / "empty", kind) is False
    files = _user_data(tmp_path / "data")
    with pytest.raises(OutputDirError, match="not written by Flora as a tiny-model"):
        ensure_own_output_dir(tmp_path / "data", kind)
    assert ensure_own_output_dir(tmp_path / "data", kind, overwrite=True) is True
    assert _intact(tmp_path / "data", files)  # the guard itself never removes anything
    # A folder Flora claimed for another purpose is not this kind's either.
    prepare_output_dir(tmp_path / "other", "toy world")
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(OutputDirError):
        ensure_own_output_dir(tmp_path / "other", kind)
    prepare_output_dir(tmp_path / "mine", kind)
    (tmp_path / "mine" / "half-written.bin").write_bytes(b"\0")
    assert ensure_own_output_dir(tmp_path / "mine", kind) is True
    assert output_kind(tmp_path / "mine") == kind
    # A forged or broken marker is no proof.
    (tmp_path / "data" / OWNER_MARKER).write_text('{"kind": "tiny-model"}')
    with pytest.raises(OutputDirError):
        ensure_own_output_dir(tmp_path / "data", kind)


# --------------------------------------------------------------------------- tiny model


def test_build_tiny_vlm_refuses_a_folder_it_did_not_create(tmp_path):
    from flora.backends.tiny import build_tiny_vlm

    files = _user_data(tmp_path / "ds")
    with pytest.raises(OutputDirError, match="--overwrite"):
        build_tiny_vlm(tmp_path / "ds")
    assert _intact(tmp_path / "ds", files)
    (tmp_path / "file.bin").write_bytes(b"precious")
    with pytest.raises(OutputDirError, match="is a file"):
        build_tiny_vlm(tmp_path / "file.bin")
    assert (tmp_path / "file.bin").read_bytes() == b"precious"


def test_build_tiny_vlm_replaces_its_own_model_and_overwrite_replaces_a_link_not_its_target(
    tmp_path,
):
    from flora.backends.tiny import build_tiny_vlm

    out = build_tiny_vlm(tmp_path / "tiny")
    first = _digests(out)
    (out / "stale.bin").write_bytes(b"left over")
    again = build_tiny_vlm(tmp_path / "tiny")  # its own folder: rebuilt without asking
    assert _digests(again) == first and output_kind(again) == "tiny-model"

    files = _user_data(tmp_path / "ds")
    (tmp_path / "link").symlink_to(tmp_path / "ds", target_is_directory=True)
    with pytest.raises(OutputDirError, match="symlink"):
        build_tiny_vlm(tmp_path / "link")
    build_tiny_vlm(tmp_path / "link", overwrite=True)
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "link" / "config.json").exists()
    assert _intact(tmp_path / "ds", files)  # the link went, never what it pointed at


def test_tiny_model_cli_refuses_with_a_clear_message(tmp_path):
    from flora.backends.cli import register

    app = typer.Typer()
    register(app, typer.Typer())
    files = _user_data(tmp_path / "ds")
    r = CliRunner().invoke(app, ["tiny-model", "--out", str(tmp_path / "ds")])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "not written by Flora" in out and "--overwrite" in out
    assert _intact(tmp_path / "ds", files)
    r = CliRunner().invoke(app, ["tiny-model", "--out", str(tmp_path / "ds"), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ds" / "flora_tiny.json").exists() and not (
        tmp_path / "ds" / "notes.txt"
    ).exists()


def test_ensure_tiny_vlm_refuses_foreign_data_and_finishes_its_own_leftover(tmp_path):
    from flora.engine import ensure_tiny_vlm

    files = _user_data(tmp_path / "models" / "tiny")
    with pytest.raises(OutputDirError):
        ensure_tiny_vlm(tmp_path / "models" / "tiny")
    assert _intact(tmp_path / "models" / "tiny", files)
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny"]  # nothing built

    # A build that crashed half-way leaves a claimed folder without flora_tiny.json.
    left = prepare_output_dir(tmp_path / "own" / "tiny", "tiny-model")
    (left / "model.safetensors").write_bytes(b"truncated")
    path = ensure_tiny_vlm(left)
    assert (path / "flora_tiny.json").exists() and (path / "model.safetensors").stat().st_size > 9
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_tiny_vlm(path) == path and (path / "config.json").stat().st_mtime_ns == stamp


# --------------------------------------------------------------------------- toy world


def test_demo_dataset_step_never_replaces_a_foreign_folder(tmp_path):
    from flora.demo import generate_dataset

    files = _user_data(tmp_path / "real")
    for regenerate in (False, True):
        with pytest.raises(OutputDirError, match="toy world"):
            generate_dataset(tmp_path / "real", episodes=1, seed=0, regenerate=regenerate)
    assert _intact(tmp_path / "real", files)


def test_demo_writes_its_own_folder_not_flora_dataset(tmp_path, monkeypatch):
    import flora.demo as demo
    from flora.settings import get_settings

    files = _user_data(tmp_path / "fleet")
    seen: list[Path] = []

    class Stop(Exception):
        pass

    def fake_generate(root, episodes, seed, **kw):
        seen.append(root)
        raise Stop

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FLORA_DATASET", str(tmp_path / "fleet"))
    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    monkeypatch.setattr(demo, "generate_dataset", fake_generate)
    try:
        r = CliRunner().invoke(demo.app, ["--no-dvc"])
    finally:
        get_settings.cache_clear()
    assert isinstance(r.exception, Stop), r.output
    assert seen == [(REPO / "datasets" / "toy_world").resolve()]
    assert _intact(tmp_path / "fleet", files)
    # datasets.dvc versions the folder that holds the demo's toy world.
    assert "path: datasets\n" in (REPO / "datasets.dvc").read_text()


def test_flora_synth_refuses_a_non_empty_foreign_folder(tmp_path):
    from flora.data.synth import generate

    files = _user_data(tmp_path / "ds")
    with pytest.raises(FileExistsError):
        generate(tmp_path / "ds", episodes=1, seed=0, progress=False)
    assert _intact(tmp_path / "ds", files)
