"""Loopback ports for the servers the engine starts itself (``flora serve`` in the demo,
a second rank's rendezvous, test servers).

Where the server is ours, it binds port 0 and announces the port the OS gave it in a file
(:func:`listen`, :func:`announce_port`; ``flora serve --port 0 --port-file F``) and the
starter reads it back (:func:`await_port`): no port is chosen, released and then taken by
someone else in between. :func:`free_port` is for servers that need their port up front.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now. It is released before it is returned, so a server
    that can bind port 0 itself should (``training.sft.init_distributed`` and ``flora
    serve --port 0`` do); this is for a port that has to be known before the server starts."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; port 0 takes whatever port the OS gives."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=2048)


def announce_port(path: Path, port: int) -> None:
    """Write ``port`` to ``path`` whole (temporary file, then rename): a reader never sees a
    partial number."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n", encoding="utf-8")
    tmp.replace(path)


def await_port(
    path: Path, proc: subprocess.Popen, timeout_s: float = 600.0, what: str = "server"
) -> int:
    """The port ``proc`` announced in ``path`` (:func:`announce_port`).

    Raises ``RuntimeError`` naming ``what`` when the process exits first or nothing is
    announced within ``timeout_s``.
    """
    path = Path(path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file():
            text = path.read_text(encoding="utf-8").strip()
            if text.isdigit() and int(text) > 0:
                return int(text)
            raise RuntimeError(f"{what}: port file {path} holds {text!r}, not a port")
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before announcing its port")
        time.sleep(0.1)
    raise RuntimeError(f"{what} announced no port in {path} within {timeout_s:.0f}s")
