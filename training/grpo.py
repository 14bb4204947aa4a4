"""GRPO for the segmenter (``r_seg``) and the captioner (``r_cap``) — DESIGN §3.5, seed §6.

One step:

1. **Rollouts.** For each of ``prompts_per_step`` prompts, ``G`` completions at temperature
   1.0 through the project's :class:`~flora.backends.base.VLMBackend` protocol — in
   process a :class:`LivePolicyBackend` over the very module being trained; in
   production any backend (an OpenAI-compatible vLLM pod) via ``backend_factory``.
   With ``guided`` (recipe ``grpo.guided``) rollouts are sampled within each request's
   grammar regex, as the served engine decodes, and the loss uses the masked policy's
   log-probabilities (the distribution they were sampled from; :func:`guide_support`).
   With ``grpo.guided_share < 1`` only the first part of each group is guided; the rest
   decode freely and are scored by the unmasked policy (mixed groups, ``free_rows``).
2. **Rewards** (:mod:`training.rewards`): the strict grammar parses each completion; an
   unparseable one gets 0 and lowers the parse rate; the rest get ``r_seg`` against the
   window's reference segments or ``r_cap`` from the judge against the event's
   requirements.
3. **Advantages** per group: ``A = (r - mean_g) / (std_g + 1e-4)`` (:func:`group_advantages`,
   sample std). A group whose rewards are all equal (or one with a reward the judge could
   not decide, or a rollout the backend failed) is dropped: its tokens leave both the
   numerator and the token count, so it contributes exactly no gradient — not even
   through the KL term.
4. **Loss** (:func:`grpo_loss`): per completion token,
   ``-(min(ρ A, clip(ρ, 1-ε, 1+ε) A) - β k3)`` with ``ρ = π_θ / π_old`` and the k3
   estimator ``k3 = exp(ref - logp) - (ref - logp) - 1`` of KL(π_θ || π_ref) to the frozen
   SFT reference; summed over every completion token of the step and divided by their
   count (token-level normalisation over the whole step, whatever the micro-batching).
   Log-probabilities are recomputed by the trained policy on the completion text's
   tokenisation (:func:`completion_logprobs`), so the backend only has to return text:
   this is what lets a remote pod generate.

``π_old`` is the policy at rollout time. With one update per rollout batch
(``inner_steps=1``, the default) ``ρ = 1`` at the update and the clip only matters for
stale rollouts or ``inner_steps > 1``; the clipped objective is implemented and tested
either way.

Why not TRL's ``GRPOTrainer``: see ``docs/training.md`` (GRPO section).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flora.backends.base import VLMBackend, VLMRequest, VLMResponse
from training.grpo_probe import BestState, ProbeResult, probe_episode_ids, probe_policy
from training.rewards import Reward, caption_rewards, segment_rewards

log = logging.getLogger(__name__)

END = "<|im_end|>"
GRPO_MODELS = ("segmenter", "captioner")


# --------------------------------------------------------------------------- pure functions


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages ``(r - mean_g) / (std_g + eps)`` and a per-group validity mask.

    ``rewards`` is ``(n_groups, G)``. ``std_g`` is the sample standard deviation (Bessel
    corrected, as in DeepSeekMath/TRL). A group is invalid — advantages 0 and
    ``valid=False`` — when all its rewards are equal (no signal: it must contribute no
    gradient), when any reward is NaN (a judge or backend failure), or when ``G < 2``.
    """
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be (n_groups, G), got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float64)
    finite = torch.isfinite(r).all(dim=1)
    if r.shape[1] < 2:
        return torch.zeros_like(r, dtype=torch.float32), torch.zeros(r.shape[0], dtype=torch.bool)
    safe = torch.where(torch.isfinite(r), r, torch.zeros_like(r))
    spread = safe.max(dim=1).values - safe.min(dim=1).values
    valid = finite & (spread > 0)
    mean = safe.mean(dim=1, keepdim=True)
    std = safe.std(dim=1, unbiased=True, keepdim=True)
    adv = (safe - mean) / (std + eps)
    adv = torch.where(valid[:, None], adv, torch.zeros_like(adv))
    return adv.to(torch.float32), valid


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, bound: float | None = None) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ || π_ref): ``exp(d) - d - 1`` with ``d = ref - logp``.

    Non-negative, zero where the two agree, unbiased for the KL under samples from π_θ.
    Its tail is exponential: one sampled token the policy gives far less probability than
    the reference (d = 13) weighs e^13 ≈ 4·10^5 and swamps a step's mean. With ``bound``
    the estimator continues linearly beyond ``d = bound`` with the slope it has there, so
    value and gradient stay finite and the pull back towards the reference keeps its sign
    (biased low on those tokens; unchanged everywhere else).
    """
    d = ref_logp - logp
    if bound is None:
        return torch.exp(d) - d - 1.0
    if bound <= 0:  # the slope e^c - 1 would pull the wrong way
        raise ValueError(f"kl_bound must be > 0 (a log-ratio), got {bound}")
    # exp() only ever sees d <= bound: no inf (and no inf * 0 = NaN in the gradient)
    inner = torch.clamp(d, max=bound)
    slope = math.expm1(bound)
    return torch.exp(inner) - inner - 1.0 + slope * (d - inner)


@dataclass
class LossParts:
    """The step loss and what is logged with it (token means over the loss tokens)."""

    loss: torch.Tensor
    n_tokens: int
    kl: float
    clip_fraction: float
    ratio_mean: float
    objective: float
    # The largest d = ref - logp over the loss tokens (0 without a reference): a KL spike
    # carried by one token shows here as a large value beside a small typical KL.
    log_ratio_max: float = 0.0


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    beta: float = 0.02,
    ref_logp: torch.Tensor | None = None,
    n_tokens: int | None = None,
    kl_logp: torch.Tensor | None = None,
    kl_bound: float | None = None,
) -> LossParts:
    """Clipped-ratio GRPO loss with a k3 KL penalty, token-level normalised.

    ``logp``/``old_logp``/``ref_logp``/``mask`` are ``(B, T)`` per completion token (mask 1
    on real completion tokens of valid groups, 0 on padding and dropped groups),
    ``advantages`` is ``(B,)`` (one per completion, broadcast over its tokens).
    ``n_tokens`` is the denominator: the number of loss tokens of the *whole* step, so
    micro-batches can be backpropagated one by one and their gradients add up to the
    gradient of the step loss (default: ``mask.sum()``). ``beta = 0`` needs no reference.
    ``kl_logp`` is the policy's side of the KL when it is not ``logp`` (guided rollouts with
    an unmasked KL: ``ref_logp`` is then unmasked too); default ``logp``. ``kl_bound``
    bounds the per-token estimator's log-ratio (:func:`k3_kl`); None keeps plain k3.

    A token is "clipped" when the clip removes its gradient: ``ρ > 1 + ε`` with ``A > 0``
    or ``ρ < 1 - ε`` with ``A < 0``.
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the frozen SFT reference)")
    m = mask.to(logp.dtype)
    denom = int(m.sum().item()) if n_tokens is None else int(n_tokens)
    a = advantages.to(logp.dtype)[:, None].expand_as(logp)
    ratio = torch.exp(logp - old_logp.detach())
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * a
    objective = torch.minimum(unclipped, clipped)
    per_token = -objective
    kl = torch.zeros_like(logp)
    log_ratio_max = 0.0
    if beta > 0:
        pol = logp if kl_logp is None else kl_logp
        kl = k3_kl(pol, ref_logp.detach(), kl_bound)  # type: ignore[union-attr]
        per_token = per_token + beta * kl
        with torch.no_grad():
            on = mask.bool()
            if bool(on.any()):
                log_ratio_max = float((ref_logp - pol)[on].max())  # type: ignore[operator]
    if denom <= 0:
        # Nothing to learn from in this step (every group dropped): a zero that still
        # belongs to the graph, so callers can treat it uniformly.
        loss = (per_token * 0.0).sum()
    else:
        loss = (per_token * m).sum() / denom
    with torch.no_grad():
        k = float(m.sum().item())
        was_clipped = ((ratio > 1 + clip_eps) & (a > 0)) | ((ratio < 1 - clip_eps) & (a < 0))
        stats = {
            "kl": float((kl * m).sum() / k) if k else 0.0,
            "clip": float((was_clipped.to(m.dtype) * m).sum() / k) if k else 0.0,
            "ratio": float((ratio * m).sum() / k) if k else 1.0,
            "obj": float((objective * m).sum() / k) if k else 0.0,
        }
    return LossParts(
        loss, int(k), stats["kl"], stats["clip"], stats["ratio"], stats["obj"], log_ratio_max
    )


