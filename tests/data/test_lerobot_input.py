"""LeRobot input as it exists in the wild: tasks.parquet shapes, image-dtype cameras, Hub ids."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from flora.data import open_dataset
from flora.data.dataset import read_tasks_parquet
from flora.data.episode import FloraDataError
from flora.data.frames import decode_all, sample_episode_frames
from flora.data.ingest import ingest_dataset
from flora.data.mosaic import sample_mosaics
from flora.data.render import WorldRenderer
from flora.data.world import simulate_episode

TOP, WRIST = "observation.images.top", "observation.images.wrist"
SEED, DURS = 7, (6.0, 14.0, 26.0)  # the session's tiny dataset (tests/conftest.py)


# ----------------------------------------------------------------------------- tasks


def test_synth_writes_tasks_parquet_the_way_lerobot_does(tiny_v30):
    """LeRobot: ``pd.DataFrame({"task_index": ...}, index=tasks).to_parquet``; looked up by
    ``tasks.loc[task].task_index``."""
    p = tiny_v30 / "meta/tasks.parquet"
    tasks = pd.read_parquet(p)
    assert list(tasks.columns) == ["task_index"]
    assert len(tasks) and all(isinstance(t, str) for t in tasks.index)
    eps = pd.read_parquet(tiny_v30 / "meta/episodes/chunk-000/file-000.parquet")
    for ep_tasks in eps.tasks:
        assert int(tasks.loc[ep_tasks[0]].task_index) in range(len(tasks))
    # Indices are 0..N-1 and the reader maps them back.
    assert sorted(tasks.task_index) == list(range(len(tasks)))
    assert read_tasks_parquet(p) == {int(i): t for t, i in tasks.task_index.items()}


def test_reader_reads_old_new_and_metadata_free_tasks_shapes(tmp_path):
    tasks = ["pick up the red cube", "push the ball"]
    want = {0: tasks[0], 1: tasks[1]}
    lerobot = tmp_path / "lerobot.parquet"
    pd.DataFrame({"task_index": [0, 1]}, index=tasks).to_parquet(lerobot)
    flat = tmp_path / "flat.parquet"
    pq.write_table(pa.table({"task_index": [0, 1], "task": tasks}), flat)
    bare = tmp_path / "bare.parquet"  # LeRobot's file rewritten without pandas metadata
    pq.write_table(pa.table({"task_index": [0, 1], "__index_level_0__": tasks}), bare)
    for p in (lerobot, flat, bare):
        assert read_tasks_parquet(p) == want, p.name
    broken = tmp_path / "broken.parquet"
    pq.write_table(pa.table({"task": tasks}), broken)
    with pytest.raises(FloraDataError) as e:
        read_tasks_parquet(broken, dataset="d")
    assert e.value.field == "task_index" and e.value.file == str(broken)


def test_v30_task_comes_from_tasks_parquet_when_episodes_meta_has_none(damaged):
    """Episodes metadata without ``tasks``: the task is looked up by ``task_index``."""
    ep_file = damaged / "meta/episodes/chunk-000/file-000.parquet"
    eps = pd.read_parquet(ep_file)
    want = [t[0] for t in eps.tasks]
    eps.drop(columns=["tasks"]).to_parquet(ep_file)
    ds = open_dataset(damaged)
    assert [ds.episode(i).task for i in ds.episode_indices()] == want


# ----------------------------------------------------------------------------- image dtype


def _png(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _wrist_frames() -> dict[int, list[np.ndarray]]:
    out = {}
    for i, d in enumerate(DURS):
        r = simulate_episode(SEED, i, d)
        w = WorldRenderer(r, 96, 96)
        out[i] = [w.wrist(f) for f in range(r.n_frames)]
    return out


def _make_libero_style(root: Path, frames: dict[int, list[np.ndarray]]) -> None:
    """Turn the wrist camera of a v3.0 copy into a ``dtype: image`` feature (PNG in parquet)."""
    info_p = root / "meta/info.json"
    info = json.loads(info_p.read_text())
    info["features"][WRIST] = {
        "dtype": "image",
        "shape": [96, 96, 3],
        "names": ["height", "width", "channel"],
    }
    info_p.write_text(json.dumps(info, indent=2))
    shutil.rmtree(root / "videos" / WRIST)
    ep_file = root / "meta/episodes/chunk-000/file-000.parquet"
    eps = pd.read_parquet(ep_file)
    eps.drop(columns=[c for c in eps.columns if c.startswith(f"videos/{WRIST}/")]).to_parquet(
        ep_file
    )
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for p in sorted((root / "data").rglob("*.parquet")):
        t = pq.read_table(p)
        cells = [
            {"bytes": _png(frames[e][f]), "path": f"frame_{f:06d}.png"}
            for e, f in zip(
                t.column("episode_index").to_pylist(),
                t.column("frame_index").to_pylist(),
                strict=True,
            )
        ]
        pq.write_table(t.append_column(WRIST, pa.array(cells, struct)), p)


@pytest.fixture(scope="module")
def wrist_frames() -> dict[int, list[np.ndarray]]:
    return _wrist_frames()


@pytest.fixture
def libero_style(damaged, wrist_frames) -> Path:
    _make_libero_style(damaged, wrist_frames)
    return damaged


def test_image_dtype_camera_is_read_not_dropped(libero_style, wrist_frames):
    ds = open_dataset(libero_style)
    assert ds.camera_keys == [TOP, WRIST]
    assert ds.camera_roles == {TOP: "main", WRIST: "wrist"}
    ep = ds.episode(1)
    cam = ep.cameras[WRIST]
    assert cam.kind == "image" and (cam.width, cam.height) == (96, 96)
    assert ep.cameras[TOP].kind == "video"
    # Exact frames (PNG is lossless) at exact times, with the same time -> frame rule as
    # video: a time inside a frame's period maps to that frame.
    times = [0, 49_800, 49_950, 3_210_000, 13_950_000]  # 49_950: within SLACK_US of frame 1
    got = sample_episode_frames(ep, WRIST, times)
    assert [f.t_us for f in got] == [0, 0, 50_000, 3_200_000, 13_950_000]
    for f in got:
        np.testing.assert_array_equal(f.image, wrist_frames[1][f.t_us // 50_000])
    with pytest.raises(FloraDataError) as e:
        sample_episode_frames(ep, WRIST, [14_000_000])
    assert e.value.field == WRIST
    assert sample_episode_frames(ep, WRIST, [14_000_000], clamp_end=True)[0].t_us == 13_950_000
    # The rest of the stack sees a normal camera: mosaics, decode_all, ingest.
    m = sample_mosaics(ep, [0, 250_000])
    assert m[0].image.shape == (96, 192, 3)
    assert len(decode_all(cam)) == 280
    res = ingest_dataset(libero_style, progress=False)
    assert res.n_error == 0
    assert set(res.manifest.cameras) == {f"{TOP},{WRIST}"}


def test_image_only_dataset_with_null_video_path(libero_style, wrist_frames):
    """LeRobot writes ``"video_path": null`` when no camera is a video."""
    info_p = libero_style / "meta/info.json"
    info = json.loads(info_p.read_text())
    del info["features"][TOP]
    info["video_path"] = None
    info_p.write_text(json.dumps(info))
    ds = open_dataset(libero_style)
    assert ds.camera_keys == [WRIST]
    ep = ds.episode(0)
    assert list(ep.cameras) == [WRIST]
    f = sample_episode_frames(ep, WRIST, [5_000_000])[0]
    np.testing.assert_array_equal(f.image, wrist_frames[0][100])


def test_image_cell_without_bytes_is_a_clear_error(libero_style):
    p = libero_style / "data/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    cells = t.column(WRIST).to_pylist()
    cells[5] = {"bytes": None, "path": "frame_000005.png"}
    struct = t.schema.field(WRIST).type
    t = t.set_column(t.schema.get_field_index(WRIST), WRIST, pa.array(cells, struct))
    pq.write_table(t, p)
    ep = open_dataset(libero_style).episode(0)
    assert len(sample_episode_frames(ep, WRIST, [0, 200_000])) == 2
    with pytest.raises(FloraDataError) as e:
        sample_episode_frames(ep, WRIST, [250_000])
    assert e.value.field == WRIST and e.value.episode == 0 and e.value.file == str(p)
    assert "no bytes" in str(e.value)


def test_image_feature_without_its_column_names_the_file(libero_style):
    p = libero_style / "data/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(p).drop_columns([WRIST]), p)
    with pytest.raises(FloraDataError) as e:
        open_dataset(libero_style).episode(0)
    assert e.value.field == WRIST and e.value.file == str(p)


# ----------------------------------------------------------------------------- Hub ids

SHA = "0123456789abcdef0123456789abcdef01234567"


def _hf_cache(cache: Path, src: Path, repo: str, refs: dict[str, str]) -> Path:
    """Lay ``src`` out the way huggingface_hub caches a dataset repo (blobs + symlinks)."""
    store = cache / ("datasets--" + repo.replace("/", "--"))
    snap = store / "snapshots" / SHA
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        data = f.read_bytes()
        blob = store / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / f.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        ups = [".."] * (len(f.relative_to(src).parts) + 1)  # up to the repo folder
        link.symlink_to(Path(*ups, "blobs", blob.name))
    for name, commit in refs.items():
        ref = store / "refs" / name
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return snap


@pytest.fixture
def hub_cache(tiny_v30, tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf_cache"
    snap = _hf_cache(cache, tiny_v30, "lerobot/toy_tiny", {"v3.0": SHA, "main": SHA})
    assert (snap / "meta/info.json").is_symlink() and (snap / "meta/info.json").exists()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snap


def test_hub_repo_id_and_revision_resolve_from_the_cache_offline(hub_cache, tiny_v30):
    for name, kw in (
        ("lerobot/toy_tiny@v3.0", {}),
        ("lerobot/toy_tiny", {"revision": "v3.0"}),
        ("lerobot/toy_tiny", {}),  # default branch: refs/main
        (f"lerobot/toy_tiny@{SHA}", {}),
    ):
        ds = open_dataset(name, **kw)
        assert ds.root == hub_cache, name
        assert ds.name == "toy_tiny" and ds.format == "lerobot_v3.0"
        assert ds.source.repo_id == "lerobot/toy_tiny" and ds.source.commit == SHA
    ep = ds.episode(2)
    local = open_dataset(tiny_v30).episode(2)
    assert ep.episode_id == local.episode_id == "toy_tiny/000002"
    np.testing.assert_array_equal(ep.state, local.state)
    a = sample_episode_frames(ep, TOP, [1_000_000])[0].image
    np.testing.assert_array_equal(a, sample_episode_frames(local, TOP, [1_000_000])[0].image)


def test_unknown_hub_revision_or_repo_is_a_clear_error(hub_cache):
    with pytest.raises(FloraDataError) as e:
        open_dataset("lerobot/toy_tiny@v9.9")
    assert e.value.field == "revision" and "HF_HUB_OFFLINE=1" in str(e.value)
    with pytest.raises(FloraDataError) as e:
        open_dataset("lerobot/not_there")
    assert e.value.dataset == "lerobot/not_there"
    with pytest.raises(FloraDataError) as e:
        open_dataset("lerobot/toy_tiny@v3.0", revision="main")
    assert "two revisions" in str(e.value)
    with pytest.raises(FloraDataError) as e:
        open_dataset("no/such/local/folder")
    assert "does not exist" in str(e.value)


def test_cli_accepts_hub_ids_and_revision(hub_cache):
    from flora.cli import app

    r = CliRunner().invoke(app, ["dataset-info", "lerobot/toy_tiny", "--revision", "v3.0"])
    assert r.exit_code == 0, r.output
    assert "name: toy_tiny" in r.output and "lerobot_v3.0" in r.output
    r = CliRunner().invoke(app, ["ingest", "lerobot/toy_tiny@v3.0"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["dataset-info", "./no/such/folder!"])
    assert r.exit_code == 2
