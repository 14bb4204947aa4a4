"""Fixtures for validation/tracking tests: an isolated FLORA_HOME per test."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="module")
def flora_home(tmp_path_factory):
    """Point settings (MLflow store, outputs) at a fresh directory, shared per module.

    Module scope because creating an MLflow SQLite store costs ~4 s; tests in a module
    use distinct experiments/runs, so sharing the store does not couple them.
    """
    from flora.settings import get_settings

    home = tmp_path_factory.mktemp("flora") / "flora_home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLORA_HOME", str(home))
        mp.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
        get_settings.cache_clear()
        yield home
    get_settings.cache_clear()


def _nan_action(root, episode: int, frame: int = 5) -> None:
    """Put a NaN into one action value of one frame of ``episode`` (data Parquet)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    for p in sorted((root / "data").rglob("*.parquet")):
        df = pq.read_table(p).to_pandas()
        rows = df.index[df.episode_index == episode]
        if len(rows) == 0:
            continue
        a = np.array(df.at[rows[frame], "action"], dtype=np.float32)
        a[0] = np.nan
        df.at[rows[frame], "action"] = a
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), p)
        return
    raise AssertionError(f"episode {episode} not found")


def _backwards_timestamp(root, episode: int, frame: int = 10) -> None:
    """Make one timestamp of ``episode`` go backwards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for p in sorted((root / "data").rglob("*.parquet")):
        df = pq.read_table(p).to_pandas()
        rows = df.index[df.episode_index == episode]
        if len(rows):
            df.loc[rows[frame], "timestamp"] = df.loc[rows[frame - 2], "timestamp"]
            pq.write_table(pa.Table.from_pandas(df, preserve_index=False), p)
            return
    raise AssertionError(f"episode {episode} not found")


def _corrupt_video(root, episode: int, camera: str = "observation.images.wrist") -> str:
    """Overwrite the (single-episode) video file of ``episode`` with truncated garbage."""
    import pandas as pd

    meta = pd.read_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
    m = meta[meta.episode_index == episode].iloc[0]
    users = meta[
        (meta[f"videos/{camera}/file_index"] == m[f"videos/{camera}/file_index"])
        & (meta[f"videos/{camera}/chunk_index"] == m[f"videos/{camera}/chunk_index"])
    ]
    assert len(users) == 1, "pick an episode that has its video file to itself"
    path = (
        root
        / "videos"
        / camera
        / f"chunk-{int(m[f'videos/{camera}/chunk_index']):03d}"
        / f"file-{int(m[f'videos/{camera}/file_index']):03d}.mp4"
    )
    data = path.read_bytes()
    path.write_bytes(data[:64] + b"\x00garbage" * 100)
    return str(path)


DAMAGES = {
    "nan_action": _nan_action,
    "backwards_timestamp": _backwards_timestamp,
    "corrupt_video": _corrupt_video,
}


@pytest.fixture
def damaged_copy(tiny_dataset, tmp_path):
    """Factory: ``damaged_copy(kind, episode)`` -> (root of a damaged copy, damage info)."""
    import shutil

    def make(kind: str, episode: int):
        root = tmp_path / f"{kind}_{episode}" / tiny_dataset.name
        shutil.copytree(tiny_dataset, root)
        info = DAMAGES[kind](root, episode)
        return root, info

    return make