# --------------------------------------------------------------------------- prompts


@dataclass
class GRPOPrompt:
    """One GRPO prompt: the request the step sends and what its reward needs.

    ``source``: the request, or the set example (:class:`training.sets.Example`) it is
    built from each time a step uses the prompt — frames are then decoded per step, not
    all at once (a 240-episode segmenter set decodes to ~5 GB of frames). Segmenter:
    ``n_ticks`` and ``reference`` (the window's ``LocalSegment`` list with flags).
    Captioner: ``requirements`` (the event's reference requirements).
    """

    model: str
    source: Any  # VLMRequest | training.sets.Example
    prompt_id: str
    n_ticks: int = 0
    reference: list[Any] = field(default_factory=list)
    requirements: list[Any] = field(default_factory=list)

    @property
    def request(self) -> VLMRequest:
        """The request the step sends (built afresh from an example)."""
        if isinstance(self.source, VLMRequest):
            return self.source
        return self.source.to_request(keep_frames=False)

    @property
    def guided_regex(self) -> str | None:
        """The request's grammar regex, read without building the request."""
        return self.source.guided_regex or None

    def __post_init__(self) -> None:
        if self.model not in GRPO_MODELS:
            raise ValueError(
                f"GRPO prompt {self.prompt_id}: model {self.model!r} not in {GRPO_MODELS} "
                "(no RL for the rewarder)"
            )
        if self.model == "segmenter" and self.n_ticks <= 0:
            raise ValueError(f"GRPO prompt {self.prompt_id}: segmenter prompt needs n_ticks > 0")


def score_completions(
    prompt: GRPOPrompt, texts: Sequence[str], judge: Any | None = None
) -> list[Reward]:
    """Rewards of one prompt's completions (0 for unparseable; NaN if the judge failed)."""
    if prompt.model == "segmenter":
        n = len(texts)
        return segment_rewards(texts, [prompt.n_ticks] * n, [prompt.reference] * n)
    if judge is None:
        raise ValueError("captioner rewards need a judge")
    return caption_rewards(texts, [prompt.requirements] * len(texts), judge)


# --------------------------------------------------------------------------- rollouts


def rollout_requests(
    prompt: GRPOPrompt,
    group_size: int,
    temperature: float,
    max_new_tokens: int,
    guided: int | None = None,
) -> list[VLMRequest]:
    """``G`` copies of the prompt's request, sampled at ``temperature`` (ids ``…#g<j>``).

    ``guided``: how many of them keep the request's grammar regex (the first ones); the
    rest are sent without it and decode freely. Default: all keep it.
    """
    base = prompt.request
    n_guided = group_size if guided is None else guided
    return [
        replace(
            base,
            temperature=float(temperature),
            max_new_tokens=int(max_new_tokens),
            top_logprobs=0,
            request_id=f"{base.request_id or prompt.prompt_id}#g{j}",
            guided_regex=base.guided_regex if j < n_guided else None,
        )
        for j in range(group_size)
    ]


def generate_groups(
    backend: VLMBackend,
    prompts: Sequence[GRPOPrompt],
    group_size: int,
    temperature: float,
    max_new_tokens: int,
    guided: int | None = None,
) -> list[list[VLMResponse]]:
    """One batched backend call for every completion of every prompt, regrouped per prompt
    (``guided``: as :func:`rollout_requests`)."""
    reqs = [
        r
        for p in prompts
        for r in rollout_requests(p, group_size, temperature, max_new_tokens, guided)
    ]
    resps = backend.generate(reqs)
    if len(resps) != len(reqs):
        raise RuntimeError(f"backend {backend.name} returned {len(resps)} for {len(reqs)} requests")
    return [resps[i * group_size : (i + 1) * group_size] for i in range(len(prompts))]


