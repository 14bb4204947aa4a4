"""Does a rewarder *localise* failures in a dense window, or only detect them?  (not a test)

Teacher-forced on held-out dense examples of a set: the model reads the reference answer
and, at each group line ``g: L``, we take its probability of the label token "1"
(failure). Groups are split by what the reference says there:

* ``failure, first`` — the first group of a run of failures (nothing above to copy);
* ``failure, continued`` — a failure group right after another (the line above says 1);
* ``normal, failure window`` — normal groups of a window that holds a failure;
* ``normal, clean window`` — groups of a window without any failure.

A model that localises puts high mass on "1" at ``failure, first``; one that only
detects "this window holds a failure" raises it a little on every group of such windows;
copying the line above shows up as high mass on ``failure, continued`` alone.
(``docs/benchmarks.md``, "the small rewarder on window-relative dense stamps".)

    python benchmarks/dense_probe.py models/small/rewarder /tmp/fl9/rewarder/set --episodes 10
    python benchmarks/dense_probe.py … --split train   # its own training onsets
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

KINDS = ("failure, first", "failure, continued", "normal, failure window", "normal, clean window")


def label_positions(target: str, tokenizer) -> list[tuple[int, int]]:
    """``(token index, label)`` of each group line's label in the rendered dense target."""
    from flora.parsing import Rejection
    from flora.reward.dense import DENSE_GROUPS, parse_dense

    d = parse_dense(target)
    if isinstance(d, Rejection):
        raise ValueError(f"reference does not parse: {d.reason}")
    offsets = tokenizer(target, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    lines = target.split("\n")
    pos = len(lines[0]) + 1
    out = []
    for g in range(1, DENSE_GROUPS + 1):
        c = pos + len(f"{g}: ")
        tok = next(i for i, (a, b) in enumerate(offsets) if a <= c < b)
        out.append((tok, int(d.labels[g - 1])))
        pos += len(lines[g]) + 1
    return out


@torch.no_grad()
def failure_probs(model: Any, processor: Any, ex: Any) -> list[float]:
    """Teacher-forced P("1") at each of the 32 group labels of dense example ``ex``: the
    model reads the reference answer up to ``g: `` and we take the label token's mass."""
    from training.sft import collate, encode_items

    one = processor.tokenizer.convert_tokens_to_ids("1")
    item = encode_items([ex], processor)[0]
    batch = collate([item], processor)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
    n = item.n_target
    # logits at position t predict token t + 1; the target is the sequence's suffix
    return [
        float(torch.softmax(logits[-n - 1 + tok].float(), -1)[one])
        for tok, _ in label_positions(ex.target, processor.tokenizer)
    ]


def probe(
    model_dir: Path, set_dir: Path, episodes: int, split: str = "heldout"
) -> dict[str, list[float]]:
    """P("1") at every group label of the dense examples of ``split`` (``heldout``: the
    evaluation's episodes; ``train``: the first ``episodes`` training episodes, to tell a
    model that fits its own onsets from one that cannot), by kind of group."""
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor
    from training.evaluate import heldout_examples
    from training.sets import load_set
    from training.sft import model_paths

    path, adapter = model_paths(model_dir)
    if adapter is not None:
        raise SystemExit(f"{model_dir}: a PEFT adapter; the rewarder is full-weight")
    proc = load_processor(path, "images")
    model = AutoModelForImageTextToText.from_pretrained(str(path)).eval()
    if split == "train":
        rows = [e for e in load_set(set_dir, split="train") if e.model == "rewarder"]
        keep = sorted({e.episode_id for e in rows})[:episodes]
        held = [e for e in rows if e.episode_id in keep and e.task_kind == "dense"]
    else:
        held = [e for e in heldout_examples("rewarder", set_dir, limit=episodes)
                if e.task_kind == "dense"]  # fmt: skip
    got: dict[str, list[float]] = {k: [] for k in KINDS}
    for ex in held:
        labels = label_positions(ex.target, proc.tokenizer)
        window_fails = any(lab == 1 for _, lab in labels)
        prev = 3
        for p1, (_, lab) in zip(failure_probs(model, proc, ex), labels, strict=True):
            if lab == 1:
                kind = "failure, continued" if prev == 1 else "failure, first"
            elif lab == 3:
                kind = "normal, failure window" if window_fails else "normal, clean window"
            else:
                kind = ""  # suboptimal groups: not part of this question
            if kind:
                got[kind].append(p1)
            prev = lab
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="an exported full-weight rewarder")
    ap.add_argument("set", type=Path, help="a rewarder set (training.sets) with held-out rows")
    ap.add_argument("--episodes", type=int, default=10, help="first N held-out episodes")
    ap.add_argument("--split", choices=("heldout", "train"), default="heldout")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    got = probe(args.model, args.set, args.episodes, args.split)
    print(f"| group | n | mean P(1) | median | 90th pct |  ({args.model}, {args.split})")
    print("| --- | --- | --- | --- | --- |")
    for k in KINDS:
        v = np.asarray(got[k])
        if len(v):
            print(f"| {k} | {len(v)} | {v.mean():.3f} | {np.median(v):.3f} | "
                  f"{np.quantile(v, 0.9):.3f} |")  # fmt: skip
        else:
            print(f"| {k} | 0 | – | – | – |")


if __name__ == "__main__":
    main()
