"""``flora serve`` limits against a real server subprocess on 127.0.0.1 (issue 15, finding 3).

The server runs with small limits set through ``FLORA_SERVE_*`` (the one settings
object) and its token from ``FLORA_SERVE_TOKEN``; a request whose text holds
``STALL_MARKER`` hangs inside generation until cancelled (a deterministic runaway), so
cancellation is asserted from the server's counters, never from timings.
"""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.backends.backend_helpers import TOKEN, Server, start_server, stop_server

STALL_MARKER = "__FLORA_STALL__"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMITS = {
    "FLORA_SERVE_MAX_BODY_BYTES": 262_144,
    "FLORA_SERVE_MAX_IMAGES": 4,
    "FLORA_SERVE_MAX_IMAGE_BYTES": 65_536,
    "FLORA_SERVE_MAX_IMAGE_PIXELS": 1_000_000,
    "FLORA_SERVE_MAX_TOTAL_PIXELS": 2_000_000,
    "FLORA_SERVE_MAX_TOKENS": 64,
    "FLORA_SERVE_MAX_PROMPT_TOKENS": 2_000,
}
OK_BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


def _start(tiny_model: Path, log: Path, env: dict[str, object], *extra: str) -> Server:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, str(v))
        mp.delenv("FLORA_SERVE_TOKEN_FILE", raising=False)
        return start_server(tiny_model, log, "--stall-marker", STALL_MARKER, *extra)


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve_limits") / "serve.log"
    server = _start(tiny_model, log, {**LIMITS, "FLORA_SERVE_TOKEN": TOKEN})
    yield server
    stop_server(server)


def _post(server: Server, body: object = None, content: bytes | None = None) -> httpx.Response:
    url = f"{server.url}/v1/chat/completions"
    if content is not None:
        return httpx.post(url, content=content, headers=AUTH, timeout=120)
    return httpx.post(url, json=body, headers=AUTH, timeout=120)


def _png_url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _images_body(urls: list[str]) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": "score"})
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2, "temperature": 0}


def _assert_400(r: httpx.Response, *needles: str) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    for n in needles:
        assert n in err["message"], err["message"]
    return err["message"]


def _vm_hwm_kib(pid: int) -> int:
    """Peak resident set size of ``pid`` (VmHWM, KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc status")


def _raw_request(port: int, body: bytes, headers: str = "") -> socket.socket:
    """Send one HTTP request on a fresh socket (the caller reads or closes it)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"{headers or f'Content-Length: {len(body)}'}\r\n\r\n"
    )
    s.sendall(head.encode() + body)
    return s


