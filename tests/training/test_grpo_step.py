"""One GRPO step on the tiny model under DeepSpeed ZeRO-2 on CPU (gloo, one rank)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from flora.backends.base import VLMRequest, VLMResponse
from flora.segment.plan import LocalSegment
from tests.tiny_finetune import single_torch_thread
from training.grpo import (
    GRPOConfig,
    GRPOPrompt,
    LivePolicyBackend,
    build_engine,
    completion_logprobs,
    encode_group,
    grpo_step,
)


class Scripted:
    """Rollout backend that answers each request id ``…#g<j>`` with ``texts[j]``."""

    name = "scripted"
    model_version = "scripted"

    def __init__(self, texts: Sequence[str]):
        self.texts = list(texts)
        self.requests: list[VLMRequest] = []

    def generate(self, requests):
        self.requests.extend(requests)
        return [VLMResponse(self.texts[int(r.request_id.rsplit("#g", 1)[1])]) for r in requests]


def _prompt(i: int) -> GRPOPrompt:
    rng = np.random.default_rng(i)
    imgs = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
    req = VLMRequest(
        prompt=f"segment window {i}",
        images=imgs,
        frame_times_us=[0, 250_000],
        system="You segment.",
        max_new_tokens=8,
        request_id=f"w{i}",
    )
    return GRPOPrompt(
        "segmenter", req, f"w{i}", n_ticks=40, reference=[LocalSegment(0, 40, True, True)]
    )


@pytest.fixture
def engine_and_model(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor
    from training.recipe import load_recipe
    from training.sft import apply_trainable, init_distributed

    torch.manual_seed(0)
    path = tiny_vlm_dir("qwen3_vl")
    recipe = load_recipe("segmenter-tiny")
    processor = load_processor(path, "images")
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
    model, groups = apply_trainable(model, recipe)  # rank-32 LoRA, like the SFT export
    _, world = init_distributed()
    cfg = GRPOConfig(
        group_size=4, prompts_per_step=2, max_new_tokens=8, lr=1e-2, beta=0.02, zero_stage=2
    )
    reference = copy.deepcopy(model).eval()  # the frozen SFT reference of the KL term
    engine = build_engine(model, groups, recipe, cfg, world)
    return engine, processor, cfg, reference


def _run(engine, processor, cfg, reference, backend, prompts):
    return grpo_step(
        1,
        engine.module,
        processor,
        prompts,
        backend,
        cfg,
        judge=None,
        reference=reference,
        backward=engine.backward,
        update=engine.step,
        zero_backward=lambda: engine.backward(
            sum((p * 0.0).sum() for p in engine.module.parameters() if p.requires_grad)
        ),
        forward=engine,
    )


def _lora(engine):
    return {n: p.detach().clone() for n, p in engine.module.named_parameters() if p.requires_grad}


def test_one_zero2_step_changes_the_lora_and_logs_parse_rate(engine_and_model):
    engine, processor, cfg, reference = engine_and_model
    assert engine.zero_optimization_stage() == 2
    backend = Scripted(["0 40 1 1", "none", "garbage!", "0 20 1 0"])
    before = _lora(engine)
    with single_torch_thread():
        stats = _run(engine, processor, cfg, reference, backend, [_prompt(0), _prompt(1)])
    after = _lora(engine)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed and all("lora_" in n for n in before)
    assert stats.valid_groups == 2 and stats.groups == 2
    assert stats.parse_rate == pytest.approx(3 / 4)  # the garbage completion
    assert not any("guided_" in k or "free_" in k for k in stats.metrics())  # no halves
    assert stats.tokens > 0 and np.isfinite(stats.loss) and stats.kl >= 0
    # every completion was sampled at the GRPO temperature, G per prompt
    assert len(backend.requests) == 8
    assert {r.temperature for r in backend.requests} == {1.0}


def test_all_equal_rewards_make_no_update(engine_and_model):
    engine, processor, cfg, reference = engine_and_model
    before = _lora(engine)
    with single_torch_thread():
        stats = _run(engine, processor, cfg, reference, Scripted(["none"] * 4), [_prompt(2)])
    after = _lora(engine)
    assert stats.valid_groups == 0 and stats.tokens == 0 and stats.reward_std == 0.0
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_the_recipes_kl_bound_reaches_the_steps_kl_and_the_max_log_ratio_is_logged(
    engine_and_model,
):
    """Against a reference that disagrees with the policy, the bounded estimator reads less
    than plain k3 on the same rollouts, and both log the same largest log-ratio."""
    engine, processor, cfg, reference = engine_and_model
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.5 * torch.randn_like(p))
    texts = ["0 40 1 1", "none", "0 20 1 0", "10 30 0 1"]
    stats = {}
    for bound in (None, 0.1):
        with single_torch_thread():
            stats[bound] = grpo_step(
                1,
                engine.module,
                processor,
                [_prompt(3)],
                Scripted(texts),
                dataclasses.replace(cfg, kl_bound=bound),
                judge=None,
                reference=reference,
                backward=lambda loss: None,  # no update: both read the same policy
                update=lambda: None,
            )
    plain, bounded = stats[None], stats[0.1]
    assert plain.kl_log_ratio_max == pytest.approx(bounded.kl_log_ratio_max)
    assert plain.kl_log_ratio_max > 0.1
    assert 0.0 < bounded.kl < plain.kl
    assert bounded.metrics()["grpo.kl_log_ratio_max"] == bounded.kl_log_ratio_max


