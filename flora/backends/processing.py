"""Turning Flora requests into Qwen-VL chat inputs, the same way for every backend.

One function, :func:`request_to_chat`, decides how a ``VLMRequest`` becomes chat messages;
the in-process transformers backend, the OpenAI-compatible client and the ``flora serve``
server all go through it (or through its wire form), so a model sees the same prompt
whichever way it is reached. Training code that renders SFT inputs should use it too.

Frames are passed in one of two ways (``vision_input``):

* ``"images"`` — every frame is an image part, preceded by a text stamp
  ``<12.25 seconds>`` when ``frame_times_us`` is given. This is what the OpenAI wire format
  carries (vLLM / KServe pods, ``flora serve``) and what works without torchvision.
* ``"video"`` — the frames are one video with their real timestamps (the Qwen3-VL
  processor writes ``<t seconds>`` stamps itself, merging frame pairs); needs the
  checkpoint's video processor, i.e. torchvision.

``load_processor`` loads a checkpoint's processor through ``AutoProcessor``; where
torchvision is missing (the pinned CPU torch wheel cannot import PyPI's torchvision) the
Qwen processors cannot be built at all, so it builds the same processor class without
its video half from ``AutoTokenizer`` + ``AutoImageProcessor`` + the saved chat template.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flora.backends.base import VLMRequest

US_PER_S = 1_000_000

#: File and format of an exported Flora model's manifest (written by ``training.sft``).
MODEL_MANIFEST = "flora_model.json"
MODEL_FORMAT = "flora-model/1"
#: How Flora's trainers render frames (SFT targets and GRPO rollouts alike): stamped images,
#: what the OpenAI wire carries and the only mode this CPU environment has. A model is
#: served the way it was trained (:func:`trained_vision_input`).
TRAINING_VISION_INPUT = "images"
VISION_INPUTS = ("images", "video")


class RequestError(ValueError):
    """A request that cannot be turned into model input (bad frames, bad data URL…)."""


@dataclass
class Chat:
    """Backend-neutral chat: messages whose parts hold text, images or one video.

    Parts are ``{"type": "text", "text": str}``, ``{"type": "image", "image": HWC uint8}``
    or ``{"type": "video", "video": list[HWC uint8], "times_us": list[int] | None}``.
    """

    messages: list[dict[str, Any]]
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = None
    top_logprobs: int = 0
    want_logprobs: bool = True
    request_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def images(self) -> list[np.ndarray]:
        """All image parts, in prompt order."""
        return [
            p["image"]
            for m in self.messages
            if isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] == "image"
        ]

    def videos(self) -> list[dict[str, Any]]:
        """All video parts, in prompt order."""
        return [
            p
            for m in self.messages
            if isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] == "video"
        ]


def stamp(t_us: int) -> str:
    """Text stamp put before a frame in image mode (seconds, 2 decimals: 4 Hz is exact)."""
    return f"<{t_us / US_PER_S:.2f} seconds>"


def check_frame(img: Any, where: str) -> np.ndarray:
    """Validate one frame (uint8 HWC RGB); raise ``RequestError`` naming ``where``."""
    if not isinstance(img, np.ndarray):
        raise RequestError(f"{where}: frame is {type(img).__name__}, expected a numpy array")
    if img.ndim != 3 or img.shape[2] != 3:
        raise RequestError(f"{where}: frame shape {img.shape}, expected (H, W, 3) RGB")
    if img.dtype != np.uint8:
        raise RequestError(f"{where}: frame dtype {img.dtype}, expected uint8")
    if img.shape[0] < 2 or img.shape[1] < 2:
        raise RequestError(f"{where}: frame {img.shape[:2]} is too small")
    return img


def validate_request(req: VLMRequest) -> None:
    """Raise ``RequestError`` (naming the request id and field) for a malformed request."""
    rid = req.request_id or "<no id>"
    if not isinstance(req.prompt, str):
        raise RequestError(f"request {rid}: prompt must be str, got {type(req.prompt).__name__}")
    for i, img in enumerate(req.images):
        check_frame(img, f"request {rid}: images[{i}]")
    if req.frame_times_us is not None:
        if len(req.frame_times_us) != len(req.images):
            raise RequestError(
                f"request {rid}: frame_times_us has {len(req.frame_times_us)} entries for "
                f"{len(req.images)} images"
            )
        if any(b < a for a, b in zip(req.frame_times_us, req.frame_times_us[1:], strict=False)):
            raise RequestError(f"request {rid}: frame_times_us must be non-decreasing")
    if req.max_new_tokens < 1:
        raise RequestError(f"request {rid}: max_new_tokens must be >= 1")
    if req.temperature < 0:
        raise RequestError(f"request {rid}: temperature must be >= 0")
    if req.top_logprobs < 0 or req.top_logprobs > 20:
        raise RequestError(f"request {rid}: top_logprobs must be in 0..20")


def request_to_chat(req: VLMRequest, vision_input: str = "images") -> Chat:
    """The one mapping from a ``VLMRequest`` to chat messages (see module docstring)."""
    validate_request(req)
    if vision_input not in ("images", "video"):
        raise ValueError(f"vision_input must be 'images' or 'video', got {vision_input!r}")
    parts: list[dict[str, Any]] = []
    if req.images:
        if vision_input == "video":
            parts.append(
                {"type": "video", "video": list(req.images), "times_us": req.frame_times_us}
            )
        else:
            for i, img in enumerate(req.images):
                if req.frame_times_us is not None:
                    parts.append({"type": "text", "text": stamp(req.frame_times_us[i])})
                parts.append({"type": "image", "image": img})
    parts.append({"type": "text", "text": req.prompt})
    messages: list[dict[str, Any]] = []
    if req.system:
        messages.append({"role": "system", "content": [{"type": "text", "text": req.system}]})
    messages.append({"role": "user", "content": parts})
    return Chat(
        messages=messages,
        max_new_tokens=req.max_new_tokens,
        temperature=req.temperature,
        seed=req.seed,
        top_logprobs=req.top_logprobs,
        want_logprobs=True,
        request_id=req.request_id,
    )


# ---- wire format (OpenAI chat completions) -------------------------------------------


def encode_image(img: np.ndarray, fmt: str = "png", quality: int = 90) -> str:
    """A frame as a ``data:image/...;base64,`` URL (PNG lossless by default, or JPEG)."""
    from PIL import Image

    fmt = fmt.lower()
    if fmt not in ("png", "jpeg", "jpg"):
        raise ValueError(f"image format must be png or jpeg, got {fmt!r}")
    buf = io.BytesIO()
    pil = Image.fromarray(img, mode="RGB")
    if fmt == "png":
        pil.save(buf, format="PNG", compress_level=1)  # speed over size: frames are small
        mime = "png"
    else:
        pil.save(buf, format="JPEG", quality=quality)
        mime = "jpeg"
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# Formats a data URL may carry; others are refused before any decoder runs.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


def decode_image(
    url: str, max_bytes: int | None = None, max_pixels: int | None = None
) -> np.ndarray:
    """Decode a base64 ``data:image/...`` URL into an HWC uint8 RGB array.

    Remote URLs are refused: the server never fetches from the network. ``max_bytes``
    bounds the encoded image and ``max_pixels`` its decoded size: the size comes from the
    header, which ``Image.open`` reads without decoding, so a decompression bomb (a
    12000x12000 PNG of a few KB) is refused before its pixels are allocated.
    """
    from PIL import Image, UnidentifiedImageError

    if not url.startswith("data:"):
        raise RequestError("image_url must be a base64 data: URL (remote URLs are not fetched)")
    head, _, payload = url.partition(",")
    if ";base64" not in head or not head[5:].startswith("image/"):
        raise RequestError(f"unsupported data URL header {head[:40]!r}")
    # base64 is 4 chars per 3 bytes: refuse an oversized payload before decoding it.
    if max_bytes is not None and len(payload) > 4 * (max_bytes // 3 + 1):
        raise RequestError(
            f"image is about {len(payload) * 3 // 4} bytes encoded, over the limit {max_bytes}"
        )
    try:
        raw = base64.b64decode(payload, validate=True)
        if max_bytes is not None and len(raw) > max_bytes:
            raise RequestError(f"image is {len(raw)} bytes encoded, over the limit {max_bytes}")
        with Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS) as im:
            w, h = im.size
            if max_pixels is not None and w * h > max_pixels:
                raise RequestError(
                    f"image is {w}x{h} = {w * h} pixels, over the limit {max_pixels}"
                )
            return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    except RequestError:
        raise
    except (ValueError, UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        # DecompressionBombError is not an OSError: named here so it is a 400, not a 500.
        raise RequestError(f"cannot decode image data URL: {type(e).__name__}: {e}") from e


def chat_to_openai_messages(chat: Chat, image_format: str = "png") -> list[dict[str, Any]]:
    """Wire form of a chat: image parts become ``image_url`` data URLs.

    A video part is sent as its frames (stamped images): the OpenAI chat format has no
    portable way to carry raw frames with timestamps as one video.
    """
    out = []
    for m in chat.messages:
        if isinstance(m["content"], str):
            out.append({"role": m["role"], "content": m["content"]})
            continue
        parts: list[dict[str, Any]] = []
        for p in m["content"]:
            if p["type"] == "text":
                parts.append({"type": "text", "text": p["text"]})
            elif p["type"] == "image":
                parts.append(
                    {
                        "type": "image_url",
                        "image_url": {"url": encode_image(p["image"], image_format)},
                    }
                )
            elif p["type"] == "video":
                times = p.get("times_us")
                for i, img in enumerate(p["video"]):
                    if times is not None:
                        parts.append({"type": "text", "text": stamp(times[i])})
                    parts.append(
                        {"type": "image_url", "image_url": {"url": encode_image(img, image_format)}}
                    )
            else:
                raise RequestError(f"unknown content part type {p['type']!r}")
        out.append({"role": m["role"], "content": parts})
    return out


def openai_messages_to_chat(
    messages: list[dict[str, Any]],
    max_images: int | None = None,
    max_image_bytes: int | None = None,
    max_image_pixels: int | None = None,
    max_total_pixels: int | None = None,
) -> list[dict[str, Any]]:
    """Server side: wire messages -> chat messages with decoded images.

    The optional limits (``flora serve`` passes its settings) raise ``RequestError``
    naming the message and part: images per request, encoded bytes and decoded pixels per
    image (checked from the header before decoding), decoded pixels over the request.
    """
    if max_images is not None:
        n_images = sum(
            1
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), list)
            for p in m["content"]
            if isinstance(p, dict) and p.get("type") == "image_url"
        )
        if n_images > max_images:
            raise RequestError(f"request has {n_images} images, over the limit {max_images}")
    total_pixels = 0
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{k}] must be an object, got {type(m).__name__}")
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            raise RequestError(f"messages[{k}].role {role!r} is not system/user/assistant")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": [{"type": "text", "text": content}]})
            continue
        if not isinstance(content, list):
            raise RequestError(f"messages[{k}].content must be a string or a list of parts")
        parts: list[dict[str, Any]] = []
        for j, p in enumerate(content):
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(p.get("text", ""))})
            elif kind == "image_url":
                iu = p.get("image_url")
                url = iu.get("url") if isinstance(iu, dict) else iu
                if not isinstance(url, str):
                    raise RequestError(f"messages[{k}].content[{j}].image_url.url missing")
                try:
                    img = decode_image(url, max_image_bytes, max_image_pixels)
                except RequestError as e:
                    raise RequestError(f"messages[{k}].content[{j}]: {e}") from e
                total_pixels += img.shape[0] * img.shape[1]
                if max_total_pixels is not None and total_pixels > max_total_pixels:
                    raise RequestError(
                        f"messages[{k}].content[{j}]: images total over {max_total_pixels} "
                        "decoded pixels per request"
                    )
                parts.append({"type": "image", "image": img})
            else:
                raise RequestError(f"messages[{k}].content[{j}].type {kind!r} is not supported")
        out.append({"role": role, "content": parts})
    return out


# ---- processors ------------------------------------------------------------------------


def _template_messages(chat: Chat) -> list[dict[str, Any]]:
    """Messages stripped of pixel data, for rendering the chat template."""
    msgs = []
    for m in chat.messages:
        if isinstance(m["content"], str):
            msgs.append({"role": m["role"], "content": m["content"]})
        else:
            msgs.append(
                {
                    "role": m["role"],
                    "content": [
                        {"type": "text", "text": p["text"]}
                        if p["type"] == "text"
                        else {"type": p["type"]}
                        for p in m["content"]
                    ],
                }
            )
    return msgs


def render_prompt(processor: Any, chat: Chat) -> str:
    """The prompt string (chat template applied, generation prompt appended)."""
    return processor.apply_chat_template(
        _template_messages(chat), tokenize=False, add_generation_prompt=True
    )


def _image_only(base: type) -> type:
    """``base`` (a Qwen-VL processor class) without its video processor."""

    class _ImageOnly(base):  # type: ignore[misc, valid-type]
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            from transformers.processing_utils import ProcessorMixin

            def tid(tok_str: str) -> int:
                return tokenizer.convert_tokens_to_ids(tok_str)

            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.image_token_id = tid(self.image_token)
            self.video_token_id = tid(self.video_token)
            self.vision_start_token = "<|vision_start|>"
            self.vision_end_token = "<|vision_end|>"
            self.vision_start_token_id = tid(self.vision_start_token)
            self.vision_end_token_id = tid(self.vision_end_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    _ImageOnly.__name__ = _ImageOnly.__qualname__ = f"{base.__name__}ImageOnly"
    return _ImageOnly


def _processor_class_name(path: str) -> str | None:
    for name in ("processor_config.json", "tokenizer_config.json", "preprocessor_config.json"):
        f = Path(path) / name
        if f.is_file():
            cls = json.loads(f.read_text()).get("processor_class")
            if cls:
                return cls
    return None


def load_processor(path: str | Path, vision_input: str = "auto"):
    """Load a Qwen-VL processor from a local checkpoint dir (left padding set).

    With torchvision (GPU image): ``AutoProcessor.from_pretrained``. Without it, or with
    ``vision_input="images"``: the checkpoint's own processor class minus video.
    """
    import transformers
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
    from transformers.utils import is_torchvision_available

    path = str(path)
    if vision_input != "images" and is_torchvision_available():
        proc = AutoProcessor.from_pretrained(path)
    else:
        name = _processor_class_name(path) or "Qwen3VLProcessor"
        base = getattr(transformers, name, None)
        if base is None or not hasattr(base, "replace_image_token"):
            raise RequestError(f"{path}: processor class {name!r} is not a Qwen-VL processor")
        tok = AutoTokenizer.from_pretrained(path)
        img = AutoImageProcessor.from_pretrained(path)
        template = None
        tf = Path(path) / "chat_template.jinja"
        if tf.is_file():
            template = tf.read_text()
        elif (Path(path) / "chat_template.json").is_file():
            template = json.loads((Path(path) / "chat_template.json").read_text())["chat_template"]
        else:
            template = getattr(tok, "chat_template", None)
        if not template:
            raise RequestError(f"{path}: no chat template (chat_template.jinja) found")
        proc = _image_only(base)(image_processor=img, tokenizer=tok, chat_template=template)
    proc.tokenizer.padding_side = "left"
    return proc


def trained_vision_input(*paths: str | Path | None) -> str | None:
    """How the exported Flora model holding ``paths`` saw frames in training, or None.

    ``paths``: a backend's model and adapter paths; the export's manifest sits in the path
    or its parent (``<export>/model``, ``<export>/adapter``, ``<export>/base``). None for a
    checkpoint that is not a Flora export (a hub id, a raw base), which keeps the
    processor's own choice. An export written before the manifest recorded the field was
    trained on images (the trainers have only ever rendered images). A manifest that does
    not read, or names another input, is a :class:`RequestError` naming file and field.
    """
    for p in paths:
        if p is None or not Path(p).exists():
            continue
        here = Path(p)
        for d in (here, here.parent):
            f = d / MODEL_MANIFEST
            if not f.is_file():
                continue
            try:
                man = json.loads(f.read_text())
            except (OSError, ValueError) as e:
                raise RequestError(f"{f}: not a readable model manifest ({e})") from None
            if not isinstance(man, dict) or man.get("format") != MODEL_FORMAT:
                continue
            got = man.get("vision_input", TRAINING_VISION_INPUT)
            if got not in VISION_INPUTS:
                raise RequestError(
                    f"{f}: field 'vision_input' is {got!r}, not one of {VISION_INPUTS}"
                )
            return str(got)
    return None


def supports_video(processor: Any) -> bool:
    """Whether ``processor`` can take frames as one timestamped video."""
    return getattr(processor, "video_processor", None) is not None


__all__ = [
    "MODEL_FORMAT",
    "MODEL_MANIFEST",
    "TRAINING_VISION_INPUT",
    "VISION_INPUTS",
    "Chat",
    "RequestError",
    "chat_to_openai_messages",
    "decode_image",
    "encode_image",
    "load_processor",
    "openai_messages_to_chat",
    "render_prompt",
    "request_to_chat",
    "stamp",
    "supports_video",
    "trained_vision_input",
    "validate_request",
]
