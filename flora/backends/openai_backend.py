"""OpenAI-compatible HTTP backend: vLLM / KServe pods in production, ``flora serve`` locally.

Each request is one ``POST {base_url}/chat/completions`` with the frames as base64
``data:`` URL images (PNG by default, JPEG optional) preceded by their timestamp stamps
(:mod:`flora.backends.processing`), ``logprobs: true`` and ``top_logprobs`` when asked.

Failure policy, per request: connection errors, timeouts, HTTP 5xx and the two
"try again" 4xx codes (408 Request Timeout, 429 Too Many Requests) are retried up to
``max_retries`` times with exponential backoff and jitter; any other 4xx is final at once
(the request itself is wrong), and so is a malformed answer (wrong JSON shape or types,
checked field by field). A request that still fails becomes ``VLMResponse(error=...)``;
the others in the batch complete. ``generate`` never raises for one bad request or one
bad answer: anything unexpected is caught at the client boundary and reported with its
type (``docs/reliability.md``). Up to ``max_concurrency`` requests are in flight at a time,
across every thread that uses the client.

Retries run on ``tenacity``: bounded (``max_retries``), exponential backoff with jitter, and
a server's ``Retry-After`` (seconds or an HTTP date, on 429/503 and any retried answer) is
honoured — waited at least, capped at ``retry_after_max_s``, plus a little jitter.

Capabilities, chosen by settings (``FLORA_OPENAI_VIDEO`` / ``FLORA_OPENAI_GUIDED`` =
``auto|on|off``), never by a code fork:

* **video** — a request with at least two timestamped frames is sent as one ``video_url``
  part (an MP4 whose presentation times are the frame times, :mod:`flora.backends.video`),
  the layout the transformers backend uses in video mode; otherwise stamped images.
* **guided** — a request's ``guided_regex`` / ``guided_json`` (each grammar's regex, next to
  its parser) goes out as ``structured_outputs`` (vLLM >= 0.12, ``flora serve``). The
  strict parser still judges, and parse-and-retry stays the fallback.

``auto`` probes the server once per capability, lazily, with a tiny request of the same
shape (a 2-frame video; a 3-token answer constrained to ``42``): supported when it answers
2xx (and, for guided, exactly ``42``); a 4xx means unsupported; a probe that cannot get an
answer (server down) decides nothing and is tried again on the next batch.
"""

from __future__ import annotations

import email.utils
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from flora.backends.base import TokenLogprob, VLMRequest, VLMResponse
from flora.backends.processing import (
    Chat,
    RequestError,
    chat_to_openai_messages,
    encode_image,
    request_to_chat,
)

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429})


class _Final(Exception):
    """A failure that must not be retried (4xx other than 408/429, bad payload)."""


