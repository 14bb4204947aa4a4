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
type (``docs/reliability.md``). Up to ``max_concurrency`` requests are in flight at a time.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from flora.backends.base import TokenLogprob, VLMRequest, VLMResponse
from flora.backends.processing import RequestError, chat_to_openai_messages, request_to_chat

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429})


class _Final(Exception):
    """A failure that must not be retried (4xx other than 408/429, bad payload)."""


class _Retryable(Exception):
    """A failure worth another attempt (5xx, 408/429, timeout, connection error)."""


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
    ):
        if not base_url:
            raise ValueError("OpenAIBackend needs a base_url (FLORA_OPENAI_BASE_URL)")
        if max_retries < 0 or max_concurrency < 1:
            raise ValueError("max_retries must be >= 0 and max_concurrency >= 1")
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

    # ---- internals --------------------------------------------------------------------

    def payload(self, req: VLMRequest) -> dict[str, Any]:
        """The JSON body for one request."""
        chat = request_to_chat(req, "images")
        body: dict[str, Any] = {
            "model": self.model,
            "messages": chat_to_openai_messages(chat, self.image_format),
            "max_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "logprobs": True,
        }
        if req.top_logprobs > 0:
            body["top_logprobs"] = req.top_logprobs
        return body

    def _one(self, req: VLMRequest) -> VLMResponse:
        rid = req.request_id or "<no id>"
        try:
            body = self.payload(req)
        except (RequestError, ValueError) as e:
            return VLMResponse(text="", error=f"bad request: {e}", model=self.model_version)
        last = ""
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            if attempt:
                delay = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random() / 2))  # jitter: no thundering herd
            try:
                data = self._post(body)
                return self._parse(data)
            except _Final as e:
                log.warning("request %s failed (not retried): %s", rid, e)
                return VLMResponse(text="", error=str(e), model=self.model_version)
            except _Retryable as e:
                last = str(e)
                log.info("request %s attempt %d/%d failed: %s", rid, attempt + 1, attempts, e)
            except Exception as e:  # noqa: BLE001 - the client boundary: never raise per item
                # Anything else the server's answer provokes is a failure of this request,
                # reported with its type; the rest of the batch and the step go on.
                log.warning("request %s failed (client error)", rid, exc_info=True)
                return VLMResponse(
                    text="",
                    error=f"client error: {type(e).__name__}: {str(e)[:300]}",
                    model=self.model_version,
                )
        return VLMResponse(
            text="", error=f"failed after {attempts} attempts: {last}", model=self.model_version
        )

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
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
            raise _Retryable(f"HTTP {r.status_code}: {r.text[:300]}")
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
        return VLMResponse(text=content or "", logprobs=lps, model=self.model_version)


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


__all__ = ["OpenAIBackend", "RETRY_STATUS"]
