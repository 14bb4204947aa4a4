"""``flora serve``: an OpenAI-compatible HTTP server over the in-process TransformersBackend.

Endpoints: ``POST /v1/chat/completions`` (text, ``image_url`` and ``video_url`` data-URL
parts; ``max_tokens``/``max_completion_tokens``, ``temperature``, ``logprobs``,
``top_logprobs``, guided decoding via ``structured_outputs`` / ``guided_regex`` /
``guided_json`` / ``response_format``),
``GET /v1/models``, ``GET /health``. Concurrent requests are gathered into batches (up to
the backend's ``batch_size``, waiting at most ``batch_wait_ms`` for company) and run on one
worker thread, so the event loop stays responsive while the model works.

An optional bearer token protects every endpoint except ``/health`` (401 without it).

Every request is bounded before it costs memory or CPU (limits from ``FloraSettings``,
``FLORA_SERVE_*``; see docs/backends.md): admitted requests (503 above), body bytes
(413, from ``Content-Length`` and while streaming, before any JSON parsing), images per
request, encoded bytes and decoded pixels per image (from the image header, before
decoding), decoded pixels per request, prompt tokens, ``max_tokens`` (400 above the cap,
never silently clamped), and a per-request deadline covering body upload, queueing and
generation (504). A request whose client disconnects or whose deadline passes stops
generating at the next token (a stopping criterion on the backend). A client fault is a
400 with an OpenAI-style error body, never a 500.

A ``video_url`` part (an MP4 data URL, :mod:`flora.backends.video`) is decoded to its frames
and timestamps within the image limits, and reaches the model as the transformers backend
lays out a timestamped clip: one video where the checkpoint's processor has a video half,
stamped images otherwise. Guided decoding (:mod:`flora.backends.guided`): a regex is
enforced token by token by a logits mask; a JSON schema is checked and re-sampled a
bounded number of times; an invalid regex or schema is a 400.

Fault injection (tests only, off by default): ``Faults`` makes the first K completions
answer 429 with ``Retry-After``, the next N answer 500, every completion whose text
contains a marker answer 500, the first M completions sleep before answering, and/or a
completion whose text contains a stall marker hang inside generation until it is
cancelled — so retries, timeouts and cancellation are tested against the real server.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from flora.backends.guided import JSON_RESAMPLES, guide_from_body, json_ok
from flora.backends.processing import (
    Chat,
    RequestError,
    openai_messages_to_chat,
    render_prompt,
    stamp,
    supports_video,
)
from flora.backends.transformers_backend import Generation, TransformersBackend
from flora.backends.video import decode_video
from flora.settings import FloraSettings, get_settings

log = logging.getLogger(__name__)

MIN_IMAGE_SIDE = 4  # pixels; smaller images are refused (see ``prompt_tokens``)


@dataclass
class Faults:
    """Injected failures for tests (all off by default)."""

    fail_first: int = 0  # the first N completions (after the 429s) answer HTTP 500
    fail_marker: str | None = None  # completions whose text contains this answer 500
    delay_first: int = 0  # the first M completions sleep ``delay_s`` first
    delay_s: float = 0.0
    # Completions whose text contains this hang at their first generated token until
    # cancelled (client gone) or past their deadline: a deterministic runaway generation.
    stall_marker: str | None = None
    throttle_first: int = 0  # the first K completions answer 429 with Retry-After
    retry_after_s: int = 1


class ChatRequest(BaseModel):
    """The subset of the OpenAI chat-completions body that Flora uses.

    Strict types (a string is not coerced to a number), no NaN/inf, at least one message.
    """

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    n: int | None = None
    stream: bool | None = None
    # Guided decoding (flora.backends.guided): checked in ``guide_from_body``.
    structured_outputs: dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_json: dict[str, Any] | str | None = None
    response_format: dict[str, Any] | None = None


def _error(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "code": status}},
        headers=headers,
    )


def _bad(message: str) -> JSONResponse:
    return _error(400, message, "invalid_request_error")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes | bytearray) -> Any:
    """Strict JSON: ``NaN``/``Infinity`` literals are refused (Python's json accepts them)."""
    return json.loads(raw, parse_constant=_reject_constant)


def _validation_message(e: ValidationError) -> str:
    # Never echo the input back: it may be megabytes of base64.
    parts = []
    for err in e.errors(include_input=False, include_url=False)[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid request: " + "; ".join(parts)


def _reserved_tokens(proc: Any) -> list[str]:
    """The strings a client's text must not hold: the processor's vision tokens and every
    special token of its tokenizer (longest first)."""
    tok = proc.tokenizer
    out = {
        getattr(proc, a, None)
        for a in ("image_token", "video_token", "vision_start_token", "vision_end_token")
    }
    out |= set(getattr(tok, "all_special_tokens", []) or [])
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    out |= {getattr(t, "content", None) for t in added.values() if getattr(t, "special", False)}
    return sorted((t for t in out if isinstance(t, str) and t), key=len, reverse=True)


def prompt_tokens(backend: TransformersBackend, chat: Chat) -> int:
    """Prompt length in tokens, without running the vision processor.

    The chat template is rendered and tokenised (each image is one placeholder token
    there); every placeholder then counts as the number of visual tokens the image
    processor will give that image size. Raises ``RequestError`` for a chat the template
    or the image processor refuses (a client fault, not a server one), and for text that
    holds a reserved token (:func:`_reserved_tokens`).
    """
    proc = backend.processor
    # All special tokens, not only the vision ones: text is tokenised with them live, so
    # <|im_end|><|im_start|> would forge a turn; Flora's own requests never hold one.
    reserved = _reserved_tokens(proc)
    for k, m in enumerate(chat.messages):
        content = m.get("content")
        for p in [{"text": content}] if isinstance(content, str) else content or []:
            text = p.get("text") if isinstance(p, dict) else None
            hit = next((t for t in reserved if isinstance(text, str) and t in text), None)
            if hit is not None:  # a vision token would also make the processor fail (500)
                raise RequestError(f"messages[{k}] text holds the reserved token {hit!r}")
    try:
        text = render_prompt(proc, chat)
    except Exception as e:  # noqa: BLE001 - template errors come from the message layout
        raise RequestError(f"messages cannot be rendered by the chat template: {e}") from e
    n = len(proc.tokenizer(text, add_special_tokens=False)["input_ids"])
    ip = getattr(proc, "image_processor", None)
    count = getattr(ip, "get_number_of_image_patches", None)
    merge = int(getattr(ip, "merge_size", 1) or 1)
    frames = list(chat.images())
    for v in chat.videos():
        # Two frames make one temporal patch: a video costs half its frames' image tokens.
        frames += v["video"][::2]
    for i, img in enumerate(frames):
        h, w = img.shape[:2]
        if min(h, w) < MIN_IMAGE_SIDE:
            # The image processor guesses the channel axis from the shape: a side of 1 or
            # 3 pixels would be read as channels and the image silently garbled.
            raise RequestError(f"image {i} ({w}x{h}) is under {MIN_IMAGE_SIDE} pixels a side")
        if count is not None:
            try:
                n += count(h, w) // (merge * merge) - 1
            except ValueError as e:  # e.g. an aspect ratio the processor refuses
                raise RequestError(f"image {i} ({w}x{h}) is not accepted: {e}") from e
    return n


def wire_to_chat(
    messages: list[dict[str, Any]], settings: FloraSettings, video_ok: bool
) -> list[dict[str, Any]]:
    """Wire messages -> chat messages, with ``video_url`` parts decoded.

    Video frames count against the same limits as images (``FLORA_SERVE_MAX_IMAGES``,
    ``..._MAX_IMAGE_PIXELS`` per frame, ``..._MAX_TOTAL_PIXELS`` per request; the encoded
    video against ``..._MAX_BODY_BYTES``). A video becomes one video part when the
    processor takes videos (``video_ok``), else its frames as images each preceded by its
    timestamp stamp — exactly what ``request_to_chat`` makes of the same frames, so the model
    sees what the in-process backend would.
    """
    s = settings
    videos: dict[tuple[int, int], tuple[list[Any], list[int]]] = {}
    n_frames = pixels = 0
    stripped: list[Any] = []
    for k, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list) or not any(
            isinstance(p, dict) and p.get("type") == "video_url" for p in content
        ):
            stripped.append(m)
            continue
        parts: list[Any] = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "video_url"):
                parts.append(p)
                continue
            vu = p.get("video_url")
            url = vu.get("url") if isinstance(vu, dict) else vu
            if not isinstance(url, str):
                raise RequestError(f"messages[{k}].content[{j}].video_url.url missing")
            try:
                frames, times = decode_video(
                    url,
                    max_bytes=s.serve_max_body_bytes,
                    max_frames=s.serve_max_images - n_frames,
                    max_frame_pixels=s.serve_max_image_pixels,
                    max_total_pixels=s.serve_max_total_pixels - pixels,
                )
            except RequestError as e:
                raise RequestError(
                    f"messages[{k}].content[{j}]: {e} (FLORA_SERVE_MAX_IMAGES / _PIXELS limits)"
                ) from e
            n_frames += len(frames)
            pixels += sum(f.shape[0] * f.shape[1] for f in frames)
            videos[(k, j)] = (frames, times)
            parts.append({"type": "text", "text": ""})  # placeholder, replaced below
        stripped.append({**m, "content": parts})
    out = openai_messages_to_chat(
        stripped,
        max_images=s.serve_max_images - n_frames,
        max_image_bytes=s.serve_max_image_bytes,
        max_image_pixels=s.serve_max_image_pixels,
        max_total_pixels=s.serve_max_total_pixels - pixels,
    )
    # Right to left within a message, so expanding a video keeps earlier indices valid.
    for (k, j), (frames, times) in sorted(videos.items(), reverse=True):
        if video_ok:
            repl: list[dict[str, Any]] = [{"type": "video", "video": frames, "times_us": times}]
        else:
            repl = []
            for img, t in zip(frames, times, strict=True):
                repl += [{"type": "text", "text": stamp(t)}, {"type": "image", "image": img}]
        out[k]["content"][j : j + 1] = repl
    return out


