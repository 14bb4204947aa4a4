"""GRPO rewards on raw completions: r_seg / r_cap, unparseable completions get 0."""

from __future__ import annotations

import math

import pytest

from flora.metrics.caption import Judgment, Requirement
from flora.metrics.segment import r_seg
from flora.parsing import Rejection
from flora.segment.plan import LocalSegment
from training.grpo import GRPOPrompt, score_completions
from training.rewards import as_local_segments, caption_rewards, segment_reward

REF = [LocalSegment(0, 30, True, False), LocalSegment(40, 120, False, False)]


def test_segment_reward_is_r_seg_of_the_parse():
    r = segment_reward("0 30 1 0\n40 120 0 0", 320, REF)
    assert r.parsed and r.value == pytest.approx(1.0)
    r = segment_reward("0 30 0 0\n50 120 0 0", 320, REF)
    assert r.parsed
    assert r.value == pytest.approx(r_seg([LocalSegment(0, 30), LocalSegment(50, 120)], REF))
    assert 0 < r.value < 1


@pytest.mark.parametrize(
    "text", ["", "0 30", "30 0 0 0", "0 30 1 0\n0 30 1 0", "0 400 0 0", "caption: a cup."]
)
def test_unparseable_segmenter_completion_gets_zero(text):
    r = segment_reward(text, 320, REF)
    assert not r.parsed and r.value == 0.0 and r.reason


def test_empty_window_with_none_scores_one():
    assert segment_reward("none", 100, []).value == 1.0
    assert segment_reward("0 10 0 0", 100, []).value < 1.0


def test_reference_formats():
    assert as_local_segments([{"u": 1, "v": 2, "left_open": True}, (3, 4, 0, 1)]) == [
        LocalSegment(1, 2, True, False),
        LocalSegment(3, 4, False, True),
    ]


class FakeJudge:
    """Covers requirement 0 when the caption says 'cup'; rejects captions saying 'skip'."""

    name = "fake"

    def __init__(self):
        self.seen: list[str] = []

    def judge_batch(self, items):
        out = []
        for cap, _ in items:
            self.seen.append(cap)
            if "skip" in cap:
                out.append(Rejection("judge gave up"))
            else:
                out.append(Judgment(covered=(0,) if "cup" in cap else ()))
        return out


def test_caption_rewards_parse_judge_and_failures():
    reqs = [Requirement("action", "pick up the cup"), Requirement("object", "red cup")]
    judge = FakeJudge()
    texts = [
        "caption: pick up the cup.",
        "caption: open the drawer.",
        "the cup",  # no prefix: unparseable
        "caption: skip this one please.",
    ]
    rs = caption_rewards(texts, [reqs] * 4, judge)
    assert rs[0].parsed and rs[0].value == pytest.approx(2 * 1 / (2 + 1 + 0))
    assert rs[1].parsed and rs[1].value == 0.0
    assert not rs[2].parsed and rs[2].value == 0.0
    assert rs[3].parsed and math.isnan(rs[3].value) and not rs[3].judged
    assert len(judge.seen) == 3  # the unparseable completion never reaches the judge


def test_prompt_dispatch_and_checks():
    from flora.backends.base import VLMRequest

    p = GRPOPrompt("segmenter", VLMRequest(prompt="x"), "w0", n_ticks=320, reference=REF)
    rs = score_completions(p, ["0 30 1 0\n40 120 0 0", "garbage"])
    assert [r.value for r in rs] == [pytest.approx(1.0), 0.0]
    with pytest.raises(ValueError, match="rewarder"):
        GRPOPrompt("rewarder", VLMRequest(prompt="x"), "o0")
    with pytest.raises(ValueError, match="n_ticks"):
        GRPOPrompt("segmenter", VLMRequest(prompt="x"), "w1")
    cp = GRPOPrompt("captioner", VLMRequest(prompt="x"), "e0", requirements=[])
    with pytest.raises(ValueError, match="judge"):
        score_completions(cp, ["caption: hi there."])
