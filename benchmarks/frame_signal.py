"""How much of the action boundaries the segmenter's input carries, without a language model.

    python benchmarks/frame_signal.py --set SET --dataset DATASET --episodes 26 \
        --vision small --vision models/small/captioner/model --vision RUN/model --out OUT

The small segmenter trails the kinematic baseline by about half its r_seg and hardly
reads its frames (``docs/benchmarks.md``). This asks where the boundary signal is lost.
The kinematic detector (:mod:`flora.segment.kinematic`, per window, same rules) runs on
an activity signal taken at each stage of the segmenter's input and is scored like a
model on the set's held-out windows (:func:`training.evaluate.score_outputs`):

* ``proprioception, episode rate``: the kinematic baseline itself;
* ``proprioception, 4 Hz``: the same state sampled at the segmenter's frame times;
* ``pixels, mosaic``: mean absolute change of the 4 Hz mosaics the set stores;
* ``pixels, model input``: the same frames as the image processor gives them to the vision
  encoder (resized to the size's pixel budget, normalised patches);
* ``visual tokens, <model>``: change of the frame's visual tokens after the vision tower
  and merger of each ``--vision`` model (a built size name, a model folder or an exported
  Flora model; a LoRA export is merged) — what the language model receives;
* ``reference on the 4 Hz grid``: the reference with every boundary snapped to the
  nearest frame, the ceiling of a frame-accurate reader.

The activity drives the detector as a one-dimensional path (its cumulative sum), so the
speed rules apply unchanged; there is no gripper channel, so no grasp/release merging.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

SLOT_US = 250_000  # the segmenter's 4 Hz frame spacing (flora.segment.plan)


def episode_frames(held: Sequence[Any]) -> dict[str, tuple[np.ndarray, list[np.ndarray]]]:
    """Each episode's 4 Hz frames, gathered from its held-out windows (all on one grid)."""
    by_ep: dict[str, dict[int, np.ndarray]] = {}
    for ex in held:
        start = ex.reference_obj()["window"][0]
        frames = by_ep.setdefault(ex.episode_id, {})
        for i, img in enumerate(ex.image_arrays()):
            frames.setdefault(start + i * SLOT_US, img)
    out = {}
    for ep, frames in by_ep.items():
        t = np.array(sorted(frames), dtype=np.int64)
        out[ep] = (t, [frames[int(x)] for x in t])
    return out


