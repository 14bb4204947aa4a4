"""SFT throughput of Flora's trainer: target tokens/s, tokens/s and model-FLOPs utilisation.

Builds a random-initialised model from an architecture config (``vlm_throughput``'s
configs: a 2B-class Qwen3.5 model, the Qwen3.5-9B architecture, or ``tiny``), puts it in
the training form a recipe asks for (the recipe's trainable parts, LoRA, gradient
checkpointing: :func:`training.sft.prepare_model`), wraps it in DeepSpeed with the
recipe's ZeRO config (:func:`training.sft.deepspeed_engine`; bf16 on GPU, fp32 on CPU) and
times optimizer steps of :func:`training.sft.optimizer_step` — the trainer's own step —
on synthetic 64-frame windows laid out as the processor lays them out, each followed by
``--answer-tokens`` labelled tokens.

Model FLOPs per window (the MFU numerator; recomputation under gradient checkpointing is
not counted, as is usual for MFU): the forward pass with the LM head on every position,
plus the backward pass — twice the forward for parts whose weights train (activation
and weight gradients), once for frozen parts that gradients must flow through (the
language model under LoRA), none for frozen parts upstream of everything trainable (the
vision tower under LoRA or for the captioner; the merger's own backward is left out,
at most 4 % of the tower's forward for the 2B config: 7.6 % of its parameters, on a
quarter of the tokens). So a full fine-tune counts 3× the forward, LoRA on the language
model 2× for the decoder and 1× for the vision tower.

On a GPU (one process; several through the ``deepspeed`` launcher)::

    python benchmarks/train_throughput.py --config qwen3_5_2b --recipe rewarder-production \\
        --micro-batch 1 --steps 6 --peak-tflops 989 --out train_2b.json
    python benchmarks/train_throughput.py --config qwen3_5_9b --recipe segmenter-production \\
        --micro-batch 1 --steps 4 --peak-tflops 989 --out train_9b_lora.json

On a CPU with the tiny config (a test runs this to prove the script executes)::

    python benchmarks/train_throughput.py --config tiny --frames 4 --size 64 --steps 1
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _load_vlm_throughput():
    """The sibling benchmark's configs, window layout and FLOP model (one FLOP model)."""
    name = "vlm_throughput"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses need their module registered
        spec.loader.exec_module(mod)
    return sys.modules[name]


vt = _load_vlm_throughput()


def with_answer(inputs: dict, cfg, answer: int, seed: int = 1) -> dict:
    """``inputs`` with ``answer`` ordinary text tokens appended to every row, and
    ``labels`` that score only those (the SFT target; the prompt and video are ignored)."""
    from training.sft import IGNORE

    ids = inputs["input_ids"]
    g = torch.Generator().manual_seed(seed)
    tail = vt.text_tokens(cfg, ids.shape[0], answer, g).to(ids.device)
    out = dict(inputs)
    out["input_ids"] = torch.cat([ids, tail], 1)
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    mm = inputs["mm_token_type_ids"]
    out["mm_token_type_ids"] = torch.cat([mm, torch.zeros_like(tail, dtype=mm.dtype)], 1)
    labels = torch.full_like(out["input_ids"], IGNORE)
    labels[:, -answer:] = tail
    out["labels"] = labels
    return out


def step_flops(cfg, shape, params, recipe) -> dict[str, float]:
    """Model FLOPs of one training window (module docstring), by part."""
    vis, lm, _ = params
    fv = vt.vision_flops(cfg, shape, vis)
    ft = vt.text_flops(cfg, shape, lm, head_positions=shape.total_tokens)
    text_factor = 2 if recipe.lora_rank is not None else 3
    vision_factor = 3 if "vision" in recipe.trainable_modules else 1
    return {
        "forward": fv + ft,
        "vision": vision_factor * fv,
        "text": text_factor * ft,
        "train": vision_factor * fv + text_factor * ft,
    }


