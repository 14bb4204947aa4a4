"""Validation of raw episodes (what the engine reads) and ``validate_dataset``.

Three tables are built from a dataset and each is checked by its GX suite:

- ``raw_frames`` — one row per frame: timestamps start at 0 and strictly increase per
  episode; state and action vectors are finite.
- ``raw_episodes`` — one row per episode: fps and duration are sane, the last timestamp
  lies inside the episode, every camera the dataset declares is present.
- ``raw_cameras`` — one row per (episode, camera): the episode's frames are in the file
  (demuxed), **every** packet of the camera's span decodes to a frame of the declared
  size (decode only, no RGB conversion: ``decode_span``), the video stream holds as many
  frames as the data has rows (±1, scaled by the camera's fps), and the video covers the
  whole episode (within one frame period at each end).

The frame count is compared with the *video stream's own* frames, not with
``duration × fps``: LeRobot readers derive the duration from the data's frame count, so
that comparison could never fail (issue 9). Metadata problems (non-UTF-8 or invalid
``info.json``, NaN fps, a ``data_path``/``video_path`` template with an unknown
placeholder or leaving the dataset root) are raised by the readers as named
``FloraDataError``s and become ``load`` issues (see docs/validation.md).

An episode the reader cannot even load (bad Parquet, missing video, broken timestamps)
becomes an issue carrying the reader's ``FloraDataError`` fields; any other exception
raised for one episode becomes a ``load`` issue naming its type and message; every other
episode is still validated. Each failed expectation becomes one issue per failing episode, naming
dataset, episode, file and field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from flora.data.episode import Episode, FloraDataError
from flora.validation.core import ValidationReport, _jsonable, register_suite, validate_table

#: Sanity bounds for raw episodes (robot datasets: 1–1000 Hz, up to 6 h per episode).
FPS_RANGE = (1.0, 1000.0)
MAX_DURATION_US = 6 * 3600 * 1_000_000
RAW_TABLES = ("raw_frames", "raw_episodes", "raw_cameras")
# Check columns -> the episode field they are about (issue ``field``).
FIELD_OF = {
    "state_finite": "state",
    "action_finite": "action",
    "dt_us": "timestamp",
    "first_timestamp_us": "timestamp",
    "timestamp_us": "timestamp",
    "frames_match_data": "length",
    "duration_us,last_timestamp_us": "timestamp",
    "n_missing_cameras": "cameras",
}


# --------------------------------------------------------------------------- suites


def _derive_frames(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if {"episode_id", "timestamp_us"} <= set(df.columns):
        g = out.groupby("episode_id", sort=False)["timestamp_us"]
        # First row of each episode has no predecessor: +inf passes "strictly increases".
        out["dt_us"] = g.diff().fillna(np.inf)
        out["first_timestamp_us"] = g.transform("first")
    return out


@register_suite(
    "raw_frames",
    derive=_derive_frames,
    index_columns=("episode_id", "frame_index"),
    description="Raw per-frame table: timestamps and finite vectors",
)
def _raw_frames(gxe):
    """Raw frames: timestamps start at 0 and strictly increase; state/action finite."""
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectColumnValuesToNotBeNull(column="timestamp_us"),
        gxe.ExpectColumnValuesToBeBetween(
            column="first_timestamp_us",
            min_value=0,
            max_value=0,
            description="episode timestamps start at 0",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="dt_us",
            min_value=0,
            strict_min=True,
            description="timestamps strictly increase",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="state_finite", value_set=[True], description="state is finite"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="action_finite", value_set=[True], description="action is finite"
        ),
    ]


@register_suite(
    "raw_episodes",
    description="Raw per-episode table: fps, duration, last timestamp, cameras",
)
def _raw_episodes(gxe):
    """Raw episodes: sane fps/duration, last frame inside the episode, all cameras present."""
    return [
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectColumnValuesToBeUnique(column="episode_id"),
        gxe.ExpectColumnValuesToBeBetween(
            column="fps", min_value=FPS_RANGE[0], max_value=FPS_RANGE[1], description="fps sane"
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="duration_us",
            min_value=1,
            max_value=MAX_DURATION_US,
            description="duration sane",
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="duration_us",
            column_B="last_timestamp_us",
            description="last frame starts inside the episode",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="n_missing_cameras",
            min_value=0,
            max_value=0,
            description="every declared camera is present",
        ),
    ]


def _derive_cameras(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    if {"video_frames", "expected_frames"} <= set(df.columns):
        diff = df["video_frames"].astype(float) - df["expected_frames"].astype(float)
        out["frames_match_data"] = diff.abs() <= 1.0
    return out


@register_suite(
    "raw_cameras",
    derive=_derive_cameras,
    index_columns=("episode_id", "camera", "file"),
    description="Raw per-camera table: every frame decodes, video matches the data",
)
def _raw_cameras(gxe):
    """Raw cameras: every frame decodes, frame count matches, video covers the episode."""
    return [
        gxe.ExpectColumnValuesToBeInSet(
            column="decodable", value_set=[True], description="every frame decodes"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="frames_match_data",
            value_set=[True],
            description="video frames = data frames (±1)",
        ),
        gxe.ExpectColumnValuesToBeBetween(
            column="video_frames", min_value=1, description="episode frames present in file"
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="slack_us",
            column_B="covered_from_us",
            or_equal=True,
            description="video starts at the episode start (±1 frame)",
        ),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="covered_to_us",
            column_B="min_end_us",
            or_equal=True,
            description="video covers the episode end (±1 frame)",
        ),
    ]


# --------------------------------------------------------------------------- table builders


def frames_table(ep: Episode) -> pd.DataFrame:
    """The ``raw_frames`` rows of one loaded episode."""
    n = len(ep.timestamps_us)

    def finite(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        if a.ndim == 1:
            a = a.reshape(n, -1) if n else a.reshape(0, 0)
        if a.shape[0] != n:  # vectors not aligned with frames: every row fails
            return np.zeros(n, bool)
        return np.isfinite(a).all(axis=1) if a.size else np.ones(n, bool)

    return pd.DataFrame(
        {
            "episode_id": ep.episode_id,
            "dataset": ep.dataset,
            "frame_index": np.arange(n, dtype=np.int64),
            "timestamp_us": np.asarray(ep.timestamps_us, dtype=np.int64),
            "state_finite": finite(ep.state),
            "action_finite": finite(ep.action),
        }
    )


def episode_row(ep: Episode, declared_cameras: Sequence[str]) -> dict[str, Any]:
    """The ``raw_episodes`` row of one loaded episode."""
    ts = np.asarray(ep.timestamps_us)
    missing = sorted(set(declared_cameras) - set(ep.cameras))
    return {
        "episode_id": ep.episode_id,
        "dataset": ep.dataset,
        "episode_index": ep.index,
        "fps": float(ep.fps),
        "duration_us": int(ep.duration_us),
        "n_frames": len(ts),
        "last_timestamp_us": int(ts[-1]) if len(ts) else -1,
        "n_missing_cameras": len(missing),
        "missing_cameras": ",".join(missing),
    }


@dataclass
class SpanDecode:
    """What :func:`decode_span` found in one camera's episode span (µs, file-relative)."""

    pts_us: list[int] = field(default_factory=list)  # packets inside the span, sorted
    decoded: int = 0  # frames decoded inside the span
    errors: int = 0  # packets the decoder rejected
    wrong_size: int = 0  # decoded frames whose size differs from the declared one
    first_error: str = ""


