"""GRPO with guided rollouts: the loss uses the masked policy the rollouts came from."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from flora.backends.guided import PrefixMask
from training.grpo import (
    EncodedGroup,
    completion_logprobs,
    completion_logprobs_pair,
    grpo_loss,
    guide_support,
)

# Answers "01" or "02": the first token and the stop token are forced, the second a choice.
ANSWERS = ("01", "02")
TOKENS = ["0", "1", "2", None]  # id 3: the stop token
EOS = 3


def _mask() -> PrefixMask:
    return PrefixMask(
        lambda t: any(a.startswith(t) for a in ANSWERS), lambda t: t in ANSWERS, TOKENS, [EOS]
    )


class FixedLogits(torch.nn.Module):
    """A 'model' whose logits are one parameter: enough to check the log-prob algebra."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, **_: object) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits)


def _group(ids: list[list[int]], prompt_len: int = 2) -> EncodedGroup:
    g, tc = len(ids), max(map(len, ids))
    cids = torch.zeros((g, tc), dtype=torch.long)
    cmask = torch.zeros((g, tc), dtype=torch.long)
    for i, row in enumerate(ids):
        cids[i, : len(row)] = torch.tensor(row)
        cmask[i, : len(row)] = 1
    inputs = {"input_ids": torch.zeros((g, prompt_len + tc), dtype=torch.long)}
    return EncodedGroup(inputs, prompt_len, cids, cmask)


def test_support_is_the_guides_allowed_set_and_always_holds_the_token():
    grp = _group([[0, 1, EOS], [0, 2, EOS], [0, 0]])
    sup = guide_support(_mask(), grp)
    sets = [[sorted(x for x in a.tolist() if x >= 0) for a in row] for row in sup]
    assert sets[0] == [[0], [1, 2], [EOS]]  # forced, a choice, forced stop
    assert sets[1] == [[0], [1, 2], [EOS]]
    # "00" leaves the grammar: the sampled token joins its set (finite log-prob); the
    # padding position after the shorter completion holds only its pad id.
    assert sets[2] == [[0], [0, 1, 2], [0]]


def test_masked_logprobs_renormalise_over_the_allowed_tokens():
    torch.manual_seed(0)
    grp = _group([[0, 1, EOS], [0, 2, EOS]])
    grp = replace(grp, allowed=guide_support(_mask(), grp))
    logits = torch.randn(2, 2 + 3, 4)
    model = FixedLogits(logits.clone())
    lp = completion_logprobs(model, grp)
    pos = logits[:, 1:-1, :]  # logits at t predict token t+1: completion from index 2
    # Forced positions (first token, stop) have log-probability 0 ...
    assert torch.allclose(lp[:, 0], torch.zeros(2)) and torch.allclose(lp[:, 2], torch.zeros(2))
    # ... and the choice is a log-softmax over {1, 2} only.
    pair = torch.log_softmax(pos[:, 1, [1, 2]], dim=-1)
    assert torch.allclose(lp[0, 1], pair[0, 0]) and torch.allclose(lp[1, 1], pair[1, 1])
    # Unguided: the raw distribution over the whole vocabulary, lower than the masked one.
    raw = completion_logprobs(model, replace(grp, allowed=None))
    full = torch.log_softmax(pos, dim=-1).gather(-1, grp.completion_ids[..., None])[..., 0]
    assert torch.allclose(raw, full) and bool((raw < lp).all())


def test_a_forced_token_gets_no_gradient_and_disallowed_logits_none():
    """A negative-advantage update cannot push probability onto tokens the guide forbids:
    the masked log-prob has no gradient through a forbidden token's logit."""
    grp = _group([[0, 1, EOS]])
    grp = replace(grp, allowed=guide_support(_mask(), grp))
    model = FixedLogits(torch.randn(1, 5, 4))
    completion_logprobs(model, grp).sum().backward()
    g = model.logits.grad[0, 1:-1]  # (positions, vocab)
    assert torch.count_nonzero(g[0]) == 0 and torch.count_nonzero(g[2]) == 0  # forced
    assert g[1, 0] == 0 and g[1, EOS] == 0  # the choice: no gradient outside {1, 2}
    assert g[1, 1] != 0 and g[1, 2] != 0
    # Without the mask every logit of every position gets a gradient.
    model.logits.grad = None
    completion_logprobs(model, replace(grp, allowed=None)).sum().backward()
    assert torch.count_nonzero(model.logits.grad[0, 1:-1]) == 12


def test_the_pair_is_the_masked_and_the_raw_logprobs_of_one_forward():
    torch.manual_seed(1)
    grp = _group([[0, 1, EOS], [0, 2, EOS]])
    guided = replace(grp, allowed=guide_support(_mask(), grp))
    model = FixedLogits(torch.randn(2, 5, 4))
    sampled, raw = completion_logprobs_pair(model, guided)
    assert torch.equal(sampled, completion_logprobs(model, guided))
    assert torch.equal(raw, completion_logprobs(model, grp))
    assert bool((raw < sampled).all())  # the masked policy concentrates on fewer tokens
    a, b = completion_logprobs_pair(model, grp)  # unguided: one distribution
    assert a is b