def run(args: argparse.Namespace) -> dict:
    """Build, wrap and time; returns the report (also for the tests)."""
    from tqdm import tqdm
    from transformers import AutoModelForImageTextToText

    from training.recipe import load_recipe
    from training.sft import (
        deepspeed_engine,
        init_distributed,
        optimizer_step,
        prepare_model,
    )

    overrides = {"micro_batch": args.micro_batch, "grad_accum": args.grad_accum}
    if args.zero is not None:
        overrides["zero_stage"] = args.zero
    if args.gradient_checkpointing != "recipe":
        overrides["gradient_checkpointing"] = args.gradient_checkpointing == "on"
    recipe = load_recipe(args.recipe, **overrides)
    rank, world = init_distributed()
    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    # The trainer's dtype rule (training.sft): bf16 weights under bf16 DeepSpeed on GPU.
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = vt.build_config(args.config)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(cfg, dtype=dtype)
    params = vt.count_params(model)
    model, groups = prepare_model(model, recipe)
    model.train()
    trainable = sum(p.numel() for g in groups for p in g["params"])
    engine, _, _ = deepspeed_engine(model, groups, recipe, world, args.steps + args.warmup)
    build_s = time.perf_counter() - t0

    shape = vt.window_shape(cfg, args.frames, args.size)
    batch = with_answer(
        vt.make_inputs(cfg, shape, args.micro_batch, device, dtype), cfg, args.answer_tokens
    )
    shape = dataclasses.replace(
        shape,
        prompt_tokens=shape.prompt_tokens + args.answer_tokens,
        total_tokens=shape.total_tokens + args.answer_tokens,
    )
    flops = step_flops(cfg, shape, params, recipe)
    windows = args.micro_batch * args.grad_accum  # per rank and optimizer step
    target = windows * args.answer_tokens
    count = target * world  # target tokens of the global batch
    scale = args.grad_accum * world / count  # the trainer's normalisation (train_sft)
    peak = args.peak_tflops or vt.matmul_peak_tflops(device, dtype)

    times, losses = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for i in tqdm(range(args.warmup + args.steps), desc="sft steps", file=sys.stderr):
        vt._sync(device)
        t = time.perf_counter()
        loss = optimizer_step(engine, (batch for _ in range(args.grad_accum)), scale)
        vt._sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
            losses.append(loss / target)
    s = sorted(times)[len(times) // 2]  # median step
    tflops = windows * flops["train"] / s / 1e12
    report = {
        "config": args.config,
        "model_type": cfg.model_type,
        "recipe": args.recipe,
        "trainable_modules": list(recipe.trainable_modules),
        "lora_rank": recipe.lora_rank,
        "zero_stage": recipe.zero_stage,
        "gradient_checkpointing": recipe.gradient_checkpointing,
        "world": world,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if cuda
        else platform.processor() or platform.machine(),
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "build_s": build_s,
        "params": {"vision": params[0], "language": params[1], "embeddings": params[2]},
        "trainable_params": trainable,
        "window": dataclasses.asdict(shape),
        "answer_tokens": args.answer_tokens,
        "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum,
        "tflop_per_window": {k: v / 1e12 for k, v in flops.items()},
        "step_s": s,
        "step_s_all": times,
        "loss": losses,
        "tokens_per_s": windows * shape.total_tokens / s,
        "target_tokens_per_s": target / s,
        "windows_per_s": windows / s,
        "model_tflops": tflops,
        "peak_tflops": peak,
        "peak_source": "given" if args.peak_tflops else "measured matmul",
        "mfu": tflops / peak,
    }
    if cuda:
        report["max_mem_gib"] = torch.cuda.max_memory_allocated(device) / 1024**3
    report["rank"] = rank
    return report


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point; prints and optionally writes the JSON report (rank 0)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="qwen3_5_2b")
    ap.add_argument(
        "--recipe",
        default="rewarder-production",
        help="trainable parts, LoRA, ZeRO stage, checkpointing, learning rates",
    )
    ap.add_argument("--device", default="auto", help="auto | cpu")
    ap.add_argument("--zero", type=int, choices=(2, 3), default=None, help="override the recipe")
    ap.add_argument("--gradient-checkpointing", choices=("recipe", "on", "off"), default="recipe")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--answer-tokens", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="per-device peak for MFU (H100/H200 dense bf16: 989; default: measured)",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)  # fmt: skip
    report = run(args)
    if report["rank"] == 0:
        vt.write_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