def decode_span(cam: Any, *, dataset: str | None = None, episode: int | None = None) -> SpanDecode:
    """Demux and decode every packet of ``cam``'s episode span, without RGB conversion.

    Seeks to the keyframe at or before the span start (v3.0 files hold several episodes)
    and decodes forward to the span end, so a frame damaged anywhere in the span is found
    — not only at its ends. Decoder errors are counted per packet (the decoder recovers
    at the next keyframe), never raised. Frames are only decoded (``to_ndarray`` is the
    expensive part and is skipped); see benchmarks/validate_decode.py for the cost.
    """
    import av

    from flora.data.video import open_video, us_to_ts

    if getattr(cam, "kind", "video") == "image":
        return _decode_image_span(cam, dataset=dataset, episode=episode)
    out = SpanDecode()
    with open_video(cam.path, dataset=dataset, episode=episode, field=cam.key) as c:
        vs = c.streams.video[0]
        tb = vs.time_base
        num, den, half = tb.numerator * 2_000_000, 2 * tb.denominator, tb.denominator
        s0 = ((vs.start_time or 0) * num + half) // den
        start, end = int(cam.file_start_us), int(cam.file_end_us)
        if start > 0:
            c.seek(us_to_ts(start + s0, tb), stream=vs, backward=True, any_frame=False)

        def take(frames: Any) -> None:
            for fr in frames:
                if fr.pts is None:
                    continue
                t = (fr.pts * num + half) // den - s0
                if start <= t < end:
                    out.decoded += 1
                    if (fr.width, fr.height) != (cam.width, cam.height):
                        out.wrong_size += 1

        def error(at: int | None, e: Exception) -> None:
            out.errors += 1
            if not out.first_error:
                where = f" at {at - start} µs" if at is not None else ""
                out.first_error = f"decode error{where} ({type(e).__name__}: {e})"

        for pkt in c.demux(vs):
            if pkt.pts is None and pkt.dts is None:  # the demuxer's final flush packet
                continue
            t = None if pkt.pts is None else (pkt.pts * num + half) // den - s0
            if t is not None and t >= end:
                dts = pkt.dts
                if dts is None or (dts * num + half) // den - s0 >= end:
                    break
            if t is not None and start <= t < end:
                out.pts_us.append(t)
            try:
                take(pkt.decode())
            except av.error.FFmpegError as e:
                if t is None or start <= t < end:
                    error(t, e)
        try:  # frames still buffered in the decoder (reordering codecs)
            take(vs.codec_context.decode(None))
        except av.error.FFmpegError as e:
            error(None, e)
    out.pts_us.sort()
    return out


