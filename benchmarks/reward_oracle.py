"""Rewarder oracle check and dense post-processing cost.

1. **Oracle check** (docs/benchmarks.md "Rewarder"): for every episode of a generated
   toy-world dataset, and for random synthetic episodes (1 s – 10 min), the ground-truth
   dense labels are rendered per window through the dense grammar, parsed by the strict
   parser and stitched by eq. (22); the result must equal the ground truth exactly.
2. **Pipeline oracle** (``--pipeline``): the three step functions run on the dataset with
   the ground-truth oracle backend (frames decoded, mosaics built, tables validated) and are
   scored by ``flora eval reward``'s metrics — the harness's upper bound.
3. **Stitching cost**: the vectorised eq. (22) stitcher against the literal brute force on a
   10-minute episode (both must agree), and seconds per video hour for the fast one.

Usage: ``python benchmarks/reward_oracle.py [--episodes 10] [--random 200] [--pipeline]``
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flora.data.ground_truth import load_ground_truth  # noqa: E402
from flora.data.synth import generate  # noqa: E402
from flora.reward.dense import (  # noqa: E402
    group_times,
    plan_windows,
    roundtrip_ground_truth,
    stitch_labels_bruteforce,
    stitch_sources,
)

S = 1_000_000


def oracle_toy(root: Path) -> tuple[int, int, int, int]:
    """(episodes exact, episodes, groups exact, groups) over the dataset's ground truth."""
    gt = load_ground_truth(root)
    eps = gt.tables["episodes"]
    dur = dict(zip(eps.episode_index, eps.duration_us, strict=True))
    ok_eps = ok_groups = n_groups = 0
    for i in gt.episode_indices():
        ref = gt.dense(i)
        got = [(r.t_us, r.label, r.reason) for r in roundtrip_ground_truth(int(dur[i]), ref)]
        ok_eps += got == ref
        ok_groups += sum(a == b for a, b in zip(got, ref, strict=True))
        n_groups += len(ref)
    return ok_eps, len(gt.episode_indices()), ok_groups, n_groups


def oracle_random(n: int, seed: int = 0) -> tuple[int, int]:
    """(exact, total) over ``n`` random episodes of 1 s .. 10 min with random labels."""
    rng = random.Random(seed)
    ok = 0
    for _ in range(n):
        T = rng.randrange(S, 600 * S + 1)
        ref = []
        for t in group_times(T):
            lab = rng.choice([1, 2, 3, 3, 3])
            ref.append((t, lab, "" if lab == 3 else f"reason at {t}"))
        got = [(r.t_us, r.label, r.reason) for r in roundtrip_ground_truth(T, ref)]
        ok += got == ref
    return ok, n


def stitch_cost(repeat: int = 3) -> dict[str, float]:
    """Fast vs brute-force eq. (22) on a 10-minute episode, per 0.5 s group start."""
    T = 600 * S
    ws = plan_windows(T)
    rng = random.Random(1)
    labels = [[rng.choice([1, 2, 3]) for _ in range(32)] for _ in ws]
    times = group_times(T)
    best_fast = best_brute = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fast = stitch_sources(ws, times)
        best_fast = min(best_fast, time.perf_counter() - t0)
    t0 = time.perf_counter()
    brute = stitch_labels_bruteforce(ws, labels, times)
    best_brute = time.perf_counter() - t0
    assert fast == [(p, g) for _, p, g in brute], "fast and brute-force eq. (22) disagree"
    return {
        "windows": len(ws),
        "times": len(times),
        "fast_s": best_fast,
        "brute_s": best_brute,
        "speedup": best_brute / best_fast,
        "fast_s_per_video_hour": best_fast * 6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--random", type=int, default=200)
    ap.add_argument("--pipeline", action="store_true", help="also run the step functions")
    args = ap.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        root = generate(Path(tmp) / "toy_world", episodes=args.episodes, seed=args.seed,
                        progress=False)  # fmt: skip
        print(f"generated {args.episodes} toy episodes in {time.perf_counter() - t0:.1f} s")
        e, ne, g, ng = oracle_toy(root)
        print(f"oracle (toy world): {e}/{ne} episodes exact, {g}/{ng} groups exact")
        r, nr = oracle_random(args.random, args.seed)
        print(f"oracle (random 1 s - 10 min): {r}/{nr} episodes exact")
        if args.pipeline:
            from flora.reward.benchmark import run_toy_benchmark
            from flora.reward.oracle import GroundTruthRewardBackend

            t0 = time.perf_counter()
            res = run_toy_benchmark(root, GroundTruthRewardBackend(root), Path(tmp) / "out",
                                    progress=False)  # fmt: skip
            dt = time.perf_counter() - t0
            print(f"pipeline oracle ({dt:.1f} s): " + ", ".join(
                f"{k}={v:.4g}" for k, v in sorted(res.metrics.items())))  # fmt: skip
    c = stitch_cost()
    print(
        f"eq. (22) stitching, 10 min episode ({c['windows']} windows, {c['times']} times): "
        f"fast {c['fast_s'] * 1e3:.2f} ms, brute force {c['brute_s'] * 1e3:.0f} ms "
        f"({c['speedup']:.0f}x), {c['fast_s_per_video_hour'] * 1e3:.1f} ms CPU per video hour"
    )
    if e != ne or r != nr:
        sys.exit(1)


if __name__ == "__main__":
    main()
