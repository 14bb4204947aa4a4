"""What a Flora model learnt from: the episodes its lineage trained on.

A model continued from another (a recipe's ``init_from``) must not be scored on an
episode its starting point trained on, and the set it is scored on cannot know that when
the two models were trained on different sets: the split hashes the whole episode id,
dataset name included. Toy worlds of one seed and kind draw episode *i* alike at every
size, so ``toy_120_1/000019`` and ``toy_240_1/000019`` are one episode that hashes to
different splits (``docs/training.md``, "A continued model is scored only on episodes its
lineage never saw").
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from training.sft import MODEL_MANIFEST, TrainingError, read_model_manifest

# toy_<episodes>_<seed>[_quick]/<index>: the id scheme of flora.toy.generate_dataset.
_TOY = re.compile(r"\Atoy_\d+_(\d+)(_quick)?/(\d+)\Z")


def trained_episodes(model_dir: str | Path) -> set[str]:
    """Every episode id a Flora export learnt from: its set's train split, the held-out
    episodes that selected its state (``selected_on``, GRPO's probe), those of a base that
    is itself a Flora export (``base_lineage``) and, through the
    ``init_from`` it records, the train splits of every model it was continued from —
    as written into the export when it was trained (``init_from.train_episodes``), else
    by following the ancestor's path (exports written before that field).

    An export whose set recorded no episode lists (a bare examples file), or an
    ``init_from`` no longer on disk or now holding other weights than the recorded digest,
    raises :class:`TrainingError`, not an empty set: the lineage would be unknown.
    """
    path = Path(model_dir)
    man = read_model_manifest(path)
    train = (man.get("set_manifest") or {}).get("episodes", {}).get("train")
    if train is None:
        raise TrainingError(f"{path}: its set manifest records no training episodes")
    # Episodes that chose the exported state (GRPO's held-out probe) count as seen.
    ids = set(train) | set((man.get("selected_on") or {}).get("episodes") or [])
    # A base that is itself a Flora export (a released captioner under a segmenter's LoRA)
    # learnt from its own episodes: recorded at export, never followed on disk.
    base = man.get("base_lineage")
    if base is not None:
        if base.get("train_episodes") is None:
            raise TrainingError(
                f"{path}: trained over the base of {base.get('path')}, whose training "
                "episodes were unknown when it was exported"
            )
        ids |= set(base["train_episodes"])
    init = man.get("init_from") or {}
    if init.get("train_episodes") is not None:  # recorded at export: no ancestor needed
        return ids | set(init["train_episodes"])
    if init.get("path"):
        parent = Path(init["path"])
        if not (parent / MODEL_MANIFEST).is_file():
            raise TrainingError(f"{path}: continued from {parent}, which is not on disk")
        # The weights it started from are recorded by digest: a folder that now holds
        # others (a newer release) is not its ancestor.
        files = read_model_manifest(parent).get("files") or {}
        if init.get("sha256") and init["sha256"] not in files.values():
            raise TrainingError(
                f"{path}: continued from {parent}, which now holds other weights "
                f"(sha256 {init['sha256'][:12]}… is not among its files)"
            )
        ids |= trained_episodes(parent)
    return ids


def same_world_ids(ids: Collection[str], dataset: str) -> set[str]:
    """``ids`` written as ids of the dataset named ``dataset``: the ones among them that
    are episodes of it.

    Toy worlds: ids of the same seed and kind map across world sizes
    (``toy_120_1/000005`` is ``toy_240_1/000005``); another seed or kind, or a non-toy
    id, is another episode and maps to nothing. When ``dataset`` is no toy world, ids keep
    their names: an episode's id is its own there.
    """
    m = _TOY.match(f"{dataset}/0")
    if m is None:
        return set(ids)
    out = set()
    for i in ids:
        t = _TOY.match(i)
        if t is not None and t.group(1, 2) == m.group(1, 2):
            out.add(f"{dataset}/{t.group(3)}")
    return out


def seen_in(model_dir: str | Path, dataset: str) -> set[str]:
    """Ids, in ``dataset``, of every episode the model at ``model_dir`` (or a model it was
    continued from) trained on. Raises :class:`TrainingError` when the lineage is unknown."""
    return same_world_ids(trained_episodes(model_dir), dataset)


def base_seen_in(base: str, dataset: str) -> set[str]:
    """Ids, in ``dataset``, of the episodes a recipe's ``base`` learnt from: those of a base
    that is a folder of a Flora export (the released small captioner under the small
    segmenter's LoRA); none for a built size or a hub model. Read before training, so a
    benchmark can leave them out of every variant it scores, the untrained base included.
    Raises :class:`TrainingError` when that export's lineage is unknown."""
    from training.sft import base_ancestry
    from training.sizes import SIZES, resolve_base

    if base in SIZES and SIZES[base].built:
        return set()
    anc = base_ancestry(resolve_base(base))
    if anc is None:
        return set()
    if anc.get("train_episodes") is None:
        raise TrainingError(f"base {base}: the training episodes of {anc['path']} are unknown")
    return same_world_ids(anc["train_episodes"], dataset)


__all__ = ["base_seen_in", "same_world_ids", "seen_in", "trained_episodes"]