class LivePolicyBackend:
    """The in-process rollout backend: the transformers backend over the live policy module.

    It reuses :class:`flora.backends.transformers_backend.TransformersBackend`'s batching,
    sampling and EOS handling on the module being trained (no reload, no copy), so rollouts
    always come from the current weights. The module is put in eval mode for generation
    and returned to its previous mode afterwards.
    """

    name = "transformers-live"

    def __init__(self, model: torch.nn.Module, processor: Any, *, batch_size: int = 16,
                 seed: int | None = None, guided: bool = False) -> None:  # fmt: skip
        from flora.backends.processing import TRAINING_VISION_INPUT
        from flora.backends.transformers_backend import TransformersBackend

        inner = TransformersBackend.__new__(TransformersBackend)
        inner.model_path = "<live policy>"
        inner.adapter_path = None
        inner.processor = processor
        inner.tokenizer = processor.tokenizer
        inner.vision_input = TRAINING_VISION_INPUT  # rollouts see what SFT trained on
        p = next(model.parameters())
        inner.device, inner.dtype = p.device, p.dtype
        inner.batch_size = batch_size
        inner.seed = None
        inner.show_progress = False
        inner.set_guided(guided)
        tok = processor.tokenizer
        eos = [tok.convert_tokens_to_ids(END)]
        gc = getattr(model, "generation_config", None)
        extra = getattr(gc, "eos_token_id", None) if gc is not None else None
        for e in extra if isinstance(extra, list) else [extra]:
            if e is not None and int(e) not in eos:
                eos.append(int(e))
        inner.eos_ids = eos
        inner.pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
        inner.model = model
        inner.model_version = "live"
        self._inner = inner
        self._gen = torch.Generator().manual_seed(seed) if seed is not None else None
        self.model_version = "live"

    def mask_for(self, request: VLMRequest) -> Any | None:
        """The guide mask the rollouts of ``request`` were sampled under (None unguided).

        The same object the generation used, so its per-prefix cache of allowed tokens
        serves the loss too (:func:`guide_support`)."""
        if not self._inner.guided or request.guided_regex is None:
            return None
        return self._inner.regex_mask(request.guided_regex)

    def generate(self, requests: Sequence[VLMRequest]) -> list[VLMResponse]:
        """Sample from the current weights (seeded per call when a seed was given)."""
        model = self._inner.model
        was_training = model.training
        model.eval()
        try:
            # Only a sampling call draws from the stream: a greedy probe between steps
            # leaves the rollouts of a run as they would be without it.
            if self._gen is not None and any(r.temperature > 0 for r in requests):
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=self._gen)))
            return self._inner.generate(requests)
        finally:
            model.train(was_training)


# --------------------------------------------------------------------------- log-probs


@dataclass
class EncodedGroup:
    """Model inputs for one prompt and its completions (right-padded completions)."""

    inputs: dict[str, torch.Tensor]
    prompt_len: int
    completion_ids: torch.Tensor  # (G, Tc), padded with 0
    # (G, Tc), 1 on real tokens (incl. the final <|im_end|> of an answer the policy ended)
    completion_mask: torch.Tensor
    # (G, Tc, K) token ids the guide allowed at each completion position, -1 padded;
    # set for guided rollouts (:func:`guide_support`), None otherwise.
    allowed: torch.Tensor | None = None
    # (G,) True for completions sampled without the guide in a guided group (a mixed group,
    # grpo.guided_share < 1): they are scored under the unmasked policy they came from.
    free_rows: torch.Tensor | None = None
    # The temperature the completions were sampled at: the policy being scored (and
    # updated) is softmax(logits / temperature), the distribution the rollouts came from.
    temperature: float = 1.0


def encode_group(
    processor: Any,
    request: VLMRequest,
    completions: Sequence[str],
    finish_reasons: Sequence[str] | None = None,
) -> EncodedGroup:
    """Tokenise one prompt (the backends' own chat path, stamped images) and ``G`` completions.

    The prompt goes through ``request_to_chat`` / ``render_prompt`` and the processor exactly
    as the transformers backend and SFT do; each completion is tokenised on its own and,
    when the policy ended it (``finish_reasons[i] == "stop"``, the default), followed by
    ``<|im_end|>`` (the stop token is part of the action). A completion cut off at
    ``max_new_tokens`` (``"length"``) gets none: the policy never sampled it. Sequences are
    the prompt ids followed by the completion ids, right-padded: every row shares the
    prompt, so no left padding shifts positions.
    """
    from flora.backends.processing import render_prompt, request_to_chat

    chat = request_to_chat(request, "images")
    text = render_prompt(processor, chat)
    imgs = chat.images()
    enc = processor(text=[text], images=imgs or None, return_tensors="pt")
    enc.pop("token_type_ids", None)
    tok = processor.tokenizer
    end_id = tok.convert_tokens_to_ids(END)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else end_id
    finishes = list(finish_reasons) if finish_reasons is not None else ["stop"] * len(completions)
    if len(finishes) != len(completions):
        raise ValueError(f"{len(finishes)} finish reasons for {len(completions)} completions")
    comp = [
        tok(c, add_special_tokens=False)["input_ids"] + ([end_id] if f == "stop" else [])
        for c, f in zip(completions, finishes, strict=True)
    ]
    g = len(comp)
    tc = max(1, *(len(c) for c in comp))  # >= 1 column even if every row is cut and empty
    ids = torch.full((g, tc), pad_id, dtype=torch.long)
    cmask = torch.zeros((g, tc), dtype=torch.long)
    for i, c in enumerate(comp):
        ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        cmask[i, : len(c)] = 1
    p_ids = enc["input_ids"]
    plen = p_ids.shape[1]
    inputs: dict[str, torch.Tensor] = {
        "input_ids": torch.cat([p_ids.expand(g, -1), ids], dim=1),
        "attention_mask": torch.cat([enc["attention_mask"].expand(g, -1), cmask], dim=1),
    }
    if "mm_token_type_ids" in enc:
        mm = enc["mm_token_type_ids"]
        inputs["mm_token_type_ids"] = torch.cat(
            [mm.expand(g, -1), torch.zeros((g, tc), dtype=mm.dtype)], dim=1
        )
    if imgs:
        inputs["pixel_values"] = enc["pixel_values"].repeat(g, 1)
        inputs["image_grid_thw"] = enc["image_grid_thw"].repeat(g, 1)
    return EncodedGroup(inputs, plen, ids * cmask, cmask)


def completion_logprobs(model: torch.nn.Module, group: EncodedGroup) -> torch.Tensor:
    """``(G, Tc)`` log-probabilities of each completion token under ``model`` (0 on padding).

    Without ``group.allowed``: the distribution the rollouts were sampled from, the
    log-softmax of ``logits / group.temperature``. With it (guided rollouts): that
    distribution renormalised over the tokens the guide allowed at each position — so a
    forced token has log-probability 0 and no gradient, and an update moves probability
    only among allowed tokens (docs/training.md, guided rollouts).
    """
    return completion_logprobs_pair(model, group)[0]


