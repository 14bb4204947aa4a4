"""A real local HTTP server that answers ``/v1/chat/completions`` with canned bodies.

Unlike ``flora serve`` (tests/backends/backend_helpers.py) it runs no model: each POST gets
the next body from a queue (the last one repeats), so a test can hand the OpenAI client
exactly the malformed answers a broken server or proxy sends. Loopback only, port 0.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StubServer:
    """Serves ``bodies`` in order (bytes, or JSON-encoded objects); counts the requests."""

    def __init__(self, bodies: Sequence[Any]) -> None:
        self.bodies = [b if isinstance(b, bytes) else json.dumps(b).encode() for b in bodies]
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n) or b"{}")
                with stub._lock:
                    i = len(stub.requests)
                    stub.requests.append(req)
                    body = stub.bodies[min(i, len(stub.bodies) - 1)]
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


@contextmanager
def stub_server(bodies: Sequence[Any]) -> Iterator[StubServer]:
    """``with stub_server([...]) as s: OpenAIBackend(s.url, ...)``."""
    with StubServer(bodies) as s:
        yield s


def completion(content: Any = "caption: a robot arm picks up the red block.", **choice: Any):
    """A well-formed chat completion with ``content``; ``choice`` overrides choice fields."""
    return {
        "id": "stub",
        "object": "chat.completion",
        "model": "flora",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                **choice,
            }
        ],
    }


def outcome_completion(score: int = 4) -> dict[str, Any]:
    """A well-formed outcome answer ``score: K`` with top logprobs at the digit."""
    top = [{"token": str(k), "logprob": -0.05 if k == score else -4.0} for k in range(1, 6)]
    toks = [
        {"token": "score", "logprob": 0.0, "top_logprobs": []},
        {"token": ":", "logprob": 0.0, "top_logprobs": []},
        {"token": " ", "logprob": 0.0, "top_logprobs": []},
        {"token": str(score), "logprob": -0.05, "top_logprobs": top},
    ]
    return completion(f"score: {score}", logprobs={"content": toks})
