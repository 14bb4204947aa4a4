"""LLM judge grammar: strict JSON parser, renderer round trip, prompt contents."""

from __future__ import annotations

import json

import pytest

from flora.caption.judges import build_judge_prompt, parse_judgment, render_judgment
from flora.metrics.caption import FactualError, Judgment, Requirement, score_judgment
from flora.parsing import Rejection

REQS = [
    Requirement("action", "grasp"),
    Requirement("object", "red block"),
    Requirement("outcome", "miss the object", 0.5),
]


def test_prompt_numbers_requirements_and_states_the_answer_grammar():
    p = build_judge_prompt("grasp the blue block.", REQS)
    assert "0. [action] grasp" in p and "2. [outcome] miss the object" in p
    assert "Caption: grasp the blue block." in p
    assert '{"covered": [...], "errors"' in p
    for fam in ("action", "object", "coordination", "spatial", "outcome"):
        assert fam in p


def test_parse_valid_answer_and_round_trip():
    text = json.dumps(
        {
            "covered": [0],
            "errors": [
                {"family": "object", "requirement": 1, "claim": "blue block"},
                {"family": "outcome", "requirement": None, "claim": "grasps it successfully"},
            ],
        }
    )
    j = parse_judgment(text, 3)
    assert isinstance(j, Judgment)
    assert j.covered == (0,)
    assert j.errors[0] == FactualError("object", "blue block", 1)
    assert parse_judgment(render_judgment(j), 3) == j
    s = score_judgment(REQS, j)
    assert s.M == 1.0 and s.F == 1.0 + 2.5 / 3  # object (mass 1) + unsupported (mean mass)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("The caption is fine.", "one JSON object"),
        ('```json\n{"covered": [], "errors": []}\n```', "one JSON object"),
        ('{"covered": [0], "errors": []} extra', "one JSON object"),
        ('{"covered": [0], "errors": [}', "invalid JSON"),
        ('{"covered": [0]}', "expected keys"),
        ('{"covered": [0], "errors": [], "score": 1}', "expected keys"),
        ('{"covered": ["0"], "errors": []}', "list of integers"),
        ('{"covered": [true], "errors": []}', "list of integers"),
        ('{"covered": [0, 0], "errors": []}', "repeats"),
        ('{"covered": [3], "errors": []}', "out of range"),
        ('{"covered": [], "errors": {}}', "must be a list"),
        (
            '{"covered": [], "errors": [{"family": "colour", "requirement": 1, "claim": "x"}]}',
            "unknown error family",
        ),
        (
            '{"covered": [], "errors": [{"family": "object", "requirement": 9, "claim": "x"}]}',
            "out of range",
        ),
        (
            '{"covered": [], "errors": [{"family": "object", "requirement": 1, "claim": ""}]}',
            "claim",
        ),
        ('{"covered": [], "errors": [{"family": "object", "claim": "x"}]}', "exactly"),
        (
            '{"covered": [1], "errors": [{"family": "object", "requirement": 1, "claim": "x"}]}',
            "both covered and contradicted",
        ),
        # json.loads keeps the last of repeated keys: the answer is ambiguous, rejected.
        ('{"covered": [0, 1], "errors": [], "covered": []}', "duplicate key 'covered'"),
        (
            '{"covered": [], "errors": [{"family": "object", "requirement": 1, "claim": "x", '
            '"requirement": null}]}',
            "duplicate key 'requirement'",
        ),
    ],
)
def test_parse_rejections(text, reason):
    out = parse_judgment(text, 3)
    assert isinstance(out, Rejection), out
    assert reason in out.reason


class _KeywordJudgeBackend:
    """A backend that really answers: covered = requirements whose text is in the caption.

    Each answer depends on its own prompt only, so a verdict assigned to the wrong caption
    shows up as a wrong ``covered`` set.
    """

    name = "keyword-judge"
    model_version = "1"

    def generate(self, requests):
        from flora.backends.base import VLMResponse

        out = []
        for req in requests:
            lines = req.prompt.splitlines()
            caption = next(x for x in lines if x.startswith("Caption: ")).removeprefix("Caption: ")
            reqs = [x for x in lines if x[:1].isdigit() and ". [" in x]
            covered = [k for k, x in enumerate(reqs) if x.split("] ", 1)[1] in caption]
            out.append(VLMResponse(text=json.dumps({"covered": covered, "errors": []})))
        return out


def test_judge_batch_assigns_each_verdict_to_its_own_caption():
    from flora.caption.judges import LLMJudge

    two = REQS[:2]
    one = [Requirement("action", "lift")]
    # mixed requirement counts: the judge groups requests by count, then must put every
    # answer back in input order
    items = [
        ("grasp the red block.", REQS),  # covers 0, 1
        ("lift it.", one),  # covers 0
        ("push the red block.", two),  # covers 1
        ("grasp it.", REQS),  # covers 0
        ("wave.", one),  # covers nothing
        ("grasp the red block and miss the object.", REQS),  # covers 0, 1, 2
    ]
    got = LLMJudge(_KeywordJudgeBackend()).judge_batch(items)
    assert all(isinstance(j, Judgment) for j in got)
    assert [j.covered for j in got] == [(0, 1), (0,), (1,), (0,), (), (0, 1, 2)]
