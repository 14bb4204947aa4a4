"""One bad answer never aborts a step (issue 15 finding 2).

Adversarial model text (huge integers, NUL bytes, 10 MB lines, unicode digits) through every
parser, and malformed server answers through the OpenAI client over a real local HTTP
server: each becomes a typed rejection or an error response; the steps complete and record
the failure with its reason.
"""

from __future__ import annotations

import pytest

from flora.backends.base import TokenLogprob, VLMRequest, VLMResponse
from flora.backends.openai_backend import OpenAIBackend
from flora.caption.grammar import parse_caption
from flora.parsing import MAX_REASON_CHARS, MAX_TEXT_CHARS, Rejection, generate_parsed
from flora.reward.dense import parse_dense, render_dense
from flora.reward.outcome import parse_outcome, parse_outcome_response
from flora.reward.rubric import Rubric, parse_rubric
from flora.segment.grammar import REASONS, parse_segments
from flora.tables import TableStore
from tests.faults import ScriptedBackend
from tests.reliability.stub_server import completion, outcome_completion, stub_server

HUGE = "9" * 5000  # int() refuses more than 4,300 digits
TEN_MB = 10 * 1024 * 1024


def _bounded(rej: object) -> Rejection:
    assert isinstance(rej, Rejection), rej
    assert len(rej.reason) <= MAX_REASON_CHARS + 40 and len(rej.text) <= MAX_TEXT_CHARS + 40
    return rej


# --------------------------------------------------------------------------- parsers

