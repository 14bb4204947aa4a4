"""The one VLM backend protocol: batched requests of frames + text -> text + log-probs.

Segmenter, captioner and rewarder only ever talk to a ``VLMBackend``. Which backend
(in-process transformers, OpenAI-compatible HTTP pod, local CPU server) is chosen by
``FloraSettings.backend`` through ``flora.backends.make_backend``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass
class VLMRequest:
    """One model call. ``images`` are ordered frames (uint8 HWC RGB) of one clip/mosaic.

    ``frame_times_us`` (same length as ``images``) lets backends that support video
    input pass real timestamps. ``request_id`` is carried through for error reports.
    """

    prompt: str
    images: list[np.ndarray] = field(default_factory=list)
    frame_times_us: list[int] | None = None
    system: str | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    # Sampling seed (temperature > 0): a backend that can seed per request does, so a
    # sampled retry is reproducible (flora.parsing.generate_parsed).
    seed: int | None = None
    top_logprobs: int = 0  # >0: return that many alternatives per generated token
    request_id: str = ""
    # Guided decoding (docs/backends.md): the output grammar's regex or JSON schema. Backends
    # that can constrain generation use it; the strict parser judges the answer regardless.
    guided_regex: str | None = None
    guided_json: dict | None = None


@dataclass
class TokenLogprob:
    """A generated token, its log-probability, and the top alternatives (token -> logprob)."""

    token: str
    logprob: float
    top: dict[str, float] = field(default_factory=dict)


@dataclass
class VLMResponse:
    """Model text, or an error (transport / server failure) with ``text == ''``.

    ``finish_reason``: ``"stop"`` when the model ended its answer (its end-of-turn token,
    or a guided grammar completed), ``"length"`` when ``max_new_tokens`` cut it off (the
    OpenAI field of the same name). A response built without it reads ``"stop"``.
    """

    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: str | None = None
    model: str = ""
    finish_reason: str = "stop"

    @property
    def ok(self) -> bool:
        return self.error is None


class BackendError(RuntimeError):
    """A backend could not serve a request after its bounded retries."""


@runtime_checkable
class VLMBackend(Protocol):
    """Anything that turns a batch of requests into one response per request, in order."""

    name: str
    model_version: str

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]: ...
