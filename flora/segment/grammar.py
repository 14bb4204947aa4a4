"""Segmenter output grammar: renderer (SFT targets) and strict parser (DESIGN §3.4).

Grammar (documented in ``docs/grammars.md``, section "Segmenter grammar")::

    output   := "none" | segment ("\\n" segment)*
    segment  := tick " " tick " " flag " " flag          # u v l r
    tick     := "0" | [1-9][0-9]*                         # 20 Hz ticks from window start
    flag     := "0" | "1"

Rules: ``0 <= u < v <= n_ticks``; ``l = 1`` only when ``u = 0`` and ``r = 1`` only when
``v = n_ticks`` (an action can only extend past an edge it touches); lines sorted by
``(u, v)``, no two lines with the same ``(u, v)`` — whatever their flags: two such lines
would stitch into two identical events. Leading/trailing whitespace of the whole text and
of each line is ignored; nothing else is. An empty list is the literal ``none``.
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
    "duplicate",  # two lines with the same (u, v), whatever their flags
)


def canonical_segments(segments: Sequence[LocalSegment]) -> list[LocalSegment]:
    """The canonical form of one window's segments: sorted by ``(u, v)``, one segment per
    ``(u, v)``.

    Segments with the same ticks collapse to one whose flags are the OR of theirs (some
    action on that span continues past the edge); the grammar has no way to say two
    actions share a span, and two such lines would stitch into two identical events.
    """
    flags: dict[tuple[int, int], tuple[bool, bool]] = {}
    for s in segments:
        lf, rf = flags.get((s.u, s.v), (False, False))
        flags[(s.u, s.v)] = (lf or bool(s.left_open), rf or bool(s.right_open))
    return [LocalSegment(u, v, lf, rf) for (u, v), (lf, rf) in sorted(flags.items())]


def render_segments(segments: Sequence[LocalSegment]) -> str:
    """Render one window's segments in the grammar — SFT targets.

    Renders :func:`canonical_segments` (sorted by ``(u, v)``, segments with the same ticks
    collapsed, flags OR'd), the canonical form the parser accepts.
    """
    segs = canonical_segments(segments)
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
    prev: tuple[int, int] | None = None
    seen: dict[tuple[int, int], int] = {}  # (u, v) -> line number
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
        key = (u, v)
        if key in seen:
            # Same ticks, whatever the flags: two identical events once stitched.
            return _rej(
                "duplicate",
                f"line {lineno}: segment {u} {v} repeats the ticks of line {seen[key]}",
                text,
            )
        if prev is not None and key < prev:
            return _rej("unsorted", f"line {lineno}: {key} after {prev}", text)
        seen[key] = lineno
        prev = key
        out.append(LocalSegment(u, v, bool(lf), bool(rf)))
    return out


# --------------------------------------------------------------------------- exact guide

_GUIDE_CACHE = 200_000  # checked-line prefixes kept per guide before starting afresh


def _candidates(p: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """Intervals of the integers in ``[lo, hi]`` whose decimal form (no leading zero)
    starts with the digit string ``p`` (``""``: every one)."""
    if lo > hi:
        return []
    if p == "":
        return [(lo, hi)]
    if p == "0":
        return [(0, 0)] if lo <= 0 <= hi else []
    if p[0] == "0" or not (p.isascii() and p.isdigit()):
        return []  # a leading zero, or not ASCII digits ('²', '٣' and '０' are isdigit())
    out = []
    for extra in range(len(str(hi)) - len(p) + 1):
        a, b = int(p + "0" * extra), int(p + "9" * extra)
        a, b = max(a, lo), min(b, hi)
        if a <= b:
            out.append((a, b))
    return out


class SegmentsGuide:
    """The segment grammar *exactly*, for decoding: whether a text can still be completed
    to an answer :func:`parse_segments` accepts in canonical form (``none`` or lines
    ``u v l r``, one space, ``0 <= u < v <= n``, the flag rules, lines strictly increasing
    in ``(u, v)`` — so never two lines with the same ticks).

    Unlike :func:`segments_regex` it knows ``u < v`` and the line order, which no compact
    regex states; a logits mask built on it (:class:`flora.backends.guided.PrefixMask`)
    leaves the model only answers that parse. ``flora serve`` and the in-process backend
    use it for a request whose regex is exactly ``segments_regex(n)``.
    """

    def __init__(self, n_ticks: int):
        if n_ticks < 1:
            raise ValueError(f"n_ticks must be >= 1, got {n_ticks}")
        self.n = n_ticks
        self._lines: dict[str, tuple[int, int, int, int] | None | bool] = {}

    def _full(self, line: str) -> tuple[int, int, int, int] | None:
        f = line.split(" ")
        width = len(str(self.n))
        if len(f) != 4 or not all(_INT.fullmatch(x) and len(x) <= width for x in f):
            return None
        u, v, lf, rf = (int(x) for x in f)
        if not (0 <= u < v <= self.n) or lf > 1 or rf > 1:
            return None
        if (lf and u != 0) or (rf and v != self.n):
            return None
        return (u, v, lf, rf)

    def _done(self, body: str) -> tuple[int, int, int, int] | None | bool:
        """The bound a next line must exceed after the complete lines ``body`` (all valid,
        strictly increasing in ``(u, v)``): ``(u, v, 1, 1)`` of the last line, so that no
        line with the same ticks follows whatever its flags; ``False`` if the lines are not
        valid and increasing; ``None`` for no lines."""
        if body in self._lines:
            return self._lines[body]
        if len(self._lines) > _GUIDE_CACHE:  # a long-running server: bounded memory
            self._lines.clear()
        prev: tuple[int, int, int, int] | None | bool = None
        if body:
            head, nl, last = body.rpartition("\n")
            before = (self._done(head) if head else False) if nl else None
            cur = self._full(last)
            if before is False or cur is None or (before is not None and cur <= before):
                prev = False
            else:
                prev = (cur[0], cur[1], 1, 1)  # flags are 0/1: the next (u, v) must be larger
        self._lines[body] = prev
        return prev

    def _tail(self, k: tuple[int, ...], prev: tuple[int, int, int, int]) -> bool:
        """Whether a line starting with the fields ``k`` can end above ``prev``."""
        n = self.n
        # Largest completion of the remaining fields; lines compare lexicographically.
        best = list(k)
        if len(best) < 2:
            best.append(n)
        if len(best) < 3:
            best.append(1 if best[0] == 0 else 0)
        if len(best) < 4:
            best.append(1 if best[1] == n else 0)
        return tuple(best) > prev

    def extendable(self, text: str) -> bool:
        """Whether ``text`` is a prefix of a valid canonical answer."""
        if NONE_TOKEN.startswith(text):
            return True
        head, nl, last = text.rpartition("\n")
        prev = (self._done(head) if head else False) if nl else None
        if prev is False:
            return False
        fields = last.split(" ")
        width = len(str(self.n))
        if len(fields) > 4 or any(len(x) > width for x in fields):
            return False
        if not all(_INT.fullmatch(x) for x in fields[:-1]):
            return False
        p = fields[-1]
        if p and not (p.isascii() and p.isdigit()):
            return False  # str.isdigit() alone admits '²', '٣', '０': int() fails or accepts them
        done = [int(x) for x in fields[:-1]]
        # Each finished field must be valid; the partial one must have a valid completion.
        for i, x in enumerate(done):
            if not self._field_ok(i, done[:i], x, prev):
                return False
        lo, hi = self._range(len(done), done)
        # The largest value of each interval decides: fields compare lexicographically
        # against the previous line, so if its largest value cannot follow, none can.
        return any(self._field_ok(len(done), done, b, prev) for _, b in _candidates(p, lo, hi))

    def _range(self, i: int, done: list[int]) -> tuple[int, int]:
        n = self.n
        if i == 0:
            return 0, n - 1
        if i == 1:
            return done[0] + 1, n
        if i == 2:
            return 0, 1 if done[0] == 0 else 0
        return 0, 1 if done[1] == n else 0

    def _field_ok(self, i: int, before: list[int], x: int, prev: tuple | None | bool) -> bool:
        lo, hi = self._range(i, before)
        if not lo <= x <= hi:  # the range already holds u < v and the flag rules
            return False
        if not prev:
            return True
        k = (*before, x)
        head = tuple(prev[: len(k)])
        if k != head:
            return k > head
        return self._tail(k, prev) if len(k) < 4 else False

    def complete(self, text: str) -> bool:
        """Whether ``text`` is a whole valid canonical answer."""
        if text == NONE_TOKEN:
            return True
        if not text or text.endswith("\n"):
            return False
        return self._done(text) not in (None, False)


def guide_for_regex(pattern: str) -> SegmentsGuide | None:
    """The exact guide of a pattern that is exactly ``segments_regex(n)``, else ``None``."""
    m = re.search(r"\|0 ([1-9][0-9]*) 1 1\|", pattern)
    if m is None or len(m.group(1)) > 6:
        return None
    n = int(m.group(1))
    return SegmentsGuide(n) if segments_regex(n) == pattern else None
