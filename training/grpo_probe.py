"""A held-out probe for GRPO: score the policy every N steps and keep its best state.

GRPO on the small segmenter can collapse: in a 60-step run free parsing reached 0.65 at
step 40 and 0 at step 60 (``docs/benchmarks.md``, "Longer GRPO …"). SFT guards against
the analogous failure with an early stop on held-out loss; GRPO has no loss to watch, so
it watches its reward instead: every ``probe_every`` steps the policy answers the windows
(or events) of a few held-out episodes once, greedily, as evaluation decodes them, and the
mean reward (0 for an answer that does not parse) decides which state is exported.

The probe episodes are the *last* held-out episodes of the set (sorted ids): evaluation
reports take held-out episodes from the front, and SFT's checkpoint choice uses the last
held-out examples too (never the first held-out episode). Both choices are recorded in
the export (``selected_on.episodes``) and :func:`training.lineage.trained_episodes` counts
them, so no evaluation ever scores the model on an episode that chose it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from flora.backends.base import VLMBackend


def probe_episode_ids(episode_ids: Sequence[str], n: int) -> list[str]:
    """The ``n`` held-out episodes that choose GRPO's kept state: the last ``n`` sorted ids
    (evaluation takes from the front, :func:`training.evaluate.heldout_examples`)."""
    if n < 1:
        raise ValueError(f"probe_episodes must be >= 1, got {n}")
    return sorted(set(episode_ids))[-n:]


@dataclass(frozen=True)
class ProbeResult:
    """One probe: mean reward (unparseable = 0) and parse rate over every probe answer."""

    step: int
    reward: float
    parse_rate: float
    answers: int

    def metrics(self) -> dict[str, float]:
        return {"grpo.probe_reward": self.reward, "grpo.probe_parse_rate": self.parse_rate}


def probe_policy(
    step: int,
    backend: VLMBackend,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    guided: bool,
    judge: Any | None = None,
    all_sum: Callable[[float], float] | None = None,
) -> ProbeResult:
    """One greedy answer per probe prompt (:class:`training.grpo.GRPOPrompt`), scored by the
    GRPO reward. ``guided``: keep each request's grammar regex (else decode freely). Each
    rank passes its share of the prompts; ``all_sum`` totals them, so every rank gets the
    same result and takes the same decision. A prompt the backend or judge failed on is
    left out of both means (its reward is NaN), as a GRPO group would be dropped."""
    from training.grpo import score_completions

    reqs = []
    for p in prompts:
        base = p.request
        reqs.append(replace(base, temperature=0.0, max_new_tokens=int(max_new_tokens),
                            top_logprobs=0, seed=None,
                            request_id=f"{base.request_id or p.prompt_id}#probe",
                            guided_regex=base.guided_regex if guided else None))  # fmt: skip
    resps = backend.generate(reqs) if reqs else []
    total = parsed = count = 0.0
    for p, r in zip(prompts, resps, strict=True):
        if not r.ok:
            continue
        (w,) = score_completions(p, [r.text], judge)
        if math.isnan(w.value):
            continue
        total, parsed, count = total + w.value, parsed + float(w.parsed), count + 1
    if all_sum is not None:
        total, parsed, count = all_sum(total), all_sum(parsed), all_sum(count)
    if count == 0:
        raise RuntimeError(f"GRPO probe at step {step}: no probe answer could be scored")
    return ProbeResult(step, total / count, parsed / count, int(count))


class BestState:
    """The trainable parameters at the best probe so far (a CPU copy), restorable.

    Strictly better replaces: on ties the earlier, less-trained state is kept. Needs whole
    parameters on every rank (ZeRO-2, or one process); ZeRO-3 shards them.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module
        self.best: ProbeResult | None = None
        self._state: dict[str, torch.Tensor] = {}
        self.since_best = 0

    def offer(self, result: ProbeResult) -> bool:
        """Keep the module's state if ``result`` beats the best so far; True if kept."""
        if self.best is not None and not result.reward > self.best.reward:
            self.since_best += 1
            return False
        self.best, self.since_best = result, 0
        self._state = {n: p.detach().to("cpu", copy=True)
                       for n, p in self._module.named_parameters() if p.requires_grad}  # fmt: skip
        return True

    def restore(self) -> None:
        """Write the kept state back into the module's trainable parameters."""
        if self.best is None:
            raise RuntimeError("no probe state to restore")
        with torch.no_grad():
            for n, p in self._module.named_parameters():
                if n in self._state:
                    p.copy_(self._state[n].to(p.device, p.dtype))


__all__ = ["BestState", "ProbeResult", "probe_episode_ids", "probe_policy"]
