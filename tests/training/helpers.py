"""Shared helpers of the training tests: a hand-made mini set, recipes, a spawned DP run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from training.recipe import Recipe, load_recipe
from training.sets import Example, encode_png, examples_frame

# Targets of different lengths: a mean of per-example means would differ from the
# token-level mean, and would change with the micro-batch split.
TARGETS = (
    "caption: pick up the red cup.",
    "caption: open the top drawer with the left arm while the right arm holds the lid.",
    "score: 4",
    "caption: fold the towel in half and push it to the corner of the table.",
)


def mini_examples(n_heldout: int = 1, seed: int = 0) -> list[Example]:
    """Four train (+ ``n_heldout`` held-out) captioner examples with random 32x32 frames."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(len(TARGETS) + n_heldout):
        split = "train" if i < len(TARGETS) else "heldout"
        imgs = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
        out.append(
            Example(
                example_id=f"captioner:sft:mini/{i:06d}",
                model="captioner",
                task_kind="caption",
                purpose="sft",
                dataset="mini",
                episode_id=f"mini/{i:06d}",
                split=split,
                request_id=f"mini/{i:06d}#event0@0-1000000",
                system="You are Flora.",
                prompt=f"Describe clip {i} in one sentence.",
                images=[encode_png(im) for im in imgs],
                frame_times_us=[0, 500_000],
                max_new_tokens=32,
                temperature=0.0,
                top_logprobs=0,
                target=TARGETS[i % len(TARGETS)],
                reference="{}",
            )
        )
    return out


def write_set(path: Path, examples: list[Example]) -> Path:
    """Write examples as a bare set directory (no GX run: hand-made test data)."""
    path.mkdir(parents=True, exist_ok=True)
    examples_frame(examples).to_parquet(path / "examples.parquet", index=False)
    return path


def tiny_recipe(model: str, base: Path, **kw: Any) -> Recipe:
    """The ``<model>-tiny`` recipe on the given base dir, with overrides."""
    return load_recipe(f"{model}-tiny", base=str(base), **kw)


def dp_worker(rank: int, world: int, port: int, recipe: dict, set_path: str, out: str) -> None:
    """One data-parallel rank (torch.multiprocessing.spawn target): a gloo group, one step."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    from training.sft import train_sft

    res = train_sft(Recipe.model_validate(recipe), set_path, out, log_mlflow=False, progress=False)
    if rank == 0:
        import json

        Path(out, "result.json").write_text(json.dumps(res.history))
