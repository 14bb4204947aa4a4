"""Rubric reward (DESIGN §3.3, seed §4 eq. 3): user steps, allowed scores, R = Σ ŷ_j.

A rubric is ``{"task": str, "steps": [{"name", "description", "allowed": [floats]}]}``
(YAML or JSON). It is refused unless ``Σ_j max V_j == 1`` within 1e-6. The model may
think first, then scores every step once::

    <think>
    free text (optional block, at the very start only)
    </think>
    <step name>: <score>
    ...

Each step of the rubric appears exactly once (any order); each score must be one of the
step's allowed values (compared within 1e-6, then snapped to the allowed value). Missing,
extra, duplicated or out-of-set scores reject the parse.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flora.parsing import Rejection, iter_lines

SUM_TOL = 1e-6
VALUE_TOL = 1e-6
_THINK = re.compile(r"\A\s*<think>(.*?)</think>", re.DOTALL)
_NUM = re.compile(r"\A[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


class RubricError(ValueError):
    """A rubric (or a score set) that breaks eq. (3): the message says which part."""


class Step(BaseModel):
    """One rubric step j with its allowed score set V_j."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    allowed: tuple[float, ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        v = v.strip()
        # The name is the key of a grammar line, so it must be one line without ':'. One
        # line as the parser splits (str.splitlines: \r, \v, \x1c, \u2028 … not only \n).
        if not v or ":" in v or v.startswith("<"):
            raise ValueError(f"step name {v!r} must be non-empty, one line, without ':' or '<'")
        if v.splitlines() != [v]:
            raise ValueError(
                f"step name {v!r} must be one line: it holds a line break (\\n, \\r, \\v, "
                "\\f, \\x1c-\\x1e, \\x85, \\u2028 or \\u2029)"
            )
        return v

    @field_validator("allowed")
    @classmethod
    def _allowed(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        vals = [float(x) for x in v]
        if any(not math.isfinite(x) for x in vals):
            raise ValueError(f"allowed scores must be finite, got {vals}")
        s = sorted(vals)
        if any(b - a <= 2 * VALUE_TOL for a, b in zip(s, s[1:], strict=False)):
            raise ValueError(f"allowed scores must be distinct (more than 2e-6 apart): {vals}")
        return tuple(vals)


class Rubric(BaseModel):
    """A task rubric. Construction refuses ``Σ max V_j != 1`` (within 1e-6)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    steps: tuple[Step, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Rubric:
        names = [s.name for s in self.steps]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rubric {self.task!r}: duplicate step names {dup}")
        total = math.fsum(max(s.allowed) for s in self.steps)
        if abs(total - 1.0) > SUM_TOL:
            raise ValueError(
                f"rubric {self.task!r}: maxima sum to {total:.6g}, must be 1 (within 1e-6)"
            )
        return self

    @property
    def step_names(self) -> list[str]:
        return [s.name for s in self.steps]

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)


def load_rubric(src: str | Path | Mapping[str, Any]) -> Rubric:
    """Build a ``Rubric`` from a dict, or a ``.json`` / ``.yaml`` / ``.yml`` file.

    Raises ``RubricError`` naming the file and the broken rule (e.g. "maxima sum to 0.9").
    """
    where = "rubric"
    if isinstance(src, Mapping):
        data: Any = dict(src)
    else:
        p = Path(src)
        where = str(p)
        try:
            text = p.read_text()
        except OSError as e:
            raise RubricError(f"{where}: cannot read rubric: {e}") from e
        try:
            data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as e:
            raise RubricError(f"{where}: not valid JSON/YAML: {e}") from e
    try:
        return Rubric.model_validate(data)
    except ValidationError as e:
        msgs = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or 'rubric'}: {err['msg']}"
            for err in e.errors()
        )
        raise RubricError(f"{where}: {msgs}") from e


def _snap(step: Step, value: float) -> float | None:
    for a in step.allowed:
        if abs(a - value) <= VALUE_TOL:
            return a
    return None


def score(rubric: Rubric, scores: Mapping[str, float]) -> float:
    """Eq. (3): ``R = Σ_j ŷ_j`` after checking every step is scored once from ``V_j``.

    Raises ``RubricError`` for a missing or unknown step or a score outside its set.
    """
    names = set(rubric.step_names)
    extra = sorted(set(scores) - names)
    missing = [n for n in rubric.step_names if n not in scores]
    if extra or missing:
        raise RubricError(f"rubric {rubric.task!r}: missing steps {missing}, unknown {extra}")
    total = 0.0
    for s in rubric.steps:
        v = _snap(s, float(scores[s.name]))
        if v is None:
            raise RubricError(
                f"rubric {rubric.task!r}: step {s.name!r} score {scores[s.name]} not in "
                f"allowed set {list(s.allowed)}"
            )
        total += v
    return total


def format_score(v: float) -> str:
    """Shortest decimal text for an allowed score that parses back to it within 1e-6."""
    text = f"{v:.6g}"
    if abs(float(text) - v) > VALUE_TOL:  # pragma: no cover - .6g is enough for |v| <= 1
        text = repr(float(v))
    return text


def render_rubric(rubric: Rubric, scores: Mapping[str, float], thinking: str | None = None) -> str:
    """SFT target: optional ``<think>…</think>`` block, then ``name: score`` per step."""
    score(rubric, scores)  # validates before rendering: targets must parse
    lines = []
    if thinking is not None:
        if "</think>" in thinking:
            raise RubricError("thinking text must not contain '</think>'")
        lines.append(f"<think>\n{thinking.strip()}\n</think>")
    for s in rubric.steps:
        lines.append(f"{s.name}: {format_score(_snap(s, float(scores[s.name])))}")  # type: ignore[arg-type]
    return "\n".join(lines)


def _regex_literal(text: str) -> str:
    # Only the metacharacters: ``re.escape`` also escapes spaces, which some guided-decoding
    # regex engines (vLLM's backends) may not accept.
    return "".join("\\" + c if c in ".^$*+?{}[]\\|()" else c for c in text)


def rubric_regex(rubric: Rubric, think: bool = True) -> str:
    """The grammar for ``rubric`` as a regular expression, for guided decoding: an optional
    think block (``think=True``), then one ``name: score`` line per step in rubric order,
    each score one of the step's allowed values as :func:`format_score` writes it."""
    lines = []
    for s in rubric.steps:
        values = "|".join(_regex_literal(format_score(v)) for v in s.allowed)
        lines.append(f"{_regex_literal(s.name)}: ({values})")
    body = "\\n".join(lines)
    return f"(<think>\\n[^<]*\\n</think>\\n)?{body}" if think else body


def parse_rubric(rubric: Rubric, text: str) -> dict[str, float] | Rejection:
    """Strict parser: per-step scores (snapped to ``V_j``) in rubric order, or a Rejection."""
    if not isinstance(text, str):
        return Rejection(f"rubric: expected text, got {type(text).__name__}", repr(text))
    body = text
    m = _THINK.match(text)
    if m is not None:
        body = text[m.end() :]
    elif "<think>" in text or "</think>" in text:
        return Rejection("rubric: a think block must open the output and be closed once", text)
    if "<think>" in body or "</think>" in body:
        return Rejection("rubric: only one think block is allowed, at the start", text)
    got: dict[str, float] = {}
    # Lazily: an answer of millions of lines is rejected at its first bad or repeated one.
    for raw in iter_lines(body):
        line = raw.strip()
        if not line:
            continue
        name, sep, val = line.rpartition(":")
        name, val = name.strip(), val.strip()
        if not sep or not name:
            return Rejection(f"rubric: line {line[:80]!r} is not '<step>: <score>'", text)
        if name not in rubric.step_names:
            return Rejection(f"rubric: unknown (extra) step {name[:80]!r}", text)
        if name in got:
            return Rejection(f"rubric: step {name!r} scored twice", text)
        if not _NUM.match(val):
            return Rejection(f"rubric: step {name!r} score {val[:40]!r} is not a number", text)
        # float() of a very long number is inf (never an error); _snap then finds no match.
        snapped = _snap(rubric.step(name), float(val))
        if snapped is None:
            return Rejection(
                f"rubric: step {name!r} score {val[:40]} not in allowed set "
                f"{list(rubric.step(name).allowed)}",
                text,
            )
        got[name] = snapped
    missing = [n for n in rubric.step_names if n not in got]
    if missing:
        return Rejection(f"rubric: missing steps {missing}", text)
    return {n: got[n] for n in rubric.step_names}
