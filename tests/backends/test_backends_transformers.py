"""In-process TransformersBackend: batching, logprobs, LoRA, model_version, make_backend."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
from transformers.utils import is_torchvision_available

from flora.backends import BackendError, VLMBackend, VLMRequest, make_backend
from flora.backends.processing import render_prompt, request_to_chat
from flora.backends.transformers_backend import TransformersBackend, fingerprint_dir
from flora.settings import FloraSettings
from tests.backends.backend_helpers import frames


def _reqs(max_new: int = 8, top: int = 3) -> list[VLMRequest]:
    # Different image counts and prompt lengths: left padding really happens.
    return [
        VLMRequest(
            prompt=p,
            images=frames(k, seed=k),
            frame_times_us=[250_000 * i for i in range(k)] if k else None,
            max_new_tokens=max_new,
            top_logprobs=top,
            request_id=f"r{k}",
        )
        for k, p in [(0, "hi"), (1, "segment this window"), (3, "score"), (4, "caption it")]
    ]


def _teacher_forced_logprobs(backend: TransformersBackend, req: VLMRequest, ids: list[int]):
    """Log-softmax of the model's logits at each generated position, by one forward pass."""
    chat = request_to_chat(req, "images")
    prompt = render_prompt(backend.processor, chat)
    enc = backend.processor(text=[prompt], images=chat.images() or None, return_tensors="pt")
    n = enc["input_ids"].shape[1]
    full = torch.cat([enc["input_ids"], torch.tensor([ids])], dim=1)
    enc["input_ids"] = full
    enc["attention_mask"] = torch.ones_like(full)
    enc["mm_token_type_ids"] = torch.cat(
        [enc["mm_token_type_ids"], torch.zeros(1, len(ids), dtype=enc["mm_token_type_ids"].dtype)],
        dim=1,
    )
    with torch.no_grad():
        logits = backend.model(**enc).logits[0, n - 1 : n - 1 + len(ids)]
    return torch.log_softmax(logits.float(), -1)


def test_is_a_vlm_backend(tiny_backend):
    assert isinstance(tiny_backend, VLMBackend)
    assert tiny_backend.name == "transformers"
    assert len(tiny_backend.model_version) == 16


def test_greedy_logprobs_match_a_teacher_forced_forward_pass(tiny_backend):
    req = _reqs()[2]
    (resp,) = tiny_backend.generate([req])
    assert resp.ok and resp.model == tiny_backend.model_version
    assert 1 <= len(resp.logprobs) <= req.max_new_tokens
    # Re-encoding decoded text need not give the generated ids; generate_chats exposes them.
    (gen,) = tiny_backend.generate_chats([request_to_chat(req, "images")])
    ids = gen.token_ids
    assert gen.text == resp.text and len(ids) == len(resp.logprobs)
    lp = _teacher_forced_logprobs(tiny_backend, req, ids)
    for t, (tok_id, rec) in enumerate(zip(ids, resp.logprobs, strict=True)):
        assert rec.logprob == pytest.approx(float(lp[t, tok_id]), abs=1e-4)
        # Greedy: the chosen token is the argmax, so it tops the alternatives.
        assert tok_id == int(lp[t].argmax())
        # top_logprobs: the 3 likeliest ids, decoded; ids decoding to the same string
        # (partial UTF-8 bytes -> "\ufffd") keep the likelier one.
        v3, i3 = lp[t].topk(3)
        want: dict[str, float] = {}
        for v, i in zip(v3.tolist(), i3.tolist(), strict=True):
            want.setdefault(tiny_backend.tokenizer.decode([i]), v)
        assert rec.top.keys() == want.keys()
        assert list(rec.top.values()) == pytest.approx(list(want.values()), abs=1e-4)
        assert max(rec.top.values()) == pytest.approx(rec.logprob, abs=1e-4)
        vals = list(rec.top.values())
        assert vals == sorted(vals, reverse=True)
        assert all(v <= 0 for v in vals)
    assert tiny_backend.tokenizer.decode(ids, skip_special_tokens=True) == resp.text


def test_batched_equals_one_at_a_time(tiny_backend):
    reqs = _reqs()
    batched = tiny_backend.generate(reqs)
    single = [tiny_backend.generate([r])[0] for r in reqs]
    assert len({r.text for r in batched}) > 1  # the tiny model's output depends on input
    for b, s in zip(batched, single, strict=True):
        assert b.ok and s.ok
        assert b.text == s.text
        assert len(b.logprobs) == len(s.logprobs)
        for x, y in zip(b.logprobs, s.logprobs, strict=True):
            assert x.token == y.token
            assert x.logprob == pytest.approx(y.logprob, abs=1e-3)


