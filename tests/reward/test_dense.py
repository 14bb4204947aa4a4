"""Dense reward: DESIGN §3.7 windows, the window grammar, and eq. (22) stitching."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flora.parsing import Rejection
from flora.reward.dense import (
    DENSE_GROUPS,
    DenseError,
    DenseGuide,
    DenseOutput,
    DenseWindow,
    dense_regex,
    group_times,
    parse_dense,
    plan_windows,
    render_dense,
    stitch_labels,
    stitch_labels_bruteforce,
    stitch_outputs,
    stitch_sources,
    window_targets,
)

S = 1_000_000


def test_plan_windows_exactly_16_s_is_one_window():
    ws = plan_windows(16 * S)
    assert ws == [DenseWindow(0, 0, 16 * S, tuple(range(1, 33)))]


def test_plan_windows_16_s_plus_1_us():
    ws = plan_windows(16 * S + 1)
    assert [(w.index, w.start_us, w.end_us) for w in ws] == [(0, 0, 16 * S), (1, 10 * S, 26 * S)]
    assert ws[0].groups == tuple(range(1, 25))
    # final window keeps groups starting before T: 10 + 0.5(g-1) < 16.000001 -> g <= 13
    assert ws[1].groups == tuple(range(1, 14))


def test_plan_windows_26_s():
    ws = plan_windows(26 * S)
    assert [(w.start_us, w.end_us) for w in ws] == [(0, 16 * S), (10 * S, 26 * S)]
    assert ws[0].groups == tuple(range(1, 25)) and ws[1].groups == tuple(range(1, 33))


def test_plan_windows_short_episode_is_one_window():
    ws = plan_windows(1 * S)  # shorter than a dense window: one window, fine
    assert len(ws) == 1 and ws[0].end_us == 16 * S and ws[0].groups == (1, 2)
    assert plan_windows(1).__len__() == 1 and plan_windows(1)[0].groups == (1,)


@pytest.mark.parametrize("bad", [0, -5, 1.5, "10", True])
def test_plan_windows_refuses_bad_duration(bad):
    with pytest.raises(DenseError):
        plan_windows(bad)


def _spec_windows(T: int) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """DESIGN §3.7 written out directly (loop k until end >= T)."""
    out, k = [], 0
    while True:
        s, e = 10 * k * S, 10 * k * S + 16 * S
        final = e >= T
        keep = tuple(g for g in range(1, 33) if (s + (g - 1) * S // 2 < T if final else g <= 24))
        out.append((k, s, e, keep))
        if final:
            return out
        k += 1


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(min_value=1, max_value=700 * S))
def test_plan_windows_matches_spec_and_tiles(T):
    ws = plan_windows(T)
    assert [(w.index, w.start_us, w.end_us, w.groups) for w in ws] == _spec_windows(T)
    # Retained groups cover every 0.5 s group start before T, and nothing past T
    # (non-final windows overlap their successor by 2 s).
    starts = {w.group_start_us(g) for w in ws for g in w.groups}
    assert starts == set(range(0, T, S // 2))


def test_group_frame_times():
    w = plan_windows(40 * S)[2]
    assert w.start_us == 20 * S
    assert w.group_frame_times_us(1) == (20 * S, 20 * S + 250_000)
    assert w.group_frame_times_us(32) == (35_500_000, 35_750_000)
    assert len(w.frame_times_us()) == 64 and w.frame_times_us()[-1] == 35_750_000
    assert group_times(1_200_000) == [0, 500_000, 1_000_000]


# --------------------------------------------------------------------------- grammar


def _labels(seed: int) -> tuple[list[int], list[str]]:
    rng = random.Random(seed)
    labs = [rng.choice([1, 2, 3, 3, 3]) for _ in range(DENSE_GROUPS)]
    return labs, [("" if x == 3 else f"reason {i} for level {x}") for i, x in enumerate(labs)]


@pytest.mark.parametrize("seed", range(5))
def test_dense_round_trip(seed):
    labs, why = _labels(seed)
    text = render_dense(labs, why)
    out = parse_dense(text)
    assert out == DenseOutput(min(labs), tuple(labs), tuple(why))
    assert text.splitlines()[0] == f"worst: {min(labs)}"


@pytest.mark.parametrize(
    "why",
    [
        "gripper slips \u2014 cube drops",
        "la pince glisse \u00e0 c\u00f4t\u00e9",
        "x" * 501,
        "a | b",
    ],
)
def test_render_refuses_reasons_the_parser_would_refuse(why):
    """The renderer writes SFT targets and the oracle's answers: a reason outside the
    grammar (non-ASCII, over 500 characters, '|') is refused there, not rendered into a
    target that every parse then rejects."""
    labs = [3] * DENSE_GROUPS
    labs[4] = 1
    reasons = [""] * DENSE_GROUPS
    with pytest.raises(DenseError, match="group 5"):
        render_dense(labs, [*reasons[:4], why, *reasons[5:]])
    ok = render_dense(labs, [*reasons[:4], "x" * 500, *reasons[5:]])
    assert isinstance(parse_dense(ok), DenseOutput)


def test_dense_round_trip_all_normal():
    out = parse_dense(render_dense([3] * 32))
    assert isinstance(out, DenseOutput) and out.worst == 3 and set(out.reasons) == {""}


def _rej(text: str, needle: str) -> None:
    r = parse_dense(text)
    assert isinstance(r, Rejection), r
    assert needle in r.reason, r.reason


def test_dense_rejects_31_and_33_labels():
    lines = render_dense([3] * 32).splitlines()
    _rej("\n".join(lines[:-1]), "expected 32 group labels, got 31")
    _rej("\n".join([*lines, "33: 3"]), "expected 32 group labels, got 33")


def test_dense_rejects_label_outside_1_3():
    lines = render_dense([3] * 32).splitlines()
    lines[5] = "5: 4 | odd"
    _rej("\n".join(lines), "outside 1..3")
    lines[5] = "5: 0 | odd"
    _rej("\n".join(lines), "outside 1..3")
    _rej("worst: 0\n" + "\n".join(f"{g}: 3" for g in range(1, 33)), "worst level")


def test_dense_rejects_missing_reason():
    labs = [3] * 32
    labs[9] = 1
    lines = render_dense(labs, ["" if x == 3 else "drop" for x in labs]).splitlines()
    lines[10] = "10: 1"
    _rej("\n".join(lines), "no reason")
    lines[10] = "10: 1 |   "
    _rej("\n".join(lines), "no reason")


def test_dense_rejects_reason_on_normal_group():
    lines = render_dense([3] * 32).splitlines()
    lines[3] = "3: 3 | fine"
    _rej("\n".join(lines), "carries a reason")


def test_dense_rejects_declared_worst_mismatch():
    labs = [3] * 32
    labs[0] = 2
    text = render_dense(labs, ["slow" if x == 2 else "" for x in labs])
    _rej(text.replace("worst: 2", "worst: 3"), "differs from worst group label 2")
    _rej(text.replace("worst: 2", "worst: 1"), "differs")


def test_dense_rejects_order_and_format_errors():
    lines = render_dense([3] * 32).splitlines()
    swapped = lines.copy()
    swapped[1], swapped[2] = swapped[2], swapped[1]
    _rej("\n".join(swapped), "expected group 1")
    _rej("\n".join(lines[1:] + lines[:1]), "worst")
    _rej("", "empty")
    bad = lines.copy()
    bad[7] = "seven: 3"
    _rej("\n".join(bad), "malformed")


def _one_failure() -> str:
    labels, reasons = [3] * 32, [""] * 32
    labels[4], reasons[4] = 1, "drops it"
    return render_dense(labels, reasons)


def _grammar_accepts(text: str) -> bool:
    """The documented grammar: dense_regex() plus the declared-worst rule (DenseGuide),
    whitespace around the whole answer aside."""
    return DenseGuide().complete(text.strip())


GOOD = _one_failure()
OUTSIDE_THE_GRAMMAR = {
    "reason with '|'": GOOD.replace("drops it", "drops it | and more"),
    "group 01": GOOD.replace("\n1: 3", "\n01: 3"),
    "blank lines between groups": GOOD.replace("\n", "\n\n"),
    "blank line once": GOOD.replace("\n7: 3", "\n\n7: 3"),
    "no space '1:3'": GOOD.replace("\n1: 3", "\n1:3"),
    "tab '1:\\t3'": GOOD.replace("\n1: 3", "\n1:\t3"),
    "two spaces '1:  3'": GOOD.replace("\n1: 3", "\n1:  3"),
    "'worst:1'": GOOD.replace("worst: 1", "worst:1"),
    "'worst: 1 '": GOOD.replace("worst: 1", "worst: 1 "),
    "indented group": GOOD.replace("\n2: 3", "\n  2: 3"),
    "space after a normal label": GOOD.replace("\n2: 3", "\n2: 3 "),
    "no space before '|'": GOOD.replace("1 | drops", "1| drops"),
    "no space after '|'": GOOD.replace("1 | drops", "1 |drops"),
    "reason starting with a space": GOOD.replace("1 | drops", "1 |  drops"),
    "non-ASCII reason": GOOD.replace("drops it", "drops it \u00e9"),
    "tab in reason": GOOD.replace("drops it", "drops\tit"),
    "CRLF lines": GOOD.replace("\n", "\r\n"),
    "reason of 501 characters": GOOD.replace("drops it", "x" * 501),
}
INSIDE_THE_GRAMMAR = {
    "rendered": GOOD,
    "whitespace around the answer": "  \n" + GOOD + "\n\n",
    "trailing space after a reason": GOOD.replace("drops it", "drops it "),
    "reason of 500 characters": GOOD.replace("drops it", "x" * 500),
    "reason with '~' and '}'": GOOD.replace("drops it", "drops {it} ~ here"),
}


@pytest.mark.parametrize("text", OUTSIDE_THE_GRAMMAR.values(), ids=OUTSIDE_THE_GRAMMAR.keys())
def test_dense_parser_rejects_text_outside_the_grammar(text):
    assert not _grammar_accepts(text)
    assert isinstance(parse_dense(text), Rejection)


@pytest.mark.parametrize("text", INSIDE_THE_GRAMMAR.values(), ids=INSIDE_THE_GRAMMAR.keys())
def test_dense_parser_accepts_text_inside_the_grammar(text):
    assert _grammar_accepts(text)
    out = parse_dense(text)
    assert isinstance(out, DenseOutput) and out.reasons[4] == out.reasons[4].strip() != ""


def test_dense_parser_is_exactly_as_strict_as_the_grammar_under_edits():
    """Random one-character edits of valid answers: the parser accepts exactly what the
    grammar (regex + worst rule) accepts."""
    rng = random.Random(0)
    alphabet = list("0123456789 :|\n\t\rwab~\u00e9\u00b2")
    for _ in range(600):
        text = list(GOOD if rng.random() < 0.5 else render_dense([3] * 32))
        for _ in range(rng.choice([1, 1, 2])):
            pos = rng.randrange(len(text) + 1)
            op = rng.choice(["ins", "del", "sub"])
            if op == "ins" or not text:
                text.insert(pos, rng.choice(alphabet))
            elif op == "del":
                del text[min(pos, len(text) - 1)]
            else:
                text[min(pos, len(text) - 1)] = rng.choice(alphabet)
        t = "".join(text)
        assert isinstance(parse_dense(t), DenseOutput) == _grammar_accepts(t), repr(t)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    st.lists(st.sampled_from([1, 2, 3, 3, 3]), min_size=DENSE_GROUPS, max_size=DENSE_GROUPS),
    st.text(alphabet="abc xyz.,", min_size=1, max_size=20).map(str.strip).filter(bool),
)
def test_exact_guide_admits_every_prefix_of_a_rendered_answer(labels, why):
    text = render_dense(labels, ["" if x == 3 else why for x in labels])
    guide = DenseGuide()
    assert all(guide.extendable(text[:i]) for i in range(len(text) + 1))
    assert guide.complete(text) and not guide.complete(text + "\n")


def test_exact_guide_refuses_what_only_the_parser_caught():
    import regex

    guide = DenseGuide()
    normal = [f"{g}: 3" for g in range(1, DENSE_GROUPS + 1)]
    # A label below the declared worst level: the regex lets it through.
    assert regex.fullmatch(dense_regex(), "worst: 3\n1: 2 | slow", partial=True)
    assert not guide.extendable("worst: 3\n1: 2")
    # The declared level never labelled: the last group is its last chance.
    head = "worst: 2\n" + "\n".join(normal[:-1]) + "\n32: "
    assert guide.extendable(head + "2") and not guide.extendable(head + "3")
    assert not guide.complete("worst: 2\n" + "\n".join(normal))
    assert guide.complete("worst: 3\n" + "\n".join(normal))


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.randoms(use_true_random=False))
def test_decoding_within_the_exact_guide_never_dead_ends_and_always_parses(rnd):
    """What a mask built on the guide does to any model: every step has a way on, and
    whatever it stops on parses — the declared worst level included."""
    guide, text, alphabet = DenseGuide(), "", list("0123456789 :|\nworstab")
    for _ in range(6000):
        options = [c for c in alphabet if guide.extendable(text + c)]
        if guide.complete(text):
            break
        assert options, text
        # Lean to ending lines so that reasons stay short and the walk reaches group 32.
        text += "\n" if "\n" in options and rnd.random() < 0.3 else rnd.choice(options)
    else:
        raise AssertionError(f"no answer after 6000 characters: {text[-200:]!r}")
    parsed = parse_dense(text)
    assert isinstance(parsed, DenseOutput), (text, parsed)
    assert len(text.splitlines()) == DENSE_GROUPS + 1


def test_exact_guide_is_chosen_for_the_dense_regex_itself():
    from flora.backends.guided import exact_guide

    assert isinstance(exact_guide(dense_regex()), DenseGuide)
    assert exact_guide(dense_regex().replace("worst: [123]", "worst: [12]")) is None


def test_render_dense_refuses_bad_targets():
    with pytest.raises(DenseError):
        render_dense([3] * 31)
    with pytest.raises(DenseError):
        render_dense([1] + [3] * 31)  # failure without a reason


# --------------------------------------------------------------------------- eq. (22)


def _query_times(rng: random.Random, T: int, n: int) -> list[int]:
    """Random times plus deliberate ties: midpoints between frames, shared overlap frames,
    group starts, and times before 0 / past T (nearest still wins)."""
    ts = [rng.randrange(-2 * S, T + 3 * S) for _ in range(n)]
    grid = [rng.randrange(0, T + 2 * S) // 125_000 * 125_000 for _ in range(n)]  # midpoints
    overlap = []
    for k in range(1, T // (10 * S) + 1):
        base = 10 * k * S
        overlap += [base + rng.randrange(0, 8) * 250_000, base + 1_999_999, base - 1]
    return ts + grid + overlap[: 4 * n] + [0, T - 1, T, T + 10 * S, -1]


def test_stitch_matches_bruteforce_on_random_episodes():
    rng = random.Random(22)
    durations = (
        [S, 16 * S, 16 * S + 1, 26 * S]
        + [
            int(10 ** rng.uniform(6, 8.778))
            for _ in range(36)  # 1 s .. 10 min
        ]
        + [600 * S]
    )
    for T in durations:
        ws = plan_windows(T)
        labels = [[rng.choice([1, 2, 3]) for _ in range(32)] for _ in ws]
        times = _query_times(rng, T, 60)
        fast = stitch_sources(ws, times)
        brute = stitch_labels_bruteforce(ws, labels, times)
        assert fast == [(p, g) for _, p, g in brute], T
        assert stitch_labels(ws, labels, times) == [lab for lab, _, _ in brute], T


def test_stitch_tie_breaks():
    ws = plan_windows(30 * S)  # windows at 0, 10, 20 s
    labels = [[1] * 32, [2] * 32, [3] * 32]
    # t = 10 s: window 0 group 21 (edge 11) and window 1 group 1 (edge 0) share the frame;
    # the group farther from its window edge wins -> window 0.
    assert stitch_sources(ws, [10 * S]) == [(0, 21)]
    # t = 10.125 s: equidistant from 10.0 and 10.25 (both group 21 of window 0) -> window 0.
    assert stitch_sources(ws, [10_125_000]) == [(0, 21)]
    # t = 11.875 s: between w0 g24's 11.75 frame and w0's trimmed g25 (not retained); the
    # nearest retained frames are 11.75 (w0 g24, w1 g4) and 12.0 (w1 g5): 11.75 -> tie at
    # distance 0.125 with 12.0: keys (-8, 0, 24) vs (-4, 1, 5) -> w0 g24.
    assert stitch_sources(ws, [11_875_000]) == [(0, 24)]
    # t = 12 s: only window 1 retains it (group 5).
    assert stitch_sources(ws, [12 * S]) == [(1, 5)]
    assert stitch_labels(ws, labels, [9 * S, 12 * S, 25 * S]) == [1, 2, 3]
    # Past every retained group: nearest wins (last frame 29.75 s of window 2, group 20).
    assert stitch_sources(ws, [45 * S]) == [(2, 20)]
    assert stitch_sources(ws, [-5 * S]) == [(0, 1)]


def test_stitch_symmetric_tie_prefers_earlier_window_and_lower_group():
    # Two synthetic windows with the same edge distance at the same instant.
    a = DenseWindow(3, 0, 16 * S, (2,))
    b = DenseWindow(1, 0, 16 * S, (2,))
    assert stitch_sources([a, b], [0]) == [(1, 2)]  # k=1 < k=3
    c = DenseWindow(0, 0, 16 * S, (2, 31))  # g=2 and g=31 both have edge 1
    t = c.group_start_us(2) + (c.group_start_us(31) - c.group_start_us(2) + 250_000) // 2
    brute = stitch_labels_bruteforce([c], [[3] * 32], [t])
    assert stitch_sources([c], [t]) == [(0, brute[0][2])]


def test_stitch_bad_labels_are_refused():
    ws = plan_windows(20 * S)
    with pytest.raises(DenseError, match="2 windows but 1"):
        stitch_labels(ws, [[3] * 32], [0])
    with pytest.raises(DenseError, match="expected 32 labels, got 31"):
        stitch_labels(ws, [[3] * 32, [3] * 31], [0])
    with pytest.raises(DenseError, match="outside 1..3"):
        stitch_labels(ws, [[3] * 32, [3] * 31 + [4]], [0])
    assert stitch_labels(ws, [[3] * 32, [3] * 32], []) == []


def test_stitch_outputs_carries_reason_and_source():
    T = 20 * S
    ws = plan_windows(T)
    gt = [
        (t, 1 if 11 * S <= t < 12 * S else 3, "drop" if 11 * S <= t < 12 * S else "")
        for t in group_times(T)
    ]
    outs = []
    for w in ws:
        labs, why = window_targets(w, T, gt)
        o = parse_dense(render_dense(labs, why))
        assert isinstance(o, DenseOutput)
        outs.append(o)
    rows = stitch_outputs(ws, outs, group_times(T))
    assert [(r.t_us, r.label, r.reason) for r in rows] == gt
    r11 = next(r for r in rows if r.t_us == 11 * S)
    assert (r11.source_window, r11.source_group) == (0, 23)
    r13 = next(r for r in rows if r.t_us == 13 * S)
    assert (r13.source_window, r13.source_group) == (1, 7)


def _label_lps(text: str, at: dict[int, dict[str, float]]):
    """Raw label log-probs per group: ``at[g]`` where given, else "3" likeliest."""
    label_at = {m.end(): int(m.group(1)) for m in re.finditer(r"\n(\d+): ", text)}

    def lps(i: int) -> dict[str, float] | None:
        g = label_at.get(i)
        return None if g is None else at.get(g, {"1": -8.0, "2": -9.0, "3": -0.05})

    return lps


def test_repair_moves_a_forced_label_to_where_the_model_finds_it_least_unlikely():
    guide = DenseGuide()
    text = render_dense([3] * 31 + [1], [""] * 31 + ["dropped"])  # forced at group 32
    lead = guide.repair(text, _label_lps(text, {7: {"1": -1.0, "2": -9.0, "3": -0.5}}))
    assert lead == text[: text.index("\n7: ") + len("\n7: ")] + "1"
    assert guide.extendable(lead) and not guide.complete(lead)
    # Nothing to repair: the model chose the level at group 32 itself; group 32 is the
    # cheapest place; the level is placed above group 32; the answer is incomplete.
    own = {32: {"1": -0.1, "2": -5.0, "3": -3.0}, 7: {"1": -1.0, "2": -9.0, "3": -0.5}}
    assert guide.repair(text, _label_lps(text, own)) is None
    assert guide.repair(text, _label_lps(text, {32: {"1": -2.0, "2": -9.0, "3": -1.0}})) is None
    placed = render_dense([3] * 4 + [1] + [3] * 27, [""] * 4 + ["slipped"] + [""] * 27)
    assert guide.repair(placed, _label_lps(placed, {2: {"1": -0.2, "2": -9, "3": -1}})) is None
    assert guide.repair(text[:-10], _label_lps(text, {7: {"1": -1.0, "2": -9, "3": -1}})) is None
    # A declared 2 is weighed against the allowed labels (2, 3) only: at group 3 the model
    # prefers "1", which is not allowed there, so 2 costs nothing; counting "1" would put
    # the cheapest place at group 9.
    two = render_dense([3] * 31 + [2], [""] * 31 + ["slow"])
    g3, g9 = {"1": -0.01, "2": -1.5, "3": -3.0}, {"1": -5.0, "2": -1.0, "3": -0.2}
    lps = _label_lps(two, {3: g3, 9: g9})
    assert guide.repair(two, lps) == two[: two.index("\n3: ") + len("\n3: ")] + "2"
