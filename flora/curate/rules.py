"""Curation rules: a typed (pydantic) model loaded from YAML.

The default rules live in ``flora/curate/rules/default.yaml``; a user file overrides any
subset of fields (missing sections keep their defaults). Times are seconds in the file
(the edge) and microseconds everywhere else. ``docs/curation.md`` explains each rule.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_RULES = Path(__file__).with_name("rules") / "default.yaml"
SPLITS = ("pretrain", "policy", "failures")
STRATA = ("task", "verb", "robot")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OutcomeRule(_Strict):
    """Episodes whose outcome reward is below ``min_reward`` become failures."""

    min_reward: float = Field(0.6, ge=0.0, le=1.0)
    #: An episode with no usable outcome (step failed, NaN reward): keep it unjudged or drop it.
    on_missing: Literal["keep", "drop"] = "keep"


class DenseRule(_Strict):
    """Segments overlapping dense failure (label 1) / suboptimal (label 2) spans."""

    #: A segment whose overlap with failure spans exceeds this share of its length -> failures.
    failure_overlap: float = Field(0.0, ge=0.0, lt=1.0)
    suboptimal: Literal["keep", "drop", "failures"] = "keep"
    #: Spans shorter than this are ignored. Measured in whole 0.5 s groups (a span's
    #: groups × 0.5 s), so the last group, clipped at the episode's end, counts as 0.5 s.
    min_span_s: float = Field(0.5, ge=0.0)


class CaptionRule(_Strict):
    """Caption quality for the pretraining split."""

    min_words: int = Field(2, ge=1)
    max_words: int = Field(40, ge=1)
    #: A rejected/unparseable caption always keeps its segment out of pretrain; ``policy``
    #: keeps the (uncaptioned) segment in the policy split, ``drop`` drops it there too (a
    #: caption the model could not produce can mean a malformed segment).
    on_rejected: Literal["policy", "drop"] = "policy"

    @model_validator(mode="after")
    def _range(self) -> CaptionRule:
        # min > max would silently empty the pretrain split.
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) > max_words ({self.max_words})")
        return self


class DurationRule(_Strict):
    """Segments outside ``min_segment_s``..``max_segment_s`` and short episodes are dropped."""

    min_segment_s: float = Field(0.25, ge=0.0)
    max_segment_s: float = Field(120.0, gt=0.0)
    min_episode_s: float = Field(1.0, ge=0.0)

    @model_validator(mode="after")
    def _range(self) -> DurationRule:
        # min > max would drop every segment.
        if self.min_segment_s > self.max_segment_s:
            raise ValueError(f"min_segment_s ({self.min_segment_s}) > max_segment_s "
                             f"({self.max_segment_s})")  # fmt: skip
        return self


class RebalanceRule(_Strict):
    """Temperature-based mixture weights with per-level caps (``flora.curate.rebalance``)."""

    strata: tuple[str, ...] = STRATA
    temperature: float = Field(2.0, gt=0.0)
    max_share: float = Field(0.35, gt=0.0, le=1.0)
    verb_source: Literal["verb", "cluster"] = "verb"

    @field_validator("strata")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [s for s in v if s not in STRATA]
        if bad or len(set(v)) != len(v):
            raise ValueError(f"strata must be distinct values of {STRATA}, got {list(v)}")
        return v


class CurationRules(_Strict):
    """Every rule of one curation run."""

    outcome: OutcomeRule = OutcomeRule()
    dense: DenseRule = DenseRule()
    caption: CaptionRule = CaptionRule()
    duration: DurationRule = DurationRule()
    splits: tuple[str, ...] = SPLITS
    rebalance: RebalanceRule = RebalanceRule()

    @field_validator("splits")
    @classmethod
    def _splits(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [s for s in v if s not in SPLITS]
        if bad or not v:
            raise ValueError(f"splits must be a non-empty subset of {SPLITS}, got {list(v)}")
        return v

    def sha(self) -> str:
        """Short content hash: a decision made under other rules is redone."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, default=_inf)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _inf(x: Any) -> Any:
    return "inf" if isinstance(x, float) and math.isinf(x) else str(x)


class RulesError(ValueError):
    """A rules file that cannot be used; the message names the file and the field."""


def load_rules(path: str | Path | None = None, **overrides: Any) -> CurationRules:
    """Rules from ``path`` (default: the packaged ``default.yaml``), then ``overrides``.

    ``overrides`` are section dicts, e.g. ``outcome={"min_reward": 0.5}``; sections merge
    field by field with the file.
    """
    p = Path(path) if path else DEFAULT_RULES
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RulesError(f"curation rules {p}: cannot read ({e})") from e
    if not isinstance(data, dict):
        raise RulesError(f"curation rules {p}: top level must be a mapping")
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    try:
        return CurationRules.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")  # a validator's own message
        raise RulesError(f"curation rules {p}: field {loc}: {msg}") from e


__all__ = [
    "DEFAULT_RULES",
    "SPLITS",
    "STRATA",
    "CaptionRule",
    "CurationRules",
    "DenseRule",
    "DurationRule",
    "OutcomeRule",
    "RebalanceRule",
    "RulesError",
    "load_rules",
]
