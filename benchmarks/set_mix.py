"""How much each task kind of an SFT set weighs in the loss.  (not a timed test)

DESIGN §3.5's SFT loss is summed over the target tokens of a batch and divided by their
count, so a task kind pulls on the model by its share of *target tokens*, not of items.
For a co-trained set (the rewarder's outcome, dense and rubric items) the two differ by
orders of magnitude: on a world-2 rewarder set outcome items are 15 % of the items and
0.43 % of the target tokens (docs/benchmarks.md, "The small rewarder trained on world 2").

    python benchmarks/set_mix.py --set RUN/rewarder/set --model-dir models/small/rewarder/model

Counts the tokens the trainer labels (``target + <|im_end|>``, the model's tokenizer;
``training.sft.encode_items``) over one split (default ``train``) and prints a table.
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class KindShare:
    """One task kind's items and labelled target tokens, and their shares of the set's."""

    items: int
    item_share: float
    target_tokens: int
    token_share: float
    tokens_per_item: float


def kind_mix(examples: Iterable[Any], count: Callable[[str], int]) -> dict[str, KindShare]:
    """Per ``task_kind``: items and target tokens (``count(target)``), with their shares of
    the whole; kinds in first-seen order. No examples is a ``ValueError`` (no shares)."""
    items: collections.Counter[str] = collections.Counter()
    tokens: collections.Counter[str] = collections.Counter()
    for ex in examples:
        items[ex.task_kind] += 1
        tokens[ex.task_kind] += count(ex.target)
    n_items, n_tokens = sum(items.values()), sum(tokens.values())
    if not n_items:
        raise ValueError("no examples to weigh")
    return {
        kind: KindShare(
            items=items[kind],
            item_share=items[kind] / n_items,
            target_tokens=tokens[kind],
            token_share=tokens[kind] / n_tokens if n_tokens else 0.0,
            tokens_per_item=tokens[kind] / items[kind],
        )
        for kind in items
    }


def mix_table(mix: dict[str, KindShare]) -> str:
    """The mix as a markdown table."""
    lines = [
        "| kind | items | item share | target tokens | token share | tokens per item |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, s in mix.items():
        lines.append(
            f"| {kind} | {s.items} | {s.item_share:.1%} | {s.target_tokens} | "
            f"{s.token_share:.2%} | {s.tokens_per_item:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, required=True, help="an SFT set directory")
    ap.add_argument("--model-dir", type=Path, required=True, help="whose tokenizer to count with")
    ap.add_argument("--split", default="train", choices=["train", "heldout", "all"])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from training.sets import load_set
    from training.sft import END

    tok = AutoTokenizer.from_pretrained(str(args.model_dir))

    def count(target: str) -> int:
        return len(tok(target + END, add_special_tokens=False)["input_ids"])

    examples = load_set(args.set, split=None if args.split == "all" else args.split)
    try:
        mix = kind_mix(examples, count)
    except ValueError as e:
        raise SystemExit(f"{args.set}: split {args.split!r}: {e}") from e
    if args.json:
        print(json.dumps({k: asdict(v) for k, v in mix.items()}, indent=1))
    else:
        print(mix_table(mix))


if __name__ == "__main__":
    main()