def completion_logprobs_pair(
    model: torch.nn.Module, group: EncodedGroup
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sampled, raw)`` log-probabilities of the completion tokens from one forward pass.

    ``sampled`` is :func:`completion_logprobs` (the masked policy for guided rollouts,
    the raw one for the ``free_rows`` of a mixed group), ``raw`` the unmasked log-softmax —
    what free decoding reads. Without ``group.allowed`` both are the same tensor. The guided
    KL of ``grpo.guided_kl: unmasked`` needs both.
    """
    dev = next(model.parameters()).device
    inputs = {k: v.to(dev) for k, v in group.inputs.items()}
    out = model(**inputs, use_cache=False)
    p = group.prompt_len
    # Logits at position t predict token t+1: the completion starts at index p.
    logits = out.logits[:, p - 1 : -1, :].float() / float(group.temperature)
    ids = group.completion_ids.to(dev)
    keep = group.completion_mask.to(dev).to(logits.dtype)
    tok_logit = logits.gather(-1, ids[..., None]).squeeze(-1)
    raw = (tok_logit - torch.logsumexp(logits, dim=-1)) * keep
    if group.allowed is None:
        return raw, raw
    allowed = group.allowed.to(dev)
    sel = logits.gather(-1, allowed.clamp(min=0))
    norm = torch.logsumexp(sel.masked_fill(allowed < 0, float("-inf")), dim=-1)
    masked = (tok_logit - norm) * keep
    if group.free_rows is not None:
        masked = torch.where(group.free_rows.to(dev)[:, None], raw, masked)
    return masked, raw


def guide_support(mask: Any, group: EncodedGroup, skip: Sequence[bool] = ()) -> torch.Tensor:
    """``(G, Tc, K)`` the token ids ``mask`` (a :class:`~flora.backends.guided.PrefixMask`)
    allows at each completion position of ``group``, right-padded with -1.

    The prefix at position t is the text of the completion's first t tokens. The actual
    token is always in its position's set (re-tokenised text), so every log-probability
    stays finite.
    Padding positions get their own (pad) token alone, and so does every position of a row
    whose ``skip`` is true (a free rollout of a mixed group: scored unmasked, and a free
    answer that left the grammar would cost a vocabulary scan per position).
    """
    ids = group.completion_ids.tolist()
    n = group.completion_mask.sum(dim=1).tolist()
    rows: list[list[list[int]]] = []
    for r, (g_ids, g_n) in enumerate(zip(ids, n, strict=True)):
        prefix, row = "", []
        for t, tok in enumerate(g_ids):
            if t >= g_n or (r < len(skip) and skip[r]):
                row.append([tok])
                continue
            allowed = mask.allowed(prefix)
            row.append(allowed if tok in set(allowed) else [*allowed, tok])
            prefix += mask.tokens[tok] or ""
        rows.append(row)
    k = max(len(a) for row in rows for a in row)
    out = torch.full((len(rows), len(rows[0]), k), -1, dtype=torch.long)
    for g, row in enumerate(rows):
        for t, a in enumerate(row):
            out[g, t, : len(a)] = torch.tensor(a, dtype=torch.long)
    return out


# --------------------------------------------------------------------------- config


@dataclass
class GRPOConfig:
    """GRPO settings (DESIGN §3.5 defaults); :meth:`from_recipe` reads a recipe's grpo section."""

    group_size: int = 8
    temperature: float = 1.0
    clip_eps: float = 0.2
    beta: float = 0.02
    adv_eps: float = 1e-4
    lr: float = 1e-5
    max_steps: int = 50
    prompts_per_step: int = 4
    max_new_tokens: int = 128
    judge: str = "embedding"
    guided: bool = False  # rollouts within the request's grammar regex (recipe grpo.guided)
    # Guided rollouts: the KL compares masked policies, or the unmasked ones (free decoding)
    guided_kl: str = "masked"
    # Guided rollouts: the share of each group sampled under the guide (the rest free)
    guided_share: float = 1.0
    # Held-out probe keeping the best state (training/grpo_probe.py); 0 = no probe
    probe_every: int = 0
    probe_episodes: int = 3
    probe_patience: int = 0
    probe_decoding: str = "free"
    # Bound on the per-token KL estimator's log-ratio (k3_kl); None: plain k3 (DESIGN §3.5)
    kl_bound: float | None = None
    inner_steps: int = 1  # updates per rollout batch (μ); >1 makes the clip bite
    max_grad_norm: float = 1.0
    seed: int = 0
    zero_stage: int = 2

    @classmethod
    def from_recipe(cls, recipe: Any, **overrides: Any) -> GRPOConfig:
        """From a :class:`training.recipe.Recipe` (its ``grpo`` section, seed, clipping, ZeRO)."""
        g = getattr(recipe, "grpo", None)
        if g is None:
            raise ValueError(
                f"recipe {getattr(recipe, 'model', '?')}-{getattr(recipe, 'size', '?')} has no "
                "grpo section (no RL for the rewarder)"
            )
        kw: dict[str, Any] = {
            "group_size": g.group_size,
            "temperature": g.temperature,
            "clip_eps": g.clip_eps,
            "beta": g.beta,
            "kl_bound": g.kl_bound,
            "adv_eps": g.adv_eps,
            "lr": g.lr,
            "max_steps": g.max_steps,
            "prompts_per_step": g.prompts_per_step,
            "max_new_tokens": g.max_new_tokens,
            "judge": g.judge,
            "guided": g.guided,
            "guided_kl": g.guided_kl,
            "guided_share": g.guided_share,
            "probe_every": g.probe_every,
            "probe_episodes": g.probe_episodes,
            "probe_patience": g.probe_patience,
            "probe_decoding": g.probe_decoding,
            "max_grad_norm": getattr(recipe, "max_grad_norm", 1.0),
            "seed": getattr(recipe, "seed", 0),
            "zero_stage": getattr(recipe, "zero_stage", 2),
        }
        kw.update(overrides)
        return cls(**kw)

    def guided_rollouts(self) -> int:
        """Completions per group sampled under the guide (the first ones; at least one)."""
        return max(1, min(self.group_size, round(self.guided_share * self.group_size)))

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 (a group of one has no relative signal)")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 for rollouts")
        if self.beta < 0 or self.clip_eps <= 0:
            raise ValueError("beta must be >= 0 and clip_eps > 0")
        if self.kl_bound is not None and self.kl_bound <= 0:
            raise ValueError(f"kl_bound must be > 0 (a log-ratio) or None, got {self.kl_bound}")
        if self.inner_steps < 1 or self.prompts_per_step < 1 or self.max_steps < 1:
            raise ValueError("inner_steps, prompts_per_step and max_steps must be >= 1")
        if not 0.0 < self.guided_share <= 1.0:
            raise ValueError(f"guided_share must be in (0, 1], got {self.guided_share}")
        if self.guided_kl not in ("masked", "unmasked"):
            raise ValueError(f"guided_kl must be 'masked' or 'unmasked', got {self.guided_kl!r}")
        if self.probe_every < 0 or self.probe_episodes < 1 or self.probe_patience < 0:
            raise ValueError("probe_every and probe_patience must be >= 0, probe_episodes >= 1")
        if self.probe_decoding not in ("free", "guided"):
            raise ValueError(
                f"probe_decoding must be 'free' or 'guided', got {self.probe_decoding!r}"
            )
        if self.probe_every and self.probe_decoding == "guided" and not self.guided:
            raise ValueError("probe_decoding 'guided' needs guided rollouts (grpo.guided)")
        if self.probe_every and self.zero_stage == 3:
            raise ValueError("the GRPO probe keeps whole parameters: it needs ZeRO-2, not ZeRO-3")


# --------------------------------------------------------------------------- one step


