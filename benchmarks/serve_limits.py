"""Peak resident memory of ``flora serve`` under its largest accepted request and a burst of
rejected ones (issue 15: a bounded server).

Starts ``flora serve`` as a subprocess on 127.0.0.1, port 0 (it announces the port),
with its **default** limits (``FLORA_SERVE_*`` unset; token from ``FLORA_SERVE_TOKEN``)
over a tiny random model (built offline) or ``--model``, then, phase by phase, resets and
reads the server's peak resident set (``VmHWM`` in ``/proc/<pid>/status``; ``echo 5 >
/proc/<pid>/clear_refs`` resets it to the current RSS between phases):

1. ``idle`` — after start-up and one small warm-up request;
2. ``largest_accepted`` — one request at every limit at once: ``max_images`` PNG frames
   whose decoded pixels sum to ``max_total_pixels`` and whose body is just under
   ``max_body_bytes`` (must answer 200);
3. ``rejected_burst`` — ``--concurrency`` clients sending, together, bodies declaring
   1 GB (413 from the header), chunked bodies streaming past the limit (413 while
   streaming), requests of ``max_images`` 12000x12000 pixel-bomb PNGs (400), and
   requests over the image-count limit (400); none may answer 200 or 5xx.

The stated bound (checked; exit 1 when exceeded) is, above the idle peak,

    largest accepted:  4 x max_body_bytes + 4 x max_total_pixels x 3 bytes
    rejected burst:    concurrency x 3 x max_body_bytes

(body buffer, parsed JSON strings, base64-decoded copies and RGB arrays with their
processor copies; a rejected request holds at most its body buffer up to the limit, and
the JSON of a request that is small enough to parse). Everything is loopback and every
loop has a fixed count.

    python benchmarks/serve_limits.py [--model DIR] [--concurrency 8] [--out results.json]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from flora.ports import await_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "bench-token"
MIB = 1024**2


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def _reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _png_url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _body(urls: list[str], max_tokens: int = 2) -> dict:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": "score"})
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens}


def largest_accepted_body(limits: dict) -> bytes:
    """A body at every limit at once (images, total pixels, just under the body bytes)."""
    n = limits["max_images"]
    side = int((limits["max_total_pixels"] / n) ** 0.5)
    budget = limits["max_body_bytes"] - 64 * 1024  # JSON framing headroom
    rng = np.random.default_rng(0)
    # Noise rows do not compress: choose the noisy fraction so that n frames fill the body.
    lo, hi = 0.0, 1.0
    for _ in range(12):  # bisection, fixed count
        frac = (lo + hi) / 2
        img = np.zeros((side, side, 3), np.uint8)
        rows = int(side * frac)
        img[:rows] = rng.integers(0, 256, (rows, side, 3), dtype=np.uint8)
        size = len(_png_url(Image.fromarray(img))) * n
        lo, hi = (frac, hi) if size < budget else (lo, frac)
    img = np.zeros((side, side, 3), np.uint8)
    rows = int(side * lo)
    urls = []
    for _ in range(n):  # distinct frames: no shared strings on the server
        img[:rows] = rng.integers(0, 256, (rows, side, 3), dtype=np.uint8)
        urls.append(_png_url(Image.fromarray(img)))
    body = json.dumps(_body(urls)).encode()
    assert len(body) <= limits["max_body_bytes"], len(body)
    return body


def _raw(port: int, head: str, payload: bytes = b"") -> int:
    """One raw HTTP request; the status code (0 when the connection was reset)."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        try:
            s.sendall(head.encode() + payload)
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    return 0
                data += chunk
        except OSError:
            return 0
    return int(data.split()[1])