SEGMENT_BAD = {
    "huge start tick": f"{HUGE} 1 0 0",
    "huge end tick": f"0 {HUGE} 0 0",
    "huge flag": f"0 1 {HUGE} 0",
    "huge tick in line 2": f"0 4 0 0\n5 {HUGE} 0 0",
    "NUL byte": "0 4 0 0\x00",
    "NUL line": "\x00",
    "arabic-indic digits": "0 \u0664 0 0",
    "fullwidth digits": "\uff10 \uff14 0 0",
    "10 MB line": "0 4 0 0 " + "1 " * (TEN_MB // 2),
    "10 MB of digits": "1" * TEN_MB,
    "millions of lines": "0 1 0 0\n" + "x\n" * (TEN_MB // 2),
}


@pytest.mark.parametrize("text", SEGMENT_BAD.values(), ids=SEGMENT_BAD.keys())
def test_segment_parser_rejects_without_raising(text):
    rej = _bounded(parse_segments(text, 320))
    assert rej.reason.split(":", 1)[0] in REASONS


def test_segment_parser_names_huge_ticks_as_out_of_range():
    rej = parse_segments(f"0 {HUGE} 0 0", 320)
    assert rej.reason.startswith("tick_range: line 1") and "5000 digits" in rej.reason


OUTCOME_BAD = {
    "huge score": f"score: {HUGE}",
    "NUL": "score: 4\x00",
    "unicode digit": "score: \u0664",
    "fullwidth digit": "score: \uff14",
    "10 MB line": "score: 4 " + "x" * TEN_MB,
    "10 MB of digits": "score: " + "4" * TEN_MB,
}


@pytest.mark.parametrize("text", OUTCOME_BAD.values(), ids=OUTCOME_BAD.keys())
def test_outcome_parser_rejects_without_raising(text):
    _bounded(parse_outcome(text))


@pytest.mark.parametrize("lp", [1e308, 5.0, float("inf"), "-0.1", None, True])
def test_outcome_distribution_rejects_broken_logprobs(lp):
    # A positive or infinite log-probability made exp() overflow or the expectation NaN.
    toks = [TokenLogprob("4", -0.1, {"4": -0.1, "3": lp})]  # type: ignore[dict-item]
    res = parse_outcome_response(VLMResponse("score: 4", toks))
    if lp is None:  # an absent probability is "missing", not broken
        assert not isinstance(res, Rejection) and res.missing_scores == (1, 2, 3, 5)
    else:
        assert _bounded(res).kind == "validation"


def _dense_ok() -> list[str]:
    labels = [3] * 32
    labels[5] = 1
    reasons = [""] * 32
    reasons[5] = "the gripper closes on empty air"
    return render_dense(labels, reasons).split("\n")


def _dense_with(line_no: int, text: str) -> str:
    lines = _dense_ok()
    lines[line_no] = text
    return "\n".join(lines)


DENSE_BAD = {
    "huge group number": _dense_with(1, f"{HUGE}: 3"),
    "huge label": _dense_with(1, f"1: {HUGE}"),
    "huge worst": _dense_with(0, f"worst: {HUGE}"),
    "NUL in reason": _dense_with(6, "6: 1 | the gripper\x00 slips"),
    "NUL as label": _dense_with(1, "1: \x00"),
    "unicode group number": _dense_with(1, "\u0661: 3"),
    "10 MB reason": _dense_with(6, "6: 1 | " + "slip " * (TEN_MB // 5)),
    "millions of lines": "worst: 3\n" + "1: 3\n" * (TEN_MB // 5),
}


@pytest.mark.parametrize("text", DENSE_BAD.values(), ids=DENSE_BAD.keys())
def test_dense_parser_rejects_without_raising(text):
    assert not isinstance(parse_dense("\n".join(_dense_ok())), Rejection)
    _bounded(parse_dense(text))


RUBRIC = Rubric.model_validate(
    {
        "task": "stack",
        "steps": [{"name": "grasp", "allowed": [0, 0.5]}, {"name": "place", "allowed": [0, 0.5]}],
    }  # fmt: skip
)
RUBRIC_BAD = {
    "huge score": f"grasp: {HUGE}\nplace: 0.5",
    "huge exponent": "grasp: 1e999999999999\nplace: 0.5",
    "NUL": "grasp: 0.5\x00\nplace: 0.5",
    "unicode digit": "grasp: \u0660.5\nplace: 0.5",
    "10 MB line": "grasp: 0.5 " + "x" * TEN_MB + "\nplace: 0.5",
    "millions of lines": "grasp: 0.5\n" + "grasp: 0.5\n" * (TEN_MB // 11),
}


@pytest.mark.parametrize("text", RUBRIC_BAD.values(), ids=RUBRIC_BAD.keys())
def test_rubric_parser_rejects_without_raising(text):
    assert parse_rubric(RUBRIC, "grasp: 0.5\nplace: 0.5") == {"grasp": 0.5, "place": 0.5}
    _bounded(parse_rubric(RUBRIC, text))


CAPTION_BAD = {
    "NUL": "caption: the robot picks up the\x00 red block.",
    "huge number": f"caption: the robot picks up {HUGE} red blocks.",
    "10 MB line": "caption: the robot " + "picks " * (TEN_MB // 6) + "up.",
}


@pytest.mark.parametrize("text", CAPTION_BAD.values(), ids=CAPTION_BAD.keys())
def test_caption_parser_rejects_without_raising(text):
    _bounded(parse_caption(text))


# --------------------------------------------------------------------------- boundaries


def test_retries_are_sampled_and_seeded_by_request_and_attempt():
    """A greedy backend repeats a rejected answer word for word: retries sample, with a seed
    from the request id and the attempt, so a rerun sends exactly the same retries."""
    from flora.parsing import RETRY_TEMPERATURE

    def run():
        seen: list[tuple[str, float, int | None]] = []

        def answer(r):
            seen.append((r.request_id, r.temperature, r.seed))
            return "bad"

        reqs = [VLMRequest("x", request_id="ep1/dense/w0"), VLMRequest("x", request_id="ep1/w1",
                temperature=1.2)]  # fmt: skip
        out = generate_parsed(ScriptedBackend(answer), reqs, lambda r: Rejection("no"), 3)
        assert [len(o.attempts) for o in out] == [3, 3]
        return seen

    seen = run()
    assert seen[:2] == [("ep1/dense/w0", 0.0, None), ("ep1/w1", 1.2, None)]  # as asked
    retries = seen[2:]
    assert [t for _, t, _ in retries] == [RETRY_TEMPERATURE, 1.2] * 2
    assert len({s for _, _, s in retries}) == 4 and None not in {s for _, _, s in retries}
    assert run() == seen  # reproducible


def test_a_raising_parser_rejects_that_answer_only():
    def parse(resp):
        if resp.text == "boom":
            raise ZeroDivisionError("parser bug")
        return resp.text

    be = ScriptedBackend(lambda r: r.prompt)
    out = generate_parsed(be, [VLMRequest("ok"), VLMRequest("boom")], parse, max_attempts=2)
    assert out[0].ok and out[0].value == "ok"
    rej = out[1].rejection
    assert rej.kind == "parse" and rej.reason == "parser error: ZeroDivisionError: parser bug"
    assert len(out[1].attempts) == 2  # retried like any rejected answer


def test_one_parser_per_request_in_a_mixed_batch():
    """A mixed batch (the rewarder's outcome and dense items) parses each answer with its own
    grammar: only the request whose own parser rejects is asked again."""
    be = ScriptedBackend(lambda r: "score: 4")
    out = generate_parsed(be, [VLMRequest("o"), VLMRequest("d")],
                          [lambda r: parse_outcome(r.text), lambda r: parse_dense(r.text)],
                          max_attempts=2)  # fmt: skip
    assert out[0].ok and out[0].value == 4 and out[0].attempts == []
    assert not out[1].ok and len(out[1].attempts) == 2
    assert be.calls == 2  # the second round re-sent the dense request alone
    with pytest.raises(ValueError, match="1 parsers for 2 requests"):
        generate_parsed(be, [VLMRequest("o"), VLMRequest("d")], [parse_outcome], 2)


MALFORMED = {
    "logprobs a list": (completion(logprobs=[1, 2]), "choices[0].logprobs is list"),
    "logprobs a string": (completion(logprobs="none"), "choices[0].logprobs is str"),
    "logprobs.content an object": (completion(logprobs={"content": {"a": 1}}), "content is dict"),
    "logprob a string": (
        completion(logprobs={"content": [{"token": "a", "logprob": "-0.1"}]}),
        "logprobs.content[0].logprob is str",
    ),
    "top_logprobs entry without token": (
        completion(logprobs={"content": [{"token": "a", "logprob": -0.1, "top_logprobs": [7]}]}),
        "top_logprobs[0] has no string 'token'",
    ),
    "message a string": ({"choices": [{"message": "score: 4"}]}, "message is str"),
    "choices empty": ({"choices": []}, "'choices' is list of length 0"),
    "choices missing": ({"id": "x"}, "'choices' is null"),
    "choice a number": ({"choices": [3]}, "message is null"),
    "content a number": (completion(17), "content is int"),
    "body a list": ([1, 2, 3], "expected a JSON object, got list"),
    "body not JSON": (b"<html>502 Bad Gateway</html>", "invalid JSON"),
    "deeply nested JSON": (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
}


@pytest.mark.parametrize("body,why", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_server_answers_become_error_responses(body, why):
    with stub_server([body]) as srv:
        client = OpenAIBackend(srv.url, max_retries=1, backoff_s=0.0, max_concurrency=1)
        with client:
            out = client.generate([VLMRequest("describe")])
    assert len(out) == 1 and not out[0].ok and out[0].text == ""
    assert why in out[0].error, out[0].error


def test_null_content_is_an_empty_answer_rejected_by_the_parser():
    with stub_server([completion(None)]) as srv, OpenAIBackend(srv.url, max_retries=0) as client:
        out = generate_parsed(client, [VLMRequest("x")], lambda r: parse_outcome(r.text), 2)
    assert out[0].rejection.reason.startswith("outcome: expected exactly")
    assert len(srv.requests) == 2


def _eid(ds, i: int) -> str:
    return f"{ds.name}/{i:06d}"


def test_outcome_step_over_http_completes_and_records_each_bad_answer(tiny_dataset, tmp_path):
    from flora.reward.run import outcome_dataset

    answers = [
        completion("score: 4", logprobs=[{"token": "4"}]),  # episode 0: logprobs a list
        outcome_completion(4),  # episode 1: fine
        completion(f"score: {HUGE}"),  # episode 2: huge integer
    ]
    with stub_server(answers) as srv:
        client = OpenAIBackend(srv.url, max_retries=0, max_concurrency=1)
        with client:
            res = outcome_dataset(tiny_dataset, client, tmp_path, max_attempts=1, max_frames=4,
                                  progress=False)  # fmt: skip
    assert res.written == [_eid(tiny_dataset, 1)]
    by_ep = {f.episode_id: f.reason for f in res.failures}
    assert set(by_ep) == {_eid(tiny_dataset, 0), _eid(tiny_dataset, 2)}
    assert "transport" in by_ep[_eid(tiny_dataset, 0)]
    assert "choices[0].logprobs is list" in by_ep[_eid(tiny_dataset, 0)]
    assert "outcome: score 999999…(5000 digits) outside 1..5" in by_ep[_eid(tiny_dataset, 2)]
    recorded = TableStore(tmp_path).failures("outcome")
    assert {f.episode_id: f.reason for f in recorded} == by_ep
    assert len(TableStore(tmp_path).read("outcome")) == 1


def test_segment_step_records_huge_integer_windows_and_completes(tiny_dataset, tmp_path):
    from flora.segment.run import segment_dataset

    def answer(req: VLMRequest) -> str:
        # Window 0 of every primary pass answers a tick of 5000 digits; the rest "none".
        return f"0 {HUGE} 0 0" if ":primary:0:" in req.request_id else "none"

    be = ScriptedBackend(answer)
    run = segment_dataset(tiny_dataset, tmp_path, be, episodes=[0, 1], max_attempts=2,
                          progress=False)  # fmt: skip
    assert run.processed == [_eid(tiny_dataset, 0), _eid(tiny_dataset, 1)]
    assert {f.episode_id for f in run.failures} == set(run.processed)
    for f in run.failures:
        assert f.item.startswith("primary window 0 ")
        assert f.reason.startswith("parse: tick_range: line 1: ticks 0,999999…(5000 digits)")
    # The episodes' parts are written (their other windows are fine) and will be retried.
    store = TableStore(tmp_path)
    assert all(store._part("events", e).exists() for e in run.processed)
    todo, _ = store.split_pending("events", run.processed)
    assert todo == run.processed
