"""GRPO rewards of the segmenter (``r_seg``) and the captioner (``r_cap``) on raw completions.

DESIGN §3.5: a completion that does not parse under its model's strict grammar gets
reward 0 — the floor of both rewards — and counts against the parse rate. The rewards
themselves are the project's metrics, never re-implemented here:

* segmenter: :func:`flora.segment.grammar.parse_segments` then
  :func:`flora.metrics.r_seg` against the window's reference ``LocalSegment`` list (ticks
  and continuation flags); a window with no reference and no predicted segment scores 1;
* captioner: :func:`flora.caption.grammar.parse_caption` then
  :func:`flora.metrics.caption.score_captions` with a judge
  (:class:`flora.caption.judges.EmbeddingJudge` by default, ``LLMJudge`` by option)
  against the event's reference requirements.

A judge that cannot decide an item (an LLM judge whose answers kept failing its own
grammar) is not the policy's fault: that completion's reward is ``NaN`` and the GRPO loop
drops its whole group from the gradient (and counts it), instead of inventing a value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flora.caption.grammar import parse_caption
from flora.metrics.caption import Judge, as_requirements, score_captions
from flora.metrics.segment import r_seg
from flora.parsing import Rejection
from flora.segment.grammar import parse_segments
from flora.segment.plan import LocalSegment

REWARD_MODELS = ("segmenter", "captioner")


@dataclass(frozen=True)
class Reward:
    """One completion's reward: value, whether it parsed, and why it did not (or the judge)."""

    value: float
    parsed: bool
    reason: str = ""

    @property
    def judged(self) -> bool:
        """False when the judge could not score a parsed completion (value is NaN)."""
        return not math.isnan(self.value)


def as_local_segments(items: Any) -> list[LocalSegment]:
    """Reference segments from LocalSegments, dicts ``{u, v, left_open, right_open}`` or tuples."""
    out: list[LocalSegment] = []
    for it in items or []:
        if isinstance(it, LocalSegment):
            out.append(it)
        elif isinstance(it, dict):
            out.append(
                LocalSegment(
                    int(it["u"]),
                    int(it["v"]),
                    bool(it.get("left_open", False)),
                    bool(it.get("right_open", False)),
                )
            )
        elif hasattr(it, "u"):
            out.append(LocalSegment(int(it.u), int(it.v), bool(it.left_open), bool(it.right_open)))
        else:
            u, v, lf, rf = it
            out.append(LocalSegment(int(u), int(v), bool(lf), bool(rf)))
    return out


def segment_reward(text: str, n_ticks: int, reference: Sequence[Any]) -> Reward:
    """``r_seg`` of one raw segmenter completion for an ``n_ticks`` window (0 if no parse)."""
    parsed = parse_segments(text, n_ticks)
    if isinstance(parsed, Rejection):
        return Reward(0.0, False, parsed.reason)
    return Reward(float(r_seg(parsed, as_local_segments(reference))), True)


def segment_rewards(
    texts: Sequence[str], n_ticks: Sequence[int], references: Sequence[Sequence[Any]]
) -> list[Reward]:
    """:func:`segment_reward` over aligned lists."""
    if not len(texts) == len(n_ticks) == len(references):
        raise ValueError(
            f"segment_rewards: {len(texts)} texts, {len(n_ticks)} n_ticks, "
            f"{len(references)} references"
        )
    return [segment_reward(t, n, r) for t, n, r in zip(texts, n_ticks, references, strict=True)]


def caption_rewards(
    texts: Sequence[str], requirements: Sequence[Any], judge: Judge
) -> list[Reward]:
    """``r_cap`` of raw captioner completions (0 if unparseable; NaN if the judge failed).

    All parsed captions are judged in one batch (the embedding judge embeds every text
    once).
    """
    if len(texts) != len(requirements):
        raise ValueError(f"caption_rewards: {len(texts)} texts, {len(requirements)} references")
    out: list[Reward | None] = [None] * len(texts)
    todo: list[tuple[int, str, Any]] = []
    for i, t in enumerate(texts):
        p = parse_caption(t)
        if isinstance(p, Rejection):
            out[i] = Reward(0.0, False, p.reason)
        else:
            todo.append((i, p, as_requirements(requirements[i])))
    if todo:
        scores = score_captions(judge, [(c, r) for _, c, r in todo])
        for (i, _, _), s in zip(todo, scores, strict=True):
            if isinstance(s, Rejection):
                out[i] = Reward(math.nan, True, f"judge: {s.reason}")
            else:
                out[i] = Reward(float(s.reward), True)
    return [r for r in out if r is not None]


def make_judge(kind: str = "embedding", backend: Any | None = None) -> Judge:
    """The captioner's reward judge: ``"embedding"`` (default, offline) or ``"llm"``.

    ``"llm"`` needs a ``VLMBackend`` (an OpenAI-compatible pod in production); with
    ``backend=None`` it is built from settings (``flora.backends.make_backend``).
    """
    from flora.caption.judges import EmbeddingJudge, LLMJudge

    if kind == "embedding":
        return EmbeddingJudge()
    if kind == "llm":
        if backend is None:
            from flora.backends import make_backend
            from flora.settings import get_settings

            backend = make_backend(get_settings())
        return LLMJudge(backend)
    raise ValueError(f"judge must be 'embedding' or 'llm', got {kind!r}")


__all__ = [
    "REWARD_MODELS",
    "Reward",
    "as_local_segments",
    "caption_rewards",
    "make_judge",
    "segment_reward",
    "segment_rewards",
]
