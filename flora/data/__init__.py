"""flora.data: dataset readers, frame sampling, mosaics, toy-world generator, ingest.

Entry points: ``open_dataset(path)`` (LeRobot v3.0 / v2.1 / plain mp4 folder, or a Hub
dataset ``org/name[@revision]`` resolved by ``resolve_dataset``),
``flora.data.synth.generate``, ``flora.data.frames.sample_frames``,
``flora.data.mosaic.sample_mosaics``, ``flora.data.ingest.ingest_dataset`` and
``flora.data.ground_truth.load_ground_truth``.
"""

from flora.data.dataset import (
    Dataset,
    DatasetSource,
    LeRobotV21Dataset,
    LeRobotV30Dataset,
    Mp4FolderDataset,
    open_dataset,
    resolve_dataset,
)
from flora.data.episode import CameraStream, Episode, FloraDataError, Frame

__all__ = [
    "CameraStream",
    "Dataset",
    "DatasetSource",
    "Episode",
    "FloraDataError",
    "Frame",
    "LeRobotV21Dataset",
    "LeRobotV30Dataset",
    "Mp4FolderDataset",
    "open_dataset",
    "resolve_dataset",
]