def _chunked_oversized(port: int, limit: int) -> int:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"y" * MIB
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        try:
            s.sendall(head.encode() + f"{2:x}\r\n".encode() + b'["\r\n')
            for _ in range(limit // MIB + 2):  # just past the limit
                s.sendall(chunk)
            s.sendall(b'3\r\n"]}\r\n0\r\n\r\n')
            data = s.recv(4096)
        except OSError:
            return 0
    return int(data.split()[1]) if data else 0


def run(model: Path, concurrency: int, bursts: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLORA_SERVE_")}
    env.update(
        FLORA_SERVE_TOKEN=TOKEN,
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
    )
    cmd = [sys.executable, "-m", "flora.cli", "serve", "--model", str(model)]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    port_file = Path(log.name).with_suffix(".port")
    cmd += ["--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file)]
    cmd += ["--device", "cpu", "--batch-size", "4"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    port = await_port(port_file, proc, 120.0, "flora serve")
    url = f"http://127.0.0.1:{port}"
    h = {"Authorization": f"Bearer {TOKEN}"}
    out: dict = {"server_pid": proc.pid}
    try:
        for _ in range(600):  # up to 120 s
            if proc.poll() is not None:
                raise RuntimeError(Path(log.name).read_text())
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        limits = httpx.get(f"{url}/health").json()["limits"]
        out["limits"] = limits
        small = _png_url(Image.new("RGB", (64, 48)))
        r = httpx.post(f"{url}/v1/chat/completions", json=_body([small]), headers=h, timeout=120)
        assert r.status_code == 200, r.text
        pid = proc.pid
        out["peak_reset_supported"] = _reset_peak(pid)
        out["idle_rss_mib"] = _status_kib(pid, "VmRSS") / 1024
        out["idle_peak_mib"] = _status_kib(pid, "VmHWM") / 1024

        body = largest_accepted_body(limits)
        out["largest_body_bytes"] = len(body)
        _reset_peak(pid)
        t0 = time.perf_counter()
        r = httpx.post(
            f"{url}/v1/chat/completions",
            content=body,
            headers={**h, "Content-Type": "application/json"},
            timeout=600,
        )
        out["largest_status"] = r.status_code
        out["largest_seconds"] = round(time.perf_counter() - t0, 2)
        out["largest_prompt_tokens"] = r.json().get("usage", {}).get("prompt_tokens")
        out["largest_peak_mib"] = _status_kib(pid, "VmHWM") / 1024
        out["after_largest_rss_mib"] = _status_kib(pid, "VmRSS") / 1024
        del body

        bomb = _png_url(Image.new("1", (12_000, 12_000), 0))
        bomb_body = json.dumps(_body([bomb] * limits["max_images"])).encode()
        many_body = json.dumps(_body([small] * (limits["max_images"] + 1))).encode()
        post = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        )

        def declared() -> int:
            return _raw(port, post + "Content-Length: 1000000000\r\n\r\n")

        def chunked() -> int:
            return _chunked_oversized(port, limits["max_body_bytes"])

        def bombs() -> int:
            return _raw(port, post + f"Content-Length: {len(bomb_body)}\r\n\r\n", bomb_body)

        def too_many() -> int:
            return _raw(port, post + f"Content-Length: {len(many_body)}\r\n\r\n", many_body)

        kinds = [
            ("declared_1GB", declared),
            ("chunked_oversized", chunked),
            ("pixel_bombs", bombs),
            ("too_many_images", too_many),
        ]
        jobs = kinds * bursts  # each kind `bursts` times, interleaved
        _reset_peak(pid)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            statuses = list(pool.map(lambda j: (j[0], j[1]()), jobs))
        out["burst_seconds"] = round(time.perf_counter() - t0, 2)
        out["burst_requests"] = len(jobs)
        out["bomb_body_bytes"] = len(bomb_body)
        counts: dict[str, dict[str, int]] = {}
        for kind, status in statuses:
            counts.setdefault(kind, {}).setdefault(str(status), 0)
            counts[kind][str(status)] += 1
        out["burst_statuses"] = counts
        out["burst_peak_mib"] = _status_kib(pid, "VmHWM") / 1024
        out["after_burst_rss_mib"] = _status_kib(pid, "VmRSS") / 1024
        r = httpx.post(f"{url}/v1/chat/completions", json=_body([small]), headers=h, timeout=120)
        out["healthy_after"] = r.status_code == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    lim = out["limits"]
    out["largest_bound_mib"] = (
        out["idle_peak_mib"] + (4 * lim["max_body_bytes"] + 4 * lim["max_total_pixels"] * 3) / MIB
    )
    out["burst_bound_mib"] = out["idle_peak_mib"] + concurrency * 3 * lim["max_body_bytes"] / MIB
    bad = [s for kind in counts.values() for s in kind if s == "200" or s.startswith("5")]
    out["ok"] = bool(
        out["largest_status"] == 200
        and out["largest_peak_mib"] <= out["largest_bound_mib"]
        and out["burst_peak_mib"] <= out["burst_bound_mib"]
        and not bad
        and out["healthy_after"]
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="checkpoint dir (default: a tiny random model)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--bursts", type=int, default=4, help="requests of each rejected kind")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = args.model
        if model is None:
            from flora.backends.tiny import build_tiny_vlm

            model = build_tiny_vlm(Path(d) / "tiny")
        res = run(model, args.concurrency, args.bursts)
    res["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"
    )
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
