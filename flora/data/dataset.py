"""Dataset readers: LeRobot v3.0, LeRobot v2.1 and a plain folder of mp4 files.

``open_dataset(path)`` detects the layout and returns a ``Dataset`` whose ``episode(i)``
yields the shared ``Episode`` model (``flora.data.episode``). Readers validate what they
read and raise ``FloraDataError`` naming dataset, episode, file and field.

Choices (see docs/dataset.md):
- Timestamps are stored as float seconds (float32 in LeRobot); they are converted to
  integer µs and snapped to the ``k / fps`` grid when every value lies within 1 ms of it.
  They must then strictly increase; they are made episode-relative (first frame = 0).
- ``duration_us = length / fps`` (each frame presents for one period).
- Camera roles: a key containing "wrist", "hand", "gripper" or "eye_in_hand" is the
  wrist camera; the first other camera (preferring "top", "main", "front", "high",
  "overhead", "image") is "main"; further cameras keep their short name as role.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flora.data.episode import CameraStream, Episode, FloraDataError

WRIST_WORDS = ("wrist", "hand", "gripper", "eye_in_hand")
MAIN_PREF = ("top", "main", "front", "high", "overhead", "image", "video", "cam")
SNAP_TOL_US = 1000


def short_name(key: str) -> str:
    """``observation.images.top`` -> ``top``."""
    return key.rsplit(".", 1)[-1]


def assign_roles(keys: list[str]) -> dict[str, str]:
    """Camera key -> role ("main", "wrist", or the key's short name)."""
    roles: dict[str, str] = {}
    wrist = [k for k in keys if any(w in short_name(k).lower() for w in WRIST_WORDS)]
    if wrist:
        roles[wrist[0]] = "wrist"
    others = [k for k in keys if k not in roles]

    def pref(k: str) -> tuple[int, str]:
        n = short_name(k).lower()
        ranks = [i for i, w in enumerate(MAIN_PREF) if w in n]
        return (ranks[0] if ranks else len(MAIN_PREF), k)

    others_sorted = sorted([k for k in others if k not in wrist], key=pref)
    if others_sorted:
        roles[others_sorted[0]] = "main"
    for k in keys:
        roles.setdefault(k, short_name(k))
    return roles


def timestamps_to_us(
    ts: np.ndarray, fps: float, *, dataset: str, episode: int, file: Path
) -> np.ndarray:
    """Float seconds -> episode-relative int64 µs, snapped to the frame grid, validated."""
    ts = np.asarray(ts, dtype=np.float64).reshape(-1)
    if len(ts) == 0:
        raise FloraDataError(
            "episode has no frames", dataset=dataset, episode=episode, file=file, field="timestamp"
        )
    if not np.all(np.isfinite(ts)):
        raise FloraDataError(
            "non-finite timestamp", dataset=dataset, episode=episode, file=file, field="timestamp"
        )
    us = np.round(ts * 1e6).astype(np.int64)
    k = np.round(ts * fps).astype(np.int64)
    grid = np.round(k * (1e6 / fps)).astype(np.int64)
    if np.all(np.abs(us - grid) <= SNAP_TOL_US):
        us = grid
    us = us - us[0]
    bad = np.nonzero(np.diff(us) <= 0)[0]
    if len(bad):
        j = int(bad[0])
        raise FloraDataError(
            f"timestamps not strictly increasing at frame {j + 1} ({us[j]} µs then {us[j + 1]} µs)",
            dataset=dataset,
            episode=episode,
            file=file,
            field="timestamp",
        )
    return us


def meta_path(root: Path, template: str, *, field: str, **where_and_values) -> Path:
    """``root / template.format(**values)`` for a path template read from metadata.

    A template that does not format (unknown placeholder, bad format spec) or a result
    that leaves the dataset root (absolute, drive-qualified or containing ``..``) is a
    ``FloraDataError`` naming ``field``, never a KeyError/traceback or a file outside
    ``root``. ``where_and_values`` holds ``dataset``/``episode``/``file`` (error location)
    and the placeholder values. Lexical only: symlinks inside the root (the Hugging Face
    cache lays datasets out as symlinks to blobs) are followed as usual.
    """
    where = {
        k: where_and_values.pop(k) for k in ("dataset", "episode", "file") if k in where_and_values
    }
    if not isinstance(template, str):
        raise FloraDataError(
            f"path template must be a string, got {template!r}", field=field, **where
        )
    try:
        rel = template.format(**where_and_values)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
        names = sorted(
            {f for _, f, _, _ in string.Formatter().parse(template) if f} - set(where_and_values)
        )
        why = f"unknown placeholder(s) {names}" if names else f"{type(e).__name__}: {e}"
        raise FloraDataError(
            f"path template {template!r} does not format ({why}; "
            f"known: {sorted(where_and_values)})",
            field=field,
            **where,
        ) from e
    pp, wp = PurePosixPath(rel), PureWindowsPath(rel)
    if not rel or pp.is_absolute() or wp.drive or wp.root or ".." in pp.parts or ".." in wp.parts:
        raise FloraDataError(
            f"path from metadata leaves the dataset root: {rel!r}", field=field, **where
        )
    return root / rel


def _is_numeric(t: pa.DataType) -> bool:
    # An all-null column has Arrow type null: it reads as NaN, which validation reports.
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_decimal(t)
        or pa.types.is_null(t)
    )


