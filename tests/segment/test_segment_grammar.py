"""Segmenter grammar: strict parser reasons, fuzzing, render -> parse round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flora.parsing import Rejection
from flora.segment import LocalSegment, parse_segments, render_segments
from flora.segment.grammar import REASONS, SegmentsGuide, guide_for_regex, segments_regex


def test_render_and_parse_example() -> None:
    segs = [LocalSegment(40, 320, False, True), LocalSegment(0, 37, True, False)]
    text = render_segments(segs)
    assert text == "0 37 1 0\n40 320 0 1"
    assert parse_segments(text, 320) == sorted(segs, key=lambda s: s.u)


def test_empty_list_is_none_token() -> None:
    assert render_segments([]) == "none"
    assert parse_segments("none", 10) == []
    assert parse_segments("  none\n", 10) == []


def test_whitespace_around_lines_is_tolerated() -> None:
    assert parse_segments("\n 1 5 0 0 \n2 9 0 0\n", 10) == [
        LocalSegment(1, 5),
        LocalSegment(2, 9),
    ]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "empty"),
        ("   \n ", "empty"),
        ("the robot picks up the cup", "field_count"),
        ("1 5 0", "field_count"),
        ("1 5 0 0 0", "field_count"),
        ("1  5 0 0", "field_count"),  # exactly one space between fields
        ("1\t5 0 0", "field_count"),
        ("a b c d", "garbage"),
        ("1 5.0 0 0", "garbage"),
        ("-1 5 0 0", "garbage"),
        ("01 5 0 0", "garbage"),
        ("1 5 0 0\n\n2 6 0 0", "field_count"),  # blank line inside
        ("```\n1 5 0 0\n```", "field_count"),
        ("1 11 0 0", "tick_range"),
        ("11 12 0 0", "tick_range"),
        ("5 5 0 0", "order"),
        ("6 5 0 0", "order"),
        ("1 5 2 0", "bad_flag"),
        ("1 5 0 7", "bad_flag"),
        ("1 5 1 0", "bad_flag"),  # left flag but does not touch the left edge
        ("0 5 0 1", "bad_flag"),  # right flag but does not touch the right edge
        ("1 5 0 0\n1 5 0 0", "duplicate"),
        ("3 5 0 0\n1 5 0 0", "unsorted"),
        ("1 6 0 0\n1 5 0 0", "unsorted"),
        ("none\n1 5 0 0", "field_count"),
    ],
)
def test_rejection_reasons(text: str, code: str) -> None:
    res = parse_segments(text, 10)
    assert isinstance(res, Rejection), res
    assert res.reason.split(":")[0] == code, res.reason
    assert res.kind == "parse"


def test_flags_at_edges_accepted() -> None:
    assert parse_segments("0 10 1 1", 10) == [LocalSegment(0, 10, True, True)]


@st.composite
def window_output(draw) -> tuple[list[LocalSegment], int]:
    n = draw(st.integers(1, 640))
    out = []
    for _ in range(draw(st.integers(0, 12))):
        u = draw(st.integers(0, n - 1))
        v = draw(st.integers(u + 1, n))
        lf = draw(st.booleans()) and u == 0
        rf = draw(st.booleans()) and v == n
        out.append(LocalSegment(u, v, lf, rf))
    return out, n


@settings(max_examples=300, derandomize=True, deadline=None)
@given(window_output())
def test_render_parse_round_trip(case: tuple[list[LocalSegment], int]) -> None:
    segs, n = case
    text = render_segments(segs)
    parsed = parse_segments(text, n)
    assert not isinstance(parsed, Rejection), parsed
    # Canonical: sorted by (u, v), one line per (u, v), flags OR'd over the repeats.
    flags: dict[tuple[int, int], tuple[bool, bool]] = {}
    for x in segs:
        lf, rf = flags.get((x.u, x.v), (False, False))
        flags[(x.u, x.v)] = (lf or x.left_open, rf or x.right_open)
    assert parsed == [LocalSegment(u, v, lf, rf) for (u, v), (lf, rf) in sorted(flags.items())]
    assert render_segments(parsed) == text  # canonical form is a fixed point


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.text(max_size=200), st.integers(-5, 700))
def test_fuzz_arbitrary_text_never_raises(text: str, n: int) -> None:
    res = parse_segments(text, n)
    if isinstance(res, Rejection):
        assert res.reason.split(":")[0] in REASONS
    else:
        assert all(0 <= s.u < s.v <= n for s in res)


line_alphabet = st.sampled_from(list("0123456789 \n-n oe\t"))


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.text(alphabet=line_alphabet, max_size=80), st.integers(1, 50))
def test_fuzz_grammar_like_text(text: str, n: int) -> None:
    res = parse_segments(text, n)
    if isinstance(res, Rejection):
        assert res.reason.split(":")[0] in REASONS
    else:
        # Whatever is accepted is canonical: re-rendering and re-parsing is stable.
        assert parse_segments(render_segments(res), n) == res
        assert all(0 <= s.u < s.v <= n for s in res)
        assert all((not s.left_open or s.u == 0) and (not s.right_open or s.v == n) for s in res)


def test_non_string_input_is_rejected() -> None:
    res = parse_segments(None, 10)  # type: ignore[arg-type]
    assert isinstance(res, Rejection) and res.reason.startswith("garbage")


@settings(max_examples=300, derandomize=True, deadline=None)
@given(window_output())
def test_guided_regex_admits_every_rendered_answer(case: tuple[list[LocalSegment], int]) -> None:
    import regex

    segs, n = case
    assert regex.fullmatch(segments_regex(n), render_segments(segs))


@st.composite
def free_lines(draw) -> tuple[str, int]:
    """Lines of four integers drawn independently (out of order, flags anywhere)."""
    n = draw(st.integers(1, 700))
    tick = st.integers(0, n + 2)
    lines = [
        f"{draw(tick)} {draw(tick)} {draw(st.integers(0, 1))} {draw(st.integers(0, 1))}"
        for _ in range(draw(st.integers(1, 4)))
    ]
    return "\n".join(lines), n


@settings(max_examples=400, derandomize=True, deadline=None)
@given(free_lines())
def test_guided_regex_leaves_only_order_rules_to_the_parser(case: tuple[str, int]) -> None:
    """The regex refuses only invalid answers, and what it admits has the layout, tick range
    and flag rules right: a guided answer can only be rejected for order, sorting or a
    repeated line."""
    import regex

    text, n = case
    res = parse_segments(text, n)
    code = res.reason.split(":")[0] if isinstance(res, Rejection) else None
    if regex.fullmatch(segments_regex(n), text) is None:
        assert code is not None, text  # it never refuses a valid answer
    else:
        assert code in (None, "order", "unsorted", "duplicate"), (text, code)


@pytest.mark.parametrize(
    ("n", "text"),
    [(320, "0 321 0 0"), (320, "5 40 1 0"), (320, "0 319 0 1"), (9, "0 10 0 0"), (100, "01 5 0 0")],
)
def test_guided_regex_refuses_range_and_flag_violations(n: int, text: str) -> None:
    import regex

    assert regex.fullmatch(segments_regex(n), text) is None
    assert isinstance(parse_segments(text, n), Rejection)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(window_output())
def test_exact_guide_admits_every_prefix_of_a_rendered_answer(
    case: tuple[list[LocalSegment], int],
) -> None:
    segs, n = case
    text, guide = render_segments(segs), SegmentsGuide(n)
    assert all(guide.extendable(text[:i]) for i in range(len(text) + 1))
    assert guide.complete(text)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(free_lines())
def test_exact_guide_completes_exactly_the_canonical_answers(case: tuple[str, int]) -> None:
    text, n = case
    parsed = parse_segments(text, n)
    canonical = not isinstance(parsed, Rejection) and render_segments(parsed) == text
    assert SegmentsGuide(n).complete(text) == canonical


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.integers(1, 700), st.randoms(use_true_random=False))
def test_decoding_within_the_exact_guide_never_dead_ends_and_always_parses(n, rnd) -> None:
    """What a mask built on the guide does to any model: every step has a way on, and
    whatever it stops on parses — order and sorting included, which the regex leaves out."""
    guide, text, alphabet = SegmentsGuide(n), "", list("0123456789 \nnoe")
    for _ in range(400):
        options = [c for c in alphabet if guide.extendable(text + c)]
        if guide.complete(text) and (not options or rnd.random() < 0.05):
            break
        assert options, text
        text += rnd.choice(options)
    else:
        return  # still going after 400 characters: nothing to judge
    parsed = parse_segments(text, n)
    assert not isinstance(parsed, Rejection), (text, parsed)
    assert render_segments(parsed) == text


def test_exact_guide_is_chosen_only_for_the_segment_regex_itself() -> None:
    assert guide_for_regex(segments_regex(320)).n == 320
    assert guide_for_regex(segments_regex(7)).n == 7
    assert guide_for_regex(segments_regex(320).replace("320", "321")) is None
    assert guide_for_regex("score: [1-5]") is None
    g = SegmentsGuide(320)
    assert not g.extendable("5 40 0 0\n4 ")  # a second line below the first
    assert not g.extendable("5 40 0 0\n5 39 ")
    assert g.extendable("5 40 0 0\n5 3")  # 5 3xx still can
    assert g.extendable("40 4")  # 4x or 4xx can still end above 40
    assert g.extendable("40 3") and not g.extendable("40 33")  # 3 and 30x fit, 33x does not
    assert not g.extendable("40 39 ")  # 39 < 40 is finished: no way on


# --------------------------------------------------------------------------- regressions


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("0 20 0 0\n0 20 1 0", 120),  # the review's answer: flags differ, ticks repeat
        ("0 10 0 0\n0 10 0 1", 10),
        ("0 10 1 1\n0 10 0 0", 10),  # also when the flags come down
        ("2 5 0 0\n3 4 0 0\n3 4 0 0", 10),
    ],
)
def test_same_ticks_twice_is_a_duplicate_whatever_the_flags(text: str, n: int) -> None:
    """Two lines with one ``(u, v)`` would stitch into two identical events, which the
    events table refuses after the part is committed: the parser rejects them."""
    res = parse_segments(text, n)
    assert isinstance(res, Rejection), res
    assert res.reason.split(":")[0] == "duplicate", res.reason
    assert "repeats the ticks of line" in res.reason


def test_render_collapses_same_ticks_so_the_target_parses_back() -> None:
    segs = [LocalSegment(0, 10, False, False), LocalSegment(0, 10, True, False)]
    segs += [LocalSegment(3, 10, False, True), LocalSegment(3, 10, False, False)]
    text = render_segments(segs)
    assert text == "0 10 1 0\n3 10 0 1"  # one line per (u, v), flags OR'd
    canonical = [LocalSegment(0, 10, True), LocalSegment(3, 10, False, True)]
    assert parse_segments(text, 10) == canonical

    from flora.segment.grammar import canonical_segments

    assert canonical_segments(segs) == canonical


def test_exact_guide_refuses_a_second_line_with_the_same_ticks() -> None:
    g = SegmentsGuide(10)
    assert g.complete("0 5 0 0") and g.complete("0 5 0 0\n0 6 0 0")
    assert not g.complete("0 5 0 0\n0 5 1 0")  # the parser says duplicate
    assert not g.extendable("0 5 0 0\n0 5 ")  # no flags make 0 5 a new line
    assert not g.extendable("0 10 0 0\n0 10 1")
    assert not g.complete("0 10 0 0\n0 10 1 1")
    assert not g.extendable("0 5 0 0\n0 5")  # n = 10: "0 5" can only be 5 again
    assert g.extendable("0 5 1 0\n0 6 ")
    assert SegmentsGuide(100).extendable("0 5 0 0\n0 5")  # 0 50..59 are above 0 5
    assert not SegmentsGuide(100).extendable("0 5 0 0\n0 5 0")


@pytest.mark.parametrize("text", ["²", "1 ²", "¹", "٣", "1 ٣", "0 ٣", "0 5 0 0\n٣", "０", "1 ５"])
def test_exact_guide_takes_only_ascii_digits(text: str) -> None:
    """``str.isdigit`` admits superscripts, Arabic-Indic and full-width digits: ``int('²')``
    raised inside the mask and ``'٣'`` was admitted only to dead-end at the next space."""
    assert SegmentsGuide(100).extendable(text) is False
    assert SegmentsGuide(100).complete(text) is False


def test_guide_mask_with_non_ascii_digit_tokens_never_raises_or_admits_them() -> None:
    from flora.backends.guided import make_mask

    toks = ["0", "1", "2", "5", " ", "\n", "none", "²", "٣", "０"]
    mask = make_mask(segments_regex(300), toks, eos_ids=[len(toks)])
    allowed = [toks[i] for i in mask.allowed("") if i < len(toks)]
    assert sorted(allowed) == sorted(["0", "1", "2", "5", "none"])
    assert [toks[i] for i in mask.allowed("1 2") if i < len(toks)] == ["0", "1", "2", "5", " "]
