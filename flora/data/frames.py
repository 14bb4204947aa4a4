"""Frame sampling at exact episode-relative timestamps, seek-aware.

``sample_frames(stream, times_us)`` returns, for each requested time t, the frame whose
presentation interval ``[pts_k, pts_{k+1})`` holds t (the last frame's interval ends one
frame period after it; a time within ``SLACK_US`` = 100 µs before a frame's pts counts as
that frame), together with that frame's exact episode-relative timestamp.

How it decodes (why it is fast for sparse sampling):
1. Demux (no decoding) the packets of the episode's span to learn every frame's pts and
   where the keyframes are; map each requested time to its frame.
2. Walk the wanted frames in time order. If a keyframe lies after the last decoded frame
   and at or before the next wanted frame, seek there (the frames in between are never
   decoded); otherwise keep decoding forward. Only wanted frames are converted to RGB.

Works on concatenated LeRobot v3.0 files: episode time t is file time
``file_start_us + t``.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Sequence
from dataclasses import dataclass

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from av.video.reformatter import VideoReformatter
from PIL import Image

from flora.data.episode import CameraStream, Episode, FloraDataError, Frame
from flora.data.video import open_video, packet_index, ts_to_us, us_to_ts


def sample_times(start_us: int, end_us: int, fps: float) -> list[int]:
    """Times ``start + round(k * 1e6 / fps)`` for k = 0, 1, ... that are ``< end_us``."""
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    out: list[int] = []
    k = 0
    while True:
        t = int(start_us) + int(round(k * 1_000_000 / fps))
        if t >= end_us:
            return out
        out.append(t)
        k += 1


# A time this close before a frame's pts already counts as that frame (LeRobot's own
# timestamp tolerance is 1e-4 s): absorbs float rounding of requested/stored times.
SLACK_US = 100


def _snap(pts: list[int], t: int, tol: int) -> int:
    """The pts nearest to t if within tol, else t."""
    k = bisect.bisect_left(pts, t)
    best = min((p for p in pts[max(0, k - 1) : k + 1]), key=lambda p: abs(p - t), default=t)
    return best if abs(best - t) <= tol else t


@dataclass
class DecodeStats:
    """What one ``sample_frames`` call decoded (used by tests and the benchmark)."""

    requested: int = 0
    decoded: int = 0
    seeks: int = 0


def _where(stream: CameraStream, dataset, episode) -> dict:
    return dict(dataset=dataset, episode=episode, file=stream.path, field=stream.key)


def sample_frames(
    stream: CameraStream,
    times_us: Sequence[int],
    *,
    missing: str = "error",
    clamp_end: bool = False,
    dataset: str | None = None,
    episode: int | None = None,
    stats: DecodeStats | None = None,
) -> list[Frame | None]:
    """Decode the frames shown at ``times_us`` (episode-relative µs), in request order.

    Args:
        missing: "error" raises FloraDataError when no frame holds a time; "none" returns
            None there (mosaics use this for a camera that is absent at an instant).
        clamp_end: times at or beyond the episode's end return its last frame (whose
            own timestamp is reported) instead of counting as missing.
    """
    if missing not in ("error", "none"):
        raise ValueError("missing must be 'error' or 'none'")
    times = [int(t) for t in times_us]
    st = stats if stats is not None else DecodeStats()
    st.requested += len(times)
    if not times:
        return []
    where = _where(stream, dataset, episode)
    if stream.kind == "image":
        return _sample_images(stream, times, missing, clamp_end, st, where)
    container = open_video(stream.path, dataset=dataset, episode=episode, field=stream.key)
    try:
        try:
            pts, keys, tb, s0 = packet_index(container, stream.file_start_us, stream.file_end_us)
        except av.error.FFmpegError as e:
            raise FloraDataError(f"unreadable video ({e})", **where) from e
        period = int(round(1_000_000 / stream.fps))
        # Episode origin/end snapped to the nearest frame pts within half a period: float
        # seconds in v3.0 metadata (e.g. 10.033333 at 30 fps) round to within a few µs of,
        # but not exactly onto, the frames.
        origin = _snap(pts, stream.file_start_us, period // 2)
        end = _snap(pts, stream.file_end_us, period // 2)
        span = end - origin
        ep_pts = [p for p in pts if origin <= p < end]
        if not ep_pts:
            raise FloraDataError(
                f"no video frames in the episode span [{stream.file_start_us}, "
                f"{stream.file_end_us}) µs (truncated file?)",
                **where,
            )
        last_end = min(ep_pts[-1] + period, end)
        want: dict[int, int] = {}  # request position -> frame pts (file µs)
        for j, t in enumerate(times):
            if t < 0:
                raise FloraDataError(f"requested time {t} µs is negative", **where)
            ft = origin + t
            if t >= span and clamp_end:
                want[j] = ep_pts[-1]
                continue
            k = bisect.bisect_right(ep_pts, ft + SLACK_US) - 1
            if k < 0 or ft >= last_end or t >= span:
                if missing == "error":
                    raise FloraDataError(
                        f"no frame at {t} µs (camera covers [0, {last_end - origin}) µs of "
                        "this episode)",
                        **where,
                    )
                continue
            want[j] = ep_pts[k]
        images = _decode(container, sorted(set(want.values())), ep_pts, keys, tb, s0, st, where)
    finally:
        container.close()
    out: list[Frame | None] = [None] * len(times)
    for j, p in want.items():
        out[j] = Frame(p - origin, images[p])
    return out


def _image_rows(stream: CameraStream, where: dict) -> tuple[list[int], pa.Array]:
    """Episode-relative frame times (µs) and the encoded-image cells of an image camera."""
    from flora.data.dataset import timestamps_to_us

    cols = ["timestamp", stream.key]
    try:
        names = pq.read_schema(stream.path).names
        if "frame_index" in names:
            cols.append("frame_index")
        filters = None
        if stream.episode_index is not None and "episode_index" in names:
            filters = [("episode_index", "=", int(stream.episode_index))]
        tbl = pq.read_table(stream.path, columns=cols, filters=filters)
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise FloraDataError(f"unreadable image column ({e})", **where) from e
    if tbl.num_rows == 0:
        raise FloraDataError("no image rows for this episode", **where)
    if "frame_index" in tbl.column_names:
        tbl = tbl.sort_by("frame_index")
    ts = timestamps_to_us(
        tbl.column("timestamp").to_numpy(),
        stream.fps,
        dataset=where["dataset"],
        episode=where["episode"],
        file=stream.path,
    )
    return [int(t) for t in ts], tbl.column(stream.key).combine_chunks()


def _decode_image_cell(cell: dict | bytes | None, t_us: int, where: dict) -> np.ndarray:
    """One ``{bytes, path}`` (or raw bytes) cell -> (H, W, 3) uint8 RGB."""
    data = cell.get("bytes") if isinstance(cell, dict) else cell
    if not data:
        raise FloraDataError(f"image cell at {t_us} µs holds no bytes", **where)
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise FloraDataError(f"undecodable image at {t_us} µs ({e})", **where) from e


def _sample_images(
    stream: CameraStream,
    times: list[int],
    missing: str,
    clamp_end: bool,
    st: DecodeStats,
    where: dict,
) -> list[Frame | None]:
    """``sample_frames`` for a ``kind="image"`` camera: same time -> frame rule as video."""
    pts, cells = _image_rows(stream, where)
    period = int(round(1_000_000 / stream.fps))
    span = stream.file_end_us - stream.file_start_us
    last_end = min(pts[-1] + period, span)
    out: list[Frame | None] = [None] * len(times)
    decoded: dict[int, np.ndarray] = {}
    for j, t in enumerate(times):
        if t < 0:
            raise FloraDataError(f"requested time {t} µs is negative", **where)
        if t >= span and clamp_end:
            k = len(pts) - 1
        else:
            k = bisect.bisect_right(pts, t + SLACK_US) - 1
            if k < 0 or t >= last_end or t >= span:
                if missing == "error":
                    raise FloraDataError(
                        f"no frame at {t} µs (camera covers [0, {last_end}) µs of this episode)",
                        **where,
                    )
                continue
        if k not in decoded:
            decoded[k] = _decode_image_cell(cells[k].as_py(), pts[k], where)
            st.decoded += 1
        out[j] = Frame(pts[k], decoded[k])
    return out


def _decode(
    container,
    wanted: list[int],
    pts: list[int],
    keys: list[int],
    tb,
    s0: int,
    st: DecodeStats,
    where: dict,
    min_skip: int = 4,
) -> dict[int, np.ndarray]:
    """Decode the frames at the given pts (µs, sorted), seeking past useless stretches.

    A seek is made only when it skips at least ``min_skip`` frames that sequential
    decoding would otherwise have to decode: a seek (reposition + decoder flush) costs
    about as much as decoding 3-4 P-frames of small H.264 video (measured here), so
    seeking over fewer frames would only cost time.
    """
    vs = container.streams.video[0]
    # One reformatter for all frames: a fresh swscale context per frame costs ~10x more.
    rgb = VideoReformatter()
    num, den, half = tb.numerator * 2_000_000, 2 * tb.denominator, tb.denominator
    out: dict[int, np.ndarray] = {}
    cur: int | None = None  # pts (µs) of the last decoded frame
    it = None
    for target in wanted:
        kb = bisect.bisect_right(keys, target) - 1
        key = keys[kb] if kb >= 0 else None
        skip = 0
        if key is not None and cur is not None and key > cur:
            # Frames strictly between the last decoded one and the keyframe.
            skip = bisect.bisect_left(pts, key) - bisect.bisect_right(pts, cur)
        if it is None or cur is None or cur >= target or skip >= min_skip:
            seek_to = key if key is not None else 0
            container.seek(us_to_ts(seek_to + s0, tb), stream=vs, backward=True, any_frame=False)
            it = container.decode(vs)
            st.seeks += 1
        try:
            while True:
                fr = next(it)
                st.decoded += 1
                if fr.pts is None:
                    continue
                cur = (fr.pts * num + half) // den - s0
                if cur == target:
                    out[target] = rgb.reformat(fr, format="rgb24").to_ndarray()
                    break
                if cur > target:
                    raise FloraDataError(
                        f"decoder skipped the frame at {target} µs (landed on {cur} µs)", **where
                    )
        except StopIteration:
            raise FloraDataError(
                f"video ends before the frame at {target} µs (truncated?)", **where
            ) from None
        except av.error.FFmpegError as e:
            raise FloraDataError(f"decode error near {target} µs ({e})", **where) from e
    return out


def sample_episode_frames(
    episode: Episode, camera_key: str, times_us: Sequence[int], **kw
) -> list[Frame | None]:
    """``sample_frames`` for one camera of an episode (by key or by role)."""
    cam = episode.cameras.get(camera_key) or episode.camera_by_role(camera_key)
    if cam is None:
        raise FloraDataError(
            f"episode has no camera {camera_key!r} (has {sorted(episode.cameras)})",
            dataset=episode.dataset,
            episode=episode.index,
            field=camera_key,
        )
    return sample_frames(cam, times_us, dataset=episode.dataset, episode=episode.index, **kw)


def decode_all(stream: CameraStream, *, to_rgb: bool = True) -> list[Frame]:
    """Decode every frame of the stream's span in order (baseline for the benchmark)."""
    out: list[Frame] = []
    if stream.kind == "image":
        where = _where(stream, None, stream.episode_index)
        pts, cells = _image_rows(stream, where)
        for k, t in enumerate(pts):
            img = (
                _decode_image_cell(cells[k].as_py(), t, where)
                if to_rgb
                else np.empty((0, 0, 3), np.uint8)
            )
            out.append(Frame(t, img))
        return out
    with open_video(stream.path, field=stream.key) as c:
        vs = c.streams.video[0]
        rgb = VideoReformatter()
        tb = vs.time_base
        s0 = ts_to_us(vs.start_time or 0, tb)
        if stream.file_start_us > 0:
            c.seek(
                us_to_ts(stream.file_start_us + s0, tb), stream=vs, backward=True, any_frame=False
            )
        for fr in c.decode(vs):
            t = ts_to_us(fr.pts, tb) - s0
            if t < stream.file_start_us:
                continue
            if t >= stream.file_end_us:
                break
            img = (
                rgb.reformat(fr, format="rgb24").to_ndarray()
                if to_rgb
                else np.empty((0, 0, 3), np.uint8)
            )
            out.append(Frame(t - stream.file_start_us, img))
    return out
