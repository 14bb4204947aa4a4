"""Held-out evaluation scored on hand-made model output tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from flora.metrics.caption import Judgment
from flora.parsing import Rejection
from flora.reward.dense import render_dense
from flora.reward.rubric import Rubric, render_rubric
from flora.segment.plan import LocalSegment
from tests.faults import ScriptedBackend
from training.evaluate import (
    answer_parser,
    attempt_counts,
    bootstrap_ci,
    evaluate_model,
    generate_outputs,
    metric_key,
    score_outputs,
)
from training.sets import Example


def ex(eid, model, kind, episode, reference):
    return Example(
        example_id=eid,
        model=model,
        task_kind=kind,
        purpose="sft",
        dataset="toy",
        episode_id=episode,
        split="heldout",
        request_id=eid,
        system=None,
        prompt="p",
        images=[],
        frame_times_us=None,
        max_new_tokens=8,
        temperature=0.0,
        top_logprobs=0,
        target="",
        reference=json.dumps(reference),
    )


def table(rows):
    return pd.DataFrame([{"example_id": k, "text": t} for k, t in rows])


SEG = [
    ex(
        "w0",
        "segmenter",
        "segment",
        "toy/000000",
        {"n_ticks": 320, "segments": [[0, 40, 1, 0], [60, 200, 0, 0]]},
    ),
    ex("w1", "segmenter", "segment", "toy/000000", {"n_ticks": 320, "segments": []}),
    ex("w2", "segmenter", "segment", "toy/000001", {"n_ticks": 320, "segments": [[10, 50, 0, 0]]}),
    ex("w3", "segmenter", "segment", "toy/000001", {"n_ticks": 320, "segments": [[0, 320, 1, 1]]}),
]


def test_segmenter_metrics_on_a_hand_table():
    out = table(
        [
            ("w0", "0 40 1 0\n60 200 0 0"),  # perfect: every metric 1
            ("w1", "none"),  # correct empty answer: 1
            ("w2", "10 30 0 0\n100 120 0 0"),  # tIoU 0.5 with the ref, one extra segment
            # w3 missing from the table: unparseable, 0 everywhere
        ]
    )
    res = score_outputs("segmenter", SEG, out, n_boot=0)
    m = res.metrics
    assert m["parse_rate"] == 0.75 and m["items"] == 4 and m["episodes"] == 2
    # w2: matched 1 of 2 preds at 0.5 -> P=0.5, R=1, F1=2/3; none at 0.75
    assert m["f1@0.5"] == pytest.approx((1 + 1 + 2 / 3 + 0) / 4)
    assert m["f1@0.75"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert m["precision@0.5"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    # w2's pair: start exact, end 20 ticks off (tolerance 10) -> E=0.5; flags agree -> 1
    b2 = 0.5 * 0.5 + 0.5 * 1.0
    assert m["B"] == pytest.approx((1 + 1 + b2 + 0) / 4)
    r2 = 0.45 * (2 / 3) + 0.15 * 0 + 0.25 * 0.5 + 0.15 * b2
    assert m["r_seg"] == pytest.approx((1 + 1 + r2 + 0) / 4)
    row = res.items.set_index("example_id").loc["w3"]
    assert not row["parsed"] and row["r_seg"] == 0.0


def test_bootstrap_over_episodes_brackets_the_mean():
    out = table([("w0", "0 40 1 0\n60 200 0 0"), ("w1", "none"), ("w2", "garbage")])
    res = score_outputs("segmenter", SEG, out, n_boot=200, seed=3)
    lo, hi = res.intervals["r_seg"]
    # episode 0 scores 1, episode 1 scores 0: resamples give 0, 0.5 or 1
    assert lo == 0.0 and hi == 1.0 and res.metrics["r_seg"] == 0.5
    assert "items" not in res.intervals
    again = score_outputs("segmenter", SEG, out, n_boot=200, seed=3)
    assert again.intervals == res.intervals


class CupJudge:
    name = "cup"

    def judge_batch(self, items):
        return [
            Rejection("undecided") if "maybe" in c else Judgment(covered=(0,) if "cup" in c else ())
            for c, _ in items
        ]


CAP = [
    ex(
        f"e{i}",
        "captioner",
        "caption",
        f"toy/00000{i // 2}",
        {
            "caption": "pick up the cup.",
            "requirements": [{"family": "action", "text": "pick up the cup", "mass": 1.0}],
        },
    )
    for i in range(4)
]


def test_captioner_r_cap_counts_every_reference_event():
    out = table(
        [
            ("e0", "caption: pick up the cup."),  # covered: r_cap = 2*1/(1+1) = 1
            ("e1", "caption: open a drawer."),  # parsed, nothing covered: 0
            ("e2", "pick up the cup"),  # no prefix: unparseable -> 0
            ("e3", "caption: maybe the cup."),  # judge could not decide -> 0, not covered
        ]
    )
    res = score_outputs("captioner", CAP, out, judge=CupJudge(), n_boot=0)
    m = res.metrics
    assert m["r_cap"] == pytest.approx(1 / 4)
    assert m["r_cap_judged"] == pytest.approx(1 / 2)
    assert m["coverage"] == pytest.approx(2 / 4)
    assert m["parse_rate"] == pytest.approx(3 / 4)


def test_captioner_events_without_requirements_are_not_scored_zero():
    """An event of a fleet's mixture has no requirements: r_cap has nothing to measure, so
    it is left out of r_cap (which covered it as 0 before, the reference caption included)
    and counted in the parse rate only."""
    bare = [
        ex(f"b{i}", "captioner", "caption", "toy/000009",
           {"caption": "pick up the cup.", "requirements": []})
        for i in range(2)
    ]  # fmt: skip
    out = table([("e0", "caption: pick up the cup."), ("e1", "caption: open a drawer."),
                 ("b0", "caption: pick up the cup."), ("b1", "no prefix")])  # fmt: skip
    m = score_outputs("captioner", CAP[:2] + bare, out, judge=CupJudge(), n_boot=0).metrics
    assert m["r_cap"] == pytest.approx(1 / 2) and m["r_cap_items"] == 2
    assert m["parse_rate"] == pytest.approx(3 / 4) and m["items"] == 4
    only = score_outputs("captioner", bare, out, judge=CupJudge(), n_boot=0).metrics
    assert math.isnan(only["r_cap"]) and only["r_cap_items"] == 0


RUB = Rubric.model_validate(
    {
        "task": "r",
        "steps": [
            {"name": "grasp", "allowed": [0, 0.5]},
            {"name": "place", "allowed": [0, 0.25, 0.5]},
        ],
    }
)
REW = [
    ex("o0", "rewarder", "outcome", "toy/000000", {"score": 5}),
    ex("o1", "rewarder", "outcome", "toy/000001", {"score": 2}),
    ex("o2", "rewarder", "outcome", "toy/000002", {"score": 3}),
    ex(
        "d0",
        "rewarder",
        "dense",
        "toy/000000",
        {"groups": [1, 2, 3, 4], "labels": [3, 1, 2, 3] + [3] * 28},
    ),
    ex(
        "r0",
        "rewarder",
        "rubric",
        "toy/000000",
        {"rubric": RUB.model_dump(mode="json"), "scores": {"grasp": 0.5, "place": 0.25}},
    ),
]


def test_rewarder_metrics_on_a_hand_table():
    labels = [3, 1, 3, 3] + [1] * 28  # group 5+ are not retained: never scored
    reasons = ["" if x == 3 else "drops it" for x in labels]
    out = pd.DataFrame(
        [
            {"example_id": "o0", "text": "score: 4", "expected_score": 4.5},
            {"example_id": "o1", "text": "score: 2", "expected_score": np.nan},  # no distribution
            {"example_id": "o2", "text": "score: 9", "expected_score": np.nan},  # unparseable
            {"example_id": "d0", "text": render_dense(labels, reasons), "expected_score": np.nan},
            {
                "example_id": "r0",
                "text": render_rubric(RUB, {"grasp": 0.5, "place": 0.5}),
                "expected_score": np.nan,
            },
        ]
    )
    res = score_outputs("rewarder", REW, out, n_boot=0)
    m = res.metrics
    assert m["outcome.parse_rate"] == pytest.approx(2 / 3)
    assert m["outcome.mae"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["outcome.mae_argmax"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["dense.accuracy"] == pytest.approx(3 / 4)  # group 3: 3 vs ref 2
    assert m["dense.failure_recall"] == 1.0  # the one failure group (2) found
    assert m["rubric.l1"] == pytest.approx(0.25)
    assert m["parse_rate"] == pytest.approx(4 / 5)


def test_bad_tables_and_models_are_refused():
    with pytest.raises(ValueError, match="example_id"):
        score_outputs("segmenter", SEG, pd.DataFrame({"text": ["none"]}), n_boot=0)
    with pytest.raises(ValueError, match="repeats"):
        score_outputs("segmenter", SEG, table([("w0", "none"), ("w0", "none")]), n_boot=0)
    with pytest.raises(ValueError, match="not captioner"):
        score_outputs("captioner", SEG, table([]), n_boot=0)
    with pytest.raises(ValueError, match="model must be"):
        score_outputs("policy", SEG, table([]), n_boot=0)


def test_metric_keys_and_empty_bootstrap():
    assert metric_key("f1@0.5") == "eval.f1_at_0.5"
    assert bootstrap_ci(pd.DataFrame(), lambda d: {}) == {}
    assert math.isnan(float("nan"))


def test_each_example_is_parsed_with_its_own_grammar():
    """The window's own clip length bounds its ticks; the rubric is the example's own."""
    clipped = ex("c", "segmenter", "segment", "toy/000000", {"n_ticks": 100, "segments": []})
    assert answer_parser(clipped)("0 100 0 1") == [LocalSegment(0, 100, False, True)]
    assert "tick_range" in answer_parser(clipped)("0 320 0 1").reason
    assert answer_parser(SEG[0])("0 320 0 1") == [LocalSegment(0, 320, False, True)]
    rubric = answer_parser(REW[-1])
    assert isinstance(rubric(render_rubric(RUB, {"grasp": 0.5, "place": 0.25})), dict)
    assert isinstance(rubric("grasp: 0.3\nplace: 0.25"), Rejection)  # 0.3 not allowed
    assert answer_parser(CAP[0])("caption: pick up the cup.") == "pick up the cup."
    assert isinstance(answer_parser(CAP[0])("pick up the cup."), Rejection)
    weird = ex("q", "rewarder", "preference", "toy/000000", {})
    with pytest.raises(ValueError, match="example q: unknown rewarder task 'preference'"):
        answer_parser(weird)


def test_outputs_with_the_engines_retries():
    """attempts=1 keeps the greedy answer (what the model learnt); attempts=3 re-asks what
    does not parse, sampled, as the engine's steps do, and counts the answers sent."""

    def answer(r):
        if r.request_id == "w3":
            return "garbage"  # never parses
        return "none" if r.temperature > 0 or r.request_id == "w1" else "0 999 0 0"

    greedy = generate_outputs(ScriptedBackend(answer), SEG)
    assert greedy["attempts"].tolist() == [1, 1, 1, 1]
    assert greedy["text"].tolist() == ["0 999 0 0", "none", "0 999 0 0", "garbage"]
    res = score_outputs("segmenter", SEG, greedy, n_boot=0)
    assert res.metrics["parse_rate"] == 0.25

    be = ScriptedBackend(answer)
    kept = generate_outputs(be, SEG, attempts=3)
    assert kept["attempts"].tolist() == [2, 1, 2, 3]
    assert kept["text"].tolist() == ["none", "none", "none", "garbage"]
    assert be.calls == 3  # one batch, then the rejected ones only, twice
    res = score_outputs("segmenter", SEG, kept, n_boot=0)
    assert res.metrics["parse_rate"] == 0.75
    counts = attempt_counts(kept, res.items)
    assert counts == {"answers_sent": 8, "first_answer_parsed": 1}
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        generate_outputs(be, SEG, attempts=0)
    res = evaluate_model("segmenter", SEG, ScriptedBackend(answer), n_boot=0, attempts=3)
    assert res.metrics["parse_rate"] == 0.75 and res.info["answers_sent"] == 8
    assert res.info["first_answer_parsed"] == 1 and res.info["backend"] == "scripted"
    assert res.info["attempts"] == 3


def test_eval_set_fingerprint_names_the_scored_episodes_and_data():
    """What the promotion gates pair champion and challenger on: the same episodes and the
    same references (order does not matter; a subset or changed ground truth does)."""
    from dataclasses import replace

    from training.evaluate import eval_set_of

    out = table([("w0", "none"), ("w1", "none"), ("w2", "none"), ("w3", "none")])
    fp = score_outputs("segmenter", SEG, out, n_boot=0).info["eval_set"]
    assert fp["flora.eval_set.episodes"] == "2" and fp["flora.eval_set.items"] == "4"
    assert eval_set_of(SEG[::-1]) == fp
    key = "flora.eval_set.sha256"
    assert len(fp[key]) == 64
    assert eval_set_of(SEG[:2])[key] != fp[key]  # the first episode only
    changed = [*SEG[:3], replace(SEG[3], reference=json.dumps({"n_ticks": 320, "segments": []}))]
    assert eval_set_of(changed)[key] != fp[key]
