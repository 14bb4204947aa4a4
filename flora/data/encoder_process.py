"""H.264 writers that run in a child process of their own.

Why a process: x264 inside a process whose other threads decode and encode video, under
heavy load, once in a few dozen runs encoded one macroblock differently from identical
frames (docs/dataset.md, "Determinism"); the cause inside the process is not known, and
a process that does nothing but encode has never differed. The toy world writes every
video through one ``EncoderProcess`` so its bytes do not depend on what else the calling
process runs. The child also encodes while the caller renders the next frames.

The child is ``python -m flora.data.encoder_process``; parent and child exchange pickled
tuples over its stdin/stdout (``multiprocessing.connection.Connection`` framing):
``("open", id, path, fps, width, height, options)`` -> ``("ok",)`` | ``("error", msg)``;
``("add", id, frame, keyframe)`` (no reply: an error is kept and reported at close);
``("close", id)`` -> ``("ok",)`` | ``("error", msg)``; ``("stop",)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from flora.data.episode import FloraDataError


class VideoEncodeError(FloraDataError):
    """A video could not be written (the message names the file)."""


class EncoderProcess:
    """A child process that runs ``VideoWriter``s for its caller; use as a context manager."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "flora.data.encoder_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._send = Connection(os.dup(self._proc.stdin.fileno()), readable=False)
        self._recv = Connection(os.dup(self._proc.stdout.fileno()), writable=False)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._next_id = 0

    def writer(
        self, path: str | Path, fps: int, width: int, height: int, **options: Any
    ) -> RemoteVideoWriter:
        """Open a writer in the child (``VideoWriter``'s arguments); errors raise here."""
        wid = self._next_id
        self._next_id += 1
        self._call(("open", wid, str(path), fps, width, height, options), path)
        return RemoteVideoWriter(self, wid, Path(path), width, height)

    def _post(self, msg: tuple, path: Path) -> None:
        try:
            self._send.send(msg)
        except (OSError, EOFError) as e:
            raise self._died(path) from e

    def _call(self, msg: tuple, path: str | Path) -> None:
        self._post(msg, Path(path))
        try:
            reply = self._recv.recv()
        except (OSError, EOFError) as e:
            raise self._died(Path(path)) from e
        if reply[0] != "ok":
            raise VideoEncodeError(reply[1], file=path)

    def _died(self, path: Path) -> VideoEncodeError:
        code = self._proc.wait(timeout=30)
        return VideoEncodeError(f"video encoder process exited (code {code})", file=path)

    def close(self) -> None:
        """Stop the child (it finishes nothing left open) and reap it."""
        if self._proc.poll() is None:
            try:
                self._send.send(("stop",))
            except (OSError, EOFError):
                pass
        self._send.close()
        self._recv.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> EncoderProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteVideoWriter:
    """``VideoWriter``'s interface (``add``, ``close``) over an ``EncoderProcess``."""

    def __init__(self, owner: EncoderProcess, wid: int, path: Path, width: int, height: int):
        self._owner, self._wid, self.path = owner, wid, path
        self.width, self.height = width, height

    def add(self, img: np.ndarray, *, keyframe: bool = False) -> None:
        """Send one (H, W, 3) uint8 RGB frame; a bad shape raises here, at once."""
        from flora.data.video import check_frame

        check_frame(img, self.width, self.height)
        self._owner._post(("add", self._wid, np.ascontiguousarray(img), keyframe), self.path)

    def close(self) -> None:
        """Finish the file; raises ``VideoEncodeError`` if any frame failed to encode."""
        self._owner._call(("close", self._wid), self.path)

    def __enter__(self) -> RemoteVideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(recv: Connection, send: Connection) -> None:
    """The child's loop: run writers until told to stop or the parent goes away."""
    from flora.data.video import VideoWriter

    writers: dict[int, VideoWriter] = {}
    failed: dict[int, str] = {}
    while True:
        try:
            msg = recv.recv()
        except EOFError:  # the parent died or closed the pipe: nothing to report to
            break
        op = msg[0]
        if op == "stop":
            break
        wid = msg[1]
        try:
            if op == "open":
                _, _, path, fps, width, height, options = msg
                writers[wid] = VideoWriter(path, fps, width, height, **options)
            elif op == "add":
                if wid not in failed:
                    writers[wid].add(msg[2], keyframe=msg[3])
                continue
            elif op == "close":
                w = writers.pop(wid, None)
                if wid in failed:
                    raise RuntimeError(failed.pop(wid))
                if w is None:
                    raise RuntimeError(f"no open writer {wid}")
                w.close()
            send.send(("ok",))
        except Exception as e:  # reported to the parent, which raises it with the path
            err = f"{type(e).__name__}: {e}"
            if op == "add":
                failed[wid] = err
            else:
                send.send(("error", err))


def main() -> None:
    """Entry point of the child: messages on stdin, replies on (a private copy of) stdout."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # anything a library prints must not corrupt the reply stream
    serve(Connection(os.dup(0), writable=False), Connection(out_fd, readable=False))


if __name__ == "__main__":
    main()
