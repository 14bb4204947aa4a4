"""Per-chunk latency of plain / training-time RTC / inference-time RTC sampling.

The same DiT action expert and the same observation are timed with the three samplers in
one run (batch 1, H=50, 5 Euler steps by default). Training-time RTC only overwrites the
prefix and its timesteps before each step, so its latency should match plain sampling
(target: ratio <= 1.05); inference-time RTC adds one vector-Jacobian product per step.

    .venv/bin/python benchmarks/rtc_latency.py                      # ~29M expert, CPU
    .venv/bin/python benchmarks/rtc_latency.py --preset 300m --device cuda --dtype bf16

Presets: ``tiny`` (CI smoke), ``29m`` (hidden 384 x 8 blocks, CPU default) and ``300m``
(hidden 1024 x 12 blocks, ~315M parameters, for a GPU). Prints a markdown table and
writes JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flora.policy import rtc  # noqa: E402
from flora.policy.configuration_dit import DiTConfig  # noqa: E402
from flora.policy.modeling_dit import DiTActionExpert, count_parameters  # noqa: E402

PRESETS = {
    "tiny": dict(hidden=64, depth=2, heads=4),
    "29m": dict(hidden=384, depth=8, heads=6),
    "300m": dict(hidden=1024, depth=12, heads=16),
}
METHODS = ("plain", "training_time", "inference_time")


def build(
    preset: str, horizon: int, action_dim: int, device: str, dtype: torch.dtype
) -> DiTActionExpert:
    """A randomly initialised expert (gates perturbed so every block does real work)."""
    torch.manual_seed(0)
    cfg = DiTConfig(
        action_dim=action_dim, horizon=horizon, state_dim=32, lang_vocab=4096, **PRESETS[preset]
    )
    model = DiTActionExpert(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model.to(device=device, dtype=dtype).eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_methods(
    model: DiTActionExpert, *, d: int, s: int, steps: int, repeats: int, warmup: int, device: str
) -> dict[str, list[float]]:
    """Milliseconds per chunk for each method, interleaved so drift hits all alike."""
    cfg = model.config
    dtype = next(model.parameters()).dtype
    obs = {
        "state": torch.randn(1, cfg.state_dim, device=device, dtype=dtype),
        "lang_ids": model.encode_text(["fold the towel in half"]).to(device),
    }
    prefix = torch.randn(1, cfg.horizon - s, cfg.action_dim, device=device, dtype=dtype)
    noise = torch.randn(1, cfg.horizon, cfg.action_dim, device=device, dtype=dtype)
    shape = (1, cfg.horizon, cfg.action_dim)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for k in range(warmup + repeats):
        for m in METHODS:
            _sync(device)
            t0 = time.perf_counter()
            rtc.sample(model, obs, prefix, d, steps, m, s=s, shape=shape, noise=noise)
            _sync(device)
            if k >= warmup:
                times[m].append((time.perf_counter() - t0) * 1000)
    return times


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="29m")
    ap.add_argument("--horizon", type=int, default=50)
    ap.add_argument("--action-dim", type=int, default=14)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--delay", type=int, default=5)
    ap.add_argument("--s", type=int, default=25, help="execution horizon")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = build(args.preset, args.horizon, args.action_dim, args.device, dtype)
    times = time_methods(
        model,
        d=args.delay,
        s=args.s,
        steps=args.steps,
        repeats=args.repeats,
        warmup=args.warmup,
        device=args.device,
    )
    med = {m: statistics.median(v) for m, v in times.items()}
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "device": args.device,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "parameters": count_parameters(model),
        "preset": args.preset,
        "horizon": args.horizon,
        "steps": args.steps,
        "d": args.delay,
        "s": args.s,
        "repeats": args.repeats,
        "median_ms": med,
        "min_ms": {m: min(v) for m, v in times.items()},
        "ratio_training_time_over_plain": med["training_time"] / med["plain"],
        "ratio_inference_time_over_plain": med["inference_time"] / med["plain"],
    }
    print(
        f"DiT {res['parameters'] / 1e6:.1f}M params, H={args.horizon}, {args.steps} steps, "
        f"d={args.delay}, s={args.s}, batch 1, {args.device} {args.dtype}, "
        f"{res['threads']} threads, median of {args.repeats}"
    )
    print("| method | median ms/chunk | min ms | vs plain |")
    print("| --- | --- | --- | --- |")
    for m in METHODS:
        print(f"| {m} | {med[m]:.1f} | {res['min_ms'][m]:.1f} | {med[m] / med['plain']:.3f} |")
    ok = res["ratio_training_time_over_plain"] <= 1.05
    print(
        f"training-time / plain = {res['ratio_training_time_over_plain']:.3f} "
        f"({'meets' if ok else 'misses'} the <= 1.05 target)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