def _read_response(s: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    length = int(
        next(
            h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
    )
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk
        rest += chunk
    return status, json.loads(rest[:length])


def _wait_for(
    server: Server, cond: Callable[[dict], bool], what: str, limit_s: float = 120
) -> dict:
    """Poll /health until ``cond`` holds (a generous bound: only a hang fails it)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        h = server.health()
        if cond(h):
            return h
        time.sleep(0.05)
    raise AssertionError(f"server never reached: {what}; last health {server.health()}")


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_limits_come_from_settings_and_token_from_env(limited):
    h = limited.health()
    assert h["limits"]["max_body_bytes"] == LIMITS["FLORA_SERVE_MAX_BODY_BYTES"]
    assert h["limits"]["max_tokens"] == LIMITS["FLORA_SERVE_MAX_TOKENS"]
    # Token from FLORA_SERVE_TOKEN: required, and no "no token" / argv warning printed.
    assert httpx.post(f"{limited.url}/v1/chat/completions", json=OK_BODY).status_code == 401
    assert _post(limited, OK_BODY).status_code == 200
    log = limited.log.read_text()
    assert "NO bearer token" not in log and "process list" not in log


def test_oversized_body_is_413_and_server_stays_healthy(limited):
    before = limited.health()["rejected"]
    # Declared too large: refused from the header, before a byte of body is read.
    s = _raw_request(_port(limited), b"", headers="Content-Length: 1000000000")
    try:
        status, err = _read_response(s)
    finally:
        s.close()
    assert status == 413 and "FLORA_SERVE_MAX_BODY_BYTES" in err["error"]["message"]

    # No Content-Length (chunked): counted while streaming, refused past the limit.
    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(30):
            yield b"y" * 10_000
        yield b'"}]}'

    r = _post(limited, content=chunks())  # type: ignore[arg-type]
    assert r.status_code == 413, r.text
    assert "more than 262144 bytes" in r.json()["error"]["message"]
    # Just under the limit is parsed (and then refused for its prompt length, a 400).
    text = "z " * ((LIMITS["FLORA_SERVE_MAX_BODY_BYTES"] - 200) // 2)
    _assert_400(_post(limited, {**OK_BODY, "messages": [{"role": "user", "content": text}]}),
                "FLORA_SERVE_MAX_PROMPT_TOKENS")  # fmt: skip
    h = limited.health()
    assert h["status"] == "ok" and h["rejected"] - before == 3 and h["active"] == 0
    assert _post(limited, OK_BODY).status_code == 200


def test_pixel_bombs_are_400_without_allocating_them(limited):
    # 12000 x 12000 1-bit PNG: ~23 KB encoded, 144 M pixels (432 MB as RGB) decoded.
    bomb = _png_url(Image.new("1", (12_000, 12_000), 0))
    assert len(bomb) < 40_000
    # 1200 x 1200: over our 1 M pixel limit but under PIL's own guard (2x its limit).
    over = _png_url(Image.new("L", (1_200, 1_200), 0))
    hwm0 = _vm_hwm_kib(limited.proc.pid)
    for _ in range(3):
        _assert_400(_post(limited, _images_body([bomb] * 4)), "messages[0].content[0]",
                    "DecompressionBombError")  # fmt: skip
    _assert_400(_post(limited, _images_body([over])), "1200x1200", "over the limit 1000000")
    grown_mib = (_vm_hwm_kib(limited.proc.pid) - hwm0) / 1024
    # Decoding one bomb would need >= 144 MiB (one byte per pixel) before RGB conversion.
    assert grown_mib < 64, f"peak RSS grew by {grown_mib:.0f} MiB"
    assert _post(limited, OK_BODY).status_code == 200


def test_image_count_bytes_total_pixels_and_undecodable(limited):
    small = _png_url(Image.fromarray(np.zeros((48, 64, 3), np.uint8)))
    assert _post(limited, _images_body([small] * 4)).status_code == 200
    _assert_400(_post(limited, _images_body([small] * 5)), "5 images, over the limit 4")
    # Encoded bytes per image (noise does not compress: ~120 KB > 64 KiB).
    noise = np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8)
    _assert_400(_post(limited, _images_body([_png_url(Image.fromarray(noise))])),
                "bytes encoded, over the limit 65536")  # fmt: skip
    # Decoded pixels over the request: three 900x900 images (each under the per-image cap).
    big = _png_url(Image.new("RGB", (900, 900)))
    _assert_400(_post(limited, _images_body([big] * 3)), "content[2]", "2000000 decoded pixels")
    _assert_400(_post(limited, _images_body(["data:image/png;base64,AAAA"])), "cannot decode")
    _assert_400(_post(limited, _images_body(["data:image/png;base64,@@@"])), "cannot decode")
    _assert_400(_post(limited, _images_body([_png_url(Image.new("RGB", (1, 1)))])),
                "under 4 pixels a side")  # fmt: skip
    _assert_400(_post(limited, _images_body([_png_url(Image.new("RGB", (900, 4)))])),
                "aspect ratio")  # fmt: skip
    assert limited.health()["active"] == 0


def test_max_tokens_over_the_cap_is_400_not_clamped(limited):
    cap = LIMITS["FLORA_SERVE_MAX_TOKENS"]
    _assert_400(_post(limited, {**OK_BODY, "max_tokens": cap + 1}), f"limit {cap}")
    _assert_400(
        _post(limited, {**OK_BODY, "max_completion_tokens": 10**9}), "FLORA_SERVE_MAX_TOKENS"
    )
    r = _post(limited, {**OK_BODY, "max_tokens": cap})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= cap


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({**OK_BODY, "messages": []}),
        json.dumps({"max_tokens": 3}),
        '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        '{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
        '{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
        json.dumps({**OK_BODY, "temperature": -0.5}),
        json.dumps({**OK_BODY, "temperature": "hot"}),
        json.dumps({**OK_BODY, "max_tokens": "5"}),
        json.dumps({**OK_BODY, "max_tokens": 0}),
        json.dumps({**OK_BODY, "logprobs": "yes"}),
        json.dumps({**OK_BODY, "top_logprobs": 99}),
        json.dumps({**OK_BODY, "messages": "hi"}),
        json.dumps({**OK_BODY, "messages": [1]}),
        json.dumps({**OK_BODY, "messages": [{"role": "robot", "content": "hi"}]}),
        json.dumps({**OK_BODY, "messages": [{"role": "user", "content": 5}]}),
        json.dumps({**OK_BODY, "messages": [{"role": "user", "content": [{"type": "audio"}]}]}),
        json.dumps({**OK_BODY, "n": 2}),
        json.dumps([OK_BODY]),
        "{not json",
        "[" * 100_000 + "]" * 100_000,
        b"\xff\xfe not utf-8",
    ],
    ids=[
        "empty-messages", "no-messages", "nan-temperature", "inf-temperature",
        "overflow-temperature", "negative-temperature", "string-temperature",
        "string-max-tokens", "zero-max-tokens", "string-logprobs", "top-logprobs-99",
        "messages-string", "message-int", "bad-role", "content-int", "unknown-part", "n-2",
        "body-list", "not-json", "deep-nesting", "not-utf8",
    ],
)  # fmt: skip
def test_invalid_requests_are_400(limited, content):
    raw = content if isinstance(content, bytes) else content.encode()
    _assert_400(_post(limited, content=raw))


def test_invalid_requests_leave_the_server_healthy(limited):
    h = limited.health()
    assert h["status"] == "ok" and h["active"] == 0
    assert _post(limited, OK_BODY).status_code == 200


def test_prompt_token_limit(limited):
    msg = _assert_400(
        _post(limited, {**OK_BODY, "messages": [{"role": "user", "content": "word " * 3000}]}),
        "FLORA_SERVE_MAX_PROMPT_TOKENS",
    )
    assert int(msg.split("prompt is ")[1].split()[0]) > LIMITS["FLORA_SERVE_MAX_PROMPT_TOKENS"]


def test_prompt_token_count_equals_the_backends(tiny_backend):
    """The limit is checked on the same count the model sees (without running the vision
    processor): text + one placeholder per image replaced by its visual tokens."""
    from flora.backends.processing import Chat
    from flora.backends.server import prompt_tokens

    rng = np.random.default_rng(3)
    for shape in [(48, 64), (200, 120), (33, 70)]:
        img = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        chat = Chat(
            messages=[
                {"role": "system", "content": [{"type": "text", "text": "You are Flora."}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "<0.25 seconds>"}, {"type": "image", "image": img},
                    {"type": "image", "image": img}, {"type": "text", "text": "score: ?"}]},
            ],
            max_new_tokens=1,
        )  # fmt: skip
        (gen,) = tiny_backend.generate_chats([chat])
        assert gen.error is None and prompt_tokens(tiny_backend, chat) == gen.prompt_tokens


def test_client_disconnect_cancels_generation_and_queued_requests(limited):
    h0 = limited.health()
    port = _port(limited)
    stall = {**OK_BODY, "max_tokens": 60, "messages": [{"role": "user", "content": STALL_MARKER}]}
    # A: a runaway generation (it hangs at its first token until cancelled).
    a = _raw_request(port, json.dumps(stall).encode())
    _wait_for(limited, lambda h: h["generating"] == 1, "A generating")
    # B: queued behind A; its client gives up while it waits.
    b = _raw_request(port, json.dumps({**OK_BODY, "max_tokens": 5}).encode())
    _wait_for(limited, lambda h: h["queued"] == 1, "B queued")
    b.close()
    _wait_for(limited, lambda h: h["disconnected"] == h0["disconnected"] + 1, "B disconnect seen")
    a.close()
    h = _wait_for(
        limited,
        lambda h: h["disconnected"] == h0["disconnected"] + 2 and h["generating"] == 0,
        "A disconnect seen and generation stopped",
    )
    # A's generation was stopped by its stopping criterion, B was never generated.
    assert h["stopped_generations"] == h0["stopped_generations"] + 1
    assert h["batched_chats"] == h0["batched_chats"] + 1
    # The next request is served: the worker is free (B is dropped when it is dequeued).
    r = _post(limited, OK_BODY)
    assert r.status_code == 200, r.text
    h = limited.health()
    assert h["dropped_from_queue"] == h0["dropped_from_queue"] + 1
    assert h["batched_chats"] == h0["batched_chats"] + 2 and h["active"] == 0


def test_deadline_stops_a_runaway_generation(tiny_model, tmp_path):
    server = _start(
        tiny_model, tmp_path / "deadline.log",
        {"FLORA_SERVE_REQUEST_TIMEOUT_S": 8, "FLORA_SERVE_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        # The deadline (8 s) is far longer than reading and queueing this tiny request, so
        # it always passes during the stalled generation, which must then stop.
        stall = {**OK_BODY, "messages": [{"role": "user", "content": f"x {STALL_MARKER}"}]}
        r = _post(server, stall)
        assert r.status_code == 504, r.text
        assert "FLORA_SERVE_REQUEST_TIMEOUT_S" in r.json()["error"]["message"]
        h = _wait_for(server, lambda h: h["generating"] == 0, "generation stopped")
        assert h["deadline_exceeded"] == 1 and h["stopped_generations"] == 1
        assert h["active"] == 0
    finally:
        stop_server(server)


# ---- token resolution and warnings (the CLI layer, the model is not loaded) ----------------


@pytest.fixture
def serve_calls(monkeypatch) -> list[dict]:
    """``flora serve`` with ``server.serve`` replaced by a recorder; FLORA_SERVE_* cleared."""
    import flora.backends.server as server_mod
    from flora.settings import get_settings

    calls: list[dict] = []
    monkeypatch.setattr(server_mod, "serve", lambda model, **kw: calls.append(kw))
    for k in [k for k in os.environ if k.startswith("FLORA_SERVE_")]:
        monkeypatch.delenv(k)
    monkeypatch.chdir(Path(__file__).parent)  # no .env file from the repo root
    get_settings.cache_clear()
    yield calls
    get_settings.cache_clear()


def _invoke(*args: str):
    from typer.testing import CliRunner

    from flora.cli import app

    return CliRunner().invoke(app, ["serve", "--model", "unused", *args])


def test_no_token_prints_a_loud_warning(serve_calls):
    res = _invoke()
    assert res.exit_code == 0, res.output
    assert "NO bearer token" in res.stderr and "http://127.0.0.1:8000" in res.stderr
    assert serve_calls[0]["token"] is None


def test_token_on_the_command_line_works_but_warns(serve_calls):
    res = _invoke("--token", "s3cret")
    assert res.exit_code == 0, res.output
    assert "process list" in res.stderr and "NO bearer token" not in res.stderr
    assert serve_calls[0]["token"] == "s3cret"


def test_token_from_file_or_env_without_warning(serve_calls, tmp_path, monkeypatch):
    from flora.settings import get_settings

    f = tmp_path / "token"
    f.write_text("from-file\n")
    res = _invoke("--token-file", str(f))
    assert res.exit_code == 0 and res.stderr == "" and serve_calls[-1]["token"] == "from-file"
    monkeypatch.setenv("FLORA_SERVE_TOKEN", "from-env")
    get_settings.cache_clear()
    res = _invoke()
    assert res.exit_code == 0 and res.stderr == "" and serve_calls[-1]["token"] == "from-env"
    monkeypatch.delenv("FLORA_SERVE_TOKEN")
    monkeypatch.setenv("FLORA_SERVE_TOKEN_FILE", str(f))
    get_settings.cache_clear()
    res = _invoke()
    assert res.exit_code == 0 and serve_calls[-1]["token"] == "from-file"


def test_bad_token_sources_are_refused(serve_calls, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for args in (["--token-file", str(empty)], ["--token-file", str(tmp_path / "missing")],
                 ["--token", "x", "--token-file", str(empty)], ["--token", " "]):  # fmt: skip
        res = _invoke(*args)
        assert res.exit_code != 0 and not serve_calls, (args, res.output)