def _decode_image_span(cam: Any, *, dataset: str | None, episode: int | None) -> SpanDecode:
    """``decode_span`` for a ``dtype: image`` camera: decode every encoded image cell of the
    episode (``Image.load``, no RGB conversion); an undecodable cell is counted, not raised."""
    import io

    from PIL import Image

    from flora.data.frames import _image_rows  # the reader's own row selection

    where = dict(dataset=dataset, episode=episode, file=cam.path, field=cam.key)
    pts, cells = _image_rows(cam, where)
    out = SpanDecode(pts_us=list(pts))
    for t, cell in zip(pts, cells.to_pylist(), strict=True):
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        try:
            if not data:
                raise ValueError("image cell holds no bytes")
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                size = im.size
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            out.errors += 1
            if not out.first_error:
                out.first_error = f"decode error at {t} µs ({type(e).__name__}: {e})"
            continue
        out.decoded += 1
        if size != (cam.width, cam.height):
            out.wrong_size += 1
    return out


def camera_rows(ep: Episode) -> list[dict[str, Any]]:
    """The ``raw_cameras`` rows of one loaded episode: demux, decode every frame, coverage."""
    rows = []
    n_data = len(ep.timestamps_us)
    for key, cam in sorted(ep.cameras.items()):
        period = int(round(1_000_000 / cam.fps)) if cam.fps > 0 else ep.duration_us
        scale = cam.fps / ep.fps if cam.fps > 0 and ep.fps > 0 else 1.0
        row: dict[str, Any] = {
            "episode_id": ep.episode_id,
            "dataset": ep.dataset,
            "camera": key,
            "role": cam.role,
            "file": str(cam.path),
            "duration_us": int(ep.duration_us),
            "slack_us": period,
            "min_end_us": int(ep.duration_us) - period,
            "data_frames": n_data,
            "expected_frames": int(round(n_data * scale)),
            "video_frames": 0,
            "decoded_frames": 0,
            "decode_errors": 0,
            "covered_from_us": None,
            "covered_to_us": None,
            "decodable": False,
            "error": "",
        }
        try:
            got = decode_span(cam, dataset=ep.dataset, episode=ep.index)
            inside = got.pts_us
            row["video_frames"] = len(inside)
            row["decoded_frames"] = got.decoded
            row["decode_errors"] = got.errors
            if inside:
                row["covered_from_us"] = inside[0] - cam.file_start_us
                row["covered_to_us"] = inside[-1] + period - cam.file_start_us
            row["decodable"] = bool(
                inside and got.errors == 0 and got.decoded == len(inside) and not got.wrong_size
            )
            if got.first_error:
                row["error"] = f"{got.errors} of {len(inside)} frames fail: {got.first_error}"
            elif got.wrong_size:
                row["error"] = (
                    f"{got.wrong_size} decoded frames differ from the declared size "
                    f"{cam.height}x{cam.width}"
                )
            elif got.decoded != len(inside):
                row["error"] = f"{got.decoded} of {len(inside)} frames decode"
            elif not inside:
                row["error"] = "no frames in the episode span"
        except FloraDataError as e:
            row["error"] = e.reason
        except Exception as e:  # noqa: BLE001 - any demux failure is this camera's issue
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- dataset report


