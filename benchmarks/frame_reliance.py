"""Does a trained Flora model read its frames? Target loss with its own frames vs another's.

    python benchmarks/frame_reliance.py --model segmenter \
        --model-dir RUN/segmenter/sft/model --set RUN/segmenter/set --episodes 20

Held-out items: the episodes the model's lineage never trained on (as
``guided_decoding.py`` picks them). The measure is :mod:`training.frame_reliance`: each
item's target loss (nats per target token) with its own frames and with a donor's — the
next item of the same task kind and frame count from another episode. Δ > 0: the model
uses its video; Δ ≈ 0: it writes from the prompt alone. Intervals: percentile bootstrap
over episodes. ``docs/benchmarks.md`` ("Do the small models read their frames?") holds
the results.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, choices=("segmenter", "captioner", "rewarder"))
    ap.add_argument("--model-dir", type=Path, required=True, help="an exported Flora model dir")
    ap.add_argument("--set", type=Path, required=True, help="the model's set (held-out split)")
    ap.add_argument("--episodes", type=int, default=20, help="held-out episodes used")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write result.json here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from training.evaluate import backend_for, bootstrap_ci, unseen_heldout
    from training.frame_reliance import frame_swap_table, reliance_metrics

    t0 = time.perf_counter()
    held = unseen_heldout(args.model, args.set, args.model_dir, limit=args.episodes).examples
    backend = backend_for(args.model_dir)
    backend.model.eval()
    table = frame_swap_table(backend.model, backend.processor, held, progress=True)
    res: dict = {"model": args.model, "source": str(args.model_dir), "items": len(table),
                 "no_donor": len(held) - len(table),
                 "episodes": int(table["episode_id"].nunique())}  # fmt: skip
    for kind, g in [("all", table), *sorted(table.groupby("task_kind"))] if len(table) else []:
        ci = bootstrap_ci(g, reliance_metrics, n_boot=1000, seed=0)
        res[str(kind)] = {"items": len(g), **reliance_metrics(g),
                          "intervals": {k: list(v) for k, v in ci.items()}}  # fmt: skip
    res["seconds"] = time.perf_counter() - t0
    print(json.dumps(res, indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(res, indent=2))
        table.to_csv(args.out / "items.csv", index=False)


if __name__ == "__main__":
    main()
