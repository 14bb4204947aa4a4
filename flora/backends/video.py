"""Frames + timestamps as one video on the OpenAI wire (``video_url`` content parts).

vLLM's OpenAI server takes ``{"type": "video_url", "video_url": {"url": "data:video/mp4;
base64,..."}}``. The client encodes the request's frames into an MP4 whose presentation
times are the frames' real timestamps (millisecond time base, as the transformers backend
passes them: ``VideoMetadata(fps=1000, frames_indices=<ms>)``) and whose declared frame rate
is the frames' mean rate, so a server that derives times from ``index / fps`` (vLLM's
loaders) gets the same times for evenly spaced frames starting at 0 — the engine's
segmentation and dense windows are 4 Hz from their start. Encoding is lossless RGB H.264
(``libx264rgb``, QP 0): the server decodes exactly the frames that were sent.

``flora serve`` decodes it back to frames and timestamps (from the presentation times)
within its image limits: frame count, pixels per frame (from the stream header, before
decoding) and decoded pixels per request.
"""

from __future__ import annotations

import base64
import io
from fractions import Fraction

import numpy as np

from flora.backends.processing import RequestError

MIME = "video/mp4"
US_PER_MS = 1000


def encode_video(frames: list[np.ndarray], times_us: list[int]) -> str:
    """A ``data:video/mp4;base64,`` URL of ``frames`` (uint8 HWC RGB) at ``times_us``.

    Times must be non-decreasing; they are kept to the millisecond (a repeated millisecond
    is nudged by 1 ms: a container cannot hold two frames at one time).
    """
    import av

    if len(frames) != len(times_us) or not frames:
        raise ValueError(f"{len(frames)} frames for {len(times_us)} timestamps")
    h, w = frames[0].shape[:2]
    if any(f.shape[:2] != (h, w) for f in frames):
        raise ValueError("all frames of a video must have one size")
    ms: list[int] = []
    for t in times_us:
        m = int(round(t / US_PER_MS))
        ms.append(max(m, ms[-1] + 1) if ms else m)
    span = ms[-1] - ms[0]
    rate = Fraction(1000 * (len(ms) - 1), span).limit_denominator(1000) if span > 0 else 4
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264rgb", rate=rate)
        stream.width, stream.height = w, h
        stream.pix_fmt = "rgb24"
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.options = {"qp": "0", "preset": "ultrafast", "bf": "0", "threads": "1"}
        for img, m in zip(frames, ms, strict=True):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            frame.pts = m
            frame.time_base = Fraction(1, 1000)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return f"data:{MIME};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def decode_video(
    url: str,
    max_bytes: int | None = None,
    max_frames: int | None = None,
    max_frame_pixels: int | None = None,
    max_total_pixels: int | None = None,
) -> tuple[list[np.ndarray], list[int]]:
    """Frames (uint8 HWC RGB) and their timestamps (µs, from the presentation times) of a
    base64 ``data:video/...`` URL; ``RequestError`` for anything refused or undecodable.

    Remote URLs are refused (the server never fetches). The encoded size is checked on the
    base64 length, the frame size from the stream header before any frame is decoded, and
    the frame count and total pixels while decoding (decoding stops at the limit).
    """
    import av

    if not isinstance(url, str) or not url.startswith("data:"):
        raise RequestError("video_url must be a base64 data: URL (remote URLs are not fetched)")
    head, _, payload = url.partition(",")
    if ";base64" not in head or not head[5:].startswith("video/"):
        raise RequestError(f"unsupported video data URL header {head[:40]!r}")
    if max_bytes is not None and len(payload) > 4 * (max_bytes // 3 + 1):
        raise RequestError(
            f"video is about {len(payload) * 3 // 4} bytes encoded, over the limit {max_bytes}"
        )
    try:
        raw = base64.b64decode(payload, validate=True)
    except ValueError as e:
        raise RequestError(f"video data URL is not valid base64: {e}") from e
    frames: list[np.ndarray] = []
    times: list[int] = []
    total = 0
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            if not container.streams.video:
                raise RequestError("video data URL holds no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "NONE"
            w, h = stream.codec_context.width, stream.codec_context.height
            if max_frame_pixels is not None and w * h > max_frame_pixels:
                raise RequestError(
                    f"video frames are {w}x{h} = {w * h} pixels, over the limit {max_frame_pixels}"
                )
            for frame in container.decode(stream):
                if max_frames is not None and len(frames) >= max_frames:
                    raise RequestError(f"video has more than {max_frames} frames (the limit)")
                total += frame.width * frame.height
                if max_total_pixels is not None and total > max_total_pixels:
                    raise RequestError(
                        f"video frames total over {max_total_pixels} decoded pixels per request"
                    )
                if frame.width * frame.height > (max_frame_pixels or 1 << 62):
                    raise RequestError(f"video frame over {max_frame_pixels} pixels")
                frames.append(frame.to_ndarray(format="rgb24"))
                pts = frame.pts if frame.pts is not None else len(times)
                times.append(int(round(float(pts * frame.time_base) * 1_000_000)))
    except RequestError:
        raise
    except (av.error.FFmpegError, ValueError, OSError) as e:
        raise RequestError(f"cannot decode video data URL: {type(e).__name__}: {e}") from e
    if not frames:
        raise RequestError("video data URL holds no frames")
    return frames, times


__all__ = ["MIME", "decode_video", "encode_video"]
