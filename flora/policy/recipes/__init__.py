"""Named policy fine-tuning recipes (``flora policy train --recipe NAME``).

A recipe is a YAML file beside this module whose keys are :class:`PolicyTrainConfig`
fields (plus a ``description``). Explicit command-line options override it.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

RECIPE_DIR = Path(__file__).parent


def recipe_names() -> list[str]:
    """Names of the shipped recipes."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def load_recipe(name: str) -> dict[str, Any]:
    """The recipe's config fields (``description`` removed); unknown names/keys raise."""
    from flora.policy.lerobot import PolicyTrainConfig

    path = RECIPE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown policy recipe {name!r}; expected one of {recipe_names()}")
    raw = yaml.safe_load(path.read_text()) or {}
    raw.pop("description", None)
    known = {f.name for f in fields(PolicyTrainConfig)}
    bad = sorted(set(raw) - known)
    if bad:
        raise ValueError(f"policy recipe {name!r} ({path}): unknown fields {bad}")
    return {**raw, "recipe": name}


__all__ = ["RECIPE_DIR", "load_recipe", "recipe_names"]
