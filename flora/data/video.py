"""Small PyAV helpers: a deterministic H.264 writer and a stream probe.

Decoding for sampling lives in ``flora.data.frames``; this module only writes files and
reads container-level facts (size, rate, packet timestamps, keyframes).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from av.video.frame import PictureType

from flora.data.episode import FloraDataError

# x264 settings that make the encoder a pure function of its input frames: one thread,
# no sliced threads, no asynchronous lookahead thread (x264's defaults with threads=1,
# spelled out so a libavcodec default or a global option cannot change them), and its
# plain C code (asm=0): x264's SIMD kernels are not all bit-exact with its C code
# (asm=0 changes the bytes) and x264 picks them per CPU, so the bytes depended on the
# CPU — the committed toy world's md5 was not reproduced on an AVX2-only AMD machine
# (docs/dataset.md, "Determinism"). Costs ~35 % more generation time.
X264_DETERMINISTIC = "threads=1:lookahead-threads=1:sliced-threads=0:sync-lookahead=0:asm=0"


def rgb_to_yuv420p(img: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (H*3/2, W) uint8 I420 planes (Y, then U, then V).

    BT.601 limited range (what libswscale does by default, so decoded colours stay put),
    in exact integer arithmetic: 8-bit fixed-point coefficients with rounding, chroma as
    the rounded mean of each 2x2 block. Doing it here instead of letting PyAV call
    libswscale is the determinism fix (docs/dataset.md): libswscale's SIMD and C
    conversions are not bit-exact with each other and which one runs is picked at run
    time, so its output was not a pure function of the frame.
    """
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f"expected (H, W, 3) uint8 RGB, got {img.shape} {img.dtype}")
    h, w = img.shape[:2]
    if h % 2 or w % 2:
        raise ValueError(f"yuv420p needs even frame sizes, got {w}x{h}")
    x = img.astype(np.int32)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    # Chroma is linear in RGB, so the sum of the four pixels' chroma numerators equals
    # the numerator of the block's RGB sums: sum the 2x2 blocks first (a quarter of the
    # multiplications), then divide by 4 * 256 with rounding (one shift by 10).
    q = x[0::2, 0::2] + x[1::2, 0::2] + x[0::2, 1::2] + x[1::2, 1::2]
    r4, g4, b4 = q[..., 0], q[..., 1], q[..., 2]
    u = ((-38 * r4 - 74 * g4 + 112 * b4 + 512) >> 10) + 128
    v = ((112 * r4 - 94 * g4 - 18 * b4 + 512) >> 10) + 128
    planes = [y.reshape(-1), u.reshape(-1), v.reshape(-1)]
    return np.concatenate(planes).astype(np.uint8).reshape(h * 3 // 2, w)


def check_frame(img: np.ndarray, width: int, height: int) -> None:
    """Refuse a frame that is not (height, width, 3) uint8 RGB."""
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f"expected (H, W, 3) uint8 RGB, got {img.shape} {img.dtype}")
    if img.shape[:2] != (height, width):
        raise ValueError(f"frame is {img.shape[1]}x{img.shape[0]}, stream is {width}x{height}")


class VideoWriter:
    """Encode RGB frames to H.264/yuv420p MP4, deterministically.

    The bytes are a pure function of the frames and the arguments (for one PyAV/x264
    build, on any x86-64 CPU): RGB -> YUV is converted here in integer numpy
    (``rgb_to_yuv420p``), never by libswscale, and x264 runs single-threaded, its plain C
    code (``X264_DETERMINISTIC``). ``gop`` is the keyframe interval in frames (scene-cut
    keyframes are disabled so the structure is predictable); ``add(..., keyframe=True)``
    forces an IDR frame, used at every episode start so a concatenated v3.0 file can be
    cut per episode.
    """

    def __init__(
        self,
        path: str | Path,
        fps: int,
        width: int,
        height: int,
        *,
        gop: int = 10,
        crf: int = 23,
        preset: str = "veryfast",
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(self.path), "w", format="mp4")
        st = self.container.add_stream("libx264", rate=fps)
        st.width, st.height, st.pix_fmt = width, height, "yuv420p"
        st.codec_context.thread_count = 1
        st.options = {
            "preset": preset,
            "crf": str(crf),
            "threads": "1",
            "x264-params": (
                f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0:{X264_DETERMINISTIC}"
            ),
        }
        self.stream = st
        self.width, self.height = width, height
        self.n = 0

    def add(self, img: np.ndarray, *, keyframe: bool = False) -> None:
        """Append one (H, W, 3) uint8 RGB frame."""
        check_frame(img, self.width, self.height)
        # Already yuv420p at the stream's size, so PyAV hands it to x264 unconverted.
        frame = av.VideoFrame.from_ndarray(rgb_to_yuv420p(img), format="yuv420p")
        frame.pts = self.n
        if keyframe:
            frame.pict_type = PictureType.I
        for pkt in self.stream.encode(frame):
            self.container.mux(pkt)
        self.n += 1

    def close(self) -> None:
        """Flush the encoder and finalise the file."""
        for pkt in self.stream.encode():
            self.container.mux(pkt)
        self.container.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ts_to_us(ts: int, time_base: Fraction) -> int:
    """Stream timestamp to integer microseconds (exact integer arithmetic, half up)."""
    q = int(ts) * time_base.numerator * 1_000_000
    d = time_base.denominator
    return (2 * q + d) // (2 * d)