@dataclass
class StepStats:
    """What one GRPO step logs (MLflow ``grpo.*``)."""

    step: int
    reward_mean: float
    reward_std: float
    parse_rate: float
    loss: float
    kl: float
    clip_fraction: float
    valid_groups: int
    groups: int
    tokens: int
    failed_completions: int
    seconds: float
    # The largest ref − policy log-ratio over the step's loss tokens (see LossParts),
    # floored at 0: a step where no token lost probability against the reference reads 0
    kl_log_ratio_max: float = 0.0
    # Mixed groups only (``guided_share`` < 1): each half on its own, as the pooled mean is
    # dominated by whichever half parses less; NaN (and not logged) otherwise.
    guided_reward_mean: float = math.nan
    guided_parse_rate: float = math.nan
    free_reward_mean: float = math.nan
    free_parse_rate: float = math.nan

    def metrics(self) -> dict[str, float]:
        d = asdict(self)
        d.pop("step")
        halves = {f"{h}_{m}" for h in ("guided", "free") for m in ("reward_mean", "parse_rate")}
        return {f"grpo.{k}": float(v) for k, v in d.items()
                if not (k in halves and math.isnan(v))}  # fmt: skip


def _stack_rewards(groups: Sequence[Sequence[Reward]]) -> torch.Tensor:
    return torch.tensor([[r.value for r in g] for g in groups], dtype=torch.float64)


def grpo_step(
    step: int,
    policy: torch.nn.Module,
    processor: Any,
    prompts: Sequence[GRPOPrompt],
    backend: VLMBackend,
    cfg: GRPOConfig,
    *,
    judge: Any | None,
    reference: torch.nn.Module | None,
    backward: Callable[[torch.Tensor], None],
    update: Callable[[], None],
    zero_backward: Callable[[], None] | None = None,
    all_sum: Callable[[float], float] | None = None,
    forward: Any | None = None,
    masks: Callable[[VLMRequest], Any | None] | None = None,
) -> StepStats:
    """Rollouts, rewards, advantages and ``cfg.inner_steps`` updates on ``prompts``.

    ``backward(loss)`` backpropagates one micro-batch (one group) and ``update()`` applies
    the accumulated gradient (DeepSpeed engine or plain optimizer). Each micro-batch loss
    is divided by the step's total loss-token count (summed over ranks by ``all_sum``), so
    the accumulated gradient is that of the token-normalised step loss. A dropped group
    calls ``zero_backward()`` instead (ranks then run the same number of reductions).
    ``forward`` computes the policy's log-probs (the DeepSpeed engine; default ``policy``).
    When no rank has a loss token the step makes no update at all. ``masks(request)``
    (guided rollouts, :func:`guide_masks`) gives the guide each prompt's rollouts were
    sampled under; log-probabilities are then the masked policy's.
    """
    fwd = forward if forward is not None else policy
    t0 = time.perf_counter()
    n_guided = cfg.guided_rollouts() if masks is not None else None
    resp_groups = generate_groups(
        backend, prompts, cfg.group_size, cfg.temperature, cfg.max_new_tokens, n_guided
    )
    reward_groups: list[list[Reward]] = []
    texts: list[list[str]] = []
    finishes: list[list[str]] = []
    failed = 0
    for p, resps in zip(prompts, resp_groups, strict=True):
        tx = [r.text if r.ok else "" for r in resps]
        finishes.append([getattr(r, "finish_reason", "stop") for r in resps])
        rw = score_completions(p, tx, judge)
        # A transport failure is the pod's, not the policy's: NaN drops the group.
        rw = [w if r.ok else Reward(math.nan, False, f"backend: {r.error}")
              for w, r in zip(rw, resps, strict=True)]  # fmt: skip
        failed += sum(not r.ok for r in resps)
        reward_groups.append(rw)
        texts.append(tx)
    R = _stack_rewards(reward_groups)
    adv, valid = group_advantages(R, cfg.adv_eps)
    vals, parsed = _reward_summary(reward_groups)
    halves: dict[str, float] = {}
    if n_guided is not None and n_guided < cfg.group_size:
        for half, rows in (("guided", slice(0, n_guided)), ("free", slice(n_guided, None))):
            v, p = _reward_summary([g[rows] for g in reward_groups])
            halves[f"{half}_reward_mean"] = float(v.mean()) if len(v) else math.nan
            halves[f"{half}_parse_rate"] = float(np.mean(p)) if p else math.nan

    requests = [p.request for p in prompts]  # built once per step (frames decoded here)
    encoded = [
        encode_group(processor, r, tx, fr) if bool(valid[i]) else None
        for i, (r, tx, fr) in enumerate(zip(requests, texts, finishes, strict=True))
    ]
    for e in encoded:
        if e is not None:
            e.temperature = cfg.temperature
    if masks is not None:  # guided rollouts: score the masked policy they came from
        for r, e in zip(requests, encoded, strict=True):
            mask = masks(r) if e is not None else None
            if mask is not None:
                if n_guided is not None and n_guided < cfg.group_size:
                    e.free_rows = torch.arange(cfg.group_size) >= n_guided
                e.allowed = guide_support(
                    mask, e, [] if e.free_rows is None else e.free_rows.tolist()
                )
    n_tokens = int(sum(int(e.completion_mask.sum()) for e in encoded if e is not None))
    if all_sum is not None:
        n_tokens = int(round(all_sum(float(n_tokens))))
    # With an unmasked KL the penalty reads the raw log-probs of both policies (the masked
    # ones still carry the policy-gradient term): it anchors what free decoding samples from,
    # forced tokens included, which the masked term cannot reach.
    raw_kl = cfg.guided_kl == "unmasked"
    old: list[torch.Tensor | None] = [None] * len(prompts)
    ref: list[torch.Tensor | None] = [None] * len(prompts)
    with torch.no_grad():
        for i, e in enumerate(encoded):
            if e is None:
                continue
            if cfg.inner_steps > 1:
                old[i] = completion_logprobs(fwd, e)
            if cfg.beta > 0:
                assert reference is not None
                ref[i] = completion_logprobs_pair(reference, e)[1 if raw_kl else 0]

    loss_sum = kl_sum = clip_sum = 0.0
    log_ratio_max = 0.0
    k_sum = 0
    for _ in range(cfg.inner_steps if n_tokens > 0 else 0):
        for i, e in enumerate(encoded):
            if e is None:
                if zero_backward is not None:
                    zero_backward()
                continue
            logp, raw = completion_logprobs_pair(fwd, e)
            parts = grpo_loss(
                logp,
                old[i] if old[i] is not None else logp.detach(),
                adv[i],
                e.completion_mask,
                clip_eps=cfg.clip_eps,
                beta=cfg.beta,
                ref_logp=ref[i],
                n_tokens=n_tokens,
                kl_logp=raw if raw_kl else None,
                kl_bound=cfg.kl_bound,
            )
            backward(parts.loss)
            log_ratio_max = max(log_ratio_max, parts.log_ratio_max)
            loss_sum += float(parts.loss.detach())
            kl_sum += parts.kl * parts.n_tokens
            clip_sum += parts.clip_fraction * parts.n_tokens
            k_sum += parts.n_tokens
        update()
    k = max(k_sum, 1)
    return StepStats(
        step=step,
        reward_mean=float(vals.mean()) if len(vals) else math.nan,
        reward_std=float(vals.std()) if len(vals) else math.nan,
        parse_rate=float(np.mean(parsed)) if parsed else math.nan,
        loss=loss_sum / max(cfg.inner_steps, 1),
        kl=kl_sum / k,
        clip_fraction=clip_sum / k,
        valid_groups=int(valid.sum()),
        groups=len(prompts),
        tokens=n_tokens,
        failed_completions=failed,
        seconds=time.perf_counter() - t0,
        kl_log_ratio_max=log_ratio_max,
        **halves,
    )