@dataclass(frozen=True)
class EpisodeIssue:
    """One problem found in a dataset, located as precisely as the check allows."""

    dataset: str
    episode: int | None  # None: dataset-level problem
    file: str | None
    field: str | None
    check: str  # "load" or the failed expectation's description
    reason: str

    def describe(self) -> str:
        """One readable line."""
        where = ", ".join(
            f"{k}={v}"
            for k, v in (("episode", self.episode), ("file", self.file), ("field", self.field))
            if v is not None
        )
        return f"{self.check}: {self.reason} [{where}]"


@dataclass
class DatasetReport:
    """Result of :func:`validate_dataset`: issues per episode plus the three GX reports."""

    dataset: str
    path: str
    format: str
    episodes: list[int]
    issues: list[EpisodeIssue] = field(default_factory=list)
    tables: dict[str, ValidationReport] = field(default_factory=dict)

    @property
    def invalid_episodes(self) -> list[int]:
        """Episodes with at least one issue."""
        return sorted({i.episode for i in self.issues if i.episode is not None})

    @property
    def valid_episodes(self) -> list[int]:
        """Episodes that passed every check (what downstream steps may process)."""
        bad = set(self.invalid_episodes)
        if any(i.episode is None for i in self.issues):
            return []  # a dataset-level problem taints every episode
        return [i for i in self.episodes if i not in bad]

    @property
    def success(self) -> bool:
        """True when no issue was found and every table passed its suite."""
        return not self.issues and all(r.success for r in self.tables.values())

    @property
    def statistics(self) -> dict[str, int]:
        return {
            "episodes": len(self.episodes),
            "valid": len(self.valid_episodes),
            "invalid": len(self.invalid_episodes),
            "issues": len(self.issues),
            "failed": len(self.issues),
        }

    def issues_of(self, episode: int) -> list[EpisodeIssue]:
        """The issues of one episode."""
        return [i for i in self.issues if i.episode == episode]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (MLflow artifact, DAG XCom summary, ``--json``)."""
        return _jsonable(
            {
                "dataset": self.dataset,
                "path": self.path,
                "format": self.format,
                "success": self.success,
                "episodes": self.episodes,
                "valid_episodes": self.valid_episodes,
                "invalid_episodes": self.invalid_episodes,
                "statistics": self.statistics,
                "issues": [asdict(i) for i in self.issues],
                "tables": {k: v.to_dict() for k, v in self.tables.items()},
            }
        )

    def write(self, path: str | Path) -> Path:
        """Write the report as JSON."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p


def data_file_of(ds: Any, index: int) -> str | None:
    """Best-effort path of the file holding an episode's frames (for issue locations)."""
    from flora.data.dataset import meta_path

    info = getattr(ds, "info", None)
    meta = getattr(ds, "episodes_meta", None)
    try:
        if info and isinstance(meta, pd.DataFrame):  # LeRobot v3.0
            m = meta.loc[index]
            values = {"chunk_index": int(m["data/chunk_index"]),
                      "file_index": int(m["data/file_index"])}  # fmt: skip
        elif info and isinstance(meta, dict):  # LeRobot v2.x
            chunk = index // int(getattr(ds, "chunks_size", 1000))
            values = {"episode_chunk": chunk, "episode_index": index}
        else:
            return None
        return str(meta_path(ds.root, info["data_path"], field="data_path", **values))
    except (KeyError, ValueError, TypeError, IndexError, ZeroDivisionError, FloraDataError):
        return None
    return None


def _camera_detail(column: str | None, cam: dict[str, Any]) -> str:
    """Why one camera row failed the check on ``column``."""
    if column == "frames_match_data":
        return (
            f"video has {cam.get('video_frames')} frames in the episode span, the data has "
            f"{cam.get('data_frames')} rows (expected {cam.get('expected_frames')} frames)"
        )
    if column == "decodable" or cam.get("error"):
        return cam.get("error") or "frames do not decode"
    return (
        f"video covers [{cam.get('covered_from_us')}, {cam.get('covered_to_us')}) µs"
        f" of [0, {cam.get('duration_us')}) µs ({cam.get('video_frames')} frames)"
    )


