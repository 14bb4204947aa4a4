"""VLM throughput for segmentation windows: batched vs one-at-a-time, prefill and generation.

Builds a random-initialised model from an architecture config (no weights are needed for
speed: the FLOPs and memory traffic are those of the real model), makes synthetic
segmentation windows (``--frames`` frames at ``--size`` x ``--size`` as one video, plus a
prompt with per-frame-pair time stamps, token layout as the Qwen3-VL processor makes it),
and measures

* prefill: one forward pass over a batch of windows (windows/s),
* generation: prefill + ``--gen-tokens`` greedy tokens (windows/s),

for each batch size, against a roofline of ``peak TFLOP/s / FLOPs per window``. It reports
GPU-seconds per hour of video for the standard segmentation profile (12 s cores: 300
windows per video hour per pass, 600 with the shifted refinement pass).

Run on a GPU pod::

    python benchmarks/vlm_throughput.py --config qwen3_5_9b --batch-sizes 1,4,8,16 \\
        --out bench.json

and on a CPU with the tiny config (CI runs this to prove the script executes)::

    python benchmarks/vlm_throughput.py --config tiny --frames 4 --size 64 \\
        --batch-sizes 1,2 --windows 2 --gen-tokens 4

Inputs are built directly as tensors (``pixel_values_videos``, ``video_grid_thw``,
``input_ids``, ``mm_token_type_ids``), so no processor or torchvision is needed.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

WINDOWS_PER_VIDEO_HOUR = 3600 / 12  # standard profile: one window per 12 s core, per pass


def _qwen3_5(text: dict, vision: dict, tie: bool = False):
    """A Qwen3.5 config: what the family shares (tokenizer, head dims, multimodal RoPE,
    vision patching) plus the given dims."""
    from transformers import Qwen3_5Config

    rope = {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
        "partial_rotary_factor": 0.25,
    }
    shared_text = dict(vocab_size=248320, head_dim=256, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_num_key_heads=16)  # fmt: skip
    shared_vision = dict(num_heads=16, patch_size=16, spatial_merge_size=2,
                         temporal_patch_size=2, num_position_embeddings=2304)  # fmt: skip
    return Qwen3_5Config(
        text_config={**shared_text, **text, "rope_parameters": rope, "tie_word_embeddings": tie},
        vision_config={**shared_vision, **vision},
        tie_word_embeddings=tie,
    )


def build_config(name: str):
    """Architecture configs by name (or a path to a config.json)."""
    from transformers import AutoConfig, Qwen3VLConfig

    if name == "tiny":
        import tempfile

        from flora.backends.tiny import TinySpec, _model_config, build_tokenizer

        with tempfile.TemporaryDirectory() as d:
            tok = build_tokenizer(Path(d), "qwen3_vl")
            cfg, _ = _model_config("qwen3_vl", tok, TinySpec())
        return cfg
    if name == "qwen3_5_9b":
        # Qwen3.5-9B text (transformers' Qwen3_5TextConfig defaults are the 9B) + the
        # 27-layer SigLIP-style vision tower projecting to the 4096-wide text model.
        return _qwen3_5(
            dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                 num_attention_heads=16, num_key_value_heads=4, linear_num_value_heads=32),
            dict(depth=27, hidden_size=1152, intermediate_size=4304, out_hidden_size=4096),
        )  # fmt: skip
    if name == "qwen3_5_2b":
        # A 2B-class model of the Qwen3.5 architecture (hybrid linear/full attention, the
        # same tokenizer and vision layout), dims chosen here: 1.98 B parameters, tied
        # embeddings. For throughput only; no checkpoint has these dims.
        return _qwen3_5(
            dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=20,
                 num_attention_heads=8, num_key_value_heads=2, linear_num_value_heads=16),
            dict(depth=24, hidden_size=1024, intermediate_size=4096, out_hidden_size=2048),
            tie=True,
        )  # fmt: skip
    if name == "qwen3_vl_8b":
        return Qwen3VLConfig(
            text_config=dict(
                vocab_size=151936,
                hidden_size=4096,
                intermediate_size=12288,
                num_hidden_layers=36,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
                rope_parameters={
                    "rope_type": "default",
                    "rope_theta": 5_000_000.0,
                    "mrope_section": [24, 20, 20],
                    "mrope_interleaved": True,
                },
            ),
            vision_config=dict(
                depth=27,
                hidden_size=1152,
                intermediate_size=4304,
                num_heads=16,
                out_hidden_size=4096,
                deepstack_visual_indexes=[8, 16, 24],
            ),
        )
    p = Path(name)
    if p.is_file() or p.is_dir():
        return AutoConfig.from_pretrained(str(p))
    raise SystemExit(
        f"unknown --config {name!r} (tiny, qwen3_5_2b, qwen3_5_9b, qwen3_vl_8b or a path)"
    )


@dataclass
class WindowShape:
    """Token layout of one synthetic window."""

    frames: int
    size: int
    grid_t: int
    grid_hw: int  # patches per side
    tokens_per_group: int  # merged visual tokens per temporal group
    prompt_tokens: int
    total_tokens: int
    patches: int  # vision-encoder tokens (before the 2x2 merge)


def window_shape(cfg, frames: int, size: int, prompt_tokens: int = 160) -> WindowShape:
    v = cfg.vision_config
    tp, ps, ms = v.temporal_patch_size, v.patch_size, v.spatial_merge_size
    factor = ps * ms
    side = max(factor, round(size / factor) * factor)
    grid_t = math.ceil(frames / tp)
    grid_hw = side // ps
    per_group = (grid_hw // ms) ** 2
    stamp_tokens = 5  # "<12.5 seconds>" is ~5 tokens in the Qwen tokenizer
    total = prompt_tokens + grid_t * (stamp_tokens + 2 + per_group)
    return WindowShape(
        frames, side, grid_t, grid_hw, per_group, prompt_tokens, total, grid_t * grid_hw * grid_hw
    )


def text_tokens(cfg, rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    """``rows`` × ``n`` random ordinary text tokens: any draw that hits a vision special
    token (which would make the model look for frames) becomes the first ordinary id."""
    special = {cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id}
    special.add(cfg.vision_end_token_id)
    safe = next(i for i in range(cfg.text_config.vocab_size) if i not in special)
    ids = torch.randint(0, cfg.text_config.vocab_size, (rows, n), generator=g)
    ids[torch.isin(ids, torch.tensor(sorted(special)))] = safe
    return ids


def make_inputs(cfg, shape: WindowShape, batch: int, device, dtype, seed: int = 0) -> dict:
    """Synthetic batch of windows, laid out exactly as the processor would lay them out."""
    g = torch.Generator().manual_seed(seed)
    v = cfg.vision_config

    def text(n: int) -> list[int]:
        return text_tokens(cfg, 1, n, g)[0].tolist()

    rows = []
    for _ in range(batch):
        ids = text(shape.prompt_tokens // 2)
        for _ in range(shape.grid_t):
            ids += text(5) + [cfg.vision_start_token_id]
            ids += [cfg.video_token_id] * shape.tokens_per_group + [cfg.vision_end_token_id]
        ids += text(shape.prompt_tokens - shape.prompt_tokens // 2)
        rows.append(ids)
    input_ids = torch.tensor(rows, dtype=torch.long)
    mm = (input_ids == cfg.video_token_id).to(torch.int32) * 2
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
    pixels = torch.randn(batch * shape.patches, patch_dim, generator=g).to(dtype)
    thw = torch.tensor([[shape.grid_t, shape.grid_hw, shape.grid_hw]] * batch)
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": torch.ones_like(input_ids).to(device),
        "mm_token_type_ids": mm.to(device),
        "pixel_values_videos": pixels.to(device),
        "video_grid_thw": thw.to(device),
    }


def count_params(model) -> tuple[int, int, int]:
    """(vision, language-model-without-embeddings, embedding) parameter counts."""
    vis = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    emb = sum(
        p.numel() for n, p in model.named_parameters() if "embed_tokens" in n or "lm_head" in n
    )
    total = sum(p.numel() for p in model.parameters())
    return vis, total - vis - emb, emb


def vision_flops(cfg, shape: WindowShape, vis_params: int) -> float:
    """Forward FLOPs of one window's vision tower (merger included): 2·params per patch
    plus attention within each frame group (4·n²·d per layer)."""
    v = cfg.vision_config
    per_group_patches = shape.grid_hw**2
    return float(
        2 * vis_params * shape.patches
        + v.depth * 4 * shape.grid_t * per_group_patches**2 * v.hidden_size
    )


def _full_attention(cfg) -> tuple[int, int]:
    """(number of full-attention decoder layers, query heads × head dim)."""
    t = cfg.text_config
    layer_types = getattr(t, "layer_types", None) or ["full_attention"] * t.num_hidden_layers
    head_dim = getattr(t, "head_dim", t.hidden_size // t.num_attention_heads)
    return sum(x == "full_attention" for x in layer_types), t.num_attention_heads * head_dim


def text_flops(cfg, shape: WindowShape, lm_params: int, head_positions: int = 1) -> float:
    """Forward FLOPs of one window through the decoder: 2·params·tokens; full-attention
    layers add the causal scores and mixing (2·L²·d per layer); linear-attention layers are
    linear in L. Plus the LM head on ``head_positions`` positions (1 for a prefill, every
    position for a training step)."""
    t = cfg.text_config
    L = shape.total_tokens
    n_full, qdim = _full_attention(cfg)
    f = 2 * lm_params * L + n_full * 2 * L * L * qdim
    return float(f + 2 * t.vocab_size * t.hidden_size * head_positions)


def window_flops(cfg, shape: WindowShape, params: tuple[int, int, int], gen: int = 0) -> float:
    """Forward FLOPs of one window: the vision tower, the decoder with the LM head on the
    last position (prefill), and with ``gen`` greedy tokens each token's decoder pass, LM
    head and attention over the prompt."""
    vis, lm, _ = params
    f = vision_flops(cfg, shape, vis) + text_flops(cfg, shape, lm)
    if gen:
        n_full, qdim = _full_attention(cfg)
        lm_head = cfg.text_config.vocab_size * cfg.text_config.hidden_size
        f += gen * (2 * lm + 2 * lm_head) + n_full * gen * 4 * shape.total_tokens * qdim
    return float(f)


def matmul_peak_tflops(device, dtype, n: int = 4096, reps: int = 10) -> float:
    """Measured dense-matmul TFLOP/s (a practical roofline where none is given)."""
    if device.type == "cpu":
        n, reps = 1024, 3
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_prefill(model, inputs: dict, device, reps: int) -> float:
    """Seconds per forward pass (median of ``reps`` after one warm-up)."""
    model(**inputs, use_cache=False, logits_to_keep=1)
    _sync(device)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model(**inputs, use_cache=False, logits_to_keep=1)
        _sync(device)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


@torch.inference_mode()
def time_generate(model, inputs: dict, device, gen_tokens: int) -> float:
    """Seconds for prefill + exactly ``gen_tokens`` greedy tokens (EOS disabled)."""
    kw = dict(max_new_tokens=gen_tokens, min_new_tokens=gen_tokens, do_sample=False)
    model.generate(**inputs, **kw)
    _sync(device)
    t0 = time.perf_counter()
    model.generate(**inputs, **kw)
    _sync(device)
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict:
    from tqdm import tqdm
    from transformers import AutoModelForImageTextToText

    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32}.get(
        args.dtype, getattr(torch, args.dtype, None)
    )
    cfg = build_config(args.config)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(cfg, dtype=dtype)
    model.eval()
    model.generation_config.eos_token_id = None  # always generate exactly --gen-tokens
    model.generation_config.pad_token_id = 0
    build_s = time.perf_counter() - t0
    shape = window_shape(cfg, args.frames, args.size)
    params = count_params(model)
    peak = args.peak_tflops or matmul_peak_tflops(device, dtype)
    f_prefill = window_flops(cfg, shape, params)
    f_gen = window_flops(cfg, shape, params, gen=args.gen_tokens)
    roofline = peak * 1e12 / f_prefill
    # Global warm-up (allocator, kernels, thread pools) so the first size is not penalised.
    one = make_inputs(cfg, shape, 1, device, dtype)
    time_prefill(model, one, device, 1)
    results = []
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    for bs in tqdm(sizes, desc="batch sizes", file=sys.stderr):
        row: dict = {"batch": bs}
        try:
            inputs = make_inputs(cfg, shape, bs, device, dtype)
            s = time_prefill(model, inputs, device, args.reps)
            row["prefill_s"] = s
            row["prefill_windows_per_s"] = bs / s
            row["prefill_tflops"] = bs * f_prefill / s / 1e12
            row["prefill_roofline_frac"] = (bs / s) / roofline
            if args.gen_tokens > 0:
                s = time_generate(model, inputs, device, args.gen_tokens)
                row["generate_s"] = s
                row["generate_windows_per_s"] = bs / s
                row["generate_tflops"] = bs * f_gen / s / 1e12
            if device.type == "cuda":
                row["max_mem_gib"] = torch.cuda.max_memory_allocated(device) / 1024**3
                torch.cuda.reset_peak_memory_stats(device)
        except torch.OutOfMemoryError as e:  # report and go on with the other sizes
            row["error"] = f"OOM: {str(e)[:120]}"
            torch.cuda.empty_cache()
        results.append(row)
    # One-at-a-time: the same number of windows sent as batch-1 calls.
    n = args.windows
    s1 = time_prefill(model, one, device, max(1, min(args.reps, n)))
    one_at_a_time = {"prefill_windows_per_s": 1 / s1}
    if args.gen_tokens > 0:
        one_at_a_time["generate_windows_per_s"] = 1 / time_generate(
            model, one, device, args.gen_tokens
        )
    ok = [r for r in results if "error" not in r]
    best = max(ok, key=lambda r: r.get("generate_windows_per_s", r["prefill_windows_per_s"]))
    best_rate = best.get("generate_windows_per_s", best["prefill_windows_per_s"])
    summary = {
        "best_batch": best["batch"],
        "best_windows_per_s": best_rate,
        "speedup_vs_one_at_a_time": best_rate
        / one_at_a_time.get("generate_windows_per_s", one_at_a_time["prefill_windows_per_s"]),
        "gpu_s_per_video_hour_one_pass": WINDOWS_PER_VIDEO_HOUR / best_rate,
        "gpu_s_per_video_hour_two_passes": 2 * WINDOWS_PER_VIDEO_HOUR / best_rate,
        "roofline_gpu_s_per_video_hour_one_pass": WINDOWS_PER_VIDEO_HOUR / roofline,
    }
    return {
        "config": args.config,
        "model_type": cfg.model_type,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "build_s": build_s,
        "params": {"vision": params[0], "language": params[1], "embeddings": params[2]},
        "window": asdict(shape),
        "tflop_per_window_prefill": f_prefill / 1e12,
        "tflop_per_window_generate": f_gen / 1e12,
        "gen_tokens": args.gen_tokens,
        "peak_tflops": peak,
        "peak_source": "given" if args.peak_tflops else "measured matmul",
        "roofline_windows_per_s": roofline,
        "batched": results,
        "one_at_a_time": one_at_a_time,
        "summary": summary,
    }


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point; prints and optionally writes the JSON report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="qwen3_5_9b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", help="auto | bfloat16 | float16 | float32")
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--windows", type=int, default=8, help="windows for the one-at-a-time run")
    ap.add_argument("--gen-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--peak-tflops", type=float, default=None, help="roofline peak (default: measured)"
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    report = run(args)
    write_report(report, args.out)
    return report


def write_report(report: dict, out: Path | None) -> None:
    """Print the JSON report and write it to ``out`` when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        out.write_text(text)


if __name__ == "__main__":
    main()
