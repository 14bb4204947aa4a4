"""Tiny random-initialised Qwen-VL-family checkpoints, built offline in a few seconds.

``build_tiny_vlm(out_dir)`` writes a directory in the standard Hugging Face layout that
``AutoModelForImageTextToText``, ``AutoConfig``, ``AutoTokenizer`` and
``AutoImageProcessor`` load with no network (and ``AutoProcessor`` wherever torchvision is
installed; see :func:`flora.backends.processing.load_processor` for the torchvision-less
fallback). It is what tests, CI and the embedded mode use in place of real weights: the
same loading, batching, generation and serving code runs on it as on a real checkpoint.

The tokenizer is a byte-level BPE trained locally with ``tokenizers`` on a small corpus of
Flora grammar text, using Qwen's own pre-tokenizer (so every digit is its own token, as
the outcome reward's score tokens require) plus the special tokens the Qwen chat template
and processors need. Being byte-level, it encodes any string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from flora.safety import prepare_output_dir

Family = Literal["qwen3_vl", "qwen2_5_vl", "qwen3_5"]
FAMILIES: tuple[str, ...] = ("qwen3_vl", "qwen2_5_vl", "qwen3_5")

# Special tokens of the Qwen chat format, in Qwen's own order. The ids differ from the real
# checkpoints (the vocabulary is tiny) but the strings, and so the chat template and the
# processors' placeholder logic, are the same.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Added (non-special) tokens: rubric outputs may think first.
ADDED_TOKENS: tuple[str, ...] = ("<think>", "</think>")

# Qwen2 / Qwen3.5 pre-tokenisation regex (digits are single tokens: \p{N} matches one).
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN3_5_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Written by hand for Flora (not copied from a Qwen release). Handles string or list
# content; list parts are {"type": "text"|"image"|"video"|"image_url"}. For Qwen3-family
# video the processor itself wraps every frame in <|vision_start|>…<|vision_end|> after a
# "<t seconds>" stamp, so the template emits the bare video placeholder there.
_CHAT_TEMPLATE = """\
{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'text' -%}
{{ part['text'] }}
{%- elif part['type'] in ('image', 'image_url') -%}
<|vision_start|><|image_pad|><|vision_end|>
{%- elif part['type'] == 'video' -%}
__VIDEO__
{%- endif -%}
{%- endfor -%}
{%- endif -%}
<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""

# A small corpus covering digits, Flora's grammar words and ordinary caption English. The
# BPE merges learnt from it only make tokenisation shorter; byte-level BPE encodes anything.
_CORPUS_LINES: tuple[str, ...] = (
    "none",
    "0 12 0 1\n13 40 1 0\n41 240 0 1",
    "score: 1\nscore: 2\nscore: 3\nscore: 4\nscore: 5",
    "worst: 1\n1: 3\n2: 3\n3: 2 | gripper slips\n4: 1 | drops the cup\n32: 3",
    "caption: pick up the red cup from the table and place it in the bin.",
    "caption: open the top drawer with the left arm while the right arm holds the lid.",
    "caption: fold the towel in half and push it to the corner of the table.",
    "<think>\nthe gripper closes on the handle, then the arm lifts.\n</think>\n"
    "grasp: 0.25\nlift: 0.5\nplace: 0.25",
    "step reach grasp lift move place release push pull open close pour wipe stack",
    "robot arm gripper hand camera wrist main left right object cup bowl box drawer lid",
    "success failure suboptimal normal collision slip drop miss retry pause hesitation",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 24 32 40 48 64 128 240 320 480",
    "<0.0 seconds> <0.5 seconds> <1.0 seconds> <12.5 seconds> frames segments window",
    "You are Flora. Segment the robot video into actions with local tick times.",
    "Describe the target clip. Rate the outcome of the task from 1 to 5.",
    "system user assistant main camera wrist camera task instruction episode",
)


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny model (transformers' own Qwen3-VL tests use the same scale)."""

    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 8
    vision_hidden_size: int = 32
    vision_depth: int = 2
    vision_heads: int = 4
    vocab_target: int = 640
    # Larger than the usual 0.02 so that a random model's greedy output depends on its
    # input (with 0.02 every prompt decodes to the same token) — tests need that.
    init_std: float = 0.5
    # Image processor pixel budget: small frames keep CPU tests fast (a 64x64 frame is
    # 4x4 patches of 16 -> 4 merged visual tokens).
    min_pixels: int = 32 * 32
    max_pixels: int = 64 * 64


def build_tokenizer(out_dir: Path, family: str = "qwen3_vl", spec: TinySpec | None = None):
    """Train the tiny byte-level BPE tokenizer and save it (HF layout) under ``out_dir``.

    Returns the loaded ``transformers`` tokenizer (class ``Qwen2Tokenizer`` or, for the
    Qwen3.5 family, ``Qwen3_5Tokenizer`` — the classes real checkpoints use).
    """
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    spec = spec or TinySpec()
    regex = _QWEN3_5_REGEX if family == "qwen3_5" else _QWEN2_REGEX
    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=spec.vocab_target,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so that counts, and so merges, are stable and well separated.
    tok.train_from_iterator(list(_CORPUS_LINES) * 4, trainer)

    if family == "qwen3_5":
        from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer as TokCls
    else:
        from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer as TokCls

    hf_tok = TokCls(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
        padding_side="left",  # decoder-only batched generation pads on the left
    )
    hf_tok.add_tokens(list(ADDED_TOKENS))
    hf_tok.save_pretrained(out_dir)
    return hf_tok


def _token_ids(tok) -> dict[str, int]:
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None or i == tok.unk_token_id]
    if missing:
        raise RuntimeError(f"tiny tokenizer lacks special tokens {missing}")
    return ids