def test_bad_request_is_an_error_response_and_the_rest_completes(tiny_backend):
    import numpy as np

    reqs = _reqs(max_new=4, top=0)
    bad = [
        VLMRequest(prompt="x", images=[np.zeros((8, 8), np.uint8)], request_id="gray"),
        VLMRequest(prompt="x", images=frames(2), frame_times_us=[0], request_id="times"),
        VLMRequest(prompt="x", images=[np.zeros((8, 8, 3), np.float32)], request_id="dtype"),
    ]
    out = tiny_backend.generate([reqs[0], bad[0], reqs[1], bad[1], bad[2]])
    assert out[0].ok and out[2].ok and out[0].text and out[2].text
    assert "gray" in out[1].error and "(H, W, 3)" in out[1].error
    assert "times" in out[3].error and "frame_times_us" in out[3].error
    assert "dtype" in out[4].error and "uint8" in out[4].error
    assert all(r.text == "" for r in (out[1], out[3], out[4]))
    assert out[0].logprobs and all(lp.top == {} for lp in out[0].logprobs)


def test_max_new_tokens_and_mixed_settings_in_one_call(tiny_backend):
    reqs = [
        VLMRequest(prompt="a", max_new_tokens=2),
        VLMRequest(prompt="b", max_new_tokens=7, top_logprobs=1),
        VLMRequest(prompt="c", max_new_tokens=1, temperature=0.7),
    ]
    out = tiny_backend.generate(reqs)
    assert [len(r.logprobs) <= m.max_new_tokens for r, m in zip(out, reqs, strict=True)] == [
        True
    ] * 3
    assert all(len(lp.top) == 1 for lp in out[1].logprobs)
    # Cut at max_new_tokens ("length") or ended by the model ("stop", fewer tokens).
    for r, m in zip(out, reqs, strict=True):
        assert r.finish_reason == ("length" if len(r.logprobs) == m.max_new_tokens else "stop")


def test_sampling_is_seeded_and_reports_raw_logprobs(tiny_model):
    b = TransformersBackend(tiny_model, device="cpu", seed=7)
    req = VLMRequest(prompt="sample me", temperature=1.5, max_new_tokens=6, top_logprobs=2)
    first = b.generate([req, req, req])
    again = b.generate([req, req, req])
    assert [r.text for r in first] == [r.text for r in again]  # seeded: reproducible
    assert len({r.text for r in first}) > 1  # sampled: the three draws differ
    (gen,) = b.generate_chats([request_to_chat(req, "images")])
    lp = _teacher_forced_logprobs(b, req, gen.token_ids)
    # Reported logprobs are the raw model's (temperature 1), not the tempered ones.
    for t, (tid, rec) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True)):
        assert rec.logprob == pytest.approx(float(lp[t, tid]), abs=1e-4)


def test_a_request_seed_reproduces_its_draw_alone_or_batched(tiny_backend):
    """A sampled retry (flora.parsing.retry_request) carries its own seed: its draw does not
    depend on what else is generated in the same call."""
    a = VLMRequest(prompt="sample me", temperature=1.5, max_new_tokens=6, seed=11)
    b = VLMRequest(prompt="sample me", temperature=1.5, max_new_tokens=6, seed=12)
    (alone,) = tiny_backend.generate([a])
    mixed = tiny_backend.generate([b, VLMRequest(prompt="hi", max_new_tokens=3), a])
    assert alone.ok and alone.text == mixed[2].text
    assert mixed[0].text != alone.text  # another seed, another draw


def test_lora_adapter_is_applied(tiny_model, lora_dir, tiny_backend):
    merged = TransformersBackend(tiny_model, adapter_path=lora_dir, device="cpu")
    unmerged = TransformersBackend(
        tiny_model, adapter_path=lora_dir, device="cpu", merge_adapter=False
    )
    assert merged.model_version.startswith(tiny_backend.model_version + "+lora-")
    assert merged.model_version == unmerged.model_version
    reqs = _reqs(max_new=6)
    base = tiny_backend.generate(reqs)
    a, u = merged.generate(reqs), unmerged.generate(reqs)
    # The adapter changes the model: the first-token distributions differ.
    diffs = [
        abs(x.logprobs[0].logprob - y.logprobs[0].logprob) for x, y in zip(base, a, strict=True)
    ]
    assert max(diffs) > 1e-3
    # Merging the adapter into the weights does not change what it computes.
    for x, y in zip(a, u, strict=True):
        assert x.text == y.text
        for p, q in zip(x.logprobs, y.logprobs, strict=True):
            assert p.logprob == pytest.approx(q.logprob, abs=1e-3)


