"""Free vs grammar-guided decoding of one trained Flora model on held-out set items.

    # a segmenter SFT checkpoint (its LoRA weights), running or cut
    python benchmarks/guided_decoding.py --checkpoint RUN/sft/checkpoints/step800 \
        --set RUN/set --out /tmp/guided --episodes 10
    # an exported model (full weights or adapter), e.g. the released small rewarder
    python benchmarks/guided_decoding.py --model rewarder \
        --model-dir models/small/rewarder --set SET --out /tmp/guided-rew --episodes 10

Answers the set's held-out items with the in-process backend, free and (``--decoding
both``, the default; ``free`` or ``guided`` for one of them) within each request's
grammar (``TransformersBackend(guided=True)``: the grammar's exact guide where it has
one — segments, dense — else its regex; what ``flora serve`` applies).
``--attempts 3`` scores the free answers the engine keeps after its bounded retries (an
answer that does not parse is asked again, sampled and seeded; ``flora.parsing``), beside
how many items parsed at their first, greedy answer.
Prints and writes the metrics with 95 % intervals and the parser's rejection reasons
(``result.json``), and the answers themselves (``outputs_free|guided.parquet``: what
``benchmarks/outcome_compare.py`` pairs against the outcome baselines);
``docs/benchmarks.md`` ("Guided decoding …") holds the results. The set must carry
``guided_regex`` (sets built since that column exist have it).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time
from pathlib import Path

import torch


def _lora_from_checkpoint(checkpoint: Path, recipe_name: str, out: Path) -> tuple[Path, Path]:
    """The base and a PEFT adapter dir holding a DeepSpeed checkpoint's LoRA weights."""
    from transformers import AutoModelForImageTextToText

    from training.recipe import load_recipe
    from training.sft import apply_trainable
    from training.sizes import resolve_base

    recipe = load_recipe(recipe_name)
    base = resolve_base(recipe.base, seed=recipe.base_seed, max_pixels=recipe.max_pixels)
    adapter = out / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        model, _ = apply_trainable(AutoModelForImageTextToText.from_pretrained(str(base)), recipe)
        states = checkpoint / "mp_rank_00_model_states.pt"
        sd = torch.load(states, map_location="cpu", weights_only=False)["module"]
        missing, unexpected = model.load_state_dict(sd, strict=False)
        lora_missing = [k for k in missing if "lora_" in k]
        if unexpected or lora_missing:
            bad = (unexpected + lora_missing)[:3]
            raise SystemExit(f"{states}: not this recipe's LoRA ({bad})")
        model.save_pretrained(adapter)
    return base, adapter


def _reason_code(reason: str) -> str:
    """A rejection reason without its numbers and quoted text: the failure's kind."""
    code = re.sub(r"'[^']*'|\"[^\"]*\"", "…", reason)
    return re.sub(r"\d+", "N", code)[:70]


def _tally(group_of: dict[str, str], items) -> dict[str, list[int]]:
    """``[parsed, answers]`` per group of the scored items (items not in ``group_of`` skipped)."""
    out: dict[str, list[int]] = {}
    for eid, ok in zip(items["example_id"], items["parsed"], strict=True):
        if eid in group_of:
            n = out.setdefault(group_of[eid], [0, 0])
            n[0] += bool(ok)
            n[1] += 1
    return out


def parse_by_clip(examples: list, items) -> dict[str, list[int]]:
    """Segmenter: ``[parsed, windows]`` per clip length in ticks (the prompt states it),
    shortest first — where the free answers fail (docs/benchmarks.md)."""
    out = _tally({e.example_id: str(e.reference_obj()["n_ticks"]) for e in examples}, items)
    return {k: out[k] for k in sorted(out, key=int)}