def _vector_column(tbl: pa.Table, name: str, n: int, **where) -> np.ndarray:
    """A list/fixed-size-list/scalar column as (N, D) float32; absent -> (N, 0).

    Values must be numbers: a column of strings (or any other type) is a
    ``FloraDataError`` naming the column, never a bare conversion error.
    """
    if name not in tbl.column_names:
        return np.zeros((n, 0), np.float32)
    col = tbl.column(name).combine_chunks()
    is_list = (
        pa.types.is_list(col.type)
        or pa.types.is_fixed_size_list(col.type)
        or pa.types.is_large_list(col.type)
    )
    value_type = col.type.value_type if is_list else col.type
    if not _is_numeric(value_type):
        raise FloraDataError(
            f"vector column holds {value_type} values, not numbers", field=name, **where
        )
    if is_list:
        lens = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if len(lens) and (lens.min() != lens.max()):
            raise FloraDataError("vector column has rows of different lengths", field=name, **where)
        d = int(lens[0]) if len(lens) else 0
        flat = pc.list_flatten(col).to_numpy(zero_copy_only=False)
        return flat.astype(np.float32).reshape(n, d)
    return col.to_numpy(zero_copy_only=False).astype(np.float32).reshape(n, 1)


def _names(feat: dict | None) -> list[str]:
    if not feat:
        return []
    names = feat.get("names")
    if isinstance(names, dict):  # older LeRobot: {"motors": [...]}
        names = [n for v in names.values() for n in (v if isinstance(v, list) else [v])]
    return [str(n) for n in names] if isinstance(names, list) else []


def _chunks_size(info: dict, *, dataset: str, file: Path) -> int:
    """``info.json`` ``chunks_size`` (default 1000) as a positive int.

    Checked once when the dataset opens, so a null, non-numeric or zero value is a named
    dataset error instead of a TypeError/ZeroDivisionError while loading every episode.
    """
    v = info.get("chunks_size", 1000)
    # bool is an int subclass; an integral float (1000.0) is accepted as its int.
    ok = not isinstance(v, bool) and (
        isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    )
    if not ok or v <= 0:
        raise FloraDataError(
            f"chunks_size must be a positive integer, got {v!r}",
            dataset=dataset,
            file=file,
            field="chunks_size",
        )
    return int(v)