def test_model_version_tracks_content(tiny_model, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    assert fingerprint_dir(copy) == fingerprint_dir(tiny_model)
    cfg = copy / "generation_config.json"
    cfg.write_text(cfg.read_text().replace('"do_sample": false', '"do_sample": false '))
    assert fingerprint_dir(copy) != fingerprint_dir(tiny_model)
    # Large-directory mode (partial hashing) still sees a change in a weight file's header.
    w = copy / "model.safetensors"
    data = bytearray(w.read_bytes())
    h1 = fingerprint_dir(copy, full_limit=0)
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    assert fingerprint_dir(copy, full_limit=0) != h1


def test_video_input_mode(tiny_model):
    if is_torchvision_available():
        b = TransformersBackend(tiny_model, device="cpu", vision_input="video")
        req = VLMRequest(
            prompt="v", images=frames(4), frame_times_us=[0, 250_000, 500_000, 750_000]
        )
        (r,) = b.generate([req])
        assert r.ok, r.error
    else:  # documented: video input needs the checkpoint's video processor (torchvision)
        with pytest.raises(BackendError, match="torchvision"):
            TransformersBackend(tiny_model, device="cpu", vision_input="video")


def test_make_backend_selects_by_settings(tiny_model, lora_dir):
    from flora.backends.openai_backend import OpenAIBackend

    assert make_backend(FloraSettings(backend="kinematic")) is None
    tb = make_backend(
        FloraSettings(backend="transformers", model_path=str(tiny_model), device="cpu")
    )
    assert isinstance(tb, TransformersBackend) and tb.adapter_path is None
    tl = make_backend(
        FloraSettings(
            backend="transformers",
            model_path=str(tiny_model),
            adapter_path=str(lora_dir),
            device="cpu",
        )
    )
    assert "+lora-" in tl.model_version
    ob = make_backend(
        FloraSettings(
            backend="openai",
            openai_base_url="http://127.0.0.1:9/v1",
            openai_api_key="k",
            openai_model="m",
            request_timeout_s=3.5,
            max_retries=2,
            max_concurrency=5,
        )
    )
    assert isinstance(ob, OpenAIBackend)
    assert (ob.base_url, ob.model, ob.timeout_s, ob.max_retries, ob.max_concurrency) == (
        "http://127.0.0.1:9/v1",
        "m",
        3.5,
        2,
        5,
    )
    with pytest.raises(BackendError, match="FLORA_MODEL_PATH"):
        make_backend(FloraSettings(backend="transformers"))
    with pytest.raises(BackendError, match="FLORA_OPENAI_BASE_URL"):
        make_backend(FloraSettings(backend="openai"))


def test_make_backend_reads_env(monkeypatch, tiny_model):
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_BACKEND", "transformers")
    monkeypatch.setenv("FLORA_MODEL_PATH", str(tiny_model))
    monkeypatch.setenv("FLORA_DEVICE", "cpu")
    monkeypatch.setenv("FLORA_GUIDED", "true")
    get_settings.cache_clear()
    try:
        b = make_backend()
        assert isinstance(b, TransformersBackend) and b.model_path == str(tiny_model)
        assert b.guided is True
    finally:
        get_settings.cache_clear()


def test_guided_backend_answers_within_the_request_grammar(tiny_model, tiny_backend):
    """``guided=True`` enforces each request's regex in process (as ``flora serve`` does);
    the same random model unguided breaks the grammar, so the mask is what holds it."""
    import regex

    from flora.parsing import Rejection
    from flora.segment.grammar import SegmentsGuide, parse_segments, segments_regex

    pattern = segments_regex(40)
    reqs = [
        VLMRequest(
            prompt=f"segment {k}", images=frames(k, seed=k), max_new_tokens=24, guided_regex=pattern
        )
        for k in range(3)
    ] + [VLMRequest(prompt="no grammar", max_new_tokens=6)]
    guided = TransformersBackend(tiny_model, device="cpu", batch_size=4, guided=True)
    out = guided.generate(reqs)
    assert all(r.ok for r in out)
    guide = SegmentsGuide(40)  # the segment regex gets its exact guide (order included)
    for r in out[:3]:
        assert regex.fullmatch(pattern, r.text, partial=True), r.text
        assert guide.extendable(r.text), r.text
        if guide.complete(r.text):
            assert not isinstance(parse_segments(r.text, 40), Rejection)
    assert out[3].text == tiny_backend.generate(reqs[3:])[0].text  # no regex: untouched
    free = tiny_backend.generate(reqs[:3])
    assert not any(regex.fullmatch(pattern, r.text, partial=True) for r in free)
    assert guided.regex_mask(pattern) is guided.regex_mask(pattern)  # compiled once
    # The dense regex gets its exact guide too: a label below the declared worst is out.
    from flora.reward.dense import dense_regex

    dense = guided.regex_mask(dense_regex())
    assert dense.extendable("worst: 3\n1: 3") and not dense.extendable("worst: 3\n1: 2")


def test_guided_rollouts_of_the_live_policy(tiny_backend):
    """GRPO's in-process rollout backend samples within the grammar when the recipe asks."""
    import regex

    from flora.segment.grammar import segments_regex
    from training.grpo import LivePolicyBackend

    pattern = segments_regex(40)
    req = VLMRequest(prompt="segment", max_new_tokens=16, temperature=1.0, guided_regex=pattern)
    for guided in (True, False):
        live = LivePolicyBackend(tiny_backend.model, tiny_backend.processor, seed=3, guided=guided)
        texts = [r.text for r in live.generate([req] * 4)]
        hits = [regex.fullmatch(pattern, t, partial=True) is not None for t in texts]
        assert all(hits) if guided else not any(hits), texts


def test_a_forced_dense_label_is_decoded_again_from_the_cheapest_group(tiny_model):
    """The dense guide forces the declared worst level at group 32 when no label above took
    it; the backend then continues the answer, within the guide, from the group where the
    model found that level least unlikely (``DenseGuide.repair``). The first pass is set
    by hand (the answer and the raw label log-probs a model would have given); the
    continuation is the tiny model's own."""
    from flora.backends.base import TokenLogprob
    from flora.backends.transformers_backend import Generation
    from flora.reward.dense import DenseGuide, DenseOutput, dense_regex, parse_dense, render_dense

    backend = TransformersBackend(tiny_model, device="cpu", guided=True)
    req = VLMRequest(prompt="dense", images=frames(2), max_new_tokens=300,
                     guided_regex=dense_regex())  # fmt: skip
    chat = request_to_chat(req, "images")
    mask = chat.meta["logits_mask"] = backend.regex_mask(dense_regex())
    text = render_dense([3] * 31 + [1], [""] * 31 + ["dropped"])
    ids = backend.tokenizer.encode(text)
    assert "".join(mask.tokens[i] for i in ids) == text
    starts, pos = {}, 0
    for t, i in enumerate(ids):
        starts[pos] = t
        pos += len(mask.tokens[i])
    at30, at32 = text.index("\n30: ") + 5, text.index("\n32: ") + 5
    watch = backend._watch_ids([chat])
    assert sorted(watch) == ["1", "2", "3"]
    col = {s: k for k, s in enumerate(watch)}
    watched = torch.full((len(ids), 3), -8.0)
    watched[:, col["3"]] = -0.05  # the model prefers "normal" at every label
    watched[starts[at30], col["1"]] = -1.0  # and finds a failure least unlikely at group 30
    first = Generation(text=text, token_ids=ids, prompt_tokens=7,
                       logprobs=[TokenLogprob(mask.tokens[i], -0.1, {}) for i in ids])  # fmt: skip
    (out,) = backend._repaired([chat], [first], watched[None], watch, 0.0, seed=0)
    lead = text[:at30] + "1"
    assert out is not first and out.text.startswith(lead), out.text[:80]
    assert DenseGuide().extendable(out.text), out.text
    assert backend.tokenizer.decode(out.token_ids) == out.text
    assert len(out.logprobs) == len(out.token_ids) and out.prompt_tokens == 7
    assert out.logprobs[starts[at30]].logprob == -1.0  # the placed label, raw log-prob
    if out.finish_reason == "stop":
        parsed = parse_dense(out.text)
        assert isinstance(parsed, DenseOutput) and parsed.labels[29] == 1, out.text
    # The model chose the level at group 32 itself: nothing is decoded again.
    watched[starts[at32], col["1"]] = -0.01
    (kept,) = backend._repaired([chat], [first], watched[None], watch, 0.0, seed=0)
    assert kept is first

    # Several forced answers of one batch are continued together, each as it would be alone.
    watched[starts[at32], col["1"]] = -8.0
    other = watched.clone()
    other[starts[at30], col["1"]] = -8.0
    other[starts[text.index("\n12: ") + 5], col["1"]] = -0.5  # cheapest at group 12
    short = dataclasses.replace(chat, max_new_tokens=starts[at30] + 6)  # a tight budget
    cases = [(chat, watched), (chat, other), (short, watched)]
    stacked = torch.stack([w for _, w in cases])
    together = backend._repaired([c for c, _ in cases], [first] * 3, stacked, watch, 0.0, seed=0)
    for (c, w), got in zip(cases, together, strict=True):
        (alone,) = backend._repaired([c], [first], w[None], watch, 0.0, seed=0)
        assert got.token_ids == alone.token_ids and got.text == alone.text
        assert got.finish_reason == alone.finish_reason
    assert together[1].text.startswith(text[: text.index("\n12: ") + 5] + "1")
    assert len(together[2].token_ids) <= short.max_new_tokens
    assert together[2].finish_reason == "length"
