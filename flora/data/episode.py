"""Typed episode model shared by every reader (LeRobot v3.0, v2.1, plain mp4).

The dataset format is the contract: readers turn any supported layout into these
dataclasses, and everything downstream (segmenter, captioner, rewarder, validation)
reads only these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class FloraDataError(ValueError):
    """Bad input. The message names the dataset, episode, file and field involved."""

    def __init__(
        self,
        message: str,
        *,
        dataset: str | None = None,
        episode: int | str | None = None,
        file: str | Path | None = None,
        field: str | None = None,
    ) -> None:
        self.dataset = dataset
        self.episode = episode
        self.file = str(file) if file is not None else None
        self.field = field
        self.reason = message
        where = ", ".join(
            f"{k}={v}"
            for k, v in (
                ("dataset", dataset),
                ("episode", episode),
                ("file", self.file),
                ("field", field),
            )
            if v is not None
        )
        super().__init__(f"{message} [{where}]" if where else message)


@dataclass(frozen=True)
class CameraStream:
    """One camera of one episode: a span of an mp4 file, or an image column.

    ``kind="video"``: LeRobot v3.0 concatenates several episodes in one file, so the
    episode's frames live at ``[file_start_us, file_end_us)`` of ``path``.
    ``kind="image"`` (LeRobot ``dtype: image`` features, e.g. LIBERO): every frame is an
    encoded image (PNG/JPEG bytes, struct ``{bytes, path}``) in column ``key`` of the data
    parquet ``path``, on the rows of episode ``episode_index``; frame times are the rows'
    timestamps and ``[file_start_us, file_end_us)`` is ``[0, duration)``.
    """

    key: str  # dataset feature key, e.g. "observation.images.top"
    role: str  # "main" or "wrist" (used by mosaics and prompts)
    path: Path
    file_start_us: int
    file_end_us: int
    fps: float
    width: int
    height: int
    kind: str = "video"  # "video" (mp4 span) or "image" (encoded images in a parquet column)
    episode_index: int | None = None  # rows of this episode in ``path`` (kind="image")


def make_episode_id(dataset: str, index: int) -> str:
    """The ``episode_id`` of episode ``index`` of ``dataset``: ``<dataset>/<index:06d>``.

    One definition so steps can name an episode without loading it (reading video
    metadata is not free).
    """
    return f"{dataset}/{int(index):06d}"


@dataclass
class Episode:
    """One robot episode: cameras, proprioception, actions and task text."""

    dataset: str
    index: int
    task: str
    fps: float
    duration_us: int
    timestamps_us: np.ndarray  # (N,) int64, episode-relative, starts at 0
    state: np.ndarray  # (N, Ds) float32
    action: np.ndarray  # (N, Da) float32
    cameras: dict[str, CameraStream] = field(default_factory=dict)
    state_names: list[str] = field(default_factory=list)
    action_names: list[str] = field(default_factory=list)

    @property
    def episode_id(self) -> str:
        """Stable id used as the ``episode_id`` column of every table."""
        return make_episode_id(self.dataset, self.index)

    def camera_by_role(self, role: str) -> CameraStream | None:
        for cam in self.cameras.values():
            if cam.role == role:
                return cam
        return None


@dataclass(frozen=True)
class Frame:
    """A decoded frame and its exact episode-relative presentation time."""

    t_us: int
    image: np.ndarray  # (H, W, 3) uint8 RGB