def test_an_unmasked_kl_reaches_the_forced_tokens_the_masked_kl_cannot():
    """Free decoding reads the unmasked distribution, forced positions included: with
    ``guided_kl: unmasked`` the KL pulls a drifted forced token back; masked, it cannot."""
    grp = _group([[0, 1, EOS]])
    grp = replace(grp, allowed=guide_support(_mask(), grp))
    ref_logits = torch.randn(1, 5, 4)
    drifted = ref_logits.clone()
    drifted[0, 1, 0] -= 2.0  # the forced first token lost probability under free decoding
    ref = FixedLogits(ref_logits)
    adv = torch.zeros(1)  # no policy-gradient signal: only the KL acts

    def forced_grad(unmasked: bool) -> tuple[float, float]:
        model = FixedLogits(drifted.clone())
        lp, raw = completion_logprobs_pair(model, grp)
        ref_lp = completion_logprobs_pair(ref, grp)[1 if unmasked else 0].detach()
        parts = grpo_loss(lp, lp.detach(), adv, grp.completion_mask, beta=0.5,
                          ref_logp=ref_lp, kl_logp=raw if unmasked else None)  # fmt: skip
        parts.loss.backward()
        return float(model.logits.grad[0, 1, 0]), parts.kl

    g_masked, kl_masked = forced_grad(False)
    g_raw, kl_raw = forced_grad(True)
    assert g_masked == 0.0 and kl_masked == 0.0  # the forced token has log-prob 0 both sides
    assert kl_raw > 0.0
    assert g_raw < 0.0  # descent raises the forced token's logit back towards the reference


def test_a_mixed_group_scores_free_rows_unmasked_and_skips_their_guide():
    """grpo.guided_share < 1: the free rows of a group are scored under the unmasked policy
    they were sampled from, and their guide support is not computed (token alone)."""
    torch.manual_seed(2)
    grp = _group([[0, 1, EOS], [0, 2, EOS], [0, 0, EOS]])
    free = [False, False, True]
    grp = replace(grp, allowed=guide_support(_mask(), grp, free))
    assert [sorted(x for x in a.tolist() if x >= 0) for a in grp.allowed[2]] == [[0], [0], [EOS]]
    model = FixedLogits(torch.randn(3, 5, 4))
    masked_all, raw = completion_logprobs_pair(model, grp)
    mixed, raw2 = completion_logprobs_pair(model, replace(grp, free_rows=torch.tensor(free)))
    assert torch.equal(raw, raw2)
    assert torch.equal(mixed[:2], masked_all[:2]) and torch.equal(mixed[2], raw[2])


def test_guided_share_sets_how_many_rollouts_keep_the_regex():
    from flora.backends.base import VLMRequest
    from training.grpo import GRPOConfig, GRPOPrompt, rollout_requests

    req = VLMRequest(prompt="p", guided_regex="[0-9]+", request_id="w0")
    prompt = GRPOPrompt("segmenter", req, "w0", n_ticks=10)
    cfg = GRPOConfig(group_size=8, guided=True, guided_share=0.5)
    reqs = rollout_requests(prompt, 8, 1.0, 16, cfg.guided_rollouts())
    assert [r.guided_regex for r in reqs] == ["[0-9]+"] * 4 + [None] * 4
    assert [r.request_id for r in reqs][-1] == "w0#g7"
    assert all(r.guided_regex == "[0-9]+" for r in rollout_requests(prompt, 8, 1.0, 16))
    assert GRPOConfig(group_size=8, guided_share=0.01).guided_rollouts() == 1  # at least one
    assert GRPOConfig(group_size=8).guided_rollouts() == 8
    with pytest.raises(ValueError, match="guided_share"):
        GRPOConfig(guided_share=0.0)


def test_tiny_model_segment_answer_under_its_guide(tiny_vlm_dir):
    """On a real processor: the trainer's guide masks (guide_masks without a live backend)
    give finite masked log-probs, at least the raw ones, and 0 where the guide forces."""
    from transformers import AutoModelForImageTextToText

    from flora.backends.base import VLMRequest
    from flora.backends.processing import load_processor
    from flora.segment.grammar import segments_regex
    from training.grpo import encode_group, guide_masks

    n_ticks = 40
    path = tiny_vlm_dir("qwen3_vl")
    processor = load_processor(path, "images")
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    req = VLMRequest(prompt="segment", images=[], system="s", max_new_tokens=16,
                     guided_regex=segments_regex(n_ticks))  # fmt: skip
    grp = encode_group(processor, req, [f"0 {n_ticks} 1 1", f"0 20 1 0\n20 {n_ticks} 0 1"])
    masks = guide_masks(object(), processor)  # no live backend: the trainer's own
    mask = masks(req)
    assert mask is not None and masks(replace(req, guided_regex=None)) is None
    assert masks(req) is mask  # one mask per regex, its prefix cache kept
    sup = guide_support(mask, grp)
    with torch.no_grad():
        masked = completion_logprobs(model, replace(grp, allowed=sup))
        raw = completion_logprobs(model, grp)
    real = grp.completion_mask.bool()
    assert torch.isfinite(masked).all() and bool((masked[real] >= raw[real] - 1e-5).all())
    forced = ((sup >= 0).sum(-1) == 1) & real
    assert forced.any() and torch.allclose(masked[forced], torch.zeros(int(forced.sum())))


def test_guided_grpo_refuses_prompts_without_their_regex():
    from flora.backends.base import VLMRequest
    from training.grpo import GRPOPrompt, check_guided_prompts

    def prompt(i: int, regex: str | None) -> GRPOPrompt:
        req = VLMRequest(prompt="p", guided_regex=regex, request_id=f"w{i}")
        return GRPOPrompt("segmenter", req, f"w{i}", n_ticks=10)

    check_guided_prompts([prompt(0, "[0-9]+"), prompt(1, "[0-9]+")], "set")  # accepted
    with pytest.raises(ValueError, match=r"set old-set: .* 1 of 2 do not \(e\.g\. w1\)"):
        check_guided_prompts([prompt(0, "[0-9]+"), prompt(1, None)], "old-set")