def _reward_summary(groups: Sequence[Sequence[Reward]]) -> tuple[np.ndarray, list[bool]]:
    """Reward values (transport failures, NaN, left out) and parse flags of completions the
    backend returned."""
    vals = np.array([r.value for g in groups for r in g if not math.isnan(r.value)], dtype=float)
    parsed = [r.parsed for g in groups for r in g if not r.reason.startswith("backend:")]
    return vals, parsed


# --------------------------------------------------------------------------- prompt sets


def prompts_from_examples(examples: Sequence[Any]) -> list[GRPOPrompt]:
    """GRPO prompts from set examples (:class:`training.sets.Example`; GRPO or SFT purpose).

    The request is :meth:`Example.to_request` (the inference step's own request); the
    reward inputs come from the example's ``reference`` JSON: ``n_ticks`` + ``segments``
    for the segmenter, ``requirements`` for the captioner.
    """
    from training.rewards import as_local_segments

    out: list[GRPOPrompt] = []
    for ex in examples:
        ref = ex.reference_obj()
        try:
            # The request is built per use: only the PNG bytes stay between steps.
            if ex.model == "segmenter":
                p = GRPOPrompt("segmenter", ex, ex.example_id,
                               n_ticks=int(ref["n_ticks"]),
                               reference=as_local_segments(ref["segments"]))  # fmt: skip
            elif ex.model == "captioner":
                p = GRPOPrompt("captioner", ex, ex.example_id,
                               requirements=list(ref["requirements"]))  # fmt: skip
                if not p.requirements:  # every answer would score 0: no signal, a silent gap
                    raise ValueError(
                        f"example {ex.example_id} (episode {ex.episode_id}): no reference "
                        "requirements (r_cap needs them); a GRPO set leaves such events out"
                    )
            else:
                raise ValueError(f"no GRPO for {ex.model!r} (no RL for the rewarder)")
        except (KeyError, TypeError) as e:
            raise ValueError(
                f"example {ex.example_id} (episode {ex.episode_id}): reference lacks what the "
                f"reward needs: {e}"
            ) from e
        out.append(p)
    return out


# --------------------------------------------------------------------------- trainer


@dataclass
class GRPOResult:
    """What :func:`train_grpo` produced."""

    model: str
    output_dir: Path
    model_dir: Path
    steps: int
    history: list[dict[str, float]]
    run_id: str | None = None
    model_uri: str | None = None
    registered_version: str | None = None
    # With a held-out probe: the step whose state was exported (0 = the SFT start) and
    # whether patience ended the run before max_steps.
    kept_step: int | None = None
    stopped_early: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["output_dir"], d["model_dir"] = str(self.output_dir), str(self.model_dir)
        return d


def load_policy(
    sft_model_dir: str | Path, recipe: Any, lr: float
) -> tuple[torch.nn.Module, Any, list[dict[str, Any]], Path, str]:
    """The SFT model as a trainable policy: (module, processor, param groups, base dir, base id).

    A LoRA export (segmenter) keeps training *its* adapter (``is_trainable=True``); a full
    export gets the recipe's trainable parts (:func:`training.sft.apply_trainable`), with
    the GRPO learning rate (the vision group keeps its ratio to the main rate).
    """
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from flora.backends.processing import load_processor
    from training.sft import apply_trainable, check_processor, model_paths, verify_model_dir
    from training.sizes import check_family

    man = verify_model_dir(sft_model_dir)
    if man.get("model") != recipe.model:
        raise ValueError(
            f"{sft_model_dir} is a {man.get('model')!r} model, the recipe trains {recipe.model!r}"
        )
    path, adapter = model_paths(sft_model_dir)
    check_family(recipe.family, path, f"recipe {recipe.model}-{recipe.size}")  # as SFT does
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    processor = load_processor(path, "images")
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype)
    check_processor(processor, model, str(path))
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
        params = [p for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"name": "main", "params": params, "lr": lr}]
    else:
        model, groups = apply_trainable(model, recipe)
        for g in groups:
            g["lr"] = lr * (g["lr"] / recipe.lr)
    return model, processor, groups, Path(path), str(man.get("base_id", man.get("base", "")))


def build_engine(
    model: torch.nn.Module, groups: Sequence[dict[str, Any]], recipe: Any, cfg: GRPOConfig,
    world: int,
) -> Any:  # fmt: skip
    """The DeepSpeed engine of a GRPO run: the SFT trainer's ZeRO config, unmanaged accumulation.

    :func:`training.sft.deepspeed_config` with one-example micro-batches and the GRPO
    gradient clipping, plus ``managed_gradient_accumulation: false`` so that ``step()``
    is the accumulation boundary whatever number of groups were backpropagated (the
    number of valid groups varies per step). A client torch AdamW (no JIT-built ops).
    Call :func:`training.sft.init_distributed` first.
    """
    import deepspeed

    from training.sft import deepspeed_config

    optimizer = torch.optim.AdamW(
        [{"params": g["params"], "lr": g["lr"]} for g in groups], lr=cfg.lr, weight_decay=0.0
    )
    step_recipe = recipe.model_copy(update={"micro_batch": 1, "grad_accum": 1,
                                            "max_grad_norm": cfg.max_grad_norm,
                                            "zero_stage": cfg.zero_stage})  # fmt: skip
    ds_cfg = deepspeed_config(step_recipe, world, model.config.get_text_config().hidden_size)
    ds_cfg["managed_gradient_accumulation"] = False
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_cfg)
    engine.train()
    return engine