def _issues_from(
    report: ValidationReport,
    ds_name: str,
    index_of: dict[str, int],
    files: dict[int, str | None],
    cameras: dict[tuple[str, str], dict[str, Any]],
) -> list[EpisodeIssue]:
    out: list[EpisodeIssue] = []
    for r in report.failures:
        check = r.description or r.expectation
        if not r.failing_ids:  # table-level failure (e.g. a missing column, empty table)
            reason = r.error or r.describe().removeprefix("FAIL ")
            out.append(EpisodeIssue(ds_name, None, None, r.column, check, reason))
            continue
        for eid in r.failing_ids:
            ep = index_of.get(eid)
            rows = [s for s in r.samples if str(s.get("episode_id")) == eid]
            fld = FIELD_OF.get(r.column or "", r.column)
            file = files.get(ep) if ep is not None else None
            detail = f"{report.table}: {r.unexpected_count} of {r.element_count} rows fail"
            if report.table == "raw_frames" and rows:
                detail += f" (first at frame {rows[0].get('frame_index')})"
            if report.table == "raw_cameras" and rows:
                # One issue per failing camera of the episode, each naming its file.
                for row in rows:
                    cam = cameras.get((eid, str(row.get("camera"))), {})
                    out.append(
                        EpisodeIssue(ds_name, ep, str(row.get("file")), str(row.get("camera")),
                                     check, _camera_detail(r.column, cam))
                    )  # fmt: skip
                continue
            out.append(EpisodeIssue(ds_name, ep, file, fld, check, detail))
    return out


def validate_dataset(
    path: str | Path, *, progress: bool = True, revision: str | None = None
) -> DatasetReport:
    """Validate every episode of the dataset at ``path``; never stops at a bad episode.

    ``path`` is a local folder or a Hub id ``org/name[@revision]`` (resolved by
    ``open_dataset`` into the Hugging Face cache; ``revision`` as there). Returns a report
    whose ``issues`` name dataset, episode, file and field and whose ``valid_episodes``
    are the episodes downstream steps may use.
    """
    from flora.data import open_dataset
    from flora.data.dataset import unexpected_episode_error

    root = Path(path)
    try:
        ds = open_dataset(path, revision=revision)
    except FloraDataError as e:
        name = e.dataset or root.name
        issue = EpisodeIssue(name, None, e.file or str(root), e.field, "load", e.reason)
        return DatasetReport(name, str(root), "unknown", [], [issue])
    root = Path(ds.root)

    report = DatasetReport(ds.name, str(root), ds.format, list(ds.episode_indices()))
    declared = list(ds.camera_keys)
    frames, episodes, cameras = [], [], []
    index_of: dict[str, int] = {}
    files: dict[int, str | None] = {}
    for i in tqdm(report.episodes, desc=f"validate {ds.name}", unit="ep", disable=not progress):
        files[i] = data_file_of(ds, i)
        try:
            ep = ds.episode(i)
            # Built before any is kept, so a failing episode adds no partial rows.
            ep_rows = (frames_table(ep), episode_row(ep, declared), camera_rows(ep))
        except Exception as e:  # noqa: BLE001 - one episode's failure must not stop the run
            err = unexpected_episode_error(e, dataset=ds.name, episode=i)
            report.issues.append(
                EpisodeIssue(ds.name, i, err.file or files[i], err.field, "load", err.reason)
            )
            continue
        index_of[ep.episode_id] = i
        frames.append(ep_rows[0])
        episodes.append(ep_rows[1])
        cameras.extend(ep_rows[2])

    if not frames:  # nothing loadable: the tables would be empty, the issues say why
        if not report.issues:
            report.issues.append(
                EpisodeIssue(
                    ds.name, None, str(root), "episodes", "load", "dataset has no episodes"
                )
            )
        return report
    tables = {
        "raw_frames": pd.concat(frames, ignore_index=True),
        "raw_episodes": pd.DataFrame(episodes),
        "raw_cameras": pd.DataFrame(cameras),
    }
    if tables["raw_cameras"].empty:  # datasets without video still get a (vacuous) table
        tables["raw_cameras"] = pd.DataFrame(
            columns=[
                "episode_id",
                "camera",
                "file",
                "decodable",
                "video_frames",
                "expected_frames",
                "slack_us",
                "covered_from_us",
                "covered_to_us",
                "min_end_us",
            ]
        )
    cam_rows = {(c["episode_id"], c["camera"]): c for c in cameras}
    for name, df in tables.items():
        r = validate_table(name, df, dataset=ds.name)
        report.tables[name] = r
        report.issues.extend(_issues_from(r, ds.name, index_of, files, cam_rows))
    return report
