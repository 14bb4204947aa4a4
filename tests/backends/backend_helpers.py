"""Helpers shared by the backend tests: random frames and ``flora serve`` subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from flora.ports import await_port

REPO = Path(__file__).resolve().parents[2]
TOKEN = "flora-test-token"
FAIL_MARKER = "__FLORA_INJECT_500__"


def frames(n: int, seed: int = 0, h: int = 48, w: int = 64) -> list[np.ndarray]:
    """``n`` random RGB frames (uint8 HWC)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


@dataclass
class Server:
    """A running ``flora serve`` subprocess."""

    url: str
    proc: subprocess.Popen
    log: Path

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole block: bound but never
    listening, so no other process can take it meanwhile (a released free port could be)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def start_server(model: Path, log: Path, *extra: str, timeout_s: float = 120.0) -> Server:
    """Start ``python -m flora.cli serve`` on port 0 (the port it announces); wait for
    /health."""
    port_file = log.with_suffix(".port")
    port_file.unlink(missing_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "flora.cli", "serve", "--model", str(model)]
    cmd += ["--port", "0", "--port-file", str(port_file), "--device", "cpu", "--batch-size", "4"]
    cmd += extra
    fh = log.open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    try:
        port = await_port(port_file, proc, timeout_s, "flora serve")
    except RuntimeError as e:
        proc.kill()
        proc.wait(timeout=5)
        raise RuntimeError(f"{e}:\n{log.read_text()}") from e
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flora serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return Server(url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait(timeout=5)
    raise RuntimeError(f"flora serve did not come up in {timeout_s}s:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    """Terminate the server process (kill if it does not exit)."""
    server.proc.terminate()
    try:
        server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=5)