def train_grpo(
    recipe: Any,
    sft_model_dir: str | Path,
    set_path: str | Path,
    output_dir: str | Path,
    *,
    backend: VLMBackend | None = None,
    judge: Any | None = None,
    max_steps: int | None = None,
    local_rank: int | None = None,
    log_mlflow: bool = True,
    register: bool = False,
    progress: bool = True,
    **overrides: Any,
) -> GRPOResult:
    """GRPO of ``recipe.model`` (segmenter or captioner) from its SFT export, on DeepSpeed.

    ``set_path``: a GRPO (or SFT) set; its *train* split gives the prompts. ``backend``:
    the rollout backend (default: :class:`LivePolicyBackend` over the trained module; in
    production an OpenAI-compatible pod serving the current policy). ``judge``: the
    captioner's reward judge (default: the recipe's, embedding or LLM). ``overrides``
    replace :class:`GRPOConfig` fields (tests, CLI). The engine is the SFT trainer's:
    its ZeRO config (:func:`training.sft.deepspeed_config`) in unmanaged gradient
    accumulation (``step()`` is the boundary), so a step may backpropagate any number of
    groups. Writes ``output_dir/model`` (same export format as SFT) and
    ``output_dir/log/history.json`` (the per-step metrics, KL included), and logs a
    ``grpo-<model>`` run in ``flora-train-<model>``. With ``probe_every`` the policy is
    scored on held-out episodes at the start and every ``probe_every`` steps, and the best
    state is exported (:mod:`training.grpo_probe`).
    """
    from tqdm.auto import tqdm

    from training.recipe import load_recipe
    from training.sets import load_set
    from training.sft import (
        DivergedError,
        _all_sum,
        _barrier,
        _export,
        _git_commit,
        export_weights,
        init_distributed,
        read_model_manifest,
    )

    recipe = recipe if not isinstance(recipe, str | Path) else load_recipe(recipe)
    if recipe.model not in GRPO_MODELS:
        raise ValueError(f"no GRPO for {recipe.model!r} (no RL for the rewarder, DESIGN §3.5)")
    cfg = GRPOConfig.from_recipe(recipe, **overrides)
    if max_steps is not None:
        cfg = replace(cfg, max_steps=int(max_steps))
    out = Path(output_dir)
    from training.sft import check_model_out

    check_model_out(out / "model")  # refuse a foreign folder before any rollout, not after
    check_log_out(out / "log")
    rank, world = init_distributed(local_rank)
    torch.manual_seed(cfg.seed + rank)
    np.random.seed(cfg.seed)

    examples = [e for e in load_set(set_path, split="train") if e.model == recipe.model]
    prompts = prompts_from_examples(examples)
    if not prompts:
        raise ValueError(f"set {set_path} has no train {recipe.model} prompts for GRPO")
    if cfg.guided:
        check_guided_prompts(prompts, set_path)
    if judge is None and recipe.model == "captioner":
        from training.rewards import make_judge

        judge = make_judge(cfg.judge)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model, processor, groups, base_dir, base_id = load_policy(sft_model_dir, recipe, cfg.lr)
        # The SFT export it starts from is its lineage (verified by load_policy; read now,
        # so the export records it even if that folder goes away during training).
        start = export_weights(sft_model_dir, read_model_manifest(sft_model_dir))
    reference = None
    if cfg.beta > 0:
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    trainable = [p for g in groups for p in g["params"]]
    if not trainable:
        raise ValueError(f"{sft_model_dir}: nothing to train")
    engine = build_engine(model, groups, recipe, cfg, world)
    if backend is None:
        if cfg.zero_stage == 3:
            raise ValueError(
                "ZeRO-3 partitions the policy's weights: in-process rollouts need ZeRO-2 or "
                "an external rollout backend (an OpenAI-compatible pod)"
            )
        backend = LivePolicyBackend(
            engine.module, processor, seed=cfg.seed + rank, guided=cfg.guided
        )

    def backward(loss: torch.Tensor) -> None:
        # ZeRO averages gradients over ranks; the loss is already over the global count.
        engine.backward(loss * world)

    def zero_backward() -> None:
        # A dropped group still takes part in every rank's reduction, without a forward.
        engine.backward(sum((p * 0.0).sum() for p in trainable))

    def update() -> None:
        engine.step()

    masks = guide_masks(backend, processor) if cfg.guided else None
    mlf = _GRPOLog(recipe, cfg, set_path, sft_model_dir, base_id, rank, log_mlflow)
    probe = _probe_prompts(set_path, sft_model_dir, recipe.model, cfg) if cfg.probe_every else None
    best = BestState(engine.module) if probe is not None else None

    def run_probe(step: int) -> ProbeResult:
        assert probe is not None and best is not None
        res = probe_policy(step, backend, probe[1][rank::world],
                           max_new_tokens=cfg.max_new_tokens,
                           guided=cfg.probe_decoding == "guided", judge=judge,
                           all_sum=_all_sum)  # fmt: skip
        best.offer(res)
        mlf.log_metrics(step, res.metrics())
        return res

    history: list[dict[str, float]] = []
    rng = random.Random(cfg.seed)
    bar = tqdm(total=cfg.max_steps, desc=f"grpo {recipe.model}", unit="step",
               disable=not progress or rank != 0)  # fmt: skip
    try:
        mlf.start(_git_commit())
        step, stopped_early = 0, False
        if best is not None:  # the start competes too: GRPO never exports a worse probe
            history.append({"step": 0, **run_probe(0).metrics()})
        for step in range(1, cfg.max_steps + 1):
            picked = [rng.randrange(len(prompts)) for _ in range(cfg.prompts_per_step * world)]
            mine = [prompts[i] for i in picked[rank::world]]
            stats = _distributed_step(step, engine, processor, mine, backend, cfg, judge,
                                      reference, backward, zero_backward, update,
                                      _all_sum, masks)  # fmt: skip
            if not math.isfinite(stats.loss):
                raise DivergedError(f"GRPO {recipe.model}: loss is {stats.loss} at step {step}")
            history.append({"step": step, **stats.metrics()})
            mlf.log_step(step, stats)
            bar.update(1)
            post = {"reward": f"{stats.reward_mean:.3f}", "parse": f"{stats.parse_rate:.2f}",
                    "kl": f"{stats.kl:.3g}"}  # fmt: skip
            if not math.isnan(stats.free_parse_rate):  # mixed groups: the free half's parse
                post["free_parse"] = f"{stats.free_parse_rate:.2f}"
            if best is not None and (step % cfg.probe_every == 0 or step == cfg.max_steps):
                history[-1].update(run_probe(step).metrics())
                post["probe"] = f"{history[-1]['grpo.probe_reward']:.3f}"
                if cfg.probe_patience and best.since_best >= cfg.probe_patience:
                    stopped_early = True
            bar.set_postfix(post)
            if stopped_early:
                break
        bar.close()
        final = out / "model"
        selected_on = None
        if best is not None and best.best is not None:
            if best.best.step != step:
                best.restore()
            selected_on = {"episodes": probe[0], "kept_step": best.best.step,  # type: ignore[index]
                           "metric": f"grpo.probe_reward ({cfg.probe_decoding})",
                           "value": best.best.reward}  # fmt: skip
        _export(engine, recipe, base_dir, base_id, final, rank, Path(set_path), start,
                selected_on=selected_on)  # fmt: skip
        if rank == 0:  # per-step metrics beside the model, whether MLflow logs them or not
            write_history(out / "log", history)
        _barrier()
        result = GRPOResult(recipe.model, out, final, step, history,
                            kept_step=selected_on["kept_step"] if selected_on else None,
                            stopped_early=stopped_early)  # fmt: skip
        mlf.finish(result, register)
        return result
    except BaseException:
        bar.close()
        mlf.fail()
        raise