def _model_config(family: str, tok, spec: TinySpec):
    """The transformers config object for ``family`` at tiny scale."""
    ids = _token_ids(tok)
    vocab = len(tok)
    vocab = (vocab + 63) // 64 * 64  # pad the embedding like real checkpoints do
    common_ids = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    text = dict(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=32768,
        pad_token_id=tok.pad_token_id,
        initializer_range=spec.init_std,
    )
    half = spec.head_dim // 2  # rotary frequencies per head, split over (t, h, w)
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig as config_cls

        patch = 16
        text["rope_parameters"] = _mrope(half, mrope_interleaved=True)
        vision = _vision(spec, patch, num_position_embeddings=16,
                         deepstack_visual_indexes=[spec.vision_depth - 1])  # fmt: skip
    elif family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig as config_cls

        patch = 14
        text.pop("head_dim")  # Qwen2.5 derives it: hidden / heads
        text["rope_parameters"] = _mrope(spec.hidden_size // spec.num_attention_heads // 2)
        text["bos_token_id"] = None
        text["eos_token_id"] = ids["<|im_end|>"]
        vision = _vision(spec, patch, window_size=56,
                         fullatt_block_indexes=[spec.vision_depth - 1])  # fmt: skip
    elif family == "qwen3_5":
        from transformers import Qwen3_5Config as config_cls

        patch = 16
        text.update(
            rope_parameters=_mrope(half, mrope_interleaved=True, partial_rotary_factor=1.0),
            # One Gated-DeltaNet (linear attention) layer and one full-attention layer, so
            # both of Qwen3.5's block types are exercised.
            layer_types=["linear_attention", "full_attention"][: spec.num_hidden_layers]
            + ["full_attention"] * max(0, spec.num_hidden_layers - 2),
            linear_conv_kernel_dim=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            eos_token_id=ids["<|im_end|>"],
        )
        vision = _vision(spec, patch, num_position_embeddings=16)
    else:
        raise ValueError(f"unknown tiny VLM family {family!r}; expected one of {FAMILIES}")
    return config_cls(
        text_config=text, vision_config=vision, tie_word_embeddings=True, **common_ids
    ), patch


def _mrope(half: int, **extra) -> dict:
    """Default multimodal RoPE with ``half`` frequencies split over (t, h, w)."""
    return {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [half - 2 * (half // 4), half // 4, half // 4],
        **extra,
    }


def _vision(spec: TinySpec, patch_size: int, **extra) -> dict:
    """The tiny vision tower settings every family shares, plus the family's ``extra``."""
    return dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden_size,
        intermediate_size=2 * spec.vision_hidden_size,
        num_heads=spec.vision_heads,
        patch_size=patch_size,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=spec.hidden_size,
        **extra,
    )


def _processor_files(out_dir: Path, family: str, patch_size: int, spec: TinySpec) -> None:
    """Write the processor layout (processor_config.json + chat_template.jinja).

    Written as plain JSON, not through ``Qwen3VLProcessor.save_pretrained``, because that
    class cannot be constructed without torchvision (its video processor needs it) and
    torchvision does not import beside the CPU torch wheel this project pins. The layout
    is the one ``save_pretrained`` produces, so ``AutoProcessor`` loads it where
    torchvision exists; ``AutoImageProcessor`` loads it everywhere.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    img = Qwen2VLImageProcessorPil(
        patch_size=patch_size, temporal_patch_size=2, merge_size=2, size=size
    ).to_dict()
    img["image_processor_type"] = "Qwen2VLImageProcessor"  # resolved to the PIL backend
    img.pop("_processor_class", None)
    if family == "qwen2_5_vl":
        proc_cls, video_cls = "Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"
        video_token = "<|vision_start|><|video_pad|><|vision_end|>"
    else:
        proc_cls, video_cls = "Qwen3VLProcessor", "Qwen3VLVideoProcessor"
        video_token = "<|video_pad|>"
    vid = {
        "video_processor_type": video_cls,
        "patch_size": patch_size,
        "temporal_patch_size": 2,
        "merge_size": 2,
        # Frames arrive already sampled by Flora's window planner: never resample them.
        "do_sample_frames": False,
        "size": {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels * 64},
        "image_mean": img["image_mean"],
        "image_std": img["image_std"],
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "resample": 3,
        "rescale_factor": 1 / 255,
    }
    if family != "qwen2_5_vl":
        vid["cap_pixels_per_frame"] = True
    cfg = {"processor_class": proc_cls, "image_processor": img, "video_processor": vid}
    (out_dir / "processor_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    (out_dir / "chat_template.jinja").write_text(_CHAT_TEMPLATE.replace("__VIDEO__", video_token))
    # Also record the processor class for the tokenizer (AutoProcessor's last fallback).
    tcfg_path = out_dir / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text())
    tcfg["processor_class"] = proc_cls
    tcfg_path.write_text(json.dumps(tcfg, indent=2, sort_keys=True))


#: ``kind`` of a tiny-model folder in its owner marker (:mod:`flora.safety`).
TINY_MODEL_KIND = "tiny-model"
#: Written last by :func:`build_tiny_vlm`: the checkpoint in this folder is complete.
TINY_DONE_MARKER = "flora_tiny.json"


def build_tiny_vlm(
    out_dir: str | Path,
    family: str = "qwen3_vl",
    seed: int = 0,
    spec: TinySpec | None = None,
    overwrite: bool = False,
) -> Path:
    """Build a tiny random-initialised ``family`` VLM checkpoint under ``out_dir``.

    ``family`` is ``"qwen3_vl"`` (default), ``"qwen2_5_vl"`` or ``"qwen3_5"`` (Qwen3.5:
    Gated-DeltaNet + full attention). Deterministic for a given ``seed`` (same bytes), a
    few seconds on a CPU, no network. Returns the directory.

    ``out_dir`` may be missing, empty, or a tiny model built here before (it is replaced).
    Anything else there — a dataset, a file — is refused with
    :class:`flora.safety.OutputDirError` unless ``overwrite``: Flora never deletes data it
    did not create.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny VLM family {family!r}; expected one of {FAMILIES}")
    spec = spec or TinySpec()
    out = prepare_output_dir(
        out_dir, TINY_MODEL_KIND, overwrite=overwrite, markers=(TINY_DONE_MARKER,)
    )

    from transformers import AutoModelForImageTextToText, GenerationConfig

    tok = build_tokenizer(out, family, spec)
    cfg, patch_size = _model_config(family, tok, spec)
    # Seed a private RNG scope so building a model never perturbs the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32)
    model.eval()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(
        eos_token_id=[eos, tok.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)
    _processor_files(out, family, patch_size, spec)
    (out / TINY_DONE_MARKER).write_text(
        json.dumps({"family": family, "seed": seed, "spec": spec.__dict__}, sort_keys=True)
    )
    return out


__all__ = [
    "FAMILIES",
    "SPECIAL_TOKENS",
    "TINY_DONE_MARKER",
    "TINY_MODEL_KIND",
    "TinySpec",
    "build_tiny_vlm",
    "build_tokenizer",
]
