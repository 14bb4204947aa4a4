"""Released ``small`` Flora models: trained weights the project ships under ``models/``.

A production Flora model is fine-tuned from a pretrained Qwen3.5 base; the ``small`` size
has no pretrained base, so ``make demo`` fine-tunes from weights the project trained
itself — the learning benchmark's SFT models (``benchmarks/learning.py --release``) — named
by a recipe's ``init_from``. The random ``small`` base stays each model's untrained
reference. A release is an exported model (``flora_model.json`` with every file's sha256)
plus ``release.json``: how, on what data and how well it was trained (held-out metrics of
the benchmark that trained it). Only full-weight exports are released: a LoRA adapter is
tied to its base and the segmenter starts from its base (DESIGN §3.5).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from training.sft import TrainingError, _replace, check_model_out, verify_model_dir

RELEASE_CARD = "release.json"


def release_model(src: str | Path, dst: str | Path, card: dict[str, Any]) -> Path:
    """Copy the verified full-weight export ``src`` to ``dst`` with ``card`` as release.json.

    ``dst`` is replaced only when it holds an earlier Flora model (never a user's folder);
    the copy is staged and verified before it takes the place of the old release.
    """
    src, dst = Path(src), Path(dst)
    man = verify_model_dir(src)
    if man.get("kind") != "full":
        raise TrainingError(f"{src}: only full-weight exports are released, not {man.get('kind')}")
    check_model_out(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    stage = dst.parent / f".{dst.name}.stage{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(src, stage)
    try:
        full = {"model": man["model"], "base_id": man["base_id"], **card}
        (stage / RELEASE_CARD).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
        verify_model_dir(stage)
        _replace(stage, dst)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return dst


def read_release(path: str | Path) -> dict[str, Any]:
    """The release card of a released model (after verifying its files)."""
    path = Path(path)
    verify_model_dir(path)
    card = path / RELEASE_CARD
    if not card.is_file():
        raise TrainingError(f"{path} is an exported model but not a release (no {RELEASE_CARD})")
    return json.loads(card.read_text())


__all__ = ["RELEASE_CARD", "read_release", "release_model"]