class _Retryable(Exception):
    """A failure worth another attempt (5xx, 408/429, timeout, connection error)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


CAPABILITY_MODES = ("auto", "on", "off")
PROBE_REGEX = "42"


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class OpenAIBackend:
    """Chat-completions client with bounded retries and a concurrency limit."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str = "flora",
        timeout_s: float = 120.0,
        max_retries: int = 3,
        max_concurrency: int = 8,
        image_format: str = "png",
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
        video: str = "off",
        guided: str = "off",
        retry_after_max_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not base_url:
            raise ValueError("OpenAIBackend needs a base_url (FLORA_OPENAI_BASE_URL)")
        if max_retries < 0 or max_concurrency < 1:
            raise ValueError("max_retries must be >= 0 and max_concurrency >= 1")
        if video not in CAPABILITY_MODES or guided not in CAPABILITY_MODES:
            raise ValueError(f"video and guided must be one of {CAPABILITY_MODES}")
        # "on"/"off" are decided now; "auto" (None) is decided by the first probe.
        self.video: bool | None = {"on": True, "off": False}.get(video)
        self.guided: bool | None = {"on": True, "off": False}.get(guided)
        self.retry_after_max_s = retry_after_max_s
        self._sleep = sleep
        self._probe_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency)
        # The most recent backoffs slept, in seconds (tests, benchmarks); bounded.
        self.waits: deque[float] = deque(maxlen=10_000)
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.image_format = image_format
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        # The key goes only into this header, never into logs or error messages.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency),
        )
        self._version: str | None = None
        self._lock = threading.Lock()
        self.attempts = 0  # HTTP attempts made (all requests), for tests and logs
        self.in_flight = 0
        self.max_in_flight = 0  # high-water mark of concurrent HTTP attempts

    # ---- VLMBackend -------------------------------------------------------------------

    @property
    def model_version(self) -> str:  # type: ignore[override]
        """The server's ``system_fingerprint`` once seen (flora serve sends the weights
        hash; vLLM may not), else ``openai:<model>``."""
        return self._version or f"openai:{self.model}"

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]:
        """One response per request, in order; failures become ``error`` responses."""
        if not requests:
            return []
        self._probe_capabilities(requests)
        if len(requests) == 1 or self.max_concurrency == 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> dict[str, Any]:
        """``GET /v1/models`` (raises ``httpx.HTTPError`` on failure)."""
        r = self._client.get(f"{self.base_url}/models")
        r.raise_for_status()
        return r.json()

    def health(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """Is the server up and serving this client's model? Never raises.

        ``GET <root>/health`` (vLLM and ``flora serve`` answer it at the server root, next
        to ``/v1``), then ``GET /v1/models`` to check that ``model`` is listed (which also
        checks the auth header). Returns ``{"ok": bool, "reason": str, "models": [...]}``.
        """
        root = self.base_url.removesuffix("/v1")
        try:
            r = self._client.get(f"{root}/health", timeout=timeout_s)
            if r.status_code != 200:
                return {"ok": False, "reason": f"GET /health: HTTP {r.status_code}", "models": []}
            r = self._client.get(f"{self.base_url}/models", timeout=timeout_s)
            if r.status_code != 200:
                return {"ok": False, "reason": f"GET /models: HTTP {r.status_code}", "models": []}
            data = r.json()
            ids = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            return {"ok": False, "reason": f"{type(e).__name__}: {str(e)[:200]}", "models": []}
        if self.model not in ids:
            return {"ok": False, "reason": f"model {self.model!r} not served", "models": ids}
        return {"ok": True, "reason": "", "models": ids}

    def capabilities(self) -> dict[str, bool | None]:
        """What this client uses: ``True``/``False``, or ``None`` while still unprobed."""
        return {"video": self.video, "guided": self.guided}

    # ---- internals --------------------------------------------------------------------

    def payload(self, req: VLMRequest) -> dict[str, Any]:
        """The JSON body for one request (video and guided fields as capabilities allow)."""
        as_video = bool(self.video) and _video_ok(req)
        chat = request_to_chat(req, "video" if as_video else "images")
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self._wire(chat),
            "max_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "logprobs": True,
        }
        if as_video:
            # vLLM: decode every frame (its loader keeps 32 by default; the per-request
            # field exists in recent vLLM, older ones need --media-io-kwargs on the server)
            # and let the Qwen-VL processor take them as sent, without resampling.
            body["media_io_kwargs"] = {"video": {"num_frames": -1}}
            body["mm_processor_kwargs"] = {"do_sample_frames": False}
        if req.seed is not None:
            body["seed"] = req.seed  # OpenAI / vLLM: per-request sampling seed
        if req.top_logprobs > 0:
            body["top_logprobs"] = req.top_logprobs
        if self.guided:
            if req.guided_regex is not None:
                body["structured_outputs"] = {"regex": req.guided_regex}
            elif req.guided_json is not None:
                body["structured_outputs"] = {"json": req.guided_json}
        return body

    def _wire(self, chat: Chat) -> list[dict[str, Any]]:
        """Chat messages on the wire: a video part becomes one ``video_url`` part."""
        if not chat.videos():
            return chat_to_openai_messages(chat, self.image_format)
        from flora.backends.video import encode_video

        out = []
        for m in chat.messages:
            parts: list[dict[str, Any]] = []
            for p in m["content"]:
                if p["type"] == "text":
                    parts.append({"type": "text", "text": p["text"]})
                elif p["type"] == "image":
                    url = encode_image(p["image"], self.image_format)
                    parts.append({"type": "image_url", "image_url": {"url": url}})
                else:  # video: request_to_chat only makes one when times are given
                    url = encode_video(p["video"], p["times_us"])
                    parts.append({"type": "video_url", "video_url": {"url": url}})
            out.append({"role": m["role"], "content": parts})
        return out

    # ---- capability probes ------------------------------------------------------------

    def _probe_capabilities(self, requests: Sequence[VLMRequest]) -> None:
        """Decide "auto" capabilities the batch needs, once (concurrent callers wait)."""
        need_video = self.video is None and any(_video_ok(r) for r in requests)
        need_guided = self.guided is None and any(
            r.guided_regex is not None or r.guided_json is not None for r in requests
        )
        if not (need_video or need_guided):
            return
        with self._probe_lock:
            if need_video and self.video is None:
                self.video = self._probe_video()
                log.info("server video input: %s", self.video)
            if need_guided and self.guided is None:
                self.guided = self._probe_guided()
                log.info("server guided decoding: %s", self.guided)

    def _probe(self, body: dict[str, Any]) -> dict[str, Any] | bool | None:
        """A probe request with the usual retries: its answer, ``False`` on a final 4xx,
        ``None`` when no answer came (undecided)."""
        try:
            return self._send(body, "capability probe")
        except _Final as e:
            log.info("capability probe refused: %s", e)
            return False
        except _Retryable as e:
            log.warning("capability probe got no answer (%s); will probe again", e)
            return None

    def _probe_video(self) -> bool | None:
        rng = np.random.default_rng(0)
        frames = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
        req = VLMRequest(
            prompt="ok",
            images=frames,
            frame_times_us=[0, 250_000],
            max_new_tokens=1,
            request_id="probe:video",
        )
        saved, self.video = self.video, True
        try:
            body = self.payload(req)
        finally:
            self.video = saved
        got = self._probe(body)
        return None if got is None else got is not False

    def _probe_guided(self) -> bool | None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Answer with a number."}],
            "max_tokens": 3,
            "temperature": 0.0,
            "structured_outputs": {"regex": PROBE_REGEX},
        }
        got = self._probe(body)
        if got is None or got is False:
            return got
        try:
            text = self._parse(got).text
        except _Final:
            return False
        # A server that ignores the field answers freely: not "42" (3 free tokens).
        return text.strip() == PROBE_REGEX

    def _one(self, req: VLMRequest) -> VLMResponse:
        rid = req.request_id or "<no id>"
        try:
            body = self.payload(req)
        except (RequestError, ValueError) as e:
            return VLMResponse(text="", error=f"bad request: {e}", model=self.model_version)
        try:
            return self._parse(self._send(body, rid))
        except _Final as e:
            log.warning("request %s failed (not retried): %s", rid, e)
            return VLMResponse(text="", error=str(e), model=self.model_version)
        except _Retryable as e:
            return VLMResponse(
                text="",
                error=f"failed after {self.max_retries + 1} attempts: {e}",
                model=self.model_version,
            )
        except Exception as e:  # noqa: BLE001 - the client boundary: never raise per item
            # Anything else the server's answer provokes is a failure of this request,
            # reported with its type; the rest of the batch and the step go on.
            log.warning("request %s failed (client error)", rid, exc_info=True)
            return VLMResponse(
                text="",
                error=f"client error: {type(e).__name__}: {str(e)[:300]}",
                model=self.model_version,
            )

    def _send(self, body: dict[str, Any], rid: str) -> dict[str, Any]:
        """POST with bounded retries (tenacity); the answer's JSON, or the last
        ``_Retryable`` / a ``_Final`` raised."""
        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(_Retryable),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda st: log.info(
                "request %s attempt %d/%d failed: %s",
                rid,
                st.attempt_number,
                self.max_retries + 1,
                st.outcome.exception() if st.outcome else "",
            ),
        )
        return retrying(self._post, body)

    def _wait(self, state: RetryCallState) -> float:
        """Backoff before the next attempt: the server's ``Retry-After`` when it sent one
        (capped, plus up to 10 % jitter), else exponential with jitter (no thundering herd)."""
        exc = state.outcome.exception() if state.outcome else None
        after = getattr(exc, "retry_after", None)
        if after is not None:
            delay = min(after, self.retry_after_max_s) * (1 + random.random() / 10)
        else:
            n = state.attempt_number  # attempts made so far (>= 1)
            delay = min(self.backoff_max_s, self.backoff_s * 2 ** (n - 1))
            delay *= 0.5 + random.random() / 2
        with self._lock:
            self.waits.append(delay)
        return delay

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._slots:  # bounded concurrency across all callers of this client
            with self._lock:
                self.attempts += 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                r = self._client.post(f"{self.base_url}/chat/completions", json=body)
            except httpx.TimeoutException as e:
                raise _Retryable(f"timeout after {self.timeout_s}s ({type(e).__name__})") from e
            except httpx.TransportError as e:
                raise _Retryable(f"connection error: {type(e).__name__}: {e}") from e
            finally:
                with self._lock:
                    self.in_flight -= 1
        if r.status_code >= 500 or r.status_code in RETRY_STATUS:
            raise _Retryable(
                f"HTTP {r.status_code}: {r.text[:300]}",
                retry_after=retry_after_s(r.headers.get("retry-after")),
            )
        if r.status_code >= 400:
            raise _Final(f"HTTP {r.status_code}: {r.text[:300]}")
        try:
            return r.json()
        except (ValueError, RecursionError) as e:  # RecursionError: absurdly nested JSON
            raise _Retryable(f"invalid JSON from server: {r.text[:200]!r}") from e

    def _parse(self, data: Any) -> VLMResponse:
        """A chat completion, checked field by field; a malformed one is ``_Final``.

        ``content: null`` is an empty answer (the parser rejects it as such); a wrong type
        anywhere (a string ``message``, ``logprobs`` that is not an object, a logprob that
        is not a number) names the field and fails this request only.
        """
        if not isinstance(data, dict):
            raise _Final(f"malformed completion: expected a JSON object, got {_kind(data)}")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise _Final(
                f"malformed completion: 'choices' is {_kind(choices)}, not a non-empty list"
            )
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise _Final(
                f"malformed completion: choices[0].message is {_kind(message)}, not an object"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise _Final(f"malformed completion: message.content is {_kind(content)}, not text")
        fingerprint = data.get("system_fingerprint")
        if isinstance(fingerprint, str) and fingerprint:
            self._version = fingerprint[:200]
        lps = _logprobs(choice.get("logprobs"))
        # "length": cut off at max_tokens; anything else (stop, a stop string, none given)
        # is an answer the model ended.
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return VLMResponse(
            text=content or "", logprobs=lps, model=self.model_version, finish_reason=finish
        )


def _video_ok(req: VLMRequest) -> bool:
    """A request that can go as one video: >= 2 frames of one size whose timestamps start
    at 0 and are evenly spaced (to the millisecond).

    vLLM's video loaders derive each frame's time from ``index / fps``, ignoring the
    container's presentation times; only such a clip keeps its real times there. Any
    other (a clip starting mid-episode, gaps between context clips) goes as stamped
    images, which carry the exact times as text — the transformers backend's image layout.
    """
    times = req.frame_times_us
    if times is None or len(req.images) < 2 or len(times) != len(req.images):
        return False
    shape = getattr(req.images[0], "shape", None)
    if not all(getattr(img, "shape", None) == shape for img in req.images):
        return False
    step = (times[-1] - times[0]) / (len(times) - 1)
    return (
        abs(times[0]) < 1000
        and step >= 1000
        and all(abs(t - (times[0] + i * step)) < 1000 for i, t in enumerate(times))
    )


def _kind(x: Any) -> str:
    """A short description of a JSON value's type, for error messages."""
    if x is None:
        return "null"
    if isinstance(x, list | str | dict):
        return f"{type(x).__name__} of length {len(x)}"
    return type(x).__name__


def _logprob(x: Any, where: str) -> float:
    # bool is an int in Python but never a log-probability in JSON.
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise _Final(f"malformed completion: {where} is {_kind(x)}, not a number")
    return float(x)


def _logprobs(obj: Any) -> list[TokenLogprob]:
    """``choices[0].logprobs.content`` as ``TokenLogprob`` s (``[]`` when absent/null)."""
    if obj is None:
        return []
    if not isinstance(obj, dict):
        raise _Final(f"malformed completion: choices[0].logprobs is {_kind(obj)}, not an object")
    content = obj.get("content")
    if content is None:
        return []
    if not isinstance(content, list):
        raise _Final(f"malformed completion: logprobs.content is {_kind(content)}, not a list")
    out: list[TokenLogprob] = []
    for i, item in enumerate(content):
        where = f"logprobs.content[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("token"), str):
            raise _Final(f"malformed completion: {where} has no string 'token'")
        top: dict[str, float] = {}
        alts = item.get("top_logprobs") or []
        if not isinstance(alts, list):
            raise _Final(f"malformed completion: {where}.top_logprobs is {_kind(alts)}, not a list")
        for j, alt in enumerate(alts):
            if not isinstance(alt, dict) or not isinstance(alt.get("token"), str):
                raise _Final(
                    f"malformed completion: {where}.top_logprobs[{j}] has no string 'token'"
                )
            top.setdefault(
                alt["token"], _logprob(alt.get("logprob"), f"{where}.top_logprobs[{j}].logprob")
            )
        out.append(
            TokenLogprob(item["token"], _logprob(item.get("logprob"), f"{where}.logprob"), top)
        )
    return out


__all__ = ["OpenAIBackend", "RETRY_STATUS", "retry_after_s"]
