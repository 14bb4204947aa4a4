"""The sorted-vocabulary walk of guided decoding (``VocabIndex``), with a guide's one-read
prefix check where it has one (the dense guide's ``extender``), allows exactly the tokens a
whole-text check of every token would, for each Flora grammar's mask, on a vocabulary with
shared heads, multi-character tokens, non-ASCII digits and a U+10FFFF token."""

from __future__ import annotations

import random

import pytest

from flora.backends.guided import PrefixMask, VocabIndex, make_mask
from flora.caption.grammar import caption_regex
from flora.reward.dense import dense_regex, render_dense
from flora.reward.outcome import outcome_regex
from flora.segment.grammar import render_segments, segments_regex
from flora.segment.plan import LocalSegment


def _vocab() -> list[str | None]:
    toks: list[str | None] = [None]  # a special token
    toks += [chr(c) for c in range(32, 127)] + ["\n", "\t", "²", "٣", "０", "é", "中"]
    toks += [str(n) for n in range(0, 400)]  # every tick count, shared heads
    toks += ["worst", "worst:", "worst: ", " |", " | ", "\n1", "\n12", ": 3", ": 3\n", ": 1 |"]
    toks += ["gripper", "grip", "gr", " slip", " slipped", "none", "non", "no", " 0 0", " 1 0"]
    toks += ["0 0\n", " 1 1", "\U0010ffff", "1\U0010ffff", "1\U0010ffffx", "", "  "]
    rng = random.Random(0)
    alphabet = "0123456789 \n:|abcwxyz"
    toks += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(300)]
    return toks


def _brute(mask: PrefixMask, prefix: str) -> list[int]:
    return [i for i, t in enumerate(mask.tokens) if t and mask.extendable(prefix + t)]


def _prefixes(answers: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    out = {""}
    for a in answers:
        out.update(a[:k] for k in range(len(a) + 1))
        out.update(
            a[: rng.randint(0, len(a))] + rng.choice(["x", "9", " ", "\n", "|"]) for _ in range(5)
        )
    return sorted(out)


def _segment_answers() -> list[str]:
    return [
        render_segments([LocalSegment(0, 40, True, False), LocalSegment(40, 320, False, True)]),
        render_segments(
            [LocalSegment(3, 17), LocalSegment(17, 99), LocalSegment(99, 320, False, True)]
        ),
        "none",
    ]


def _dense_answers() -> list[str]:
    labels = [3] * 29 + [2, 1, 1]
    reasons = [""] * 29 + ["slow grip", "slipped", "dropped it"]
    return [render_dense(labels, reasons), render_dense([3] * 32)]


@pytest.mark.parametrize(
    ("pattern", "answers"),
    [
        (segments_regex(320), _segment_answers()),
        (dense_regex(), _dense_answers()),
        (outcome_regex(), ["score: 4", "score: 1"]),
        (caption_regex(), ["caption: the robot picks up the red cube", "caption: places it"]),
    ],
    ids=["segments", "dense", "outcome", "caption"],
)
def test_index_walk_allows_what_checking_every_token_allows(
    pattern: str, answers: list[str]
) -> None:
    toks = _vocab()
    eos = len(toks)
    mask = make_mask(pattern, toks, eos_ids=[eos])
    prefixes = _prefixes(answers, seed=len(pattern))
    allowed_somewhere = 0
    for prefix in prefixes:
        walked = [i for i in mask.allowed(prefix) if i != eos]
        assert walked == _brute(mask, prefix), prefix
        allowed_somewhere += bool(walked)
    assert allowed_somewhere > len(prefixes) // 3  # the prefixes exercise real choices


def test_index_rules_out_a_head_in_one_check() -> None:
    """A head nothing extends costs one check for every token under it."""
    toks = [f"a{n}" for n in range(100)] + ["1", "2"]
    seen: list[str] = []

    def digits_only(text: str) -> bool:
        seen.append(text)
        return text.isascii() and text.isdigit()

    assert VocabIndex(toks).extending(digits_only) == [100, 101]
    assert len(seen) <= 4


def test_dense_extender_is_the_whole_text_check() -> None:
    """The dense guide's per-prefix check agrees with re-reading the whole text, on prefixes
    that declare each level and on ones that already broke a rule."""
    from flora.reward.dense import DenseGuide

    guide = DenseGuide()
    answers = _dense_answers() + [render_dense([2] * 31 + [3], ["slow"] * 31 + [""])]
    bad = ["worst: 2\n1: 1 | x", "worst: 1\n1: 3\n3", "worst: 3\n1: 2 | y"]
    # Group 32 is the last chance for the declared 1: "3" no longer extends it.
    last = "worst: 1" + "".join(f"\n{g}: 3" for g in range(1, 32)) + "\n32: "
    assert guide.extendable(last + "1") and not guide.extendable(last + "3")
    suffixes = ["", "3", "1", "2", " | ok", "\n", ": 3", "\n2: 1 | z", "x", "|", "é"]
    for prefix in _prefixes(answers, seed=3) + bad + [last, last[:-2]]:
        check = guide.extender(prefix)
        for s in suffixes:
            assert check(s) == guide.extendable(prefix + s), (prefix, s)


def test_mask_cache_shares_one_index_across_patterns() -> None:
    from flora.backends.guided import MaskCache

    class Tok:
        all_special_ids: list[int] = []

        def __len__(self) -> int:
            return 12

        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "0123456789 \n"[ids[0]]

    cache = MaskCache(Tok(), eos_ids=[12])
    a, b = cache(segments_regex(5)), cache(segments_regex(7))
    assert a.index is b.index
    assert a.allowed("1 ") == [2, 3, 4, 5]  # v in 2..5 (u < v, ticks <= 5)


@pytest.mark.parametrize(
    "pattern", [r"a\Bb", r"(?<!b)\s\b\w{1,2}(?!b)", r"(?r)ab", r"x(?=y)y", r"a++b", r"\bab"]
)
def test_a_regex_whose_partial_match_is_not_prefix_closed_checks_every_token(pattern: str) -> None:
    """``regex`` partial matching takes "ab" for ``a\\Bb`` but not "a": the sorted walk,
    which drops a head's whole run when the head fails, allowed nothing there."""
    from flora.backends.guided import RegexMask

    toks = ["a", "b", "ab", " ", " a", " ab", "x", "xy", "y", "aab"]
    mask = RegexMask(pattern, toks, eos_ids=[len(toks)])
    assert not mask.prefix_closed
    for prefix in ["", "a", " ", "x"]:
        assert [i for i in mask.allowed(prefix) if i != len(toks)] == _brute(mask, prefix)


def test_flora_regexes_keep_the_sorted_walk() -> None:
    from flora.backends.guided import RegexMask

    for pattern in (caption_regex(), outcome_regex(), "(?:ab)+c"):
        assert RegexMask(pattern, ["a"], eos_ids=[1]).prefix_closed, pattern
