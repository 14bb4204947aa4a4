"""Typed rejections and bounded retries for model outputs (DESIGN §3.4).

Every grammar has one strict parser returning either a typed value or a ``Rejection``.
``generate_parsed`` asks a backend, parses, and retries a bounded number of times; the
caller records a final ``Rejection`` as a failed item. Nothing is silently filled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from flora.backends.base import VLMBackend, VLMRequest, VLMResponse

log = logging.getLogger(__name__)

T = TypeVar("T")


#: A rejection keeps at most this much of the reason and of the rejected text: a model or
#: server can answer megabytes, and rejections end up in failure records and logs.
MAX_REASON_CHARS = 1000
MAX_TEXT_CHARS = 4000


def _clip(s: object, limit: int) -> str:
    s = s if isinstance(s, str) else "" if s is None else repr(s)
    return s if len(s) <= limit else f"{s[:limit]}… [{len(s) - limit} more characters]"


@dataclass(frozen=True)
class Rejection:
    """Why a model output (or a transport attempt) was not accepted.

    ``reason`` and ``text`` are clipped (:data:`MAX_REASON_CHARS`, :data:`MAX_TEXT_CHARS`).
    """

    reason: str
    text: str = ""
    kind: str = "parse"  # "parse" | "transport" | "validation"

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", _clip(self.reason, MAX_REASON_CHARS))
        object.__setattr__(self, "text", _clip(self.text, MAX_TEXT_CHARS))


@dataclass
class Attempted(Generic[T]):
    """Outcome of a bounded-retry call: a value or the last rejection, plus the history."""

    value: T | None
    rejection: Rejection | None
    attempts: list[Rejection] = field(default_factory=list)
    response: VLMResponse | None = None

    @property
    def ok(self) -> bool:
        return self.rejection is None


# The line breaks of str.splitlines().
_SPLITLINES = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def iter_lines(text: str, *, newline_only: bool = False) -> Iterator[str]:
    """The lines of ``text``, lazily, split where ``str.splitlines()`` splits.

    With ``newline_only`` only ``"\\n"`` separates lines (``text.split("\\n")``). As with
    ``split``, the piece after the last break is always yielded (possibly empty). Parsers
    use this so that an answer of millions of lines is rejected at its first bad line,
    not split in full first.
    """
    start = 0
    if newline_only:
        while (end := text.find("\n", start)) >= 0:
            yield text[start:end]
            start = end + 1
    else:
        for m in _SPLITLINES.finditer(text):
            yield text[start : m.start()]
            start = m.end()
    yield text[start:]


def _safe_parse(parse: Callable[[VLMResponse], T | Rejection], resp: VLMResponse) -> T | Rejection:
    """``parse(resp)``, with any exception turned into a rejection of that one answer.

    The parsers are written not to raise on any text, but a model's answer is the least
    trusted input of a step: whatever slips through (a huge integer, a malformed
    structure, a parser bug) must cost that item, not the run. The traceback is logged.
    """
    try:
        return parse(resp)
    except Exception as e:  # noqa: BLE001 - the boundary between model text and the step
        log.warning("parser %s raised on a model answer", getattr(parse, "__name__", parse),
                    exc_info=True)  # fmt: skip
        return Rejection(f"parser error: {type(e).__name__}: {e}", resp.text, kind="parse")


#: Temperature of the retries of a greedy request (docs/grammars.md, "Retries").
RETRY_TEMPERATURE = 0.7


def retry_request(
    req: VLMRequest, attempt: int, temperature: float = RETRY_TEMPERATURE
) -> VLMRequest:
    """The request sent at ``attempt`` (1-based) of :func:`generate_parsed`.

    Attempt 1 is ``req`` itself. A later attempt is sampled — at ``temperature`` when
    ``req`` is greedy — with a seed drawn from the request id and the attempt: a greedy
    backend would otherwise repeat the rejected answer word for word, and a rerun of the
    step must send the same retries.
    """
    if attempt <= 1:
        return req
    digest = hashlib.sha256(f"{req.request_id}#retry{attempt}".encode()).digest()
    return dataclasses.replace(
        req,
        temperature=req.temperature if req.temperature > 0 else temperature,
        seed=int.from_bytes(digest[:4], "big"),
    )


def generate_parsed(
    backend: VLMBackend,
    requests: Sequence[VLMRequest],
    parse: Callable[[VLMResponse], T | Rejection]
    | Sequence[Callable[[VLMResponse], T | Rejection]],
    max_attempts: int = 3,
) -> list[Attempted[T]]:
    """Run ``requests`` through ``backend`` and ``parse`` each answer, retrying rejects.

    ``parse`` is one parser for every request, or one per request (a mixed batch, e.g.
    the rewarder's outcome, dense and rubric items in one evaluation). Only the
    still-rejected requests are re-sent, batched, up to ``max_attempts`` rounds; retries
    are sampled and seeded (:func:`retry_request`). A parser that raises rejects that
    answer (:func:`_safe_parse`); it never ends the step.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    parsers = list(parse) if not callable(parse) else [parse] * len(requests)
    if len(parsers) != len(requests):
        raise ValueError(f"{len(parsers)} parsers for {len(requests)} requests")
    results: list[Attempted[T]] = [Attempted(None, Rejection("not attempted")) for _ in requests]
    pending = list(range(len(requests)))
    for attempt in range(1, max_attempts + 1):
        if not pending:
            break
        responses = backend.generate([retry_request(requests[i], attempt) for i in pending])
        still: list[int] = []
        for i, resp in zip(pending, responses, strict=True):
            res = results[i]
            res.response = resp
            if not resp.ok:
                rej = Rejection(resp.error or "backend error", "", kind="transport")
            else:
                parsed = _safe_parse(parsers[i], resp)
                if isinstance(parsed, Rejection):
                    rej = parsed
                else:
                    res.value, res.rejection = parsed, None
                    continue
            res.attempts.append(rej)
            res.rejection = rej
            still.append(i)
        pending = still
    return results
