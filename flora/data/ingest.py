"""Ingest step: open a dataset, check every episode, and build a manifest.

One row per episode: ``episode_id, dataset, episode_index, task, duration_us, fps,
n_frames, cameras, status ("ok"/"error"), error``. A bad episode is recorded with the
``FloraDataError`` message (naming dataset/episode/file/field) and the others still
ingest; any other exception raised for one episode is recorded the same way, with its
type and message. Checking an episode means loading it (metadata, data rows, timestamps) and
decoding the first and last frame of every camera over its span, which catches missing,
unreadable and truncated video files without decoding everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from flora.data.dataset import Dataset, open_dataset, unexpected_episode_error
from flora.data.episode import Episode, FloraDataError
from flora.data.frames import sample_frames

MANIFEST_COLUMNS = [
    "episode_id",
    "dataset",
    "episode_index",
    "task",
    "duration_us",
    "fps",
    "n_frames",
    "cameras",
    "status",
    "error",
]


@dataclass
class IngestResult:
    """Outcome of ``ingest_dataset``: the opened dataset and its manifest."""

    dataset: Dataset
    manifest: pd.DataFrame

    @property
    def n_ok(self) -> int:
        return int((self.manifest.status == "ok").sum())

    @property
    def n_error(self) -> int:
        return int((self.manifest.status == "error").sum())

    def ok_indices(self) -> list[int]:
        """Episode indices that ingested cleanly."""
        m = self.manifest
        return [int(i) for i in m.loc[m.status == "ok", "episode_index"]]

    def errors(self) -> dict[int, str]:
        """Episode index -> error message for the episodes that failed."""
        m = self.manifest
        return {
            int(i): str(e)
            for i, e in zip(
                m.episode_index[m.status == "error"], m.error[m.status == "error"], strict=True
            )
        }

    def write(self, path: str | Path) -> Path:
        """Write the manifest as Parquet."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        self.manifest.to_parquet(p, index=False)
        return p


def check_episode(ep: Episode) -> None:
    """Decode the first and last frame of each camera; raise FloraDataError if unreadable."""
    if ep.duration_us <= 0 or len(ep.timestamps_us) == 0:
        raise FloraDataError(
            "zero-length episode", dataset=ep.dataset, episode=ep.index, field="length"
        )
    for cam in ep.cameras.values():
        span = cam.file_end_us - cam.file_start_us
        last = span - int(round(1_000_000 / cam.fps))
        frames = sample_frames(cam, [0, max(last, 0)], dataset=ep.dataset, episode=ep.index)
        for f in frames:
            if f is None or f.image.shape[:2] != (cam.height, cam.width):
                got = None if f is None else f.image.shape
                raise FloraDataError(
                    f"decoded frame size {got} differs from declared {cam.height}x{cam.width}",
                    dataset=ep.dataset,
                    episode=ep.index,
                    file=cam.path,
                    field=cam.key,
                )


def ingest_dataset(
    path: str | Path,
    *,
    out: str | Path | None = None,
    progress: bool = True,
    revision: str | None = None,
) -> IngestResult:
    """Check every episode of a dataset and return the manifest (optionally written).

    A dataset that cannot be opened at all raises FloraDataError; a bad episode (any
    ``Exception`` raised loading or checking it) only marks its own row ``status="error"``.
    """
    ds = open_dataset(path, revision=revision)
    rows = []
    for i in tqdm(ds.episode_indices(), desc=f"ingest {ds.name}", unit="ep", disable=not progress):
        row = {
            "episode_id": f"{ds.name}/{i:06d}",
            "dataset": ds.name,
            "episode_index": i,
            "task": None,
            "duration_us": None,
            "fps": None,
            "n_frames": None,
            "cameras": None,
            "status": "ok",
            "error": "",
        }
        try:
            ep = ds.episode(i)
            row.update(
                task=ep.task,
                duration_us=ep.duration_us,
                fps=ep.fps,
                n_frames=len(ep.timestamps_us),
                cameras=",".join(sorted(ep.cameras)),
            )
            check_episode(ep)
        except Exception as e:  # noqa: BLE001 - one episode's failure must not stop the run
            err = unexpected_episode_error(e, dataset=ds.name, episode=i)
            row.update(status="error", error=str(err))
        rows.append(row)
    man = pd.DataFrame(rows, columns=MANIFEST_COLUMNS).astype(
        {
            "episode_index": "int64",
            "duration_us": "Int64",
            "fps": "Float64",
            "n_frames": "Int64",
            "task": "string",
            "cameras": "string",
        }
    )
    res = IngestResult(ds, man)
    if out is not None:
        res.write(out)
    return res
