"""Typed rejections and bounded retries for model outputs (DESIGN §3.4).

Every grammar has one strict parser returning either a typed value or a ``Rejection``.
``generate_parsed`` asks a backend, parses, and retries a bounded number of times; the
caller records a final ``Rejection`` as a failed item. Nothing is silently filled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from flora.backends.base import VLMBackend, VLMRequest, VLMResponse

T = TypeVar("T")


@dataclass(frozen=True)
class Rejection:
    """Why a model output (or a transport attempt) was not accepted."""

    reason: str
    text: str = ""
    kind: str = "parse"  # "parse" | "transport" | "validation"


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


def generate_parsed(
    backend: VLMBackend,
    requests: Sequence[VLMRequest],
    parse: Callable[[VLMResponse], T | Rejection],
    max_attempts: int = 3,
) -> list[Attempted[T]]:
    """Run ``requests`` through ``backend`` and ``parse`` each answer, retrying rejects.

    Only the still-rejected requests are re-sent, batched, up to ``max_attempts`` rounds.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    results: list[Attempted[T]] = [Attempted(None, Rejection("not attempted")) for _ in requests]
    pending = list(range(len(requests)))
    for _ in range(max_attempts):
        if not pending:
            break
        responses = backend.generate([requests[i] for i in pending])
        still: list[int] = []
        for i, resp in zip(pending, responses, strict=True):
            res = results[i]
            res.response = resp
            if not resp.ok:
                rej = Rejection(resp.error or "backend error", "", kind="transport")
            else:
                parsed = parse(resp)
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
