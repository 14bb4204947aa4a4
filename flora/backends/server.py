"""``flora serve``: an OpenAI-compatible HTTP server over the in-process TransformersBackend.

Endpoints: ``POST /v1/chat/completions`` (text + ``image_url`` data-URL parts;
``max_tokens``/``max_completion_tokens``, ``temperature``, ``logprobs``, ``top_logprobs``),
``GET /v1/models``, ``GET /health``. Concurrent requests are gathered into batches (up to
the backend's ``batch_size``, waiting at most ``batch_wait_ms`` for company) and run on one
worker thread, so the event loop stays responsive while the model works.

An optional bearer token protects every endpoint except ``/health`` (401 without it).

Fault injection (tests only, off by default): ``Faults`` makes the first N completions
answer 500, every completion whose text contains a marker answer 500, and/or the first M
completions sleep before answering — so retries and timeouts are tested against the real
server.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from flora.backends.processing import Chat, RequestError, openai_messages_to_chat
from flora.backends.transformers_backend import Generation, TransformersBackend

log = logging.getLogger(__name__)


@dataclass
class Faults:
    """Injected failures for tests (all off by default)."""

    fail_first: int = 0  # the first N completions answer HTTP 500
    fail_marker: str | None = None  # completions whose text contains this answer 500
    delay_first: int = 0  # the first M completions sleep ``delay_s`` first
    delay_s: float = 0.0


class ChatRequest(BaseModel):
    """The subset of the OpenAI chat-completions body that Flora uses."""

    model: str | None = None
    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    n: int = 1
    stream: bool = False


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "code": status}}
    )


class _Batcher:
    """Gathers concurrent chats into batches for one worker thread."""

    def __init__(self, backend: TransformersBackend, max_batch: int, wait_s: float):
        self.backend = backend
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.batches = 0  # batches run, for /health (mean batch = chats / batches)
        self.chats = 0
        self.queue: asyncio.Queue[tuple[Chat, asyncio.Future[Generation]]] | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self.task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def submit(self, chat: Chat) -> Generation:
        assert self.queue is not None
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        await self.queue.put((chat, fut))
        return await fut

    async def _loop(self) -> None:
        assert self.queue is not None
        while True:
            items = [await self.queue.get()]
            deadline = time.monotonic() + self.wait_s
            while len(items) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(self.queue.get(), left))
                except TimeoutError:
                    break
            chats = [c for c, _ in items]
            self.batches += 1
            self.chats += len(chats)
            try:
                gens = await asyncio.to_thread(self.backend.generate_chats, chats)
            except Exception as e:  # noqa: BLE001 - every waiter gets the error
                gens = [Generation(error=f"{type(e).__name__}: {e}") for _ in chats]
            for (_, fut), g in zip(items, gens, strict=True):
                if not fut.done():
                    fut.set_result(g)


def create_app(
    backend: TransformersBackend,
    served_model: str = "flora",
    token: str | None = None,
    faults: Faults | None = None,
    batch_wait_ms: float = 5.0,
) -> FastAPI:
    """Build the FastAPI app serving ``backend`` under the model name ``served_model``."""
    faults = faults or Faults()
    batcher = _Batcher(backend, backend.batch_size, batch_wait_ms / 1000)
    stats = {"completions": 0, "injected_failures": 0, "started": time.time()}

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="flora serve", lifespan=lifespan)

    @app.middleware("http")
    async def auth(request: Request, call_next):
        if token and request.url.path != "/health":
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
                return _error(401, "missing or invalid bearer token", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": served_model,
            "model_version": backend.model_version,
            **stats,
            "batches": batcher.batches,
            "batched_chats": batcher.chats,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        info = backend.info()
        return {
            "object": "list",
            "data": [
                {
                    "id": served_model,
                    "object": "model",
                    "created": int(stats["started"]),
                    "owned_by": "flora",
                    "root": info["model_path"],
                    "model_version": backend.model_version,
                    "adapter": info["adapter_path"],
                }
            ],
        }

    @app.post("/v1/chat/completions")
    async def completions(body: ChatRequest):
        if body.model not in (None, served_model):
            return _error(
                404, f"model {body.model!r} not served (have {served_model!r})", "not_found"
            )
        if body.n != 1 or body.stream:
            return _error(400, "only n=1 and stream=false are supported", "invalid_request_error")
        k = stats["completions"]
        stats["completions"] += 1
        if k < faults.delay_first and faults.delay_s > 0:
            await asyncio.sleep(faults.delay_s)
        injected = k < faults.fail_first or (
            faults.fail_marker is not None and faults.fail_marker in str(body.messages)
        )
        if injected:
            stats["injected_failures"] += 1
            return _error(500, "injected failure (test fault injection)", "server_error")
        try:
            # Decoding dozens of PNG frames is CPU work: keep it off the event loop.
            messages = await asyncio.to_thread(openai_messages_to_chat, body.messages)
        except RequestError as e:
            return _error(400, str(e), "invalid_request_error")
        top = body.top_logprobs or 0
        chat = Chat(
            messages=messages,
            max_new_tokens=body.max_completion_tokens or body.max_tokens or 256,
            temperature=body.temperature,
            top_logprobs=top if body.logprobs else 0,
            want_logprobs=body.logprobs,
        )
        try:
            gen = await batcher.submit(chat)
        except RequestError as e:
            return _error(400, str(e), "invalid_request_error")
        if gen.error is not None:
            return _error(500, gen.error, "server_error")
        logprobs = None
        if body.logprobs:
            logprobs = {
                "content": [
                    {
                        "token": lp.token,
                        "logprob": lp.logprob,
                        "bytes": list(lp.token.encode()),
                        "top_logprobs": [
                            {"token": t, "logprob": v, "bytes": list(t.encode())}
                            for t, v in lp.top.items()
                        ],
                    }
                    for lp in gen.logprobs
                ]
            }
        n_out = len(gen.token_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served_model,
            "system_fingerprint": backend.model_version,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": gen.text},
                    "logprobs": logprobs,
                    "finish_reason": gen.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": gen.prompt_tokens,
                "completion_tokens": n_out,
                "total_tokens": gen.prompt_tokens + n_out,
            },
        }

    return app


def serve(
    model: str,
    adapter: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    served_model: str = "flora",
    device: str = "auto",
    batch_size: int = 8,
    faults: Faults | None = None,
) -> None:
    """Load the model and serve it until interrupted (blocking)."""
    import uvicorn

    backend = TransformersBackend(model, adapter_path=adapter, device=device, batch_size=batch_size)
    app = create_app(backend, served_model=served_model, token=token, faults=faults)
    log.info("serving %s as %r on http://%s:%d", backend.model_version, served_model, host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning")


__all__ = ["ChatRequest", "Faults", "create_app", "serve"]