def change(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """Mean absolute change of each frame's vector from the previous one (0 for the first)."""
    x = np.stack([np.asarray(v, dtype=np.float64).ravel() for v in vectors])
    d = np.abs(np.diff(x, axis=0)).mean(axis=1)
    return np.concatenate([[0.0], d])


def path_kinematics(t_us: np.ndarray, end_us: int, activity: np.ndarray):
    """A one-dimensional path whose speed is ``activity`` (the detector's input form)."""
    from flora.segment.kinematic import Kinematics

    pos = np.cumsum(activity)
    ee = np.stack([pos, np.zeros_like(pos), np.zeros_like(pos)], axis=1)
    return Kinematics(t_us, int(end_us), ee, np.zeros(len(t_us)))


def processed(frames: Sequence[np.ndarray], processor: Any) -> list[np.ndarray]:
    """Each frame as the vision encoder receives it: the image processor's resized,
    normalised patches (its pixel budget), flattened."""
    from PIL import Image

    ip = processor.image_processor
    out: list[np.ndarray] = []
    for i in range(0, len(frames), 32):
        enc = ip(images=[Image.fromarray(f) for f in frames[i : i + 32]], return_tensors="pt")
        sizes = enc["image_grid_thw"].prod(-1).tolist()
        out.extend(p.numpy() for p in torch.split(enc["pixel_values"], sizes))
    return out


def load_vision(spec: str) -> tuple[Any, Any]:
    """(model, processor) of a built size name, a model folder or an exported Flora model."""
    from flora.backends.transformers_backend import TransformersBackend
    from training.evaluate import backend_for
    from training.sizes import resolve_base

    if (Path(spec) / "flora_model.json").is_file():
        be = backend_for(spec)
    else:
        be = TransformersBackend(str(resolve_base(spec)), device="cpu", vision_input="images")
    return be.model, be.processor


@torch.no_grad()
def token_vectors(model: Any, processor: Any, frames: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each frame's visual tokens (after the merger), flattened: what the LM receives."""
    from PIL import Image

    inner = model.model if hasattr(model, "model") else model
    out: list[np.ndarray] = []
    for i in range(0, len(frames), 32):
        batch = [Image.fromarray(f) for f in frames[i : i + 32]]
        enc = processor.image_processor(images=batch, return_tensors="pt")
        feats = inner.get_image_features(enc["pixel_values"], enc["image_grid_thw"])
        out.extend(t.float().numpy() for t in feats.pooler_output)
    return out


def snapped_reference(ref: dict[str, Any]) -> list:
    """The reference segments with every boundary on the nearest 4 Hz frame."""
    from flora.segment.plan import LocalSegment

    step = SLOT_US // 50_000  # ticks per frame
    n = ref["n_ticks"]
    out = []
    for u, v, lo, ro in ref["segments"]:
        su = 0 if lo else min(n, int(round(u / step)) * step)
        sv = n if ro else min(n, int(round(v / step)) * step)
        if sv > su:
            out.append(LocalSegment(su, sv, bool(lo), bool(ro)))
    return out


def window_outputs(
    held: Sequence[Any], kins: dict[str, Any], episodes: dict[str, Any], fps: float | None
) -> pd.DataFrame:
    """The detector's answer for every held-out window, from per-episode signals.

    At 4 Hz the detector does not smooth: its 3-frame kernel, 0.15 s at the toy world's
    20 Hz, would blur 0.75 s, longer than the shortest actions.
    """
    from flora.segment.grammar import render_segments
    from flora.segment.kinematic import KinematicConfig, kinematic_window_segments
    from flora.segment.plan import Window

    cfg = KinematicConfig(smooth_frames=1) if fps is not None else None

    rows = []
    for ex in held:
        ref = ex.reference_obj()
        s, e, cs, ce = ref["window"]
        w = Window(s, e, cs, ce, profile=ref["profile"], shifted=ref["pass"] == "shifted")
        segs = kinematic_window_segments(
            episodes[ex.episode_id], w, cfg, kin=kins[ex.episode_id], fps=fps
        )
        rows.append({"example_id": ex.example_id, "text": render_segments(segs)})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, required=True, help="a segmenter set (held-out split)")
    ap.add_argument("--dataset", type=Path, required=True, help="the set's toy dataset")
    ap.add_argument("--episodes", type=int, default=26, help="held-out episodes scored")
    ap.add_argument("--vision", action="append", default=[], help="a model whose tokens to read")
    ap.add_argument("--size", default="small", help="the size whose pixel budget applies")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    from flora.data.dataset import open_dataset
    from flora.segment.grammar import render_segments
    from flora.segment.kinematic import Kinematics, episode_kinematics
    from training.evaluate import heldout_examples, score_outputs

    held = heldout_examples("segmenter", args.set, limit=args.episodes)
    ds = open_dataset(args.dataset)
    wanted = {ex.episode_id for ex in held}
    episodes = {}
    for i in ds.episode_indices():
        ep = ds.episode(i)
        if ep.episode_id in wanted:
            episodes[ep.episode_id] = ep
    frames = episode_frames(held)
    print(f"{len(held)} windows of {len(frames)} episodes", flush=True)

    def at_frames(ep_id: str) -> Kinematics:
        k = episode_kinematics(episodes[ep_id])
        t = frames[ep_id][0]
        idx = np.clip(np.searchsorted(k.t_us, t), 0, len(k.t_us) - 1)
        return Kinematics(k.t_us[idx], k.end_us, k.ee[idx], k.grip[idx])

    def from_activity(act_of: Callable[[list[np.ndarray]], np.ndarray]) -> dict[str, Kinematics]:
        return {
            ep: path_kinematics(t, episodes[ep].duration_us, act_of(fr))
            for ep, (t, fr) in frames.items()
        }

    variants: dict[str, Callable[[], pd.DataFrame]] = {
        "proprioception, episode rate": lambda: window_outputs(
            held, {e: episode_kinematics(episodes[e]) for e in frames}, episodes, None
        ),
        "proprioception, 4 Hz": lambda: window_outputs(
            held, {e: at_frames(e) for e in frames}, episodes, 4.0
        ),
        "pixels, mosaic": lambda: window_outputs(held, from_activity(change), episodes, 4.0),
    }
    _, size_processor = load_vision(args.size)
    variants["pixels, model input"] = lambda: window_outputs(
        held, from_activity(lambda fr: change(processed(fr, size_processor))), episodes, 4.0
    )
    for spec in args.vision:

        def tokens(spec: str = spec) -> pd.DataFrame:
            model, proc = load_vision(spec)
            return window_outputs(
                held, from_activity(lambda fr: change(token_vectors(model, proc, fr))),
                episodes, 4.0,
            )  # fmt: skip

        variants[f"visual tokens, {spec}"] = tokens
    variants["reference on the 4 Hz grid"] = lambda: pd.DataFrame(
        [
            {"example_id": ex.example_id, "text": render_segments(snapped_reference(ref))}
            for ex in held
            for ref in [ex.reference_obj()]
        ]
    )

    results: dict[str, Any] = {"episodes": sorted(frames), "windows": len(held), "variants": {}}
    for name, make in variants.items():
        t0 = time.perf_counter()
        scored = score_outputs("segmenter", held, make(), n_boot=1000)
        row = {
            "metrics": scored.metrics,
            "intervals": {k: list(v) for k, v in scored.intervals.items()},
            "seconds": time.perf_counter() - t0,
        }
        results["variants"][name] = row
        m, iv = scored.metrics, scored.intervals
        print(
            f"{name}: r_seg {m['r_seg']:.3f} {np.round(iv.get('r_seg', (np.nan, np.nan)), 3)}"
            f" f1@0.5 {m['f1@0.5']:.3f} B {m['B']:.3f} parse {m['parse_rate']:.3f}",
            flush=True,
        )
    (args.out / "result.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