def _task_list(value: Any, **where) -> list[str] | None:
    """An episode's ``tasks`` metadata value as a list of strings; None when absent.

    A missing cell (None/NaN, e.g. one meta file of several lacks the column) is absent,
    so the caller falls back to ``task_index``. A plain string is one task (joining its
    characters would garble it); anything else that is not a list of strings is bad input.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple | np.ndarray) and all(isinstance(t, str) for t in value):
        return [str(t) for t in value]
    raise FloraDataError(
        f"tasks must be a list of strings, got {type(value).__name__} {value!r}"[:300],
        field="tasks",
        **where,
    )


def _episode_task(
    value: Any, declared: bool, rows: pa.Table, tasks: dict[int, str], **where
) -> str:
    """The episode's task text: its ``tasks`` metadata, else its rows' ``task_index``.

    ``declared``: the metadata has a ``tasks`` field for this episode. When that field is
    null and ``task_index`` gives no task either, the task is lost: a named error rather
    than a silent ``""``. A dataset without per-episode tasks keeps ``""``.
    """
    listed = _task_list(value, **where)
    if listed:
        return "; ".join(listed)
    task = ""
    if "task_index" in rows.column_names and rows.num_rows:
        ti = rows.column("task_index")[0].as_py()
        task = tasks.get(int(ti), "") if ti is not None else ""
    if not task and declared and listed is None:
        raise FloraDataError(
            "episode has no tasks value and no task_index to look its task up by",
            field="tasks",
            **where,
        )
    return task


def unexpected_episode_error(e: Exception, *, dataset: str, episode: int) -> FloraDataError:
    """``e`` as the ``FloraDataError`` a per-episode step records for episode ``episode``.

    A ``FloraDataError`` is returned as is; any other exception (a reader bug or input no
    check foresaw) is wrapped, naming its type and message, so that ingest and validation
    record it as that episode's failure and go on with the other episodes.
    """
    if isinstance(e, FloraDataError):
        return e
    err = FloraDataError(
        f"unexpected {type(e).__name__}: {e}",
        dataset=dataset,
        episode=episode,
    )
    err.__cause__ = e
    return err


def read_tasks_parquet(path: Path, *, dataset: str | None = None) -> dict[int, str]:
    """``task_index -> task`` from a LeRobot v3.0 ``meta/tasks.parquet``.

    Reads both shapes in the wild: LeRobot's own (the task string is the pandas index,
    one ``task_index`` column; without pandas metadata the index shows up as a
    ``__index_level_0__`` column) and a flat table with ``task`` and ``task_index``
    columns (what flora's generator wrote before it followed LeRobot).
    """
    try:
        df = pd.read_parquet(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise FloraDataError(
            f"unreadable tasks parquet ({e})", dataset=dataset, file=path, field="tasks"
        ) from e
    if "task_index" not in df.columns:
        raise FloraDataError(
            f"tasks parquet has no task_index column (columns: {list(df.columns)})",
            dataset=dataset,
            file=path,
            field="task_index",
        )
    if "task" in df.columns:
        texts = list(df["task"])
    elif "__index_level_0__" in df.columns:
        texts = list(df["__index_level_0__"])
    else:
        texts = list(df.index)
    if not all(isinstance(t, str) for t in texts):
        raise FloraDataError(
            "tasks parquet: task strings not found (expected them as the index or a 'task' column)",
            dataset=dataset,
            file=path,
            field="task",
        )
    return {int(i): t for i, t in zip(df["task_index"], texts, strict=True)}


class Dataset:
    """Common interface of every reader."""

    format: str = ""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = root.name
        self.source: DatasetSource | None = None  # set by open_dataset

    # Overridden by readers ---------------------------------------------------
    @property
    def fps(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def camera_keys(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def episode_indices(self) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _load(self, i: int) -> Episode:  # pragma: no cover - abstract
        raise NotImplementedError

    # Shared -----------------------------------------------------------------
    @property
    def num_episodes(self) -> int:
        return len(self.episode_indices())

    @cached_property
    def camera_roles(self) -> dict[str, str]:
        """Camera key -> role ("main", "wrist", ...)."""
        return assign_roles(self.camera_keys)

    def episode(self, i: int) -> Episode:
        """Load episode ``i`` (an index from ``episode_indices()``)."""
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise FloraDataError(
                f"episode index must be an int, got {i!r}", dataset=self.name, field="episode_index"
            )
        if int(i) not in set(self.episode_indices()):
            idx = self.episode_indices()
            rng = f"{idx[0]}..{idx[-1]}" if idx else "none"
            raise FloraDataError(
                f"episode index out of range (dataset has {rng})",
                dataset=self.name,
                episode=int(i),
                field="episode_index",
            )
        return self._load(int(i))

    def __len__(self) -> int:
        return self.num_episodes

    def __iter__(self):
        for i in self.episode_indices():
            yield self.episode(i)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, format={self.format!r}, "
            f"episodes={self.num_episodes}, fps={self.fps}, cameras={self.camera_keys})"
        )


# ----------------------------------------------------------------------------- LeRobot


class _LeRobotBase(Dataset):
    REQUIRED_INFO = ("codebase_version", "fps", "features", "data_path")
    DATA_FIELDS: tuple[str, ...] = ()  # placeholders data_path / video_path may use
    VIDEO_FIELDS: tuple[str, ...] = ()

    def __init__(self, root: Path, info: dict) -> None:
        super().__init__(root)
        self.info_path = root / "meta" / "info.json"
        for k in self.REQUIRED_INFO:
            if k not in info:
                raise FloraDataError(
                    "meta/info.json is missing a required key",
                    dataset=self.name,
                    file=self.info_path,
                    field=k,
                )
        if not isinstance(info["features"], dict):
            raise FloraDataError(
                "features must be an object",
                dataset=self.name,
                file=self.info_path,
                field="features",
            )
        try:
            self._fps = float(info["fps"])
        except (TypeError, ValueError) as e:
            raise FloraDataError(
                f"fps is not a number: {info['fps']!r}",
                dataset=self.name,
                file=self.info_path,
                field="fps",
            ) from e
        if not math.isfinite(self._fps) or self._fps <= 0:
            raise FloraDataError(
                f"fps must be a positive finite number, got {info['fps']!r}",
                dataset=self.name,
                file=self.info_path,
                field="fps",
            )
        self.info = info
        self.features: dict = info["features"]
        self._video_keys = [
            k for k, f in self.features.items() if isinstance(f, dict) and f.get("dtype") == "video"
        ]
        # Cameras stored as encoded images in the data parquet (LIBERO-style datasets).
        self._image_keys = [
            k for k, f in self.features.items() if isinstance(f, dict) and f.get("dtype") == "image"
        ]
        if self._video_keys and "video_path" not in info:
            raise FloraDataError(
                "meta/info.json is missing a required key",
                dataset=self.name,
                file=self.info_path,
                field="video_path",
            )
        self.chunks_size = _chunks_size(info, dataset=self.name, file=self.info_path)
        # Templates are checked once here (dummy values), so a bad one is a dataset error.
        for key, names in (("data_path", self.DATA_FIELDS), ("video_path", self.VIDEO_FIELDS)):
            # LeRobot writes "video_path": null when every camera is an image feature.
            if key in info and not (key == "video_path" and info[key] is None):
                meta_path(
                    root,
                    info[key],
                    field=key,
                    dataset=self.name,
                    file=self.info_path,
                    **{n: "x" if n == "video_key" else 0 for n in names},
                )
        self._tables: OrderedDict[Path, pa.Table] = OrderedDict()
        self._schemas: dict[Path, list[str]] = {}

    @property
    def fps(self) -> float:
        return self._fps

    @property
    def camera_keys(self) -> list[str]:
        keys = set(self._video_keys) | set(self._image_keys)
        return [k for k in self.features if k in keys]

    def _image_cameras(self, i: int, rows: pa.Table, length: int, path: Path) -> dict:
        """``kind="image"`` streams for the image features of episode ``i`` (rows of ``path``)."""
        cams = {}
        dur = int(round(length * 1e6 / self._fps))
        for key in self._image_keys:
            if key not in self._schemas.get(path, ()):
                raise FloraDataError(
                    "image feature has no column in the data file",
                    dataset=self.name,
                    episode=i,
                    file=path,
                    field=key,
                )
            w, h = self._video_size(key)
            cams[key] = CameraStream(
                key,
                self.camera_roles[key],
                path,
                0,
                dur,
                self._video_fps(key),
                w,
                h,
                kind="image",
                episode_index=i,
            )
        return cams

    def _video_size(self, key: str) -> tuple[int, int]:
        f = self.features[key]
        vi = f.get("info") or {}
        h, w = vi.get("video.height"), vi.get("video.width")
        if h is None or w is None:
            shape = f.get("shape")
            names = f.get("names") or ["height", "width", "channels"]
            if not shape or len(shape) != 3:
                raise FloraDataError(
                    "video feature has no shape",
                    dataset=self.name,
                    file=self.info_path,
                    field=f"features.{key}.shape",
                )
            if list(names)[:1] == ["channels"]:
                _, h, w = shape
            else:
                h, w, _ = shape
        return int(w), int(h)

    def _video_fps(self, key: str) -> float:
        vi = self.features[key].get("info") or {}
        try:
            fps = float(vi.get("video.fps", self._fps))
        except (TypeError, ValueError):
            fps = math.nan
        if not math.isfinite(fps) or fps <= 0:
            raise FloraDataError(
                f"video fps must be a positive finite number, got {vi.get('video.fps')!r}",
                dataset=self.name,
                file=self.info_path,
                field=f"features.{key}.info.video.fps",
            )
        return fps

    def _read_table(self, path: Path, ep: int) -> pa.Table:
        """Parquet read with a small LRU (v3.0 data files hold several episodes)."""
        if path in self._tables:
            self._tables.move_to_end(path)
            return self._tables[path]
        if not path.exists():
            raise FloraDataError(
                "data file is missing", dataset=self.name, episode=ep, file=path, field="data_path"
            )
        try:
            # Image columns (encoded frames, often most of the file) are read only when a
            # frame is sampled (flora.data.frames), not with every episode's signals.
            names = pq.read_schema(path).names
            tbl = pq.read_table(path, columns=[c for c in names if c not in self._image_keys])
            self._schemas[path] = names
        except (pa.ArrowInvalid, OSError) as e:
            raise FloraDataError(
                f"unreadable parquet ({e})",
                dataset=self.name,
                episode=ep,
                file=path,
                field="data_path",
            ) from e
        self._tables[path] = tbl
        while len(self._tables) > 2:
            self._tables.popitem(last=False)
        return tbl

    def _episode_from_rows(
        self, i: int, rows: pa.Table, length: int, task: str, cams: dict, path: Path
    ) -> Episode:
        where = dict(dataset=self.name, episode=i, file=path)
        if length <= 0:
            raise FloraDataError("zero-length episode", field="length", **where)
        if rows.num_rows == 0:
            raise FloraDataError("episode has no data rows", field="episode_index", **where)
        if rows.num_rows != length:
            raise FloraDataError(
                f"episode has {rows.num_rows} data rows but length {length}",
                field="length",
                **where,
            )
        if "frame_index" in rows.column_names:
            rows = rows.sort_by("frame_index")
        if "timestamp" not in rows.column_names:
            raise FloraDataError("data file has no timestamp column", field="timestamp", **where)
        ts = timestamps_to_us(rows.column("timestamp").to_numpy(), self._fps, **where)
        n = rows.num_rows
        return Episode(
            dataset=self.name,
            index=i,
            task=task,
            fps=self._fps,
            duration_us=int(round(length * 1e6 / self._fps)),
            timestamps_us=ts,
            state=_vector_column(rows, "observation.state", n, **where),
            action=_vector_column(rows, "action", n, **where),
            cameras=cams,
            state_names=_names(self.features.get("observation.state")),
            action_names=_names(self.features.get("action")),
        )


class LeRobotV30Dataset(_LeRobotBase):
    """LeRobot v3.0: episodes concatenated in shared data and video files."""

    format = "lerobot_v3.0"
    DATA_FIELDS = ("chunk_index", "file_index")
    VIDEO_FIELDS = ("video_key", "chunk_index", "file_index")

    def __init__(self, root: Path, info: dict) -> None:
        super().__init__(root, info)
        files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise FloraDataError(
                "no episode metadata",
                dataset=self.name,
                file=root / "meta" / "episodes",
                field="episodes",
            )
        frames = []
        for f in files:
            try:
                frames.append(pd.read_parquet(f))
            except (pa.ArrowInvalid, OSError) as e:
                raise FloraDataError(
                    f"unreadable episode metadata ({e})",
                    dataset=self.name,
                    file=f,
                    field="episodes",
                ) from e
        eps = pd.concat(frames, ignore_index=True)
        # The file each concatenated row came from, so errors name the right file.
        row_file = [f for f, fr in zip(files, frames, strict=True) for _ in range(len(fr))]
        need = ["episode_index", "length", "data/chunk_index", "data/file_index"]
        for key in self._video_keys:
            need += [
                f"videos/{key}/{c}"
                for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
            ]
        for c in need:
            if c not in eps.columns:
                raise FloraDataError(
                    "episode metadata column missing", dataset=self.name, file=files[0], field=c
                )
        idx = eps.episode_index
        if idx.isna().any():  # a file without the column: concat filled NaN
            raise FloraDataError(
                "episode metadata row without episode_index",
                dataset=self.name,
                file=row_file[int(np.flatnonzero(idx.isna().to_numpy())[0])],
                field="episode_index",
            )
        if idx.duplicated().any():
            pos = int(np.flatnonzero(idx.duplicated().to_numpy())[0])
            raise FloraDataError(
                "duplicate episode in metadata",
                dataset=self.name,
                episode=int(idx.iloc[pos]),
                file=row_file[pos],
                field="episode_index",
            )
        self._ep_files: dict[int, Path] = {int(i): f for i, f in zip(idx, row_file, strict=True)}
        self.episodes_meta = eps.set_index("episode_index", drop=False).sort_index()
        self._ep_file = files[0]
        self._tasks = self._read_tasks()

    def _read_tasks(self) -> dict[int, str]:
        p = self.root / "meta" / "tasks.parquet"
        if not p.exists():
            return {}
        return read_tasks_parquet(p, dataset=self.name)

    def episode_indices(self) -> list[int]:
        return [int(i) for i in self.episodes_meta.index]

    def _load(self, i: int) -> Episode:
        m = self.episodes_meta.loc[i]
        meta_file = self._ep_files.get(i, self._ep_file)

        def num(col: str, whole: bool = True) -> Any:
            where = {"dataset": self.name, "episode": i, "file": meta_file}
            return _meta_number(m, col, whole=whole, **where)

        dc, df_ = num("data/chunk_index"), num("data/file_index")
        path = meta_path(
            self.root,
            self.info["data_path"],
            field="data_path",
            dataset=self.name,
            episode=i,
            file=self.info_path,
            chunk_index=dc,
            file_index=df_,
        )
        tbl = self._read_table(path, i)
        if "episode_index" not in tbl.column_names:
            raise FloraDataError(
                "data file has no episode_index column",
                dataset=self.name,
                episode=i,
                file=path,
                field="episode_index",
            )
        rows = tbl.filter(pc.equal(tbl.column("episode_index"), i))
        task = _episode_task(
            m.get("tasks") if "tasks" in m.index else None,
            "tasks" in m.index,
            rows,
            self._tasks,
            dataset=self.name,
            episode=i,
            file=meta_file,
        )
        length = num("length")
        cams = {}
        roles = self.camera_roles
        for key in self._video_keys:
            vc, vf = num(f"videos/{key}/chunk_index"), num(f"videos/{key}/file_index")
            vp = meta_path(
                self.root,
                self.info["video_path"],
                field="video_path",
                dataset=self.name,
                episode=i,
                file=self.info_path,
                video_key=key,
                chunk_index=vc,
                file_index=vf,
            )
            if not vp.exists():
                raise FloraDataError(
                    "camera file is missing", dataset=self.name, episode=i, file=vp, field=key
                )
            t0 = int(round(num(f"videos/{key}/from_timestamp", whole=False) * 1e6))
            t1 = int(round(num(f"videos/{key}/to_timestamp", whole=False) * 1e6))
            if not t1 > t0 >= 0:
                raise FloraDataError(
                    f"bad video span [{t0}, {t1}) µs",
                    dataset=self.name,
                    episode=i,
                    file=meta_file,
                    field=f"videos/{key}/to_timestamp",
                )
            w, h = self._video_size(key)
            cams[key] = CameraStream(key, roles[key], vp, t0, t1, self._video_fps(key), w, h)
        cams.update(self._image_cameras(i, rows, length, path))
        return self._episode_from_rows(i, rows, length, task, cams, path)


def _meta_number(
    m: pd.Series | dict, col: str, *, whole: bool = True, dataset: str, episode: int, file: Path
) -> Any:
    """One cell of an episode's metadata row as a finite number (an int where ``whole``).

    A null or non-numeric cell is bad input of that episode, named as such, so the run
    records the episode as failed and goes on (a bare ``int(nan)`` would stop it).
    """
    v = m[col]
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or (whole and not x.is_integer()):
        kind = "an integer" if whole else "a finite number"
        raise FloraDataError(
            f"episode metadata value '{v}' is not {kind}",
            dataset=dataset,
            episode=episode,
            file=file,
            field=col,
        )
    return int(x) if whole else x


def _read_jsonl(path: Path, add: Callable[[dict], None], *, dataset: str, field: str) -> None:
    """Hand each record of a JSON-lines metadata file to ``add``; a line that is not JSON or
    lacks what ``add`` reads is bad input naming the file, the line and the field."""
    for ln, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            add(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise FloraDataError(
                f"bad {path.name} line {ln} ({e})", dataset=dataset, file=path, field=field
            ) from e


class LeRobotV21Dataset(_LeRobotBase):
    """LeRobot v2.x: one parquet and one mp4 per episode, jsonl metadata."""

    format = "lerobot_v2.1"
    DATA_FIELDS = ("episode_chunk", "episode_index")
    VIDEO_FIELDS = ("episode_chunk", "video_key", "episode_index")

    def __init__(self, root: Path, info: dict) -> None:
        super().__init__(root, info)
        p = root / "meta" / "episodes.jsonl"
        self._ep_file = p
        if not p.exists():
            raise FloraDataError(
                "episode metadata missing", dataset=self.name, file=p, field="episodes"
            )
        self.episodes_meta: dict[int, dict] = {}

        def add_episode(d: dict) -> None:
            d["length"]  # noqa: B018 - required; its value is checked per episode (_load)
            self.episodes_meta[int(d["episode_index"])] = d

        _read_jsonl(p, add_episode, dataset=self.name, field="episode_index/length")
        self._tasks: dict[int, str] = {}
        tp = root / "meta" / "tasks.jsonl"
        if tp.exists():

            def add_task(d: dict) -> None:
                self._tasks[int(d["task_index"])] = str(d["task"])

            _read_jsonl(tp, add_task, dataset=self.name, field="task_index/task")

    def episode_indices(self) -> list[int]:
        return sorted(self.episodes_meta)

    def _load(self, i: int) -> Episode:
        m = self.episodes_meta[i]
        chunk = i // self.chunks_size
        path = meta_path(
            self.root,
            self.info["data_path"],
            field="data_path",
            dataset=self.name,
            episode=i,
            file=self.info_path,
            episode_chunk=chunk,
            episode_index=i,
        )
        rows = self._read_table(path, i)
        if "episode_index" in rows.column_names:
            rows = rows.filter(pc.equal(rows.column("episode_index"), i))
        where = {"dataset": self.name, "episode": i, "file": self._ep_file}
        task = _episode_task(m.get("tasks"), "tasks" in m, rows, self._tasks, **where)
        # As v3.0: a fractional, null or non-numeric length is this episode's bad input.
        length = _meta_number(m, "length", **where)
        cams = {}
        roles = self.camera_roles
        dur = int(round(length * 1e6 / self._fps))
        for key in self._video_keys:
            vp = meta_path(
                self.root,
                self.info["video_path"],
                field="video_path",
                dataset=self.name,
                episode=i,
                file=self.info_path,
                episode_chunk=chunk,
                video_key=key,
                episode_index=i,
            )
            if not vp.exists():
                raise FloraDataError(
                    "camera file is missing", dataset=self.name, episode=i, file=vp, field=key
                )
            w, h = self._video_size(key)
            cams[key] = CameraStream(key, roles[key], vp, 0, dur, self._video_fps(key), w, h)
        cams.update(self._image_cameras(i, rows, length, path))
        return self._episode_from_rows(i, rows, length, task, cams, path)


# ----------------------------------------------------------------------------- mp4 folder

_KNOWN_CAMS = {
    "main",
    "top",
    "wrist",
    "front",
    "side",
    "left",
    "right",
    "hand",
    "gripper",
    "high",
    "low",
    "overhead",
    "cam",
    "camera",
    "external",
    "ego",
}


class Mp4FolderDataset(Dataset):
    """A folder of mp4 files: one episode per file, or ``<name>.<camera>.mp4`` groups.

    A file ``a.b.mp4`` is camera ``b`` of episode ``a`` when another file shares the stem
    ``a`` or ``b`` is a common camera word (top, wrist, front, ...); otherwise the whole
    name is the episode and its single camera key is ``video``. Episodes are indexed in
    sorted name order. The ``.mp4`` suffix matches in any case (``.MP4`` from cameras
    and phones); two files that would give the same episode and camera (``a.mp4`` and
    ``a.MP4``) are refused. There is no state/action: those arrays have zero columns.
    """

    format = "mp4_folder"

    def __init__(self, root: Path, files: list[Path]) -> None:
        super().__init__(root)
        files = sorted(files, key=lambda f: f.name)  # ids must not depend on listing order
        stems: dict[str, int] = {}
        for f in files:
            base = f.name[:-4]
            if "." in base:
                stems[base.rsplit(".", 1)[0]] = stems.get(base.rsplit(".", 1)[0], 0) + 1
        groups: dict[str, dict[str, Path]] = {}

        def put(name: str, cam: str, f: Path) -> None:
            # Silently keeping one of two files would drop an episode's video.
            if cam in groups.setdefault(name, {}):
                raise FloraDataError(
                    f"{groups[name][cam].name} and {f.name} both give episode {name!r} "
                    f"camera {cam!r}; rename one",
                    dataset=self.name,
                    file=f,
                    field="file name",
                )
            groups[name][cam] = f

        for f in files:
            base = f.name[:-4]
            if "." in base:
                stem, cam = base.rsplit(".", 1)
                if stems.get(stem, 0) > 1 or cam.lower() in _KNOWN_CAMS:
                    put(stem, cam, f)
                    continue
            put(base, "video", f)
        self.names = sorted(groups)
        self.files = groups
        keys = sorted({k for g in groups.values() for k in g})
        self._keys = keys
        self._fps_cache: float | None = None

    @property
    def camera_keys(self) -> list[str]:
        return list(self._keys)

    @property
    def fps(self) -> float:
        if self._fps_cache is None:
            from flora.data.video import probe

            first = next(iter(self.files[self.names[0]].values()))
            self._fps_cache = probe(first, dataset=self.name, episode=0).fps
        return self._fps_cache

    def episode_indices(self) -> list[int]:
        return list(range(len(self.names)))

    def episode_name(self, i: int) -> str:
        return self.names[i]

    def _load(self, i: int) -> Episode:
        from flora.data.video import open_video, packet_index

        cams: dict[str, CameraStream] = {}
        roles = self.camera_roles
        main_ts: np.ndarray | None = None
        fps = None
        for key, path in sorted(self.files[self.names[i]].items()):
            with open_video(path, dataset=self.name, episode=i, field=key) as c:
                vs = c.streams.video[0]
                rate = vs.average_rate or vs.guessed_rate
                try:
                    pts, _, _, _ = packet_index(c)
                except Exception as e:  # noqa: BLE001 - any demux failure is bad input
                    raise FloraDataError(
                        f"unreadable video ({e})",
                        dataset=self.name,
                        episode=i,
                        file=path,
                        field=key,
                    ) from e
                w, h = int(vs.codec_context.width), int(vs.codec_context.height)
            if not pts or not rate:
                raise FloraDataError(
                    "zero-length video", dataset=self.name, episode=i, file=path, field="length"
                )
            ts = np.asarray(pts, dtype=np.int64)
            ts = ts - ts[0]
            if len(ts) > 1 and np.any(np.diff(ts) <= 0):
                raise FloraDataError(
                    "frame timestamps not strictly increasing",
                    dataset=self.name,
                    episode=i,
                    file=path,
                    field="timestamp",
                )
            period = int(round(1e6 / float(rate)))
            end = int(ts[-1]) + period
            cams[key] = CameraStream(key, roles[key], path, 0, end, float(rate), w, h)
            if main_ts is None or roles[key] == "main":
                main_ts, fps = ts, float(rate)
        assert main_ts is not None and fps is not None
        n = len(main_ts)
        dur = max(c.file_end_us for c in cams.values())
        return Episode(
            dataset=self.name,
            index=i,
            task="",
            fps=fps,
            duration_us=dur,
            timestamps_us=main_ts,
            state=np.zeros((n, 0), np.float32),
            action=np.zeros((n, 0), np.float32),
            cameras=cams,
        )


# ----------------------------------------------------------------------------- entry


# ``org/name`` (Hub repo id), optionally ``@revision`` (branch, tag or commit).
HUB_DATASET = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[^@\s]+))?$")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class DatasetSource:
    """Where a dataset's files are: a local root, and for Hub datasets the repo/commit."""

    root: Path
    name: str
    repo_id: str | None = None
    revision: str | None = None  # as asked for (branch/tag/commit), None = the default
    commit: str | None = None  # the snapshot's commit hash (Hub datasets)


def local_dataset_name(path: str | Path) -> str:
    """The name of a local dataset folder: the last part of its absolute path.

    ``.`` and ``..`` have no name of their own (``Path(".").name == ""``): the absolute path
    gives it, so a step run from inside the dataset keys its episodes as a run given the
    path does. ``""`` only for ``/``.
    """
    return Path(os.path.abspath(path)).name


def dataset_name(path: str | Path) -> str:
    """The name :func:`open_dataset` gives ``path``, without opening or downloading it: a
    local folder's :func:`local_dataset_name`, a Hub ``org/name[@revision]``'s ``name``."""
    if not Path(path).exists() and (m := HUB_DATASET.match(str(path))):
        return m.group("repo").split("/", 1)[1]
    return local_dataset_name(path)


def resolve_dataset(path: str | Path, revision: str | None = None) -> DatasetSource:
    """A local dataset folder, or a Hugging Face Hub dataset resolved into the local cache.

    A path that exists on disk is used as is (so a local folder named like ``org/name``
    wins). Otherwise ``org/name`` or ``org/name@revision`` (or ``revision=``) names a Hub
    dataset repo: ``huggingface_hub.snapshot_download(repo_type="dataset")`` resolves it
    into the HF cache (``HF_HUB_CACHE``, read at call time) and returns the snapshot folder
    of that commit. With ``HF_HUB_OFFLINE=1`` resolution uses the cache only: a branch or
    tag is looked up in ``refs/<revision>``, a commit in ``snapshots/<commit>``.
    """
    text = str(path)
    local = Path(path)
    if local.exists():
        if revision is not None:
            raise FloraDataError(
                "a revision applies to Hub datasets, not to a local folder",
                dataset=local.name,
                file=local,
                field="revision",
            )
        name = local_dataset_name(local)
        if not name:
            raise FloraDataError("a dataset folder needs a name; `/` has none", file=local)
        return DatasetSource(local, name)
    m = HUB_DATASET.match(text)
    if m is None:
        raise FloraDataError("dataset path does not exist", dataset=local.name, file=local)
    repo, rev = m.group("repo"), m.group("rev")
    if rev is not None and revision is not None and rev != revision:
        raise FloraDataError(
            f"two revisions given: {rev!r} in the name and {revision!r}",
            dataset=repo,
            field="revision",
        )
    rev = rev or revision
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    try:
        snap = snapshot_download(
            repo,
            repo_type="dataset",
            revision=rev,
            cache_dir=os.environ.get("HF_HUB_CACHE") or None,
            local_files_only=offline,
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        how = "in the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "on the Hub"
        raise FloraDataError(
            f"Hub dataset {repo}@{rev or 'main'} not found {how}: {type(e).__name__}: {e}",
            dataset=repo,
            field="revision" if rev else "dataset",
        ) from e
    root = Path(snap)
    return DatasetSource(root, repo.split("/", 1)[1], repo, rev, root.name)


def open_dataset(path: str | Path, *, revision: str | None = None) -> Dataset:
    """Open a dataset, auto-detecting LeRobot v3.0, LeRobot v2.1 or a plain mp4 folder.

    ``path`` is a local folder or a Hub dataset ``org/name[@revision]`` (see
    ``resolve_dataset``); a Hub dataset is named after its repo (``name``), and
    ``dataset.source`` records repo and commit.
    """
    src = resolve_dataset(path, revision)
    ds = _open_root(src.root)
    ds.name = src.name
    ds.source = src
    return ds


def _open_root(root: Path) -> Dataset:
    info_path = root / "meta" / "info.json"
    if info_path.exists():
        try:
            info = json.loads(info_path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise FloraDataError(
                f"meta/info.json is not UTF-8 ({e})",
                dataset=root.name,
                file=info_path,
                field="info.json",
            ) from e
        except json.JSONDecodeError as e:
            raise FloraDataError(
                f"meta/info.json is not valid JSON ({e})", dataset=root.name, file=info_path
            ) from e
        if not isinstance(info, dict) or "codebase_version" not in info:
            raise FloraDataError(
                "meta/info.json is missing a required key",
                dataset=root.name,
                file=info_path,
                field="codebase_version",
            )
        v = str(info["codebase_version"])
        if re.fullmatch(r"v3\.\d+", v):
            return LeRobotV30Dataset(root, info)
        if re.fullmatch(r"v2\.\d+", v):
            return LeRobotV21Dataset(root, info)
        raise FloraDataError(
            f"unsupported LeRobot codebase_version {v!r}",
            dataset=root.name,
            file=info_path,
            field="codebase_version",
        )
    # Case-insensitive suffix: cameras and phones write .MP4.
    files = sorted(
        (
            p
            for p in (root.iterdir() if root.is_dir() else ())
            if p.suffix.lower() == ".mp4" and p.is_file()
        ),
        key=lambda p: p.name,
    )
    if files:
        return Mp4FolderDataset(root, files)
    raise FloraDataError(
        "not a dataset: no meta/info.json and no *.mp4 files", dataset=root.name, file=root
    )
