"""Loopback ports for the servers the engine starts itself (``flora serve`` in the demo,
a second rank's rendezvous, test servers)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now. It is released before it is returned, so a server
    that can bind port 0 itself should (``training.sft.init_distributed`` does); this is
    for a port that has to be known before the server starts."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
