"""Hunt the demo set's rare byte flip: regenerate it in a loop and say which stage differed.

The demo toy world (``flora.demo``: 10 episodes, seed of the demo) is regenerated again
and again in this process. For every generation three stages are hashed:

- ``sim``: each simulated rollout (``ee``, ``obj_pos``, ``opening``, ``held``) — the
  physics;
- ``rgb``: every RGB frame handed to the encoder, per video file (with the frame index of
  the first difference) — the renderer;
- ``mp4``: the encoded files' bytes — x264 in its child process.

The first generation is the reference. A generation that differs anywhere keeps its
folder and a ``hashes.json`` beside it; identical ones are deleted. About one generation
in sixty flipped one wrist file (``docs/dataset.md``, "Determinism"), so a verdict needs a
few hundred generations (≈ 1 min each on one core)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/synth_flip_hunt.py --minutes 120

Reading: ``mp4`` differs with ``rgb`` and ``sim`` the same → the encoder; ``rgb`` differs
with ``sim`` the same → the renderer; ``sim`` differs → the simulation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flora.data.encoder_process as encoder_process  # noqa: E402
import flora.data.synth as synth  # noqa: E402
from flora.demo import DEMO_EPISODES, DEMO_SEED, generate_dataset  # noqa: E402


class Tap:
    """Hashes what the simulation returns and what the encoder is handed, per generation."""

    def __init__(self) -> None:
        self.frames: dict[str, list[str]] = {}
        self.sim: dict[int, str] = {}
        add, simulate = encoder_process.RemoteVideoWriter.add, synth.simulate_episode
        tap = self

        def hashed_add(writer: Any, img: Any, *, keyframe: bool = False) -> Any:
            key = f"{writer.path.parent.parent.name}/{writer.path.name}"
            digest = hashlib.md5(img.tobytes() + bytes([keyframe])).hexdigest()[:16]
            tap.frames.setdefault(key, []).append(digest)
            return add(writer, img, keyframe=keyframe)

        def hashed_simulate(seed: int, index: int, duration_s: float) -> Any:
            r = simulate(seed, index, duration_s)
            h = hashlib.md5()
            for a in (r.ee, r.obj_pos, r.opening, r.held):
                h.update(a.tobytes())
            tap.sim[index] = h.hexdigest()
            return r

        encoder_process.RemoteVideoWriter.add = hashed_add  # type: ignore[method-assign]
        synth.simulate_episode = hashed_simulate  # type: ignore[assignment]

    def reset(self) -> None:
        self.frames, self.sim = {}, {}


def snapshot(out: Path, tap: Tap) -> dict[str, Any]:
    """The three stages' hashes of one generation."""
    mp4 = {
        str(p.relative_to(out)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*.mp4"))
    }
    return {"mp4": mp4, "frames": dict(tap.frames), "sim": {str(k): v for k, v in tap.sim.items()}}


def compare(ref: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
    """Which files / episodes differ from the reference, with the first differing frame."""
    rgb = {}
    for key, frames in cur["frames"].items():
        base = ref["frames"].get(key, [])
        if frames != base:
            # frames past the shorter list count as a difference at that index
            pairs = enumerate(zip(base, frames, strict=False))
            first = next((i for i, (a, b) in pairs if a != b), min(len(base), len(frames)))
            rgb[key] = {"first_frame": first, "frames": [len(base), len(frames)]}
    return {
        "mp4": [k for k, v in cur["mp4"].items() if v != ref["mp4"].get(k)],
        "rgb": rgb,
        "sim": [k for k, v in cur["sim"].items() if v != ref["sim"].get(k)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--runs", type=int, default=0, help="stop after this many (0: no limit)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/flora-flip-hunt"))
    args = ap.parse_args()
    tap = Tap()
    stop = time.monotonic() + 60 * args.minutes
    ref: dict[str, Any] | None = None
    flips = i = 0
    while time.monotonic() < stop and (not args.runs or i < args.runs):
        tap.reset()
        out = args.work / f"run{i}"
        shutil.rmtree(out, ignore_errors=True)
        generate_dataset(out, DEMO_EPISODES, DEMO_SEED)
        cur = snapshot(out, tap)
        ref = ref or cur
        diff = compare(ref, cur)
        differs = any(diff.values())
        flips += differs
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} run {i}: " + (json.dumps(diff) if differs else "same"), flush=True)
        if differs:
            (out / "hashes.json").write_text(json.dumps({"diff": diff, "cur": cur, "ref": ref}))
        else:
            shutil.rmtree(out)
        i += 1
    print(f"{i} generations, {flips} differed from the first", flush=True)


if __name__ == "__main__":
    main()
