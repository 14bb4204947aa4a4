"""Dense reward (DESIGN §3.3, §3.7; seed §5 eq. 22): windows, grammar, stitching.

Window k covers ``[10k s, 10k s + 16 s)``: 64 frames at 4 Hz, paired into 32 groups of
0.5 s. Group g (1..32) covers ``[10k + 0.5(g-1), 10k + 0.5g)`` s and its frames sit at
``10k + 0.5(g-1)`` and ``+ 0.25`` s. Labels are retrospective, so the last 4 s (groups
25..32) of every non-final window are trimmed; the final window keeps every group that
starts before T. Overlapping retained groups are resolved per time point by eq. (22)::

    (k*, g*) = lexmin over retained (k, g) of ( min_τ |t - τ|, -min(g-1, 32-g), k, g )

i.e. nearest retained frame, then the group farthest from its window's edges, then the
earlier window, then the lower group. A time past every retained group (t >= T or t < 0)
is still answered by the nearest group: eq. (22) has no distance cut-off.

Grammar (one window, 33 lines, worst level first)::

    worst: W
    1: L
    ...
    17: 1 | the gripper closes on empty air
    ...
    32: L

W and every L are in {1, 2, 3} (1 failure, 2 suboptimal, 3 normal). Groups appear once
each, in order 1..32, numbers without leading zeros. Lines are separated by one ``\n``
(no blank lines); ``worst:`` and ``G:`` are followed by exactly one space. A group with L
in {1, 2} carries `` | reason`` (printable ASCII without ``|``, starting with a visible
character, at most 500 characters); a normal group carries nothing after its label. W must
equal the minimum label, else the parse is rejected. This is :func:`dense_regex` plus the
worst rule; only whitespace around the whole answer is ignored.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from flora.contract import US_PER_S
from flora.parsing import Rejection, iter_lines

DENSE_FRAMES = 64
DENSE_FPS = 4.0
DENSE_GROUPS = 32
DENSE_STRIDE_US = 10 * US_PER_S
DENSE_WINDOW_US = 16 * US_PER_S
DENSE_TAIL_TRIM_US = 4 * US_PER_S
GROUP_US = DENSE_WINDOW_US // DENSE_GROUPS  # 0.5 s
FRAME_US = GROUP_US // 2  # 0.25 s (4 Hz)
NON_FINAL_KEEP = (DENSE_WINDOW_US - DENSE_TAIL_TRIM_US) // GROUP_US  # 24
LABELS = {1: "failure", 2: "suboptimal", 3: "normal"}


class DenseError(ValueError):
    """Invalid input to dense planning or stitching (names the window / field)."""


@dataclass(frozen=True)
class DenseWindow:
    """Dense window k: ``[start_us, end_us)`` with ``end_us = start_us + 16 s``.

    ``groups`` lists the retained group numbers (1..32) — the ones eq. (22) may choose.
    """

    index: int
    start_us: int
    end_us: int
    groups: tuple[int, ...]

    def group_start_us(self, g: int) -> int:
        """Start of group g (1..32) in episode time."""
        return self.start_us + (g - 1) * GROUP_US

    def group_frame_times_us(self, g: int) -> tuple[int, int]:
        """The two frame instants of group g: its start and start + 0.25 s."""
        s = self.group_start_us(g)
        return (s, s + FRAME_US)

    def frame_times_us(self) -> list[int]:
        """All 64 nominal frame instants of the window (4 Hz from its start)."""
        return [self.start_us + i * FRAME_US for i in range(DENSE_FRAMES)]


def plan_windows(duration_us: int) -> list[DenseWindow]:
    """DESIGN §3.7 dense windows for an episode of ``duration_us``.

    Window k = ``[10k s, 10k s + 16 s)`` for k = 0, 1, … up to and including the first
    window whose end is >= T (one window when T <= 16 s). Non-final windows retain groups
    1..24; the final one retains every group starting before T.
    """
    if isinstance(duration_us, bool) or not isinstance(duration_us, (int, np.integer)):
        raise DenseError(f"duration_us={duration_us!r} must be an integer number of µs")
    T = int(duration_us)
    if T <= 0:
        raise DenseError(f"duration_us={T} must be positive")
    out: list[DenseWindow] = []
    k = 0
    while True:
        start = k * DENSE_STRIDE_US
        end = start + DENSE_WINDOW_US
        final = end >= T
        if final:
            groups = tuple(g for g in range(1, DENSE_GROUPS + 1) if start + (g - 1) * GROUP_US < T)
        else:
            groups = tuple(range(1, NON_FINAL_KEEP + 1))
        out.append(DenseWindow(k, start, end, groups))
        if final:
            return out
        k += 1


def group_times(duration_us: int) -> list[int]:
    """Episode-level 0.5 s group starts ``0, 0.5 s, …`` (last one before T): table times."""
    return list(range(0, int(duration_us), GROUP_US))


# --------------------------------------------------------------------------- grammar


@dataclass(frozen=True)
class DenseOutput:
    """A parsed window: declared worst level, 32 labels and 32 reasons ('' when normal)."""

    worst: int
    labels: tuple[int, ...]
    reasons: tuple[str, ...]


# Loose shapes, so that a rejection can say what is wrong; the exact rules are checked
# after the match (see parse_dense).
_WORST = re.compile(r"\Aworst:[ \t]*(\S*)[ \t]*\Z")
_LINE = re.compile(r"\A([0-9]+)(:[ \t]*)([^|\s]*)(.*)\Z", re.DOTALL)


def render_dense(labels: Sequence[int], reasons: Sequence[str] | None = None) -> str:
    """SFT target for one window: worst level, then the 32 group lines (reasons if not 3)."""
    labels = [int(x) for x in labels]
    reasons = list(reasons) if reasons is not None else [""] * len(labels)
    if len(labels) != DENSE_GROUPS or len(reasons) != DENSE_GROUPS:
        raise DenseError(
            f"render_dense needs {DENSE_GROUPS} labels and reasons, got {len(labels)} and "
            f"{len(reasons)}"
        )
    lines = [f"worst: {min(labels)}"]
    for g, (lab, why) in enumerate(zip(labels, reasons, strict=True), start=1):
        if lab not in LABELS:
            raise DenseError(f"group {g}: label {lab} outside 1..3")
        why = " ".join(str(why).split())  # one line, collapsed whitespace
        if lab == 3:
            lines.append(f"{g}: 3")
        else:
            # The parser's reason rule (dense_regex): a target it would refuse is no target.
            if not why or len(why) > MAX_REASON_CHARS or _REASON_CHARS.match(why) is None:
                raise DenseError(
                    f"group {g}: label {lab} needs a reason of 1..{MAX_REASON_CHARS} printable "
                    f"ASCII characters without '|', got {why[:60]!r}"
                )
            lines.append(f"{g}: {lab} | {why}")
    return "\n".join(lines)


#: Longest reason a group line may carry (a sentence; the toy world's are < 60 characters).
MAX_REASON_CHARS = 500


def _first_lines(text: str, limit: int) -> list[str]:
    """Up to ``limit`` lines of ``text`` split at ``\n`` only, read lazily, unstripped.

    A window has exactly 33 lines: reading a couple more is enough to reject an answer
    with too many, without splitting a multi-megabyte answer in full.
    """
    out: list[str] = []
    for ln in iter_lines(text, newline_only=True):
        out.append(ln)
        if len(out) >= limit:
            break
    return out


#: A reason as :func:`dense_regex` states it: printable ASCII but ``|``, a visible first
#: character, at most :data:`MAX_REASON_CHARS` characters.
_REASON_CHARS = re.compile(r"\A[!-{}~][ -{}~]*\Z")


def dense_regex() -> str:
    """The grammar's syntax as a regular expression, for guided decoding: the worst line,
    then the 32 group lines in order, a reason (printable, no ``|``) only on labels 1/2.
    That the declared worst equals the worst label is not expressed: :func:`parse_dense`
    judges."""
    return f"worst: [123]{_group_lines(1)}"


def _group_lines(first: int) -> str:
    """The regex of group lines ``first`` .. 32, each with its leading newline."""
    reason = "[!-{}~][ -{}~]{0," + str(MAX_REASON_CHARS - 1) + "}"
    return "".join(f"\\n{g}: (3|[12] \\| {reason})" for g in range(first, DENSE_GROUPS + 1))


def parse_dense(text: str) -> DenseOutput | Rejection:
    """Strict parser for one dense window; a ``DenseOutput`` or a typed ``Rejection``.

    Accepts exactly what :func:`dense_regex` matches (whitespace around the whole answer
    aside) whose declared worst level is the minimum label. Rejects: missing/invalid worst
    line, a blank line, a count other than 32 group lines, groups out of order or with a
    leading zero, anything but one space after a colon, labels outside 1..3, a non-normal
    group without `` | reason``, a normal group with anything after its label, a reason
    longer than :data:`MAX_REASON_CHARS`, with ``|`` or with characters other than
    printable ASCII, and a declared worst level that differs from the minimum label.
    Never raises.
    """
    if not isinstance(text, str):
        return Rejection(f"dense: expected text, got {type(text).__name__}", repr(text))
    lines = _first_lines(text.strip(), DENSE_GROUPS + 3)  # worst line, 32 groups, 2 extra
    if lines == [""]:
        return Rejection("dense: empty output", text)
    m = _WORST.match(lines[0])
    if m is None:
        return Rejection("dense: first line must declare 'worst: W'", text)
    if m.group(1) not in ("1", "2", "3"):
        return Rejection(f"dense: declared worst level {m.group(1)!r} outside 1..3", text)
    if lines[0] != f"worst: {m.group(1)}":
        return Rejection(f"dense: first line must be exactly 'worst: W': {lines[0]!r}", text)
    worst = int(m.group(1))
    body = lines[1:]
    if "" in body:
        return Rejection(f"dense: blank line after line {body.index('') + 1}", text)
    if len(body) != DENSE_GROUPS:
        got = f"more than {DENSE_GROUPS + 1}" if len(body) > DENSE_GROUPS + 1 else len(body)
        return Rejection(f"dense: expected {DENSE_GROUPS} group labels, got {got}", text)
    labels: list[int] = []
    reasons: list[str] = []
    for g, line in enumerate(body, start=1):
        lm = _LINE.match(line)
        if lm is None:
            return Rejection(f"dense: group line {g} malformed: {line[:80]!r}", text)
        # Compare digits, not int(): int() refuses more than 4,300 digits (ValueError).
        # As written: "01" is not group 1 (the grammar has no leading zeros).
        got = lm.group(1)
        if got != str(g):
            shown = got if len(got) <= 12 else f"{got[:6]}…({len(got)} digits)"
            return Rejection(f"dense: expected group {g}, got group {shown}", text)
        if lm.group(3) not in ("1", "2", "3"):
            return Rejection(f"dense: group {g} label {lm.group(3)[:40]!r} outside 1..3", text)
        if lm.group(2) != ": ":
            return Rejection(f"dense: group {g} needs exactly one space after ':'", text)
        lab, rest = int(lm.group(3)), lm.group(4)
        if lab == 3:
            if "|" in rest:
                return Rejection(f"dense: group {g} is normal (3) but carries a reason", text)
            if rest:
                return Rejection(f"dense: group line {g} has text after its label", text)
            why = ""
        else:
            if not rest.strip(" \t|"):
                return Rejection(f"dense: group {g} has label {lab} but no reason", text)
            if not rest.startswith(" | "):
                return Rejection(f"dense: group {g} needs ' | ' between label and reason", text)
            why = rest[3:]
            if len(why) > MAX_REASON_CHARS or _REASON_CHARS.match(why) is None:
                return Rejection(
                    f"dense: group {g} reason must be at most {MAX_REASON_CHARS} characters "
                    "of printable ASCII without '|', starting with a visible character",
                    text,
                )
            why = why.rstrip()
        labels.append(lab)
        reasons.append(why)
    if worst != min(labels):
        return Rejection(
            f"dense: declared worst {worst} differs from worst group label {min(labels)}", text
        )
    return DenseOutput(worst, tuple(labels), tuple(reasons))


_DECLARED = re.compile(r"worst: ([123])")
_GROUP_LABEL = re.compile(r"\n[0-9]+: ([123])")


class DenseGuide:
    """The dense grammar *exactly*, for decoding: whether a text can still be completed to
    an answer :func:`parse_dense` accepts, in :func:`dense_regex`'s layout.

    :func:`dense_regex` fixes the layout, the group order and where reasons go; this guide
    adds what the regex leaves to the parser: every label is at least the declared worst
    level and one of them equals it (a window that declares a failure labels one). A logits
    mask built on it (:class:`flora.backends.guided.PrefixMask`) leaves the model only
    answers that parse; ``flora serve`` and the in-process backend use it for a request
    whose regex is exactly ``dense_regex()``.
    """

    def __init__(self) -> None:
        import regex

        self._rx = regex.compile(dense_regex())
        # Lines g..32 alone (index g), for :meth:`extender`: a line's text is checked
        # without reading the lines above it again.
        self._tails = [None] + [regex.compile(_group_lines(g)) for g in range(1, DENSE_GROUPS + 1)]

    @staticmethod
    def _fits(worst: int, labels: Sequence[int]) -> bool:
        if any(lab < worst for lab in labels):
            return False
        # The last group is the last chance to label the declared level.
        return len(labels) < DENSE_GROUPS or worst in labels

    @classmethod
    def _labels_fit(cls, text: str) -> bool:
        declared = _DECLARED.match(text)
        if declared is None:
            return True
        return cls._fits(int(declared.group(1)), [int(x) for x in _GROUP_LABEL.findall(text)])

    def extendable(self, text: str) -> bool:
        """Whether ``text`` is a prefix of a valid answer."""
        return self._rx.fullmatch(text, partial=True) is not None and self._labels_fit(text)

    def complete(self, text: str) -> bool:
        """Whether ``text`` is a whole valid answer."""
        return self._rx.fullmatch(text) is not None and self._labels_fit(text)

    def extender(self, prefix: str) -> Callable[[str], bool]:
        """``lambda s: self.extendable(prefix + s)``, with the prefix read once.

        A guided step asks this of every vocabulary entry after one prefix; re-matching the
        whole answer each time made a step inside a reason cost seconds over a 150k-token
        vocabulary. Lines hold no newline, so once the lines above the current one match
        (checked here, once), the rest is the current line plus ``s`` against the regex of
        the remaining lines, and the labels above are counted once.
        """
        lines = prefix.count("\n")
        if lines == 0:  # the worst line: short, checked whole
            return lambda s: self.extendable(prefix + s)
        if lines > DENSE_GROUPS or not self.extendable(prefix):
            return lambda s: False
        cut = prefix.rfind("\n")
        current, tail = prefix[cut:], self._tails[lines]
        declared = _DECLARED.match(prefix)
        assert declared is not None  # the prefix is extendable and has a newline
        worst = int(declared.group(1))
        above = [int(x) for x in _GROUP_LABEL.findall(prefix, 0, cut)]
        n_above, worst_above = len(above), worst in above  # all >= worst: prefix extendable

        def check(s: str) -> bool:
            text = current + s
            if tail.fullmatch(text, partial=True) is None:
                return False
            new = [int(x) for x in _GROUP_LABEL.findall(text)]
            if any(lab < worst for lab in new):
                return False
            return n_above + len(new) < DENSE_GROUPS or worst_above or worst in new

        return check

    #: Label tokens whose raw log-probabilities :meth:`repair` reads.
    watch = ("1", "2", "3")

    def repair(
        self, text: str, label_logprobs: Callable[[int], dict[str, float] | None]
    ) -> str | None:
        """Where to decode a guided answer again when the guide, not the model, placed the
        declared worst level — at group 32, the last chance, because no label above did.

        Forcing it there puts a failure at the window's end whatever the frames show. The
        smallest single edit that keeps the rule is instead the group where the level costs
        the least log-probability against the model's likeliest allowed label. Returned:
        the answer up to that group's label, with the level put there, for the model to
        continue (the groups after it are decoded again, so a run of failures can follow).
        ``label_logprobs(i)``: the model's raw log-probabilities of :attr:`watch` at the
        token starting at character ``i`` of ``text`` (None when unknown). None: nothing to
        repair (an incomplete answer, the model placed the level itself, or group 32 is
        the cheapest place).
        """
        declared = _DECLARED.match(text)
        if declared is None or not self.complete(text):
            return None
        worst = declared.group(1)
        marks = list(_GROUP_LABEL.finditer(text))
        if [m.group(1) for m in marks].index(worst) != len(marks) - 1:
            return None  # the level appears above the last group: the model placed it
        allowed = [lab for lab in self.watch if lab >= worst]
        costs: list[tuple[float, int]] = []
        for m in marks:
            lp = label_logprobs(m.start(1))
            if lp is None or any(lab not in lp for lab in allowed):
                continue
            costs.append((max(lp[lab] for lab in allowed) - lp[worst], m.start(1)))
        if not costs or costs[-1][1] != marks[-1].start(1) or costs[-1][0] <= 0.0:
            return None  # group 32 unread, or the model chose the level there itself
        _, at = min(costs)  # ties: the earlier group
        if at == marks[-1].start(1):
            return None
        return text[:at] + worst


@functools.cache
def _shared_guide() -> tuple[str, DenseGuide]:
    # Stateless: one guide (one compiled regex) serves every mask.
    return dense_regex(), DenseGuide()


def guide_for_regex(pattern: str) -> DenseGuide | None:
    """The exact guide of a pattern that is exactly ``dense_regex()``, else ``None``."""
    regex_, guide = _shared_guide()
    return guide if pattern == regex_ else None


# --------------------------------------------------------------------------- stitching


def _check_windows(windows: Sequence[DenseWindow]) -> None:
    for w in windows:
        bad = [g for g in w.groups if not 1 <= g <= DENSE_GROUPS]
        if bad:
            raise DenseError(f"window {w.index}: retained groups {bad} outside 1..32")


def _check_labels(windows: Sequence[DenseWindow], labels: Sequence[Sequence[int]]) -> None:
    if len(labels) != len(windows):
        raise DenseError(f"{len(windows)} windows but {len(labels)} label lists")
    for w, labs in zip(windows, labels, strict=True):
        if len(labs) != DENSE_GROUPS:
            raise DenseError(f"window {w.index}: expected {DENSE_GROUPS} labels, got {len(labs)}")
        bad = [x for x in labs if x not in LABELS]
        if bad:
            raise DenseError(f"window {w.index}: labels {bad} outside 1..3")


def _edge(g: int) -> int:
    return min(g - 1, DENSE_GROUPS - g)


def stitch_sources(
    windows: Sequence[DenseWindow], times_us: Sequence[int]
) -> list[tuple[int, int]]:
    """Eq. (22) source per query time: ``(position of the window in windows, group g)``.

    Vectorised: all retained frame instants are sorted once; for each unique instant the
    best group by the tie-break part of the key ``(-min(g-1, 32-g), k, g)`` is precomputed,
    so a query only compares the nearest instant on each side (``searchsorted``):
    O((F + Q) log F) for F frames and Q query times.
    """
    _check_windows(windows)
    times = np.asarray(list(times_us), dtype=np.int64)
    if times.size == 0:
        return []
    rows = [
        (tau, -_edge(g), w.index, g, pos)
        for pos, w in enumerate(windows)
        for g in w.groups
        for tau in w.group_frame_times_us(g)
    ]
    if not rows:
        raise DenseError("no retained groups to stitch from")
    a = np.asarray(rows, dtype=np.int64)
    # Sort by (tau, -edge, k, g): the first row of each tau run is that instant's best group.
    order = np.lexsort((a[:, 3], a[:, 2], a[:, 1], a[:, 0]))
    a = a[order]
    first = np.ones(len(a), dtype=bool)
    first[1:] = a[1:, 0] != a[:-1, 0]
    best = a[first]
    taus = best[:, 0]
    idx = np.searchsorted(taus, times, side="left")  # taus[idx-1] < t <= taus[idx]
    right = np.minimum(idx, len(taus) - 1)
    left = np.maximum(idx - 1, 0)
    d_right = np.where(idx < len(taus), taus[right] - times, np.iinfo(np.int64).max)
    d_left = np.where(idx > 0, times - taus[left], np.iinfo(np.int64).max)
    # On equal distance compare the two instants' best tie-break keys (-edge, k, g).
    kr = best[right, 1:4]
    kl = best[left, 1:4]
    right_key_smaller = (
        (kr[:, 0] < kl[:, 0])
        | ((kr[:, 0] == kl[:, 0]) & (kr[:, 1] < kl[:, 1]))
        | ((kr[:, 0] == kl[:, 0]) & (kr[:, 1] == kl[:, 1]) & (kr[:, 2] < kl[:, 2]))
    )
    take_right = (d_right < d_left) | ((d_right == d_left) & right_key_smaller)
    pick = np.where(take_right, right, left)
    return [(int(best[i, 4]), int(best[i, 3])) for i in pick]


def stitch_labels(
    windows: Sequence[DenseWindow], labels: Sequence[Sequence[int]], times_us: Sequence[int]
) -> list[int]:
    """One label per query time by eq. (22); ``labels`` holds 32 labels per window."""
    _check_labels(windows, labels)
    return [int(labels[p][g - 1]) for p, g in stitch_sources(windows, times_us)]


def stitch_labels_bruteforce(
    windows: Sequence[DenseWindow], labels: Sequence[Sequence[int]], times_us: Sequence[int]
) -> list[tuple[int, int, int]]:
    """Literal eq. (22) (reference for tests): ``(label, window position, group)`` per time.

    For every time, every retained group (k, g) of every window is a candidate with key
    ``(min over its frame times τ of |t - τ|, -min(g-1, 32-g), k, g)``; the lexmin wins.
    """
    _check_windows(windows)
    _check_labels(windows, labels)
    out: list[tuple[int, int, int]] = []
    for t in times_us:
        best_key = None
        best = None
        for pos, w in enumerate(windows):
            for g in w.groups:
                key = (
                    min(abs(int(t) - tau) for tau in w.group_frame_times_us(g)),
                    -min(g - 1, DENSE_GROUPS - g),
                    w.index,
                    g,
                )
                if best_key is None or key < best_key:
                    best_key, best = key, (int(labels[pos][g - 1]), pos, g)
        if best is None:
            raise DenseError("no retained groups to stitch from")
        out.append(best)
    return out


@dataclass(frozen=True)
class StitchedLabel:
    """One row of the ``dense_labels`` table before the common columns are added."""

    t_us: int
    label: int
    reason: str
    source_window: int
    source_group: int


def stitch_outputs(
    windows: Sequence[DenseWindow], outputs: Sequence[DenseOutput], times_us: Sequence[int]
) -> list[StitchedLabel]:
    """Stitch parsed window outputs into per-time rows carrying label, reason and source."""
    _check_labels(windows, [o.labels for o in outputs])
    rows: list[StitchedLabel] = []
    for t, (p, g) in zip(times_us, stitch_sources(windows, times_us), strict=True):
        o = outputs[p]
        rows.append(StitchedLabel(int(t), o.labels[g - 1], o.reasons[g - 1], windows[p].index, g))
    return rows


def window_targets(
    window: DenseWindow, duration_us: int, dense_gt: Sequence[tuple[int, int, str]]
) -> tuple[list[int], list[str]]:
    """32 labels/reasons for one window from per-0.5 s ground truth ``(t_us, label, reason)``.

    Used to render SFT targets (and by the test-double backend). Groups that start at or
    after T see the repeated last frame (see ``docs/reward.md``) and copy the last real
    group's label and reason, so the declared worst level is unchanged; they are never
    retained, hence never stitched.
    """
    by_t = {int(t): (int(lab), str(why)) for t, lab, why in dense_gt}
    labels: list[int] = []
    reasons: list[str] = []
    last: tuple[int, str] | None = None
    for g in range(1, DENSE_GROUPS + 1):
        s = window.group_start_us(g)
        if s < duration_us:
            if s not in by_t:
                raise DenseError(f"window {window.index}: no ground-truth label at t_us={s}")
            last = by_t[s]
        if last is None:
            raise DenseError(f"window {window.index} starts after the episode end")
        labels.append(last[0])
        reasons.append(last[1] if last[0] != 3 else "")
    return labels, reasons


def roundtrip_ground_truth(
    duration_us: int, dense_gt: Sequence[tuple[int, int, str]]
) -> list[StitchedLabel]:
    """Oracle check: render per-window targets from ground truth, parse, stitch by eq. (22).

    With a correct grammar and stitcher the result equals ``dense_gt`` exactly (same times,
    labels and reasons); ``benchmarks/reward_oracle.py`` and the tests assert that.
    """
    windows = plan_windows(duration_us)
    outs: list[DenseOutput] = []
    for w in windows:
        labels, reasons = window_targets(w, duration_us, dense_gt)
        parsed = parse_dense(render_dense(labels, reasons))
        if isinstance(parsed, Rejection):
            raise DenseError(f"window {w.index}: rendered target rejected: {parsed.reason}")
        outs.append(parsed)
    return stitch_outputs(windows, outs, [int(t) for t, _, _ in dense_gt])
