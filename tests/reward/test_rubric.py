"""Rubric reward: schema (eq. 3), grammar with optional thinking, scoring, bad input."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from flora.parsing import Rejection
from flora.reward.rubric import (
    Rubric,
    RubricError,
    Step,
    load_rubric,
    parse_rubric,
    render_rubric,
    score,
)

RUBRIC = {
    "task": "put the red block in the bowl",
    "steps": [
        {
            "name": "reach the red block",
            "description": "gripper near block",
            "allowed": [0, 0.1, 0.2],
        },
        {"name": "grasp", "description": "block lifted", "allowed": [0, 0.15, 0.3]},
        {"name": "place in bowl", "description": "block rests in bowl", "allowed": [0, 0.25, 0.5]},
    ],
}


def test_rubric_accepts_maxima_summing_to_one():
    r = Rubric.model_validate(RUBRIC)
    assert r.step_names == ["reach the red block", "grasp", "place in bowl"]
    thirds = Rubric(task="t", steps=[Step(name=f"s{i}", allowed=[0, 1 / 3]) for i in range(3)])
    assert len(thirds.steps) == 3


def test_rubric_refuses_maxima_sum_0_9(tmp_path):
    bad = json.loads(json.dumps(RUBRIC))
    bad["steps"][2]["allowed"] = [0, 0.2, 0.4]
    with pytest.raises(ValidationError, match="maxima sum to 0.9"):
        Rubric.model_validate(bad)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(RubricError, match=r"bad.json.*maxima sum to 0.9"):
        load_rubric(p)


def test_rubric_other_schema_errors():
    with pytest.raises(ValidationError, match="duplicate"):
        Rubric(task="t", steps=[Step(name="a", allowed=[0.5]), Step(name="a", allowed=[0.5])])
    with pytest.raises(ValidationError, match="without ':'"):
        Step(name="a: b", allowed=[1])
    with pytest.raises(ValidationError):
        Step(name="a", allowed=[])
    with pytest.raises(ValidationError, match="finite"):
        Step(name="a", allowed=[float("nan")])
    with pytest.raises(RubricError, match="steps"):
        load_rubric({"task": "t", "steps": []})


@pytest.mark.parametrize("brk", ["\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e",
                                 "\x85", "\u2028", "\u2029"])  # fmt: skip
def test_step_name_with_any_line_break_is_refused(brk):
    """The parser splits lines where str.splitlines does: a name holding '\\r' was accepted
    and then no answer could ever parse."""
    with pytest.raises(ValidationError, match="must be one line: it holds a line break"):
        Step(name=f"grasp{brk}cup", allowed=[1])


def test_load_rubric_yaml_and_json(tmp_path):
    import yaml

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(RUBRIC))
    (tmp_path / "r.json").write_text(json.dumps(RUBRIC))
    assert load_rubric(tmp_path / "r.yaml") == load_rubric(tmp_path / "r.json")
    (tmp_path / "x.yaml").write_text("task: [unclosed")
    with pytest.raises(RubricError, match="x.yaml"):
        load_rubric(tmp_path / "x.yaml")


def test_score_sums_and_refuses_outside_set():
    r = Rubric.model_validate(RUBRIC)
    assert score(r, {"reach the red block": 0.2, "grasp": 0.3, "place in bowl": 0.5}) == (
        pytest.approx(1.0)
    )
    assert score(r, {"reach the red block": 0.1, "grasp": 0.0, "place in bowl": 0.0}) == (
        pytest.approx(0.1)
    )
    with pytest.raises(RubricError, match="not in allowed set"):
        score(r, {"reach the red block": 0.15, "grasp": 0.3, "place in bowl": 0.5})
    with pytest.raises(RubricError, match="missing steps"):
        score(r, {"grasp": 0.3, "place in bowl": 0.5})


@pytest.mark.parametrize("thinking", [None, "The block ends in the bowl.\nGrasp slipped once."])
def test_rubric_round_trip(thinking):
    r = Rubric.model_validate(RUBRIC)
    scores = {"reach the red block": 0.2, "grasp": 0.15, "place in bowl": 0.5}
    text = render_rubric(r, scores, thinking=thinking)
    assert parse_rubric(r, text) == scores
    assert text.startswith("<think>") == (thinking is not None)


def test_rubric_round_trip_thirds():
    r = Rubric(task="t", steps=[Step(name=f"s{i}", allowed=[0, 1 / 3]) for i in range(3)])
    s = {"s0": 1 / 3, "s1": 0.0, "s2": 1 / 3}
    assert parse_rubric(r, render_rubric(r, s)) == s


def _rej(text: str, needle: str) -> None:
    r = parse_rubric(Rubric.model_validate(RUBRIC), text)
    assert isinstance(r, Rejection), r
    assert needle in r.reason, r.reason


def test_rubric_parser_rejections():
    ok = "reach the red block: 0.2\ngrasp: 0.3\nplace in bowl: 0.5"
    _rej(ok.replace("grasp: 0.3", "grasp: 0.2"), "not in allowed set")
    _rej(ok.replace("\ngrasp: 0.3", ""), "missing steps ['grasp']")
    _rej(ok + "\nwave: 0", "unknown (extra) step 'wave'")
    _rej(ok + "\ngrasp: 0", "scored twice")
    _rej(ok.replace("0.5", "half"), "not a number")
    _rej(ok.replace("grasp: 0.3", "grasp 0.3"), "not '<step>: <score>'")
    _rej("I think it worked.\n" + ok, "not '<step>: <score>'")
    _rej("<think>unterminated\n" + ok, "think block")
    _rej("<think>a</think>\n" + ok + "\n<think>b</think>", "only one think block")
    # Reasoning before the answer is fine when it is in the think block.
    r = parse_rubric(Rubric.model_validate(RUBRIC), "<think>\nok: the score\n</think>\n" + ok)
    assert r == {"reach the red block": 0.2, "grasp": 0.3, "place in bowl": 0.5}