def test_logprobs_match_the_full_forward_and_the_live_backend_samples(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor

    path = tiny_vlm_dir("qwen3_vl")
    processor = load_processor(path, "images")
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    p = _prompt(3)
    with single_torch_thread(), torch.no_grad():
        group = encode_group(processor, p.request, ["0 4 1 0", "none"])
        lp = completion_logprobs(model, group)
        # the second completion alone, scored by hand from one full forward pass
        one = encode_group(processor, p.request, ["none"])
        logits = model(**one.inputs).logits[0].float()
        ids = one.completion_ids[0]
        start = one.prompt_len
        want = torch.log_softmax(logits[start - 1 : start - 1 + len(ids)], -1)
        want = want.gather(-1, ids[:, None]).squeeze(-1)
        n = int(one.completion_mask.sum())
        assert torch.allclose(lp[1, :n], want[:n], atol=1e-4)
        assert torch.equal(lp[1, n:], torch.zeros_like(lp[1, n:]))
        # Rollouts sampled at temperature 0.5 are scored under softmax(logits / 0.5).
        group.temperature = 0.5
        hot = torch.log_softmax(logits[start - 1 : start - 1 + len(ids)] / 0.5, -1)
        hot = hot.gather(-1, ids[:, None]).squeeze(-1)
        assert torch.allclose(completion_logprobs(model, group)[1, :n], hot[:n], atol=1e-4)
        assert not torch.allclose(hot[:n], want[:n], atol=1e-2)
        live = LivePolicyBackend(model, processor, seed=0)
        reqs = [p.request] * 4
        for r in reqs:
            r.temperature, r.max_new_tokens = 1.0, 6
        outs = live.generate(reqs)
    assert len(outs) == 4 and all(o.ok for o in outs)
    assert len({o.text for o in outs}) > 1  # temperature 1: the group is not one answer
    assert not model.training


def test_guided_step_scores_the_masked_policy_with_the_rollouts_own_masks(engine_and_model):
    """Guided rollouts: the live backend samples under the segment grammar's guide and the
    step's log-probs use that very mask (its prefix cache is what the loss read)."""
    from dataclasses import replace

    from flora.segment.grammar import segments_regex
    from training.grpo import guide_masks

    engine, processor, cfg, reference = engine_and_model
    live = LivePolicyBackend(engine.module, processor, seed=0, guided=True)
    prompts = [_prompt(4), _prompt(5)]
    for p in prompts:
        p.request.guided_regex = segments_regex(p.n_ticks)
    masks = guide_masks(live, processor)
    assert masks == live.mask_for  # the backend's own masks, not a second cache
    seen = []

    def spy(request):
        m = live.mask_for(request)
        seen.append(m)
        return m

    cfg = replace(cfg, guided=True, max_new_tokens=24)
    before = _lora(engine)
    with single_torch_thread():
        stats = grpo_step(1, engine.module, processor, prompts, live, cfg, judge=None,
                          reference=reference, backward=engine.backward, update=engine.step,
                          zero_backward=lambda: engine.backward(sum(
                              (p * 0.0).sum() for p in engine.module.parameters()
                              if p.requires_grad)),
                          forward=engine, masks=spy)  # fmt: skip
    assert np.isfinite(stats.loss) and np.isfinite(stats.kl) and stats.kl >= 0
    assert stats.parse_rate > 0  # (24 new tokens cut some answers short)
    # every valid group was scored under its mask, the one generation filled
    assert stats.valid_groups >= 1 and len(seen) == stats.valid_groups
    assert all(m is live.mask_for(prompts[0].request) and m._cache for m in seen)
    assert any(not torch.equal(before[n], after) for n, after in _lora(engine).items())


def test_a_mixed_guided_group_sends_half_free_and_scores_them_unmasked(
    engine_and_model, monkeypatch
):
    """grpo.guided_share 0.5 through a pod-like backend: the first half of each group keeps
    the grammar regex, the rest decode freely; the free rows are scored by the unmasked
    policy (an unparseable free answer gets 0 against its guided siblings)."""
    from dataclasses import replace

    from flora.segment.grammar import segments_regex
    from training.grpo import guide_masks

    engine, processor, cfg, reference = engine_and_model
    cfg = replace(cfg, guided=True, guided_share=0.5, temperature=0.7)
    backend = Scripted(["0 40 1 1", "0 20 1 0", "garbage!", "0 40 1 1"])
    prompts = [_prompt(6)]
    prompts[0].request.guided_regex = segments_regex(prompts[0].n_ticks)
    masks = guide_masks(backend, processor)
    seen = []

    def spy(request):
        seen.append(request)
        return masks(request)

    import training.grpo as grpo_mod

    scored = []
    pair = grpo_mod.completion_logprobs_pair

    def record(model, group):
        scored.append((group.free_rows.tolist(), group.allowed is not None, group.temperature))
        return pair(model, group)

    monkeypatch.setattr(grpo_mod, "completion_logprobs_pair", record)
    with single_torch_thread():
        stats = grpo_step(1, engine.module, processor, prompts, backend, cfg, judge=None,
                          reference=reference, backward=engine.backward, update=engine.step,
                          forward=engine, masks=spy)  # fmt: skip
    assert [r.guided_regex is not None for r in backend.requests] == [True, True, False, False]
    # reference and policy both scored the group with its free rows marked, at the
    # temperature the rollouts were sampled at
    assert scored and all(s == ([False, False, True, True], True, 0.7) for s in scored)
    assert all(r.temperature == 0.7 for r in backend.requests)
    assert stats.valid_groups == 1 and stats.parse_rate == pytest.approx(3 / 4)
    assert np.isfinite(stats.loss) and np.isfinite(stats.kl) and stats.kl >= 0
    assert len(seen) == 1 and seen[0].guided_regex is not None  # the prompt's own mask
    # each half logged on its own: the guided rows parse, one free row is garbage
    assert stats.guided_parse_rate == 1.0 and stats.free_parse_rate == 0.5
    assert stats.reward_mean == pytest.approx(
        (stats.guided_reward_mean + stats.free_reward_mean) / 2
    )
    assert stats.guided_reward_mean > stats.free_reward_mean
    assert {"grpo.free_parse_rate", "grpo.guided_reward_mean"} <= set(stats.metrics())


class Cut(Scripted):
    """Scripted answers, the ones listed in ``cut`` cut off at max_new_tokens."""

    def __init__(self, texts: Sequence[str], cut: Sequence[int]):
        super().__init__(texts)
        self.cut = set(cut)

    def generate(self, requests):
        out = super().generate(requests)
        for r, o in zip(requests, out, strict=True):
            if int(r.request_id.rsplit("#g", 1)[1]) in self.cut:
                o.finish_reason = "length"
        return out


def test_a_rollout_cut_at_max_new_tokens_gets_no_end_token(engine_and_model):
    """The policy never sampled <|im_end|> after an answer cut off at max_new_tokens: the
    loss must not score one (only an answer the policy ended carries it)."""
    from training.grpo import END

    engine, processor, cfg, reference = engine_and_model
    end_id = processor.tokenizer.convert_tokens_to_ids(END)
    model = engine.module
    live = LivePolicyBackend(model, processor, seed=0)
    req = dataclasses.replace(_prompt(4).request, temperature=1.0, max_new_tokens=3)
    with single_torch_thread(), torch.no_grad():
        outs = live.generate([req] * 4)
    assert {o.finish_reason for o in outs} <= {"stop", "length"}
    cut = [o for o in outs if o.finish_reason == "length"]
    assert cut  # a random tiny model does not end its answer within 3 tokens
    texts = [o.text for o in cut]
    group = encode_group(processor, req, texts, [o.finish_reason for o in cut])
    ended = encode_group(processor, req, texts)  # the default: answers the policy ended
    for i in range(len(cut)):
        ids = group.completion_ids[i][group.completion_mask[i].bool()].tolist()
        assert not ids or ids[-1] != end_id
        done = ended.completion_ids[i][ended.completion_mask[i].bool()].tolist()
        assert done == [*ids, end_id]
    # grpo_step passes each rollout's finish reason on: one cut answer, one token fewer.
    texts = ["0 40 1 1", "none", "garbage!", "0 20 1 0"]
    with single_torch_thread():
        whole = _run(engine, processor, cfg, reference, Scripted(texts), [_prompt(0)])
        one_cut = _run(engine, processor, cfg, reference, Cut(texts, [2]), [_prompt(0)])
    assert whole.tokens == one_cut.tokens + 1