class _Batcher:
    """Gathers concurrent chats into batches for one worker thread.

    A chat whose request was abandoned (client gone, deadline passed) before its batch
    starts is dropped, so a queue never works for nobody.
    """

    def __init__(self, backend: TransformersBackend, max_batch: int, wait_s: float):
        self.backend = backend
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.batches = 0  # batches run, for /health (mean batch = chats / batches)
        self.chats = 0
        self.generating = 0  # chats in the batch running now
        self.dropped = 0  # abandoned before their batch started
        self.queue: asyncio.Queue[tuple[Chat, asyncio.Future[Generation]]] | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.queue = asyncio.Queue()
        self.task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def submit(self, chat: Chat) -> asyncio.Future[Generation]:
        """Queue ``chat``; the future resolves to its generation."""
        assert self.queue is not None
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((chat, fut))
        return fut

    @staticmethod
    def _abandoned(chat: Chat, fut: asyncio.Future[Generation]) -> bool:
        cancel = chat.meta.get("cancel")
        deadline = chat.meta.get("deadline")
        return (
            fut.done()
            or (cancel is not None and cancel.is_set())
            or (deadline is not None and time.monotonic() >= deadline)
        )

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
            live: list[tuple[Chat, asyncio.Future[Generation]]] = []
            for c, f in items:
                if not self._abandoned(c, f):
                    live.append((c, f))
                elif not f.done():
                    f.cancel()
            self.dropped += len(items) - len(live)
            if not live:
                continue
            chats = [c for c, _ in live]
            self.batches += 1
            self.chats += len(chats)
            self.generating = len(chats)
            try:
                gens = await asyncio.to_thread(self.backend.generate_chats, chats)
            except Exception as e:  # noqa: BLE001 - every waiter gets the error
                gens = [Generation(error=f"{type(e).__name__}: {e}") for _ in chats]
            finally:
                self.generating = 0
            for (_, fut), g in zip(live, gens, strict=True):
                if not fut.done():
                    fut.set_result(g)


