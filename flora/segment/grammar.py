"""Segmenter output grammar: renderer (SFT targets) and strict parser (DESIGN §3.4).

Grammar (documented in ``docs/grammars.md``, section "Segmenter grammar")::

    output   := "none" | segment ("\\n" segment)*
    segment  := tick " " tick " " flag " " flag          # u v l r
    tick     := "0" | [1-9][0-9]*                         # 20 Hz ticks from window start
    flag     := "0" | "1"

Rules: ``0 <= u < v <= n_ticks``; ``l = 1`` only when ``u = 0`` and ``r = 1`` only when
``v = n_ticks`` (an action can only extend past an edge it touches); lines sorted by
``(u, v, l, r)``, no duplicate lines. Leading/trailing whitespace of the whole text and of
each line is ignored; nothing else is. An empty list is the literal ``none``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from flora.parsing import Rejection, iter_lines
from flora.segment.plan import LocalSegment

NONE_TOKEN = "none"
_INT = re.compile(r"0|[1-9][0-9]*")

# Stable reason codes (the text after the colon gives the detail).
REASONS = (
    "empty",  # nothing but whitespace
    "garbage",  # a field is not a plain non-negative integer
    "field_count",  # a line does not have exactly 4 fields
    "tick_range",  # a tick outside [0, n_ticks]
    "order",  # u >= v
    "bad_flag",  # flag not 0/1, or inconsistent with the tick it refers to
    "unsorted",  # lines not sorted by (u, v)
    "duplicate",  # the same segment twice
)


def render_segments(segments: Sequence[LocalSegment]) -> str:
    """Render one window's segments in the grammar — SFT targets.

    Lines are sorted by ``(u, v, l, r)`` and exact duplicates collapse to one line, which
    is the canonical form the parser accepts.
    """
    segs = sorted(set(segments), key=lambda s: (s.u, s.v, s.left_open, s.right_open))
    if not segs:
        return NONE_TOKEN
    return "\n".join(f"{s.u} {s.v} {int(s.left_open)} {int(s.right_open)}" for s in segs)


def _at_most(n: int) -> str:
    """A regex for the decimal integers ``0..n`` without leading zeros."""
    digits = str(n)
    d = len(digits)
    alts = ["[0-9]"] if d > 1 else []  # every one-digit number when n has more digits
    alts += [f"[1-9][0-9]{{{k - 1}}}" for k in range(2, d)]  # shorter multi-digit numbers
    # d-digit numbers <= n: n's first i digits, then a smaller digit, then anything.
    for i, c in enumerate(digits):
        lo = "1" if i == 0 and d > 1 else "0"
        if int(c) > int(lo):
            hi = str(int(c) - 1)
            rng = lo if hi == lo else f"[{lo}-{hi}]"
            rest = f"[0-9]{{{d - i - 1}}}" if d - i - 1 > 1 else "[0-9]" * (d - i - 1)
            alts.append(f"{digits[:i]}{rng}{rest}")
    alts.append(digits)
    return "(" + "|".join(alts) + ")"


def segments_regex(n_ticks: int) -> str:
    """The grammar as a regular expression, for guided decoding (vLLM
    ``structured_outputs.regex``, ``flora serve``, the in-process backend with
    ``FLORA_GUIDED``).

    It expresses the line layout, ticks in ``[0, n_ticks]`` and the flag rules (``l = 1``
    only with ``u = 0``, ``r = 1`` only with ``v = n_ticks``); order (``u < v``), sorting
    and duplicates are not regular in a compact form and stay with :func:`parse_segments`,
    which remains the judge of every answer.
    """
    if n_ticks < 1:
        raise ValueError(f"n_ticks must be >= 1, got {n_ticks}")
    t, n = _at_most(n_ticks), str(n_ticks)
    line = f"(0 {t} 1 0|0 {n} 1 1|{t} {t} 0 0|{t} {n} 0 1)"
    return f"({NONE_TOKEN}|{line}(\\n{line})*)"


def _rej(code: str, detail: str, text: str) -> Rejection:
    return Rejection(f"{code}: {detail}", text[:2000], kind="parse")


def parse_segments(text: str, n_ticks: int) -> list[LocalSegment] | Rejection:
    """Strictly parse one window's output; return segments or a typed ``Rejection``.

    ``n_ticks`` is the window's tick count (:attr:`Window.n_ticks`). Never raises on any
    string input; the rejection reason starts with one of :data:`REASONS`.
    """
    if not isinstance(text, str):
        return _rej("garbage", f"expected text, got {type(text).__name__}", repr(text))
    body = text.strip()
    if not body:
        return _rej("empty", "no output", text)
    if body == NONE_TOKEN:
        return []
    out: list[LocalSegment] = []
    prev: tuple[int, int, int, int] | None = None
    seen: set[tuple[int, int, int, int]] = set()
    # A tick with more digits than n_ticks is out of range: say so without int(), which
    # refuses strings of more than 4,300 digits (and would be slow long before that).
    max_digits = len(str(n_ticks))
    for lineno, raw in enumerate(iter_lines(body, newline_only=True), start=1):
        fields = raw.strip().split(" ", 4)  # at most 5 pieces, however long the line
        if len(fields) != 4 or any(f == "" for f in fields):
            return _rej(
                "field_count",
                f"line {lineno}: {raw.strip()[:80]!r} is not 4 fields separated by single spaces",
                text,
            )
        if not all(_INT.fullmatch(f) for f in fields):
            return _rej("garbage", f"line {lineno}: {raw.strip()[:80]!r} is not 4 integers", text)
        if any(len(f) > max_digits for f in fields[:2]):
            ticks = ",".join(
                f if len(f) <= 12 else f"{f[:6]}…({len(f)} digits)" for f in fields[:2]
            )
            return _rej("tick_range", f"line {lineno}: ticks {ticks} outside [0, {n_ticks}]", text)
        u, v = int(fields[0]), int(fields[1])
        # A flag longer than one digit is no 0/1 either: 2 stands for "not a flag".
        lf, rf = (int(f) if len(f) == 1 else 2 for f in fields[2:])
        if u > n_ticks or v > n_ticks:
            return _rej("tick_range", f"line {lineno}: ticks {u},{v} outside [0, {n_ticks}]", text)
        if u >= v:
            return _rej("order", f"line {lineno}: u={u} >= v={v}", text)
        if lf not in (0, 1) or rf not in (0, 1):
            return _rej(
                "bad_flag",
                f"line {lineno}: flags must be 0 or 1, got {fields[2][:8]} {fields[3][:8]}",
                text,
            )
        if lf == 1 and u != 0:
            return _rej("bad_flag", f"line {lineno}: left flag set but u={u} != 0", text)
        if rf == 1 and v != n_ticks:
            return _rej("bad_flag", f"line {lineno}: right flag set but v={v} != {n_ticks}", text)
        key = (u, v, lf, rf)
        if key in seen:
            return _rej("duplicate", f"line {lineno}: segment {u} {v} {lf} {rf} repeated", text)
        if prev is not None and key < prev:
            return _rej("unsorted", f"line {lineno}: {key} after {prev}", text)
        seen.add(key)
        prev = key
        out.append(LocalSegment(u, v, bool(lf), bool(rf)))
    return out