def dense_parse_by_window(examples: list, items) -> dict[str, list[int]]:
    """Rewarder: ``[parsed, windows]`` of the dense answers in an episode's final window
    (the highest window index among its examples; the one that may end early) and in the
    others — where the free dense answers fail (docs/benchmarks.md)."""
    window = {e.example_id: int(e.reference_obj()["window"]) for e in examples
              if e.task_kind == "dense"}  # fmt: skip
    episode = {e.example_id: e.episode_id for e in examples}
    last: dict[str, int] = {}
    for eid, k in window.items():
        last[episode[eid]] = max(last.get(episode[eid], -1), k)
    where = {eid: "final" if k == last[episode[eid]] else "non_final" for eid, k in window.items()}
    return {"final": [0, 0], "non_final": [0, 0], **_tally(where, items)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="segmenter", choices=("segmenter", "captioner", "rewarder"))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help="a segmenter SFT step* checkpoint dir")
    src.add_argument("--model-dir", type=Path, help="an exported Flora model dir")
    ap.add_argument("--set", type=Path, required=True, help="the model's set (held-out split)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--recipe", default=None, help="default: <model>-small (checkpoint only)")
    ap.add_argument("--episodes", type=int, default=10, help="held-out episodes evaluated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decoding", choices=("both", "free", "guided"), default="both",
                    help="free only is the quick check of what a model learnt")  # fmt: skip
    ap.add_argument("--unseen-by", type=Path, action="append", default=[],
                    help="another exported model whose lineage is left out too, so models of "
                    "different lineages are scored on the same items (repeatable)")  # fmt: skip
    ap.add_argument("--attempts", type=int, default=1,
                    help="free answers per item: 1 the greedy answer alone; the engine's 3 "
                    "re-asks an answer that does not parse, sampled")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    from flora.backends.transformers_backend import TransformersBackend
    from training.evaluate import (
        attempt_counts,
        backend_for,
        generate_outputs,
        heldout_examples,
        lineages_seen,
        score_outputs,
        unseen_heldout,
    )

    # A continued model is not scored on what its lineage trained on (training.lineage).
    if args.model_dir is not None:
        unseen = unseen_heldout(args.model, args.set, args.model_dir, limit=args.episodes,
                                also_unseen_by=args.unseen_by)  # fmt: skip
        held, left_out = unseen.examples, unseen.left_out
    else:  # a checkpoint of a from-scratch run: its own set's split is its lineage
        left_out = (sorted(lineages_seen(heldout_examples(args.model, args.set), args.unseen_by))
                    if args.unseen_by else [])  # fmt: skip
        held = heldout_examples(args.model, args.set, limit=args.episodes, exclude=left_out)
        if not held:
            raise SystemExit(
                f"{args.set}: no held-out {args.model} items left to score "
                f"({len(left_out)} held-out episodes left out as seen by --unseen-by)"
            )
    if not all(e.guided_regex for e in held):
        raise SystemExit(f"{args.set}: built before sets stored guided_regex; rebuild it")
    if args.checkpoint is not None:
        if args.model != "segmenter":
            raise SystemExit("--checkpoint reads a LoRA checkpoint: segmenter only")
        base, adapter = _lora_from_checkpoint(
            args.checkpoint, args.recipe or f"{args.model}-small", args.out
        )
    res: dict[str, dict] = {}
    modes = {"both": (False, True), "free": (False,), "guided": (True,)}[args.decoding]
    for guided in modes:
        t0 = time.perf_counter()
        if args.checkpoint is not None:
            backend = TransformersBackend(base, adapter_path=adapter, device="cpu", batch_size=8,
                                          vision_input="images", guided=guided)  # fmt: skip
        else:
            backend = backend_for(args.model_dir, guided=guided)
        # the guide parses every answer: retries only ever re-ask free answers
        outs = generate_outputs(backend, held, attempts=1 if guided else args.attempts)
        scored = score_outputs(args.model, held, outs, n_boot=1000)
        items = scored.items
        kinds = items["task_kind"] if "task_kind" in items else ["all"] * len(items)
        codes: collections.Counter[str] = collections.Counter()
        for kind, ok, why in zip(kinds, items["parsed"], items["reason"], strict=True):
            codes[f"{kind}: " + ("parsed" if ok else _reason_code(str(why)))] += 1
        key = "guided" if guided else "free"
        outs.to_parquet(args.out / f"outputs_{key}.parquet")  # for benchmarks/outcome_compare.py
        res[key] = {"metrics": scored.metrics,
                    "intervals": {k: list(v) for k, v in scored.intervals.items()},
                    "codes": dict(codes), "seconds": time.perf_counter() - t0,
                    "attempts": 1 if guided else args.attempts,
                    **attempt_counts(outs, items)}  # fmt: skip
        if args.model == "segmenter":
            res[key]["by_clip_ticks"] = parse_by_clip(held, items)
        if args.model == "rewarder":
            res[key]["dense_by_window"] = dense_parse_by_window(held, items)
        print(key, json.dumps(res[key]), flush=True)
    source = str(args.checkpoint or args.model_dir)
    (args.out / "result.json").write_text(
        json.dumps(
            {
                "model": args.model,
                "source": source,
                "episodes": sorted({e.episode_id for e in held}),
                # held-out episodes not scored: the model's lineage (or --unseen-by's)
                # trained on them
                "left_out_seen": left_out,
                "unseen_by": [str(p) for p in args.unseen_by],
                **res,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
