"""Model sizes (DESIGN §3.5): ``tiny`` and ``small`` are built here, ``production`` is loaded.

- ``tiny``: the random-initialised Qwen3-VL of :mod:`flora.backends.tiny` (hidden 32,
  2 layers) for mechanics and CI; ``init_std`` 0.02 so that SFT on it trains.
- ``small``: a random-initialised Qwen3-VL-family config sized to learn the toy world on
  2 CPU cores within minutes — text hidden 128 x 4 layers (MLP 384), vision 64 x 2,
  ``init_std`` 0.02, frames resized to at most 64 x 64 pixels (2 visual tokens per
  mosaic). DESIGN §6 measured 1.23 M parameters, ~4 examples/s with one torch thread,
  captioning loss 6.5 -> 0.27 in 10 minutes. Its token embedding (tied with the LM head)
  is drawn at ``embed_std`` 0.2 instead of 0.02: the segmenter trains a LoRA only, so the
  embedding, head and final norm stay frozen, and at std 0.02 the largest logit a
  perfect hidden state can reach is ``sqrt(128) * 0.02 * sqrt(128) = 2.56`` — a floor of
  3.95 nats/token on the cross-entropy over the 640-token vocabulary, whatever the LoRA
  learns (``docs/training.md``, "The small base").
- ``production``: Qwen3.5 bases from the hub (segmenter: 9B + rank-32 LoRA; captioner and
  rewarder: 27B) loaded through transformers Auto classes; never built.

``resolve_base`` turns a recipe's ``base`` into a local checkpoint directory: ``tiny`` /
``small`` are built once (deterministic, offline, seconds) under a cache folder keyed by
the spec, a path is used as is, a hub id goes through the local Hugging Face cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from flora.backends.tiny import TinySpec

SIZE_NAMES: tuple[str, ...] = ("tiny", "small", "production")

TINY_SPEC = TinySpec(init_std=0.02)
SMALL_SPEC = TinySpec(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vision_hidden_size=64,
    vision_depth=2,
    vision_heads=4,
    init_std=0.02,
    min_pixels=32 * 32,
    max_pixels=64 * 64,
)
# Token-embedding / LM-head scale of ``small`` (module docstring; docs/training.md).
SMALL_EMBED_STD = 0.2

# Production bases (DESIGN preamble: the released Flora models fine-tune Qwen3.5).
PRODUCTION_BASES: dict[str, str] = {
    "segmenter": "Qwen/Qwen3.5-9B",
    "captioner": "Qwen/Qwen3.5-27B",
    "rewarder": "Qwen/Qwen3.5-27B",
}


@dataclass(frozen=True)
class ModelSize:
    """One size: a spec to build (tiny/small) or hub ids to load (production).

    ``embed_std``: when set, the built base's token embedding (tied with the LM head) is
    redrawn at this standard deviation instead of the spec's ``init_std`` (see ``small``).
    """

    name: str
    spec: TinySpec | None
    family: str = "qwen3_vl"
    embed_std: float | None = None

    @property
    def built(self) -> bool:
        """Whether the base is built from a config here (random init) rather than loaded."""
        return self.spec is not None


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize("tiny", TINY_SPEC),
    "small": ModelSize("small", SMALL_SPEC, embed_std=SMALL_EMBED_STD),
    "production": ModelSize("production", None, family="qwen3_5"),
}


def get_size(name: str, max_pixels: int | None = None) -> ModelSize:
    """The size called ``name``; a clear error for anything else.

    ``max_pixels`` replaces a built size's per-image pixel budget (a recipe's
    ``max_pixels``): the processor resizes every frame to at most that many pixels, so
    it sets the visual tokens per frame. The spec, hence the cache key, records it.
    """
    try:
        size = SIZES[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; expected one of {SIZE_NAMES}") from None
    if max_pixels is None or size.spec is None or max_pixels == size.spec.max_pixels:
        return size
    if max_pixels < size.spec.min_pixels:
        raise ValueError(
            f"max_pixels {max_pixels} is below size {name!r}'s min_pixels {size.spec.min_pixels}"
        )
    return replace(size, spec=replace(size.spec, max_pixels=max_pixels))


def spec_key(size: ModelSize, seed: int) -> str:
    """Short content key of a built size (spec + family + seed): its cache folder name."""
    key: dict = {"spec": asdict(size.spec) if size.spec else None, "family": size.family,
                 "seed": seed}  # fmt: skip
    if size.embed_std is not None:  # absent otherwise, so tiny's key is unchanged
        key["embed_std"] = size.embed_std
    blob = json.dumps(key, sort_keys=True)
    return f"{size.name}-{size.family}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def default_cache() -> Path:
    """Where built bases live: ``FLORA_HOME/models/bases`` (settings)."""
    from flora.settings import get_settings

    return get_settings().home / "models" / "bases"


def build_base(
    size: str,
    out: str | Path,
    *,
    seed: int = 0,
    overwrite: bool = False,
    max_pixels: int | None = None,
) -> Path:
    """Build the random-initialised ``size`` (tiny or small) checkpoint at ``out``.

    ``overwrite`` is explicit: this function owns ``out`` only when asked to replace it.
    ``max_pixels``: see :func:`get_size` (the weights do not depend on it).
    """
    from flora.backends.tiny import build_tiny_vlm

    s = get_size(size, max_pixels)
    if s.spec is None:
        raise ValueError(f"size {size!r} is loaded from the hub, not built")
    path = build_tiny_vlm(out, family=s.family, seed=seed, spec=s.spec, overwrite=overwrite)
    if s.embed_std is not None:
        rescale_embedding(path, s.embed_std, s.spec.init_std)
    return path


EMBED_KEY = "model.language_model.embed_tokens.weight"


def rescale_embedding(path: Path, embed_std: float, init_std: float) -> None:
    """Scale the built base's token embedding from ``init_std`` to ``embed_std``.

    The embedding was drawn from N(0, init_std) (its padding row zero), so multiplying by
    ``embed_std / init_std`` draws it from N(0, embed_std) with the same seed: the base
    stays deterministic. The head is tied to it (``tie_word_embeddings``), so both change.
    The build marker records the scale.
    """
    from safetensors.torch import load_file, save_file

    from flora.backends.tiny import TINY_DONE_MARKER

    f = Path(path) / "model.safetensors"
    sd = load_file(f)
    if EMBED_KEY not in sd:
        raise ValueError(f"{f}: no {EMBED_KEY} to rescale")
    sd[EMBED_KEY] = sd[EMBED_KEY] * (embed_std / init_std)
    save_file(sd, f, metadata={"format": "pt"})
    marker = Path(path) / TINY_DONE_MARKER
    info = json.loads(marker.read_text())
    info["embed_std"] = embed_std
    marker.write_text(json.dumps(info, sort_keys=True))


# A recipe's ``family`` -> the ``model_type`` in its base's config.json (transformers 5).
FAMILY_MODEL_TYPES: dict[str, str] = {
    "qwen3_vl": "qwen3_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_5": "qwen3_5",
}


def check_family(family: str, base: str | Path, where: str) -> None:
    """Refuse a base (a checkpoint folder or a hub id) that is not of the recipe's ``family``.

    SFT and GRPO both call it before loading any weights: a recipe's settings (LoRA
    targets, trainable prefixes, processor) are chosen for its family, and a base of
    another family would otherwise train silently. :class:`ValueError` naming both.
    """
    from transformers import AutoConfig

    want = FAMILY_MODEL_TYPES.get(family)
    got = AutoConfig.from_pretrained(str(base)).model_type
    if want is None or got != want:
        raise ValueError(
            f"{where}: family {family!r} needs a base of model_type {want!r}, "
            f"base {base} is {got!r}"
        )


def repo_path(path: str | Path) -> Path:
    """A path named in a recipe: as given, else (relative and not found from the working
    directory) relative to the repository root, where the released ``models/`` live."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists():
        p = Path(__file__).resolve().parents[1] / p
    return p


