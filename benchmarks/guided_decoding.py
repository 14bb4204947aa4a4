"""Free vs grammar-guided decoding of one segmenter SFT checkpoint on held-out windows.

    python benchmarks/guided_decoding.py --checkpoint RUN/sft/checkpoints/step800 \
        --set RUN/set --out /tmp/guided --episodes 10

Takes a DeepSpeed checkpoint of a running (or cut) segmenter SFT — its LoRA weights —
and answers the set's held-out windows twice with the in-process backend: free, and
within each request's grammar regex (``TransformersBackend(guided=True)``, what
``flora serve`` and a vLLM pod with structured outputs apply). Prints and writes the
metrics with 95 % intervals and the parser's rejection codes; ``docs/benchmarks.md``
("Guided decoding and the small segmenter") holds the results. The set must carry
``guided_regex`` (sets built since that column exist have it).
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="a step* checkpoint dir")
    ap.add_argument("--set", type=Path, required=True, help="the segmenter set it trained on")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--recipe", default="segmenter-small")
    ap.add_argument("--episodes", type=int, default=10, help="held-out episodes evaluated")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForImageTextToText

    from flora.backends.transformers_backend import TransformersBackend
    from flora.parsing import Rejection
    from flora.segment.grammar import parse_segments
    from training.evaluate import generate_outputs, heldout_examples, score_outputs
    from training.recipe import load_recipe
    from training.sft import apply_trainable
    from training.sizes import resolve_base

    recipe = load_recipe(args.recipe)
    held = heldout_examples("segmenter", args.set, limit=args.episodes)
    if not all(e.guided_regex for e in held):
        raise SystemExit(f"{args.set}: built before sets stored guided_regex; rebuild it")
    base = resolve_base(recipe.base, seed=recipe.base_seed, max_pixels=recipe.max_pixels)
    adapter = args.out / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        model, _ = apply_trainable(AutoModelForImageTextToText.from_pretrained(str(base)), recipe)
        states = args.checkpoint / "mp_rank_00_model_states.pt"
        sd = torch.load(states, map_location="cpu", weights_only=False)["module"]
        missing, unexpected = model.load_state_dict(sd, strict=False)
        lora_missing = [k for k in missing if "lora_" in k]
        if unexpected or lora_missing:
            bad = (unexpected + lora_missing)[:3]
            raise SystemExit(f"{states}: not this recipe's LoRA ({bad})")
        model.save_pretrained(adapter)
    res: dict[str, dict] = {}
    for guided in (False, True):
        t0 = time.perf_counter()
        backend = TransformersBackend(base, adapter_path=adapter, device="cpu", batch_size=8,
                                      vision_input="images", guided=guided)  # fmt: skip
        outs = generate_outputs(backend, held)
        scored = score_outputs("segmenter", held, outs, n_boot=1000)
        codes: collections.Counter[str] = collections.Counter()
        for ex, text in zip(held, outs.text, strict=True):
            p = parse_segments(text, ex.reference_obj()["n_ticks"])
            codes[p.reason.split(":")[0] if isinstance(p, Rejection) else "parsed"] += 1
        key = "guided" if guided else "free"
        res[key] = {"metrics": scored.metrics,
                    "intervals": {k: list(v) for k, v in scored.intervals.items()},
                    "codes": dict(codes), "seconds": time.perf_counter() - t0}  # fmt: skip
        print(key, json.dumps(res[key]), flush=True)
    (args.out / "result.json").write_text(
        json.dumps({"checkpoint": str(args.checkpoint), **res}, indent=2)
    )


if __name__ == "__main__":
    main()
