"""Caption reward ``r_cap`` (seed eq. 17, DESIGN §3.5) and its structured scorer.

``r_cap = 2M / (R + M + F)`` where, for one caption and its reference requirements
``{family, text, mass}``:

* ``R`` — support mass of the reference: the sum of requirement masses;
* ``M`` — mass correctly covered: the sum of masses of requirements the caption states
  and does not contradict (a contradicted requirement is never "covered");
* ``F`` — factual-error penalty: for each error *family* (action, object, coordination,
  spatial, outcome) that has at least one error, the largest mass among that family's
  errors — so an error repeated or re-explained several times costs once per family.
  An error tied to a requirement weighs that requirement's mass; an unsupported claim
  (hallucination, e.g. the neighbouring event's action) weighs the reference's mean
  requirement mass. When ``R = 0`` (no requirements, or every mass 0) every error weighs
  1.0.

Edge cases (documented in ``docs/captioning.md``):

* perfect caption: ``M = R``, ``F = 0`` -> 1;
* empty caption with ``R > 0``: ``M = F = 0`` -> 0 (the judge is not called);
* no requirements or only mass-0 ones (``R = 0``): 1 when there is no factual error
  (nothing was asked and nothing false was said — an empty caption), 0 as soon as
  anything is claimed that the judge counts as an error (``2·0 / (0 + 0 + F)``, each
  error weighing 1.0).

Which requirements are covered and which claims are errors is decided by a ``Judge``:
``flora.caption.judges.EmbeddingJudge`` (local MiniLM sentence embeddings + a contrast
set) or ``flora.caption.judges.LLMJudge`` (any OpenAI-compatible VLM backend).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from flora.parsing import Rejection

FAMILIES = ("action", "object", "coordination", "spatial", "outcome")
_EPS = 1e-9


@dataclass(frozen=True)
class Requirement:
    """One thing a correct caption must state: its semantic family, text and weight."""

    family: str
    text: str
    mass: float = 1.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"requirement family {self.family!r} not in {FAMILIES}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("requirement text must be a non-empty string")
        m = float(self.mass)
        if not math.isfinite(m) or m < 0:
            raise ValueError(f"requirement mass must be finite and >= 0, got {self.mass!r}")


def as_requirements(items: Any) -> list[Requirement]:
    """Coerce requirements given as a JSON string, dicts or objects into ``Requirement``s."""
    if items is None:
        return []
    if isinstance(items, str):
        items = json.loads(items) if items.strip() else []
    out: list[Requirement] = []
    for it in items:
        if isinstance(it, Requirement):
            out.append(it)
        elif isinstance(it, Mapping):
            out.append(Requirement(str(it["family"]), str(it["text"]), float(it["mass"])))
        else:
            out.append(Requirement(str(it.family), str(it.text), float(it.mass)))
    return out


@dataclass(frozen=True)
class FactualError:
    """A false claim in a caption: its family, the offending words and what it contradicts.

    ``requirement`` is the index of the contradicted requirement, or None for an
    unsupported claim (hallucination).
    """

    family: str
    claim: str
    requirement: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"error family {self.family!r} not in {FAMILIES}")


@dataclass(frozen=True)
class Judgment:
    """A judge's verdict on one caption: covered requirement indices and factual errors."""

    covered: tuple[int, ...] = ()
    errors: tuple[FactualError, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CapScore:
    """``R``, ``M``, ``F``, the reward, and the per-family penalties that made up ``F``."""

    R: float
    M: float
    F: float
    reward: float
    covered: tuple[int, ...]
    contradicted: tuple[int, ...]
    family_penalty: Mapping[str, float]


def r_cap(R: float, M: float, F: float) -> float:
    """Caption reward ``2M / (R + M + F)`` (seed eq. 17), in ``[0, 1]``.

    ``R, M, F >= 0`` and ``M <= R`` are required. ``R = M = F = 0`` (nothing required,
    nothing wrong) is defined as 1.0.
    """
    for name, v in (("R", R), ("M", M), ("F", F)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"r_cap: {name} must be finite and >= 0, got {v!r}")
    if M > R + _EPS:
        raise ValueError(f"r_cap: covered mass M={M} exceeds reference mass R={R}")
    den = R + M + F
    if den <= _EPS:
        return 1.0
    return 2.0 * M / den


def score_judgment(requirements: Sequence[Requirement], judgment: Judgment) -> CapScore:
    """Turn a judge's verdict into ``R``, ``M``, ``F`` and ``r_cap`` (rules in the module doc)."""
    reqs = as_requirements(requirements)
    n = len(reqs)
    for k in list(judgment.covered) + [
        e.requirement for e in judgment.errors if e.requirement is not None
    ]:
        if not isinstance(k, int) or not 0 <= k < n:
            raise ValueError(f"judgment names requirement {k!r}; reference has {n}")
    R = sum(float(r.mass) for r in reqs)
    # R = 0 (no requirements, or only mass-0 ones): nothing asked, so any error weighs 1.0
    # and makes r_cap 0 (else it would weigh 0 and leave the reward at 1).
    zero = R <= _EPS
    halluc_mass = 1.0 if zero else R / n
    contradicted = sorted({e.requirement for e in judgment.errors if e.requirement is not None})
    covered = sorted(set(judgment.covered) - set(contradicted))
    M = min(R, sum(float(reqs[k].mass) for k in covered))
    penalty: dict[str, float] = {}
    for e in judgment.errors:
        if e.requirement is None or zero:
            m = halluc_mass
        else:
            m = float(reqs[e.requirement].mass)
        penalty[e.family] = max(penalty.get(e.family, 0.0), m)  # once per family
    F = sum(penalty.values())
    return CapScore(
        R=R,
        M=M,
        F=F,
        reward=r_cap(R, M, F),
        covered=tuple(covered),
        contradicted=tuple(contradicted),
        family_penalty=dict(sorted(penalty.items())),
    )


@runtime_checkable
class Judge(Protocol):
    """Decides coverage and factual errors of captions against requirements, in batches.

    ``judge_batch`` returns one ``Judgment`` per ``(caption, requirements)`` pair, in order,
    or a ``Rejection`` for an item the judge could not decide (e.g. an LLM judge whose
    answers kept failing its grammar); the caller records it, never fills it.
    """

    name: str

    def judge_batch(
        self, items: Sequence[tuple[str, Sequence[Requirement]]]
    ) -> list[Judgment | Rejection]: ...


def score_captions(judge: Judge, items: Iterable[tuple[str, Any]]) -> list[CapScore | Rejection]:
    """Score many ``(caption, requirements)`` pairs with one judge.

    Empty captions are scored without calling the judge (``M = F = 0``).
    """
    pairs = [(c or "", as_requirements(r)) for c, r in items]
    todo = [i for i, (c, _) in enumerate(pairs) if c.strip()]
    verdicts = judge.judge_batch([pairs[i] for i in todo]) if todo else []
    if len(verdicts) != len(todo):
        raise RuntimeError(f"judge {judge.name} returned {len(verdicts)} for {len(todo)} items")
    by_item: dict[int, Judgment | Rejection] = dict(zip(todo, verdicts, strict=True))
    out: list[CapScore | Rejection] = []
    for i, (_, reqs) in enumerate(pairs):
        v = by_item.get(i, Judgment())
        out.append(v if isinstance(v, Rejection) else score_judgment(reqs, v))
    return out


def score_caption(judge: Judge, caption: str, requirements: Any) -> CapScore | Rejection:
    """Score one caption against its requirements with ``judge``."""
    return score_captions(judge, [(caption, requirements)])[0]


__all__ = [
    "FAMILIES",
    "CapScore",
    "FactualError",
    "Judge",
    "Judgment",
    "Requirement",
    "as_requirements",
    "r_cap",
    "score_caption",
    "score_captions",
    "score_judgment",
]