def resolve_base(
    base: str, *, seed: int = 0, cache: Path | None = None, max_pixels: int | None = None
) -> Path:
    """A local checkpoint directory for a recipe's ``base``.

    ``"tiny"`` / ``"small"``: built once into ``cache`` (default :func:`default_cache`) in a
    temporary folder renamed into place, so a crash never leaves a half-built base that
    later runs would trust. An existing directory: itself (a relative path is tried from
    the working directory, then from the repository root, where the released ``models/``
    live). Anything else: a hub id,
    resolved through the local Hugging Face cache (offline here, so a missing one is a
    clear error naming it). ``max_pixels`` (built sizes only): see :func:`get_size`.
    """
    built = base in SIZES and SIZES[base].built
    if max_pixels is not None and not built:
        raise ValueError(f"max_pixels applies to a built size (tiny/small), not to {base!r}")
    if built:
        root = Path(cache) if cache else default_cache()
        final = root / spec_key(get_size(base, max_pixels), seed)
        if (final / "config.json").is_file():
            return final
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{final.name}.tmp{os.getpid()}"
        build_base(base, tmp, seed=seed, overwrite=True, max_pixels=max_pixels)
        try:
            tmp.rename(final)
        except OSError:  # another process won the race: use its copy
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        return final
    p = repo_path(base)
    if p.exists():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"base {base!r} is a directory without config.json")
        return p.resolve()
    if "/" in base and not base.startswith((".", "/")):
        from flora.backends.base import BackendError
        from flora.backends.transformers_backend import resolve_local

        try:
            local, _ = resolve_local(base)
        except BackendError as e:
            raise FileNotFoundError(f"base model {base!r} is not available locally: {e}") from e
        return local
    raise FileNotFoundError(
        f"base model {base!r} not found: not a size ({', '.join(SIZE_NAMES[:2])}), "
        "not a directory, not a hub id"
    )


__all__ = [
    "FAMILY_MODEL_TYPES",
    "PRODUCTION_BASES",
    "SIZES",
    "SIZE_NAMES",
    "SMALL_EMBED_STD",
    "SMALL_SPEC",
    "TINY_SPEC",
    "ModelSize",
    "build_base",
    "check_family",
    "default_cache",
    "get_size",
    "repo_path",
    "rescale_embedding",
    "resolve_base",
]