class _BearerAuth:
    """Pure ASGI middleware: ``Authorization: Bearer <token>`` on all but ``/health``.

    Pure ASGI (not ``BaseHTTPMiddleware``) so that the endpoint sees the client's
    disconnect message and can cancel its generation.
    """

    def __init__(self, app: Any, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            got = b""
            for k, v in scope["headers"]:
                if k == b"authorization":
                    got = v
            if not hmac.compare_digest(got, self.expected):
                resp = _error(401, "missing or invalid bearer token", "authentication_error")
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytearray:
    """The request body, refusing more than ``limit`` bytes (``_BodyTooLarge``).

    ``Content-Length`` is checked before anything is read; a body without one (chunked)
    is counted while it streams and never held beyond ``limit``. After the limit is
    crossed up to another ``limit`` bytes are read and dropped, so that an honest client
    that uploads a little too much gets its 413 instead of a connection reset.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise ValueError(f"invalid Content-Length {declared[:32]!r}")
        if int(declared) > limit:
            raise _BodyTooLarge(f"declared body of {int(declared)} bytes")
    buf = bytearray()
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen <= limit:
            buf += chunk
        elif seen > 2 * limit:
            break  # a hostile stream: stop draining; the connection is closed after the 413
    if seen > limit:
        raise _BodyTooLarge(f"body of more than {limit} bytes")
    return buf


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _stopper(
    cancel: threading.Event, deadline: float, stall: bool, on_stop: Callable[[], None]
) -> Callable[[], bool]:
    """The ``should_stop`` check the backend calls after every generated token."""
    stopped = False

    def should_stop() -> bool:
        nonlocal stopped
        if stall and not cancel.is_set():  # injected runaway: hang until cancelled
            cancel.wait(max(0.0, deadline - time.monotonic()))
        if cancel.is_set() or time.monotonic() >= deadline:
            if not stopped:
                stopped = True
                on_stop()
            return True
        return False

    return should_stop


def create_app(
    backend: TransformersBackend,
    served_model: str = "flora",
    token: str | None = None,
    faults: Faults | None = None,
    batch_wait_ms: float = 5.0,
    settings: FloraSettings | None = None,
) -> FastAPI:
    """Build the FastAPI app serving ``backend`` under the model name ``served_model``.

    Limits come from ``settings`` (default: the process settings, ``FLORA_SERVE_*``).
    """
    from contextlib import asynccontextmanager

    from PIL import Image

    s = settings or get_settings()
    faults = faults or Faults()
    batcher = _Batcher(backend, backend.batch_size, batch_wait_ms / 1000)
    video_ok = supports_video(backend.processor)
    stats: dict[str, Any] = {
        "completions": 0,
        "injected_failures": 0,
        "started": time.time(),
        "active": 0,  # admitted requests now in flight
        "rejected": 0,  # answered 4xx/503 by a limit or validation
        "disconnected": 0,  # clients gone before their answer
        "deadline_exceeded": 0,
        "stopped_generations": 0,  # generations stopped early (disconnect or deadline)
        "video_parts": 0,  # video_url parts decoded
        "guided": 0,  # completions with a guided-decoding constraint
        "guided_resamples": 0,  # JSON-schema answers re-sampled
        "injected_429": 0,
    }
    # PIL's own decompression-bomb guard, at the same limit: Image.open raises above twice
    # it (before any pixel is decoded) and only warns between 1x and 2x, where the explicit
    # header check in decode_image refuses. Process-wide: this process serves one model.
    Image.MAX_IMAGE_PIXELS = s.serve_max_image_pixels
    limits = {
        "max_body_bytes": s.serve_max_body_bytes,
        "max_prompt_tokens": s.serve_max_prompt_tokens,
        "max_images": s.serve_max_images,
        "max_image_bytes": s.serve_max_image_bytes,
        "max_image_pixels": s.serve_max_image_pixels,
        "max_total_pixels": s.serve_max_total_pixels,
        "max_tokens": s.serve_max_tokens,
        "request_timeout_s": s.serve_request_timeout_s,
        "max_pending": s.serve_max_pending,
    }
    capabilities = {
        "video": True,
        "video_as": "video" if video_ok else "stamped_images",
        "guided": ["regex", "json_schema"],
    }

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="flora serve", lifespan=lifespan)
    if token:
        app.add_middleware(_BearerAuth, token=token)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": served_model,
            "model_version": backend.model_version,
            **stats,
            "batches": batcher.batches,
            "batched_chats": batcher.chats,
            "generating": batcher.generating,
            "queued": batcher.queue.qsize() if batcher.queue is not None else 0,
            "dropped_from_queue": batcher.dropped,
            "limits": limits,
            "capabilities": capabilities,
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

    def reject(resp: JSONResponse) -> JSONResponse:
        stats["rejected"] += 1
        return resp

    async def complete(request: Request, deadline: float) -> Any:
        try:
            raw = await read_body(request, s.serve_max_body_bytes)
        except _BodyTooLarge as e:
            return reject(
                _error(
                    413,
                    f"{e}: over the limit of {s.serve_max_body_bytes} bytes "
                    "(FLORA_SERVE_MAX_BODY_BYTES)",
                    "invalid_request_error",
                )
            )
        except ValueError as e:
            return reject(_bad(str(e)))
        try:
            # Parsing tens of MB of JSON is CPU work: keep it off the event loop.
            data = await asyncio.to_thread(parse_json, raw)
        except (ValueError, RecursionError) as e:
            return reject(_bad(f"body is not valid JSON: {str(e)[:200]}"))
        del raw
        if not isinstance(data, dict):
            return reject(_bad("body must be a JSON object"))
        try:
            body = ChatRequest.model_validate(data)
            guide = guide_from_body(data)
        except ValidationError as e:
            return reject(_bad(_validation_message(e)))
        except RequestError as e:
            return reject(_bad(str(e)))
        del data
        if body.model not in (None, served_model):
            return reject(
                _error(404, f"model {body.model!r} not served (have {served_model!r})", "not_found")
            )
        if (body.n or 1) != 1 or body.stream:
            return reject(_bad("only n=1 and stream=false are supported"))
        max_new = body.max_completion_tokens or body.max_tokens or min(256, s.serve_max_tokens)
        if max_new > s.serve_max_tokens:
            return reject(
                _bad(
                    f"max_tokens {max_new} is over this server's limit {s.serve_max_tokens} "
                    "(FLORA_SERVE_MAX_TOKENS)"
                )
            )
        k = stats["completions"]
        stats["completions"] += 1
        if k < faults.delay_first and faults.delay_s > 0:
            await asyncio.sleep(faults.delay_s)
        if k < faults.throttle_first:
            stats["injected_429"] += 1
            return _error(
                429,
                "injected throttling (test fault injection)",
                "rate_limit_error",
                headers={"Retry-After": str(faults.retry_after_s)},
            )
        text = str(body.messages)
        injected = faults.throttle_first <= k < faults.throttle_first + faults.fail_first or (
            faults.fail_marker is not None and faults.fail_marker in text
        )
        if injected:
            stats["injected_failures"] += 1
            return _error(500, "injected failure (test fault injection)", "server_error")
        stall = faults.stall_marker is not None and faults.stall_marker in text
        del text
        try:
            # Decoding dozens of PNG frames is CPU work: keep it off the event loop.
            messages = await asyncio.to_thread(wire_to_chat, body.messages, s, video_ok)
        except RequestError as e:
            return reject(_bad(str(e)))
        stats["video_parts"] += sum(
            1
            for m in body.messages
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if isinstance(p, dict) and p.get("type") == "video_url"
        )
        logprobs_on = bool(body.logprobs)
        temperature = 1.0 if body.temperature is None else body.temperature
        top = body.top_logprobs or 0
        chat = Chat(
            messages=messages,
            max_new_tokens=max_new,
            temperature=temperature,
            seed=body.seed,
            top_logprobs=top if logprobs_on else 0,
            want_logprobs=logprobs_on,
        )
        try:
            n_prompt = await asyncio.to_thread(prompt_tokens, backend, chat)
        except RequestError as e:
            return reject(_bad(str(e)))
        if n_prompt > s.serve_max_prompt_tokens:
            return reject(
                _bad(
                    f"prompt is {n_prompt} tokens, over the limit {s.serve_max_prompt_tokens} "
                    "(FLORA_SERVE_MAX_PROMPT_TOKENS)"
                )
            )
        cancel = threading.Event()

        def on_stop() -> None:
            stats["stopped_generations"] += 1  # from the worker thread; an int add is atomic

        chat.meta.update(
            cancel=cancel, deadline=deadline, should_stop=_stopper(cancel, deadline, stall, on_stop)
        )
        if guide:
            stats["guided"] += 1
        if guide.regex is not None:
            chat.meta["logits_mask"] = await asyncio.to_thread(backend.regex_mask, guide.regex)
        tries = 1 + (JSON_RESAMPLES if guide.json_schema is not None and temperature > 0 else 0)
        for attempt in range(tries):
            if attempt:
                stats["guided_resamples"] += 1
            result = await _generate(chat, request, cancel, deadline)
            if not isinstance(result, Generation) or result.error is not None:
                break
            if guide.json_schema is None or json_ok(result.text, guide.json_schema):
                break
        if not isinstance(result, Generation):
            return result
        gen = result
        if gen.error is not None:
            return _error(500, gen.error, "server_error")
        return _completion_body(body, gen, served_model, backend.model_version)

    async def _generate(
        chat: Chat, request: Request, cancel: threading.Event, deadline: float
    ) -> Generation | JSONResponse:
        """Queue ``chat``; its generation, or the 499/504 answer when the client left or
        the deadline passed (the generation is then stopped)."""
        fut = batcher.submit(chat)
        gone = asyncio.create_task(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait(
                {fut, gone},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            gone.cancel()
            if not fut.done():
                cancel.set()  # nobody waits for it any more: stop (or never start) generating
        if fut not in done:
            if gone in done:
                stats["disconnected"] += 1
                return _error(499, "client disconnected", "client_closed_request")
            stats["deadline_exceeded"] += 1
            return _deadline_error(s.serve_request_timeout_s)
        return fut.result()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        if stats["active"] >= s.serve_max_pending:
            return reject(
                _error(
                    503,
                    f"server busy: {stats['active']} requests in flight "
                    f"(FLORA_SERVE_MAX_PENDING={s.serve_max_pending})",
                    "server_busy",
                    headers={"Retry-After": "1"},
                )
            )
        stats["active"] += 1
        deadline = time.monotonic() + s.serve_request_timeout_s
        try:
            # The deadline bounds everything: a slow upload, decoding, the queue, generation.
            return await asyncio.wait_for(complete(request, deadline), s.serve_request_timeout_s)
        except TimeoutError:
            stats["deadline_exceeded"] += 1
            return _deadline_error(s.serve_request_timeout_s)
        except ClientDisconnect:
            stats["disconnected"] += 1
            return _error(499, "client disconnected", "client_closed_request")
        finally:
            stats["active"] -= 1

    return app


def _deadline_error(timeout_s: float) -> JSONResponse:
    return _error(
        504,
        f"request deadline of {timeout_s:g} s exceeded (FLORA_SERVE_REQUEST_TIMEOUT_S)",
        "timeout",
    )


def _completion_body(
    body: ChatRequest, gen: Generation, served_model: str, model_version: str
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` object for one generation."""
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
        "system_fingerprint": model_version,
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


NO_TOKEN_WARNING = (
    "WARNING: flora serve has NO bearer token: anyone who can reach {where} can use the "
    "model. Set FLORA_SERVE_TOKEN or pass --token-file FILE."
)
ARGV_TOKEN_WARNING = (
    "WARNING: --token is visible to every user in the process list (ps, /proc/<pid>/cmdline); "
    "prefer FLORA_SERVE_TOKEN or --token-file FILE."
)


def resolve_token(
    cli_token: str | None, token_file: Path | None, settings: FloraSettings
) -> tuple[str | None, list[str]]:
    """The bearer token ``flora serve`` requires, and the warnings to print.

    Order: ``--token-file``, ``--token`` (works, but warns: argv is public), then
    ``FLORA_SERVE_TOKEN``, then ``FLORA_SERVE_TOKEN_FILE``. A token file must hold a
    non-empty first line; ``ValueError`` otherwise. No token at all is allowed (loopback
    development) but the caller must print the returned warning loudly.
    """
    warnings: list[str] = []
    if cli_token is not None and token_file is not None:
        raise ValueError("pass either --token or --token-file, not both")
    if cli_token is not None:
        warnings.append(ARGV_TOKEN_WARNING)
        token: str | None = cli_token.strip()
    elif token_file is not None or settings.serve_token_file is not None:
        token = _read_token_file(Path(token_file or settings.serve_token_file))  # type: ignore[arg-type]
    elif settings.serve_token is not None:
        token = settings.serve_token.strip()
    else:
        token = None
    if not token:
        if cli_token is not None or settings.serve_token is not None:
            raise ValueError("the bearer token is empty")
        token = None
    return token, warnings


def _read_token_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read token file {path}: {e}") from e
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(f"token file {path} is empty")
    return lines[0].strip()


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
    settings: FloraSettings | None = None,
    port_file: Path | None = None,
) -> None:
    """Load the model and serve it until interrupted (blocking).

    The socket is bound here, after the model loaded: with ``port=0`` the OS picks the
    port, which is logged and, with ``port_file``, written there for whoever started the
    server (:func:`flora.ports.await_port`) — so no port is chosen beforehand and lost to
    another process in between.
    """
    import uvicorn

    from flora.ports import announce_port, listen

    backend = TransformersBackend(model, adapter_path=adapter, device=device, batch_size=batch_size)
    app = create_app(
        backend, served_model=served_model, token=token, faults=faults, settings=settings
    )
    try:
        sock = listen(host, port)
    except OSError as e:  # e.g. the port is taken: say which, not a socket traceback
        raise OSError(e.errno, f"flora serve cannot listen on {host}:{port}: {e.strerror}") from e
    bound = int(sock.getsockname()[1])
    log.info("serving %s as %r on http://%s:%d", backend.model_version, served_model, host, bound)
    if port_file is not None:
        announce_port(port_file, bound)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


__all__ = [
    "ChatRequest",
    "Faults",
    "create_app",
    "parse_json",
    "prompt_tokens",
    "resolve_token",
    "serve",
]
