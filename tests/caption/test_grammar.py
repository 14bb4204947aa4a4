"""Caption grammar: strict parser, renderer, round trip (DESIGN §3.4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flora.caption.grammar import (
    MAX_CAPTION_CHARS,
    MAX_CAPTION_WORDS,
    normalise_caption,
    parse_caption,
    render_caption,
)
from flora.parsing import Rejection


@pytest.mark.parametrize(
    "text, expected",
    [
        ("caption: grasp the red block.", "grasp the red block."),
        ("  caption: attempt to grasp the blue cube but miss it.\n", None),
        ("caption: lift the cube 2.5 cm above the bowl.", None),
    ],
)
def test_accepts_valid_outputs(text, expected):
    out = parse_caption(text)
    assert isinstance(out, str), out
    assert out == (expected or text.strip().removeprefix("caption: "))


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty output"),
        ("caption: ", "must start with"),  # stripped to 'caption:' (no space)
        ("caption: .", "empty caption"),
        ("grasp the red block.", "must start with"),
        ("Caption: grasp the red block.", "must start with"),
        ("caption: grasp the red block.\ncaption: lift it.", "single line"),
        ("```\ncaption: grasp the red block.\n```", "single line"),
        ("caption: grasp the red block", "end with a period"),
        ("caption: grasp the red block. Then lift it.", "exactly one sentence"),
        ("caption: grasp the red block!", "end with a period"),
        ("caption: grasp the red block..", "exactly one sentence"),
        ("caption:  grasp the red block.", "irregular whitespace"),
        ("caption: " + "lift the block " * 40 + "now.", "too long"),
        ("caption: #### 1234 5678 ####.", "at least 2 words"),
        ("caption: ab cd #### %%%% 1234 @@@@ 5678.", "garbage"),
        ("caption: the the the the the the the the the the the the.", "garbage"),
        ("caption: block.", "at least 2 words"),
        ("caption: in TARGET the robot grasps the red block.", "role marker"),
        ("caption: grasp the red\tblock.", "non-printable"),
        ("caption: grasp the red\x00 block.", "non-printable"),
    ],
)
def test_rejects_with_reason(text, reason):
    out = parse_caption(text)
    assert isinstance(out, Rejection), out
    assert reason in out.reason
    assert out.kind == "parse"


def test_length_limits_are_exact():
    ok = "x" * (MAX_CAPTION_CHARS - 11) + " the block."  # exactly MAX_CAPTION_CHARS
    assert len(ok) == MAX_CAPTION_CHARS
    assert parse_caption("caption: " + ok) == ok
    over = "x" + ok
    assert "characters" in parse_caption("caption: " + over).reason
    words = " ".join(["lift"] + [f"w{k}a" for k in range(MAX_CAPTION_WORDS)]) + "."
    assert "words" in parse_caption("caption: " + words).reason


def test_render_normalises_and_refuses_invalid():
    assert render_caption("  grasp   the red block ") == "caption: grasp the red block."
    assert render_caption("grasp the red block...") == "caption: grasp the red block."
    with pytest.raises(ValueError, match="empty caption"):
        render_caption("   ")
    with pytest.raises(ValueError, match="one sentence"):
        render_caption("grasp it. lift it")


_word = st.sampled_from(
    [
        "grasp",
        "the",
        "red",
        "blue",
        "block",
        "bowl",
        "lift",
        "it",
        "above",
        "attempt",
        "to",
        "miss",
        "and",
        "place",
        "into",
        "cube",
        "slowly",
        "left",
        "arm",
        "3.5",
        "cm",
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_word, min_size=2, max_size=30))
def test_parser_round_trips_renderer(words):
    text = " ".join(words)
    try:
        rendered = render_caption(text)
    except ValueError:
        return  # e.g. degenerate repetition: refused by both, never rendered
    assert parse_caption(rendered) == normalise_caption(text)
    assert parse_caption(rendered + "\n") == normalise_caption(text)
