"""``flora serve`` as a real subprocess, queried through the real OpenAIBackend over HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

from flora.backends import VLMBackend, VLMRequest
from flora.backends.base import VLMResponse
from flora.backends.openai_backend import OpenAIBackend
from flora.backends.processing import decode_image, encode_image
from tests.backends.backend_helpers import FAIL_MARKER, TOKEN, frames, start_server, stop_server


def _reqs() -> list[VLMRequest]:
    return [
        VLMRequest(
            prompt=f"window {k}",
            images=frames(k, seed=10 + k),
            frame_times_us=[250_000 * i for i in range(k)],
            max_new_tokens=6,
            top_logprobs=3,
            request_id=f"w{k}",
        )
        for k in range(4)
    ]


def test_end_to_end_matches_in_process(served, tiny_backend):
    client = OpenAIBackend(served.url, api_key=TOKEN, max_concurrency=4, timeout_s=60)
    assert isinstance(client, VLMBackend)
    reqs = _reqs()
    remote = client.generate(reqs)
    local = tiny_backend.generate(reqs)
    for r, loc in zip(remote, local, strict=True):
        assert r.ok, r.error
        # PNG frames are lossless: the served model sees exactly what the local one sees.
        assert r.text == loc.text
        assert len(r.logprobs) == len(loc.logprobs) >= 1
        # Cut off at max_new_tokens or ended by the model: the same over the wire.
        assert r.finish_reason == loc.finish_reason
        assert (loc.finish_reason == "length") == (len(loc.logprobs) == 6)
        for a, b in zip(r.logprobs, loc.logprobs, strict=True):
            assert a.token == b.token
            assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
            assert 1 <= len(a.top) <= 3 and a.top.keys() == b.top.keys()
            assert list(a.top.values()) == pytest.approx(list(b.top.values()), abs=1e-3)
    # The server reports the weights hash as system_fingerprint -> model_version.
    assert client.model_version == tiny_backend.model_version
    models = client.models()
    assert models["data"][0]["id"] == "flora"
    assert models["data"][0]["model_version"] == tiny_backend.model_version
    assert client.attempts == len(reqs)
    assert 1 <= client.max_in_flight <= 4


def test_the_client_reads_finish_reason():
    """``finish_reason: "length"`` (cut at max_tokens) is kept; anything else, or none, is
    an answer the model ended ("stop", the default of a response built without it)."""
    client = OpenAIBackend("http://127.0.0.1:9", max_concurrency=1, timeout_s=1)

    def reply(**choice):
        return {"choices": [{"message": {"role": "assistant", "content": "hi"}, **choice}]}

    assert client._parse(reply(finish_reason="length")).finish_reason == "length"
    assert client._parse(reply(finish_reason="stop")).finish_reason == "stop"
    assert client._parse(reply(finish_reason=None)).finish_reason == "stop"
    assert client._parse(reply()).finish_reason == "stop"
    assert VLMResponse("x").finish_reason == "stop"


def test_a_request_seed_travels_over_the_wire(served, tiny_backend):
    client = OpenAIBackend(served.url, api_key=TOKEN, max_concurrency=1, timeout_s=60)
    req = VLMRequest(prompt="sample me", temperature=1.5, max_new_tokens=6, seed=5)
    assert client.payload(req)["seed"] == 5
    (remote,) = client.generate([req])
    (local,) = tiny_backend.generate([req])
    assert remote.ok and remote.text == local.text


def test_concurrency_limit(served):
    client = OpenAIBackend(served.url, api_key=TOKEN, max_concurrency=2, timeout_s=60)
    reqs = [VLMRequest(prompt=f"q{i}", max_new_tokens=3) for i in range(6)]
    out = client.generate(reqs)
    assert all(r.ok for r in out)
    assert client.attempts == 6 and client.max_in_flight <= 2


def test_raw_wire_format(served):
    body = {
        "model": "flora",
        "messages": [
            {"role": "system", "content": "You are Flora."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<0.00 seconds>"},
                    {"type": "image_url", "image_url": {"url": encode_image(frames(1)[0], "jpeg")}},
                    {"type": "text", "text": "score"},
                ],
            },
        ],
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    h = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion"
    choice = data["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert data["usage"]["completion_tokens"] == len(choice["logprobs"]["content"]) <= 3
    assert data["usage"]["prompt_tokens"] > 10
    assert all(len(c["top_logprobs"]) == 2 for c in choice["logprobs"]["content"])
    # Without logprobs: none are returned.
    body2 = {**body, "logprobs": False}
    body2.pop("top_logprobs")
    r2 = httpx.post(f"{served.url}/v1/chat/completions", json=body2, headers=h, timeout=60)
    assert r2.status_code == 200 and r2.json()["choices"][0]["logprobs"] is None
    # Remote image URLs are refused (400: the server never fetches from the network).
    bad = {**body, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://example.invalid/x.png"}}]}]}  # fmt: skip
    r3 = httpx.post(f"{served.url}/v1/chat/completions", json=bad, headers=h, timeout=60)
    assert r3.status_code == 400 and "data: URL" in r3.json()["error"]["message"]


def test_bearer_token_required(served):
    body = {"model": "flora", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert httpx.get(f"{served.url}/health").status_code == 200  # probes stay open
    assert httpx.get(f"{served.url}/v1/models").status_code == 401
    assert httpx.post(f"{served.url}/v1/chat/completions", json=body).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (
        httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=wrong).status_code == 401
    )
    ok = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=ok, timeout=60)
    assert r.status_code == 200
    # Through the client: a 401 is final (not retried) and comes back as an error response.
    client = OpenAIBackend(served.url, api_key="wrong", max_retries=3, backoff_s=0.01)
    (resp,) = client.generate(_reqs()[:1])
    assert not resp.ok and "HTTP 401" in resp.error and client.attempts == 1


def test_wrong_model_name_is_final(served):
    client = OpenAIBackend(served.url, api_key=TOKEN, model="other", max_retries=3, backoff_s=0.01)
    (resp,) = client.generate(_reqs()[:1])
    assert "HTTP 404" in resp.error and client.attempts == 1


def test_500s_are_retried_bounded_then_error_while_others_succeed(served):
    before = served.health()["injected_failures"]
    client = OpenAIBackend(
        served.url, api_key=TOKEN, max_retries=2, max_concurrency=3, backoff_s=0.01
    )
    reqs = _reqs()
    reqs[1] = VLMRequest(prompt=f"please {FAIL_MARKER}", max_new_tokens=4, request_id="doomed")
    out = client.generate(reqs)
    assert [r.ok for r in out] == [True, False, True, True]
    assert out[1].text == "" and "failed after 3 attempts" in out[1].error
    assert "HTTP 500" in out[1].error
    assert all(r.text and r.logprobs for i, r in enumerate(out) if i != 1)
    # Exactly max_retries + 1 attempts hit the server for the failing request.
    assert served.health()["injected_failures"] - before == 3
    assert client.attempts == 3 + 3


def test_timeouts_and_500s_retried_then_success(tiny_model, tmp_path):
    # Completion #0 sleeps past the client timeout; #0-#2 answer 500; #3 is served. The
    # timeout leaves the served attempt 3 s: a tiny model's answer on two busy cores.
    server = start_server(
        tiny_model,
        tmp_path / "faulty.log",
        "--delay-first", "1", "--delay-s", "6",
        "--fail-first", "3",
    )  # fmt: skip
    try:
        client = OpenAIBackend(
            server.url, timeout_s=3.0, max_retries=3, max_concurrency=1, backoff_s=0.01
        )
        (resp,) = client.generate(_reqs()[2:3])
        assert resp.ok, resp.error
        assert resp.text and len(resp.logprobs) >= 1
        assert client.attempts == 4
        # #0 (abandoned by the client) also answers 500 once its sleep ends.
        deadline = time.monotonic() + 60  # a hang guard: #0's sleep ends after 6 s
        while server.health()["injected_failures"] < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        h = server.health()
        assert h["completions"] == 4 and h["injected_failures"] == 3
        # Bounded: with fewer retries than faults the request fails, and is not retried more.
        client2 = OpenAIBackend(server.url, timeout_s=10, max_retries=0, backoff_s=0.01)
        (ok,) = client2.generate(_reqs()[:1])
        assert ok.ok and client2.attempts == 1  # faults exhausted: first try works
    finally:
        stop_server(server)


def test_connection_errors_are_retried_then_reported():
    from tests.backends.backend_helpers import refused_port

    with refused_port() as port:
        client = OpenAIBackend(
            f"http://127.0.0.1:{port}", timeout_s=2, max_retries=2, backoff_s=0.01
        )
        out = client.generate(_reqs()[:2])
    assert all(not r.ok and "connection error" in r.error for r in out)
    assert "failed after 3 attempts" in out[0].error
    assert client.attempts == 6


def test_data_url_roundtrip():
    img = frames(1, seed=5)[0]
    assert (decode_image(encode_image(img, "png")) == img).all()
    jpg = decode_image(encode_image(img, "jpeg"))
    assert jpg.shape == img.shape and jpg.dtype == img.dtype
