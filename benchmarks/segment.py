"""Segmentation benchmarks: post-processing CPU cost per video hour, kinematic baseline F1.

1. **Mechanics** (no model): a 1-hour episode with ground-truth actions (0.5–40 s, some
   long, gaps on the 50 ms grid). For each profile, both passes: plan windows, render each
   window's ground-truth answer to text (the model's stand-in, timed separately), parse it
   with the strict parser, stitch, refine. Reports seconds of CPU per video hour for
   planning + parsing + stitching + refinement and checks the result is exactly the
   ground truth.
2. **Kinematic baseline quality**: generates a toy-world dataset (``flora.data.synth``),
   runs the segment step with ``backend=None`` and scores it with ``flora eval segment``'s
   metrics (F1@0.5/0.75, precision, mean tIoU).

Usage: ``python benchmarks/segment.py [--hours 1] [--episodes 12] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from flora.contract import TICK_US, US_PER_S, Event  # noqa: E402
from flora.parsing import Rejection  # noqa: E402
from flora.segment import (  # noqa: E402
    parse_segments,
    plan_windows,
    refine,
    render_segments,
    stitch,
)
from flora.segment.targets import pass_targets  # noqa: E402


def ground_truth(duration_us: int, seed: int = 0) -> list[Event]:
    """Non-overlapping tick-aligned actions covering most of the episode."""
    rng = random.Random(seed)
    out, t = [], 0
    last = duration_us // TICK_US
    while True:
        a = t + rng.choice([0, 0, 0, 2, 5, 10, 40])
        n = rng.choice([10, 20, 30, 40, 60, 80, 120, 200]) if rng.random() > 0.03 else 800
        b = a + n
        if b > last:
            return out
        out.append(Event(a * TICK_US, b * TICK_US))
        t = b


def mechanics(hours: float, repeat: int) -> list[dict]:
    T = int(hours * 3600 * US_PER_S)
    gt = ground_truth(T)
    rows = []
    for profile in ("standard", "long_horizon"):
        best: dict[str, float] = {}
        for _ in range(repeat):
            t0 = time.process_time()
            pw = plan_windows(T, profile)
            sw = plan_windows(T, profile, shift=True)
            t_plan = time.process_time() - t0
            # Model stand-in (not part of the engine's cost): ground truth rendered to text.
            t0 = time.process_time()
            p_txt = [render_segments(s) for s in pass_targets(gt, pw)]
            s_txt = [render_segments(s) for s in pass_targets(gt, sw)]
            t_model = time.process_time() - t0
            t0 = time.process_time()
            p_out = [parse_segments(x, w.n_ticks) for x, w in zip(p_txt, pw, strict=True)]
            s_out = [parse_segments(x, w.n_ticks) for x, w in zip(s_txt, sw, strict=True)]
            t_parse = time.process_time() - t0
            assert not any(isinstance(o, Rejection) for o in p_out + s_out)
            t0 = time.process_time()
            prim = stitch(pw, p_out, T)  # type: ignore[arg-type]
            t_stitch = time.process_time() - t0
            t0 = time.process_time()
            ev = refine(prim, sw, s_out, T, primary_windows=pw)  # type: ignore[arg-type]
            t_refine = time.process_time() - t0
            assert ev == gt, "stitching did not reproduce the ground truth"
            cur = {
                "plan": t_plan,
                "parse": t_parse,
                "stitch": t_stitch,
                "refine": t_refine,
                "model_standin": t_model,
            }
            best = {k: min(v, best.get(k, v)) for k, v in cur.items()}
        engine = best["plan"] + best["parse"] + best["stitch"] + best["refine"]
        rows.append(
            {
                "profile": profile,
                "windows": f"{len(pw)} + {len(sw)}",
                "events": len(gt),
                **{k: v / hours for k, v in best.items()},
                "engine_s_per_hour": engine / hours,
            }
        )
    return rows


def kinematic_quality(episodes: int, seed: int) -> dict:
    from flora.data.synth import generate
    from flora.segment.evaluate import evaluate_events
    from flora.segment.run import segment_dataset

    with tempfile.TemporaryDirectory() as d:
        root = generate(
            Path(d) / "toy_bench", episodes, seed, image_size=32, wrist_size=32, progress=False
        )
        t0 = time.perf_counter()
        res = segment_dataset(root, Path(d) / "tables", run_id="bench", progress=False)
        wall = time.perf_counter() - t0
        ev = evaluate_events(res.events, root)
        video_s = sum(res.events.drop_duplicates("episode_id")["duration_us"]) / US_PER_S
        return {**ev.metrics, "wall_s": wall, "video_s": video_s, "failures": len(res.failures)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-kinematic", action="store_true")
    a = ap.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%d')} — {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")  # fmt: skip
    print(f"\n## Mechanics, {a.hours:g} h episode (CPU s per video hour, best of {a.repeat})\n")
    print("| profile | windows (primary + shifted) | events | plan | parse | stitch | refine "
          "| engine total | GT render (model stand-in) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in mechanics(a.hours, a.repeat):
        print(
            f"| {r['profile']} | {r['windows']} | {r['events']} | {r['plan']:.4f} | "
            f"{r['parse']:.3f} | {r['stitch']:.3f} | {r['refine']:.3f} | "
            f"**{r['engine_s_per_hour']:.3f}** | {r['model_standin']:.3f} |"
        )
    if not a.skip_kinematic:
        m = kinematic_quality(a.episodes, a.seed)
        print(f"\n## Kinematic baseline on a toy world ({a.episodes} episodes, seed {a.seed}, "
              f"{m['video_s']:.0f} s of video)\n")  # fmt: skip
        print("| F1@0.5 | F1@0.75 | P@0.5 | R@0.5 | mean tIoU | events (pred/ref) | wall s |")
        print("|---|---|---|---|---|---|---|")
        print(
            f"| {m['f1@0.5']:.3f} | {m['f1@0.75']:.3f} | {m['precision@0.5']:.3f} | "
            f"{m['recall@0.5']:.3f} | {m['mean_tiou']:.3f} | {m['n_pred']:.0f}/{m['n_ref']:.0f} "
            f"| {m['wall_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