def us_to_ts(us: int, time_base: Fraction) -> int:
    """Integer microseconds to the nearest stream timestamp."""
    return int(round(Fraction(us, 1_000_000) / time_base))


@dataclass(frozen=True)
class StreamInfo:
    """Container facts of the first video stream of a file."""

    width: int
    height: int
    fps: float
    time_base: Fraction
    start_us: int
    n_frames: int
    duration_us: int


def open_video(path: Path, *, dataset: str | None = None, episode=None, field=None):
    """Open an mp4 for reading; any failure becomes a FloraDataError naming the file."""
    if not path.exists():
        raise FloraDataError(
            "camera file is missing", dataset=dataset, episode=episode, file=path, field=field
        )
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as e:
        raise FloraDataError(
            f"unreadable video ({type(e).__name__}: {e})",
            dataset=dataset,
            episode=episode,
            file=path,
            field=field,
        ) from e
    if not container.streams.video:
        container.close()
        raise FloraDataError(
            "file has no video stream", dataset=dataset, episode=episode, file=path, field=field
        )
    return container


def probe(path: Path, *, dataset: str | None = None, episode=None, field=None) -> StreamInfo:
    """Read size, rate, frame count and duration of a file's video stream."""
    with open_video(path, dataset=dataset, episode=episode, field=field) as c:
        vs = c.streams.video[0]
        tb = vs.time_base
        rate = vs.average_rate or vs.guessed_rate
        if not rate:
            raise FloraDataError(
                "video stream has no frame rate",
                dataset=dataset,
                episode=episode,
                file=path,
                field=field,
            )
        start = ts_to_us(vs.start_time or 0, tb)
        n = int(vs.frames or 0)
        if vs.duration is not None:
            dur = ts_to_us(vs.duration, tb)
        else:
            dur = int(round(n * 1_000_000 / float(rate)))
        return StreamInfo(
            int(vs.codec_context.width),
            int(vs.codec_context.height),
            float(rate),
            tb,
            start,
            n,
            dur,
        )


def packet_index(
    container, start_us: int = 0, end_us: int | None = None
) -> tuple[list[int], list[int], Fraction, int]:
    """Presentation timestamps (µs, file-relative) of every packet in ``[start, end)``.

    Demuxes only (no decoding), so it costs I/O, not CPU. Returns (sorted pts_us,
    keyframe pts_us, time_base, stream start µs). With ``start_us`` > 0 it first seeks
    to the keyframe at or before ``start_us``.
    """
    vs = container.streams.video[0]
    tb = vs.time_base
    s0 = ts_to_us(vs.start_time or 0, tb)
    if start_us > 0:
        container.seek(us_to_ts(start_us + s0, tb), stream=vs, backward=True, any_frame=False)
    pts: list[int] = []
    keys: list[int] = []
    # Inlined integer conversion: this loop runs once per packet of the span.
    num, den = tb.numerator * 2_000_000, 2 * tb.denominator
    half = tb.denominator
    for pkt in container.demux(vs):
        p = pkt.pts
        if p is None:
            continue
        t = (p * num + half) // den - s0
        if end_us is not None and t >= end_us:
            dts = pkt.dts
            if dts is None or (dts * num + half) // den - s0 >= end_us:
                break
        pts.append(t)
        if pkt.is_keyframe:
            keys.append(t)
    pts.sort()
    keys.sort()
    return pts, keys, tb, s0