LOG_KIND = "grpo-log"


def check_log_out(path: str | Path) -> None:
    """Refuse (:class:`flora.safety.OutputDirError`) a ``log`` folder Flora did not write."""
    from flora.safety import ensure_own_output_dir

    ensure_own_output_dir(path, LOG_KIND, hint="delete it yourself if it is disposable")


def write_history(path: str | Path, history: Sequence[dict[str, float]]) -> Path:
    """Write a run's per-step metrics to ``path/history.json`` (a folder Flora owns; an
    earlier run's log is replaced, anything else refused)."""
    from flora.safety import prepare_output_dir

    log_dir = prepare_output_dir(path, LOG_KIND, hint="delete it yourself if it is disposable")
    dst = log_dir / "history.json"
    dst.write_text(json.dumps(list(history), indent=1) + "\n")
    return dst


def _probe_prompts(set_path: str | Path, start: str | Path, model: str, cfg: GRPOConfig
                   ) -> tuple[list[str], list[GRPOPrompt]]:  # fmt: skip
    """The probe's episodes and prompts: every held-out ``model`` example of the last
    ``cfg.probe_episodes`` held-out episodes (:func:`training.grpo_probe.probe_episode_ids`)
    that the starting model's lineage never trained on (a probe on seen episodes would
    reward memory; when that lineage is unknown, the set's split alone)."""
    from training.evaluate import unseen_heldout

    try:
        held = unseen_heldout(model, set_path, start, allow_unknown_lineage=True).examples
    except ValueError as e:  # none held out, or every one seen by the starting model
        raise ValueError(f"grpo.probe_every needs unseen held-out episodes: {e}") from None
    ids = probe_episode_ids([e.episode_id for e in held], cfg.probe_episodes)
    prompts = prompts_from_examples([e for e in held if e.episode_id in ids])
    if cfg.probe_decoding == "guided":
        check_guided_prompts(prompts, set_path)
    return ids, prompts


def check_guided_prompts(prompts: Sequence[GRPOPrompt], set_path: str | Path) -> None:
    """Guided rollouts need every prompt's grammar regex: without it a rollout would decode
    freely while the recipe says guided. Raises ``ValueError`` naming the set and prompts."""
    bare = [p.prompt_id for p in prompts if not p.guided_regex]
    if bare:
        raise ValueError(
            f"set {set_path}: grpo.guided needs prompts that carry their grammar regex; "
            f"{len(bare)} of {len(prompts)} do not (e.g. {', '.join(bare[:3])}) — a set "
            "written before sets stored guided_regex: rebuild it with `flora train sets`"
        )


def guide_masks(backend: VLMBackend, processor: Any) -> Callable[[VLMRequest], Any | None]:
    """The masks guided rollouts were sampled under, per request (None without a regex):
    the in-process backend's own (``mask_for``: the cache generation filled), else the
    trainer's over the processor's vocabulary, for rollouts an external pod sampled."""
    own = getattr(backend, "mask_for", None)
    if own is not None:
        return own
    from flora.backends.guided import MaskCache

    tok = processor.tokenizer
    cache = MaskCache(tok, [tok.convert_tokens_to_ids(END)])
    return lambda r: cache(r.guided_regex) if r.guided_regex is not None else None


def _distributed_step(
    step: int,
    engine: Any,
    processor: Any,
    prompts: Sequence[GRPOPrompt],
    backend: VLMBackend,
    cfg: GRPOConfig,
    judge: Any,
    reference: torch.nn.Module | None,
    backward: Callable[[torch.Tensor], None],
    zero_backward: Callable[[], None],
    update: Callable[[], None],
    all_sum: Callable[[float], float],
    masks: Callable[[VLMRequest], Any | None] | None = None,
) -> StepStats:
    """:func:`grpo_step` with the token count summed over ranks and equal backward counts."""
    return grpo_step(
        step,
        engine.module,
        processor,
        prompts,
        backend,
        cfg,
        judge=judge,
        reference=reference,
        backward=backward,
        update=update,
        zero_backward=zero_backward,
        all_sum=all_sum,
        forward=engine,
        masks=masks,
    )


class _GRPOLog:
    """Rank-0 MLflow logging of one GRPO run (``grpo-<model>`` in ``flora-train-<model>``)."""

    def __init__(self, recipe: Any, cfg: GRPOConfig, set_path: Any, sft_dir: Any, base_id: str,
                 rank: int, enabled: bool) -> None:  # fmt: skip
        self.recipe, self.cfg, self.set_path, self.sft_dir = recipe, cfg, set_path, sft_dir
        self.base_id = base_id
        self.on = enabled and rank == 0
        self._cm: Any = None
        self.run_id: str | None = None

    def start(self, commit: str) -> None:
        if not self.on:
            return
        import mlflow

        from flora.tracking import mlflow_run
        from training.sets import read_manifest

        man = read_manifest(self.set_path)
        tags = {
            "flora.git_commit": commit,
            "flora.data.md5": str(man.get("dataset_md5", "")),
            "flora.set.run_id": str(man.get("mlflow_run_id", "")),
            "flora.recipe": f"{self.recipe.model}-{self.recipe.size}",
            "flora.recipe.digest": self.recipe.digest(),
            "flora.base": self.recipe.base,
            "flora.base_id": self.base_id,
            "flora.sft_model": str(self.sft_dir),
            "flora.stage": "grpo",
        }
        self._cm = mlflow_run(f"grpo-{self.recipe.model}", tags,
                              experiment=f"flora-train-{self.recipe.model}")  # fmt: skip
        self.run_id = self._cm.__enter__().info.run_id
        mlflow.log_params(self.recipe.flat())
        mlflow.log_params({f"grpo_run.{k}": v for k, v in asdict(self.cfg).items()})

    def log_step(self, step: int, stats: StepStats) -> None:
        self.log_metrics(step, stats.metrics())

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if not self.on:
            return
        import mlflow

        mlflow.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)}, step=step)

    def finish(self, result: GRPOResult, register: bool) -> None:
        result.run_id = self.run_id
        if not self.on:
            return
        from model_registry.register import log_flora_model, register_model

        try:
            result.model_uri = log_flora_model(result.model_dir)
            if register:
                result.registered_version = register_model(
                    self.recipe.model, result.model_uri, self.run_id, tags={"flora.stage": "grpo"}
                )
        except BaseException:
            self.fail()
            raise
        cm, self._cm = self._cm, None
        cm.__exit__(None, None, None)

    def fail(self) -> None:
        import sys

        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(*sys.exc_info())
