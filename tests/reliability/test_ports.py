"""Servers we start bind port 0 and announce the port (flora.ports): no port race."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flora.ports import announce_port, await_port, listen

REPO = Path(__file__).resolve().parents[2]

# A child that binds port 0, announces it, answers one connection and exits.
CHILD = """
import sys
from flora.ports import announce_port, listen
sock = listen("127.0.0.1", 0)
announce_port(sys.argv[1], sock.getsockname()[1])
conn, _ = sock.accept()
conn.sendall(b"flora")
conn.close()
"""


def _child(code: str, port_file: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, str(port_file)], cwd=REPO)


def test_a_child_announces_the_port_it_bound_and_answers_on_it(tmp_path):
    proc = _child(CHILD, tmp_path / "a.port")
    try:
        port = await_port(tmp_path / "a.port", proc, 60.0, "child")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            assert c.recv(16) == b"flora"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_a_child_that_exits_before_announcing_is_named(tmp_path):
    proc = _child("import sys; sys.exit(3)", tmp_path / "b.port")
    with pytest.raises(RuntimeError, match="flora serve exited with 3 before announcing"):
        await_port(tmp_path / "b.port", proc, 60.0, "flora serve")


def test_a_port_file_that_holds_no_port_is_refused_and_silence_times_out(tmp_path):
    (tmp_path / "c.port").write_text("eighty\n")
    proc = _child("import time; time.sleep(30)", tmp_path / "unused")
    try:
        with pytest.raises(RuntimeError, match="holds 'eighty', not a port"):
            await_port(tmp_path / "c.port", proc, 5.0)
        with pytest.raises(RuntimeError, match="announced no port .* within 0s"):
            await_port(tmp_path / "none.port", proc, 0.3)
    finally:
        proc.kill()
        proc.wait()


def test_port_zero_sockets_get_distinct_ports_and_the_file_is_replaced_whole(tmp_path):
    a, b = listen("127.0.0.1", 0), listen("127.0.0.1", 0)
    try:
        pa, pb = a.getsockname()[1], b.getsockname()[1]
        assert pa != pb and pa > 0 and pb > 0
        f = tmp_path / "s.port"
        announce_port(f, pa)
        announce_port(f, pb)  # a restarted server overwrites the old announcement
        assert f.read_text() == f"{pb}\n"
        assert [p.name for p in tmp_path.iterdir()] == ["s.port"]  # no temporary left
    finally:
        a.close()
        b.close()


def test_serve_on_a_taken_port_says_which(tiny_vlm_dir):
    from flora.backends.server import serve

    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"flora serve cannot listen on 127.0.0.1:{port}"):
            serve(str(tiny_vlm_dir("qwen3_vl")), port=port, device="cpu")
    finally:
        taken.close()
