"""VLM backends behind one protocol (``VLMBackend``), chosen by configuration.

``make_backend(settings)`` reads ``FloraSettings.backend``: ``"kinematic"`` -> ``None``
(callers use the kinematic baseline), ``"transformers"`` -> in-process
``TransformersBackend``, ``"openai"`` -> ``OpenAIBackend`` (vLLM / KServe pods or
``flora serve``). Heavy imports (torch, transformers, httpx) happen only when a backend is
built, so importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flora.backends.base import BackendError, TokenLogprob, VLMBackend, VLMRequest, VLMResponse

if TYPE_CHECKING:
    from flora.settings import FloraSettings


def make_backend(settings: FloraSettings | None = None) -> VLMBackend | None:
    """The configured backend, or ``None`` for the kinematic baseline.

    One settings object selects everything (``FLORA_BACKEND``, ``FLORA_MODEL_PATH``,
    ``FLORA_ADAPTER_PATH``, ``FLORA_DEVICE``, ``FLORA_OPENAI_*``,
    ``FLORA_REQUEST_TIMEOUT_S``, ``FLORA_MAX_RETRIES``, ``FLORA_MAX_CONCURRENCY``,
    ``FLORA_OPENAI_VIDEO``, ``FLORA_OPENAI_GUIDED``, ``FLORA_GUIDED`` for the in-process
    backend).
    """
    from flora.settings import get_settings

    s = settings or get_settings()
    if s.backend == "kinematic":
        return None
    if s.backend == "transformers":
        if not s.model_path:
            raise BackendError("FLORA_BACKEND=transformers needs FLORA_MODEL_PATH")
        from flora.backends.transformers_backend import TransformersBackend

        return TransformersBackend(
            s.model_path, adapter_path=s.adapter_path, device=s.device, guided=s.guided
        )
    if s.backend == "openai":
        if not s.openai_base_url:
            raise BackendError("FLORA_BACKEND=openai needs FLORA_OPENAI_BASE_URL")
        from flora.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(
            s.openai_base_url,
            api_key=s.openai_api_key,
            model=s.openai_model,
            timeout_s=s.request_timeout_s,
            max_retries=s.max_retries,
            max_concurrency=s.max_concurrency,
            video=s.openai_video,
            guided=s.openai_guided,
        )
    raise BackendError(f"unknown backend {s.backend!r}")  # unreachable: settings validate


__all__ = [
    "BackendError",
    "TokenLogprob",
    "VLMBackend",
    "VLMRequest",
    "VLMResponse",
    "make_backend",
]
