"""Does a trained model read its frames? Its target loss with its own frames vs another's.

For every item the target's teacher-forced loss (the SFT loss: summed token CE over the
target) is computed twice — with the item's own frames, and with the frames of a *donor*:
the next item of the same task kind and frame count from another episode (cyclic, so
deterministic). Prompt and target stay the item's own, so the difference measures only
what the frames contribute. A model that uses its video pays for the wrong frames
(Δ > 0); one that writes from the prompt alone does not (Δ ≈ 0). Run it with
``benchmarks/frame_reliance.py``; results in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from training.sets import Example

COLUMNS = ("example_id", "episode_id", "task_kind", "donor_id", "tokens", "own", "swapped")


def donors(examples: Sequence[Example]) -> dict[int, int]:
    """Index of each item's donor: the next item of its (task kind, frame count) group that
    belongs to another episode. Items whose group holds one episode only get none."""
    groups: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for i, e in enumerate(examples):
        groups[(e.task_kind, len(e.images))].append(i)
    out: dict[int, int] = {}
    for idx in groups.values():
        for j, i in enumerate(idx):
            for k in range(1, len(idx)):
                d = idx[(j + k) % len(idx)]
                if examples[d].episode_id != examples[i].episode_id:
                    out[i] = d
                    break
    return out


def with_frames(example: Example, donor: Example) -> Example:
    """``example`` with ``donor``'s frames (and their decoded cache dropped)."""
    return dataclasses.replace(example, images=list(donor.images), _decoded=None)


def target_nll(model: Any, processor: Any, examples: Sequence[Example]) -> list[tuple[float, int]]:
    """(summed target cross-entropy, target tokens) of each example, as SFT counts them."""
    from training.sft import collate, encode_items, summed_ce

    with torch.no_grad():  # one example per forward: no padding, each row's own sum
        return [
            (float(summed_ce(model, collate([it], processor))), it.n_target)
            for it in encode_items(examples, processor)
        ]


def frame_swap_table(
    model: Any, processor: Any, examples: Sequence[Example], progress: bool = False
) -> pd.DataFrame:
    """One row per item that has a donor: target tokens, loss with own and donor frames."""
    from tqdm import tqdm

    pick = donors(examples)
    rows = []
    for i in tqdm(sorted(pick), desc="frame swap", unit="item", disable=not progress):
        e, d = examples[i], examples[pick[i]]
        (own, n), (swapped, _) = target_nll(model, processor, [e, with_frames(e, d)])
        rows.append((e.example_id, e.episode_id, e.task_kind, d.example_id, n, own, swapped))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def reliance_metrics(table: pd.DataFrame) -> dict[str, float]:
    """Token-weighted loss per target token with own / donor frames and their difference."""
    n = float(table["tokens"].sum())
    own, swapped = table["own"].sum() / n, table["swapped"].sum() / n
    return {"own_nll": own, "swapped_nll": swapped, "delta": swapped - own,
            "relative_delta": (swapped - own) / own}  # fmt: skip
